"""An executor's bid whose other jobs went elsewhere frees their room soon after its first assignment
(bidding.CHOSEN_GRACE_MS), one that won nothing soon after it was made (UNCHOSEN_MS), and a late
assignment of one of them is still taken while the bid lives; an offer gets bids for what the queue has
room for."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import trio
from e31.node.market.bidding import CHOSEN_GRACE_MS, UNCHOSEN_MS
from e31.protocol.envelope import sign_message
from e31.protocol.ids import NodeId
from e31.protocol.messages import Assign, Award, Bid, Decline, Release, Results
from market_nodes import NETWORK, Net, until, wait_state, wall_ms
from test_market import Recorder, executor_and_peer, foreign_manifest


async def test_a_bids_unassigned_jobs_stop_counting_after_its_first_assignment(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    b, c = await executor_and_peer(net, nursery, tmp_path)
    named = [foreign_manifest(b, c.id, (str(i), "100")) for i in range(4)]
    b.executor.on_offer(c.offer(*named))
    bid_env = await c.only(Bid)
    bids = b.executor.bids
    assert len(bid_env.message.items) == 4
    made = bids._promises[bid_env.message_id.raw].made
    assert bids._promised_jobs(made) == 4  # a bid with no assignment yet holds all its jobs

    first, late = (item.job_id for item in bid_env.message.items[:2])
    assign = Assign(NETWORK, first, bid_env.message_id, NodeId(c.id), NodeId(b.id), 1, wall_ms() + 30_000)
    await b.market.message(c.id, sign_message(assign, c.key))
    await until(lambda: bid_env.message_id.raw in bids._chosen_at)
    chosen = bids._chosen_at[bid_env.message_id.raw]
    # the others (given to other nodes, as far as this node knows) count for the grace, then no more
    assert bids._promised_jobs(chosen) == 3
    assert bids._promised_jobs(chosen + CHOSEN_GRACE_MS) == 0
    assert [t.key for t in bids._bid_tasks(chosen + CHOSEN_GRACE_MS)] == []

    # the bid still lives: a late assignment of another of its jobs is taken, and run
    assert bids.live(bid_env.message_id.raw) is not None
    assign = Assign(NETWORK, late, bid_env.message_id, NodeId(c.id), NodeId(b.id), 1, wall_ms() + 30_000)
    await b.market.message(c.id, sign_message(assign, c.key))
    await wait_state(b, late.raw, "done", 30, role="executor")
    assert not c.kinds(Release)
    await until(lambda: {e.job_id for env in c.kinds(Results) for e in env.message.entries} >= {first, late})


async def test_a_bid_that_won_nothing_stops_counting_once_the_submitter_has_chosen(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    """A bid none of whose jobs is assigned counts as promised for UNCHOSEN_MS after it was made (the
    submitter's bid window), then no more: it no longer fills the queue of a node whose bid lost."""
    b, c = await executor_and_peer(net, nursery, tmp_path)
    named = [foreign_manifest(b, c.id, (str(i), "100")) for i in range(3)]
    before = wall_ms()
    b.executor.on_offer(c.offer(*named))
    bid_env = await c.only(Bid)
    bids = b.executor.bids
    made = bids._promises[bid_env.message_id.raw].made
    assert before <= made <= wall_ms()
    assert bids._promised_jobs(made) == 3
    assert bids._promised_jobs(made + UNCHOSEN_MS - 1) == 3
    assert bids._promised_jobs(made + UNCHOSEN_MS) == 0
    assert bids.live(bid_env.message_id.raw) is not None  # a late assignment is still taken


async def test_an_offer_gets_bids_for_only_as_many_jobs_as_the_queue_has_room_for(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    """Past the queue's room (max_queue_per_core per core, counting the jobs still promised) the rest
    of an offer is declined `busy`, not the whole offer: the node bids for what fits."""
    b, c = await executor_and_peer(net, nursery, tmp_path)
    b.ctx.settings = replace(b.ctx.settings, max_queue_per_core=4)
    room = 4 * b.executor.bids.scheduler.workers
    first = [foreign_manifest(b, c.id, ("a", str(i))) for i in range(room - 2)]
    b.executor.on_offer(c.offer(*first))
    await until(lambda: len(c.kinds(Bid)) == 1)
    assert len(c.kinds(Bid)[0].message.items) == room - 2

    second = [foreign_manifest(b, c.id, ("b", str(i))) for i in range(5)]
    b.executor.on_offer(c.offer(*second))
    await until(lambda: len(c.kinds(Bid)) == 2 and len(c.kinds(Decline)) == 1)
    bid, decline = c.kinds(Bid)[1].message, c.kinds(Decline)[0].message
    assert len(bid.items) == 2
    assert decline.reason == "busy" and len(decline.job_ids) == 3
    assert {i.job_id for i in bid.items} | set(decline.job_ids) == {m.job_id for m in second}


async def test_an_award_frees_the_room_of_the_jobs_it_does_not_name_at_once(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    """The submitter's `award` for a bid: its jobs not named stop counting at once, those named count
    until assigned; an award signed by another node than the offer's submitter changes nothing."""
    b, c = await executor_and_peer(net, nursery, tmp_path)
    named = [foreign_manifest(b, c.id, (str(i), "100")) for i in range(5)]
    b.executor.on_offer(c.offer(*named))
    bid_env = await c.only(Bid)
    bids = b.executor.bids
    promise = bids._promises[bid_env.message_id.raw]
    won = sorted((item.job_id for item in bid_env.message.items[:2]), key=lambda d: d.raw)

    stranger = Recorder(net, 11)
    forged = Award(NETWORK, bid_env.message_id, NodeId(stranger.id), NodeId(b.id), ())
    await b.market.message(stranger.id, sign_message(forged, stranger.key))
    assert promise.awarded is None and bids._promised_jobs(promise.made) == len(bid_env.message.items) >= 4

    award = Award(NETWORK, bid_env.message_id, NodeId(c.id), NodeId(b.id), tuple(won))
    await b.market.message(c.id, sign_message(award, c.key))
    assert promise.awarded == {j.raw for j in won}
    # the named jobs count until assigned (or the bid lapses), whatever the timers say
    for at in (promise.made, promise.made + UNCHOSEN_MS + CHOSEN_GRACE_MS):
        assert bids._promised_jobs(at) == 2
        assert {t.key for t in bids._bid_tasks(at)} == {j.raw for j in won}

    # the awarded jobs leave the count as they are assigned; one not named is still taken
    not_named = next(i.job_id for i in bid_env.message.items if i.job_id not in won)
    for job_id in (won[0], not_named):
        assign = Assign(
            NETWORK, job_id, bid_env.message_id, NodeId(c.id), NodeId(b.id), 1, wall_ms() + 30_000
        )
        await b.market.message(c.id, sign_message(assign, c.key))
    await until(lambda: bids._promised_jobs(promise.made) == 1)
    assert bids._promised_jobs(promise.made) == 1
    await wait_state(b, not_named.raw, "done", 30, role="executor")
    assert not c.kinds(Release)
    assert bids._promised_jobs(promise.bid_expires) == 0  # (asked last: the count is kept in time order)
