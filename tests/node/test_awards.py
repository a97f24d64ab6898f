"""A submitter that spreads an offer's jobs across its bidders tells each bidder left with jobs it was
not given which ones it won (`award`), and sends its next offer only after those awards: a bidder's
queue then holds room for the jobs it won, not for the whole offer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import nacl.signing
import pytest
import trio
from e31.node.market import offering
from e31.protocol.assignments import Assignment, assignments
from e31.protocol.envelope import VerifiedEnvelope, sign_message, verify
from e31.protocol.ids import NodeId
from e31.protocol.messages import AssignSet, Award, Bid, BidItem, Offer
from market_nodes import NETWORK, Net, RealNode, start, until, wall_ms


class Bidder:
    """Bids for every job of every offer (one core: the k-th job finishes k tenths of a second from
    now), and keeps what it hears, in order: offers from gossip, awards and assignments direct. It
    runs nothing."""

    def __init__(self, net: Net, seed: int) -> None:
        self.key = nacl.signing.SigningKey(bytes([seed]) * 32)
        self.id = bytes(self.key.verify_key)
        self.net = net
        self.send = net.sender(self.id)
        self.heard: list[VerifiedEnvelope[Any]] = []
        self.bids: dict[bytes, bytes] = {}
        """Offer id -> the id of this bidder's bid for it."""
        net.handlers[self.id] = self.message
        net.offer_sinks[self.id] = self.offer

    def offer(self, env: VerifiedEnvelope[Any]) -> None:
        self.heard.append(env)
        now = wall_ms()
        items = tuple(
            BidItem(m.job_id, now + k * 100, now + (k + 1) * 100) for k, m in enumerate(env.message.manifests)
        )
        bid = sign_message(Bid(NETWORK, env.message_id, NodeId(self.id), now + 30_000, items), self.key)
        self.bids[env.message_id.raw] = verify(bid).message_id.raw
        assert self.net.nursery is not None
        self.net.nursery.start_soon(self.send, env.message.submitter.raw, bid)

    async def message(self, peer: bytes, raw: bytes) -> None:
        self.heard.append(verify(raw))

    def of(self, kind: type) -> list[Any]:
        return [env for env in self.heard if isinstance(env.message, kind)]


def given(bidder: Bidder) -> list[Assignment]:
    """Every job assigned to the bidder, from the `assigns` sets it was sent."""
    return [x for env in bidder.of(AssignSet) for x in assignments(env)]


async def test_each_bidder_hears_what_it_won_before_the_next_offer(
    net: Net, nursery: trio.Nursery, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the wait for a decision is bounded (DECIDE_WAIT); here the order is the point, not the bound
    monkeypatch.setattr(offering, "DECIDE_WAIT", 30.0)
    a = RealNode(net, tmp_path, "a", 1)  # submits; runs none of its own jobs (SETTINGS)
    b, c = Bidder(net, 21), Bidder(net, 22)
    await start(nursery, a)
    manifests = [a.manifest((str(i), "100")) for i in range(100)]
    await a.submitter.submit_batch(manifests)
    # the whole sweep is assigned, between the two bidders (neither runs anything: it stays assigned)
    await until(lambda: len(given(b)) + len(given(c)) >= 100, seconds=30)

    first_offer = b.of(Offer)[0]
    for bidder in (b, c):
        bid_id = bidder.bids[first_offer.message_id.raw]
        awards = [env for env in bidder.of(Award) if env.message.bid_id.raw == bid_id]
        assert len(awards) == 1, "one award per bid that was not given all its jobs"
        award = awards[0].message
        assert award.submitter.raw == a.id and award.executor.raw == bidder.id
        won = {x.job_id for x in given(bidder) if x.bid_id.raw == bid_id}
        assert set(award.job_ids) == won  # the award names exactly what it is assigned under that bid
        assert 0 < len(won) < len(first_offer.message.manifests)  # the offer was spread
        # the next offer came after that award (the submitter waits for its awards to go out)
        later = [env for env in bidder.of(Offer) if env is not first_offer]
        assert later, "the sweep took more than one offer"
        assert bidder.heard.index(awards[0]) < bidder.heard.index(later[0])
