"""A node whose bids to a submitter win nothing stops planning a bid for each of its offers: it answers
them with one unplanned `busy` decline, bids again on every few (a probe: standing.py), and on every
offer again once a bid wins; while it has a core free it always bids (bidding.py). A real node (its
store, its scheduler, its signed answers) with its clock held still, so the probe by time is the test's
to decide."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import market_nodes
import pytest
import trio
from e31.node.market import standing
from e31.node.market.bidding import LOSING_TEXT, Promise
from e31.node.market.standing import PROBE_MS
from e31.protocol.envelope import VerifiedEnvelope, sign_message, verify
from e31.protocol.ids import NodeId
from e31.protocol.messages import Award, Bid, Decline, Offer
from market_nodes import NETWORK, Net, RealNode, start, until, wall_ms
from test_awards import Bidder
from test_market import Recorder, executor_and_peer, foreign_manifest

Answers = list[VerifiedEnvelope[Any]]


class Offers:
    """A submitter `c` offering node `b` sets of fresh jobs, and reading b's answers to each."""

    def __init__(self, b: RealNode, c: Recorder) -> None:
        self.b, self.c, self.made = b, c, 0

    async def offer(self, jobs: int = 4) -> Answers:
        deadline = wall_ms() + 3_600_000  # room for every job these tests offer on one core
        manifests = [
            foreign_manifest(self.b, self.c.id, ("o", str(self.made + i)), deadline=deadline)
            for i in range(jobs)
        ]
        self.made += jobs
        env: VerifiedEnvelope[Offer] = self.c.offer(*manifests)
        self.b.executor.on_offer(env)

        def answers() -> Answers:
            return [a for a in self.c.got if a.message.offer_id == env.message_id]

        await until(lambda: sum(len(_named(a)) for a in answers()) == jobs)
        got = answers()
        assert sum(len(_named(a)) for a in got) == jobs  # every job of the offer is answered
        return got

    async def award(self, bid: VerifiedEnvelope[Bid], won: int) -> None:
        """The submitter's award for `bid`: its first `won` items, the rest to other nodes."""
        named = tuple(sorted((i.job_id for i in bid.message.items[:won]), key=lambda d: d.raw))
        award = Award(NETWORK, bid.message_id, NodeId(self.c.id), NodeId(self.b.id), named)
        await self.b.market.message(self.c.id, sign_message(award, self.c.key))


def _named(answer: VerifiedEnvelope[Any]) -> list[Any]:
    msg = answer.message
    return list(msg.items) if isinstance(msg, Bid) else list(msg.job_ids)


def kind(answers: Answers) -> str:
    """B: the offer got a bid; d: only the unplanned decline of a losing node; anything else: what."""
    if any(isinstance(a.message, Bid) for a in answers):
        return "B"
    (only,) = answers
    msg = only.message
    assert isinstance(msg, Decline) and msg.reason == "busy", msg
    assert msg.text.startswith(LOSING_TEXT.split("{}")[0]), msg.text
    return "d"


def bid_of(answers: Answers) -> VerifiedEnvelope[Bid]:
    (bid,) = [a for a in answers if isinstance(a.message, Bid)]
    return bid


async def losing_node(net: Net, nursery: trio.Nursery, tmp_path: Path) -> tuple[RealNode, Offers, list[int]]:
    """Node b (one core) with its clock held at `clock[0]`, a bid of 4 jobs it won (so its core is
    promised: it is not idle), and then one bid that won nothing."""
    b, c = await executor_and_peer(net, nursery, tmp_path)
    clock = [wall_ms()]
    b.ctx.clock = lambda: clock[0]
    offers = Offers(b, c)
    first = bid_of(await offers.offer())
    await offers.award(first, won=4)  # its four jobs count here until assigned: the core is taken
    assert b.executor.bids._promised_jobs(clock[0]) >= b.executor.bids.scheduler.workers
    lost = bid_of(await offers.offer())
    await offers.award(lost, won=0)
    assert b.executor.bids.standing.lost(c.id) == 1
    return b, offers, clock


