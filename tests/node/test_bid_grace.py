"""An executor's bid whose other jobs went elsewhere frees their room soon after its first assignment
(bidding.CHOSEN_GRACE_MS), and a late assignment of one of them is still taken while the bid lives."""

from __future__ import annotations

from pathlib import Path

import trio
from e31.node.market.bidding import CHOSEN_GRACE_MS
from e31.protocol.envelope import sign_message
from e31.protocol.ids import NodeId
from e31.protocol.messages import Assign, Bid, Release, Result
from market_nodes import NETWORK, Net, until, wait_state, wall_ms
from test_market import executor_and_peer, foreign_manifest


async def test_a_bids_unassigned_jobs_stop_counting_after_its_first_assignment(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    b, c = await executor_and_peer(net, nursery, tmp_path)
    named = [foreign_manifest(b, c.id, (str(i), "100")) for i in range(4)]
    b.executor.on_offer(c.offer(*named))
    bid_env = await c.only(Bid)
    bids = b.executor.bids
    assert len(bid_env.message.items) == 4
    before = wall_ms()
    assert bids._promised_jobs(before) == 4  # a bid with no assignment yet holds all its jobs

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
    await until(lambda: {env.message.job_id for env in c.kinds(Result)} >= {first, late})