async def test_a_node_whose_bid_lost_declines_the_next_offer_unplanned_then_probes(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    b, offers, clock = await losing_node(net, nursery, tmp_path)
    bids = b.executor.bids
    promises = len(bids._promises)
    skipped = await offers.offer()
    assert kind(skipped) == "d"
    assert len(bids._promises) == promises  # no bid kept for it: nothing promised
    probe = await offers.offer()
    assert kind(probe) == "B"
    await offers.award(bid_of(probe), won=0)  # lost again: two in a row, two offers skipped
    assert [kind(await offers.offer()) for _ in range(6)] == list("ddBddB")

    # another submitter's offers are bid for all the while
    other = Offers(b, Recorder(net, 13))
    assert kind(await other.offer()) == "B"

    # a probe goes PROBE_MS after the last bid, whatever is left of the skip; a win ends the streak
    assert kind(await offers.offer()) == "d"
    clock[0] += PROBE_MS
    probe = await offers.offer()
    assert kind(probe) == "B"
    await offers.award(bid_of(probe), won=1)
    assert bids.standing.lost(offers.c.id) == 0
    assert [kind(await offers.offer()) for _ in range(3)] == list("BBB")


async def test_a_bid_none_of_whose_jobs_is_assigned_by_the_choice_counts_as_lost(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    """No award (a small offer): the bid is lost once UNCHOSEN_MS have passed with no assignment."""
    b, offers, clock = await losing_node(net, nursery, tmp_path)
    bids = b.executor.bids
    assert kind(await offers.offer()) == "d"
    probe = await offers.offer()
    assert kind(probe) == "B"
    assert bids.standing.lost(offers.c.id) == 1  # not decided yet
    clock[0] += 1500  # bidding.UNCHOSEN_MS: the submitter has chosen, and not this bid
    assert bids._promised_jobs(clock[0]) == 4  # (the four awarded jobs of the first bid only)
    assert bids.standing.lost(offers.c.id) == 2


async def test_a_node_with_a_core_free_always_bids(net: Net, nursery: trio.Nursery, tmp_path: Path) -> None:
    b, c = await executor_and_peer(net, nursery, tmp_path)
    clock = [wall_ms()]
    b.ctx.clock = lambda: clock[0]
    offers = Offers(b, c)
    for _ in range(3):  # each bid loses; nothing is queued or promised here after its award
        bid = bid_of(await offers.offer())
        await offers.award(bid, won=0)
    assert b.executor.bids.standing.lost(c.id) == 3
    assert b.executor.bids._promised_jobs(clock[0]) == 0
    assert kind(await offers.offer()) == "B"


async def test_a_node_that_loses_a_sweeps_spread_declines_most_of_its_offers_unplanned(
    net: Net, nursery: trio.Nursery, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real submitter spreads a sweep's offers between node b, whose core is promised to another
    submitter's jobs for a minute, and a bidder that promises every job within a second: b's bids win
    nothing, the submitter's awards say so, and b answers most of the later offers with an unplanned
    decline, still answering every one (the submitter's bid window does not wait for it)."""
    monkeypatch.setattr(standing, "PROBE_MS", 600_000)  # the probes by count only: the host's pace aside
    # the fast bidder runs nothing: its leases must outlast the test, or a job whose lease ran out is
    # offered again (an offer of its own, which b answers too) at a moment set by the host's pace
    monkeypatch.setattr(market_nodes, "SETTINGS", replace(market_nodes.SETTINGS, lease_slack_ms=3_600_000))
    a = RealNode(net, tmp_path, "a", 1)  # submits; runs none of its own jobs (SETTINGS)
    b = RealNode(net, tmp_path, "b", 2)
    fast = Bidder(net, 21)
    await start(nursery, a, b)
    other = Offers(b, Recorder(net, 13))  # another submitter, whose award keeps b's core promised
    await other.award(bid_of(await other.offer()), won=4)

    answers: list[VerifiedEnvelope[Any]] = []
    handler = net.handlers[a.id]

    async def tap(peer: bytes, raw: bytes) -> None:
        if peer == b.id and isinstance((env := verify(raw)).message, Bid | Decline):
            answers.append(env)
        await handler(peer, raw)

    net.handlers[a.id] = tap

    def mine() -> list[Promise]:
        """b's live bids for a's offers."""
        return [p for p in b.executor.bids._promises.values() if p.offer.message.submitter.raw == a.id]

    for batch in range(8):
        await a.submitter.submit_batch([a.manifest(("s", str(batch), str(i)), 3600.0) for i in range(8)])
        await until(lambda n=batch: len(fast.of(Offer)) > n)  # (each batch goes in an offer of its own)
        await until(lambda: {e.message.offer_id for e in answers} >= {o.message_id for o in fast.of(Offer)})
        await until(lambda: all(p.decided is not None for p in mine()))  # its award came

    assert [len(o.message.manifests) for o in fast.of(Offer)] == [8] * 8  # one offer per batch, no other
    offers = [o.message_id for o in fast.of(Offer)]
    by_offer = {o: [e for e in answers if e.message.offer_id == o] for o in offers}
    assert all(by_offer.values()), "every offer is answered"
    kinds = "".join(kind(by_offer[o]) for o in offers)
    assert kinds == "BdBddBdd"  # lost 1, 2, 3 in a row: 1, 2, then (so far) 2 offers skipped
    assert b.executor.bids.standing.lost(a.id) == 3
