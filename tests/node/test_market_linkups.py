"""The work a node does when a link comes up is bounded by its links, not by how many ever came up
(market/linkups.py): a flood of strangers' short-lived links leaves nothing waiting behind it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio
from e31.node.market.linkups import LinkUps
from market_nodes import Net, RealNode, start, until

STRANGERS = 20_000


async def test_links_that_go_down_before_their_turn_leave_nothing_waiting() -> None:
    done: list[bytes] = []

    async def work(peer: bytes) -> None:
        done.append(peer)

    queue = LinkUps(work, cap=100)
    for _ in range(STRANGERS):  # no worker runs yet: every link goes down before its turn
        peer = os.urandom(32)
        queue.up(peer)
        queue.down(peer)
    assert len(queue) == 0 and queue.dropped == 0
    async with trio.open_nursery() as nursery:
        await nursery.start(queue.run)
        await trio.sleep(0.05)
        assert done == []
        nursery.cancel_scope.cancel()


async def test_at_most_cap_peers_wait_and_each_runs_once() -> None:
    done: list[bytes] = []

    async def work(peer: bytes) -> None:
        done.append(peer)

    queue = LinkUps(work, cap=100, workers=2)
    peers = [os.urandom(32) for _ in range(STRANGERS)]
    for peer in peers:
        queue.up(peer)
        queue.up(peer)  # a peer waits once however often its link comes up
    assert len(queue) == 100 and queue.dropped == STRANGERS - 100
    async with trio.open_nursery() as nursery:
        await nursery.start(queue.run)
        await until(lambda: len(done) == 100)
        await trio.sleep(0.05)
        assert sorted(done) == sorted(peers[-100:]), "the newest links' work runs, once each"
        assert len(queue) == 0
        queue.up(peers[0])  # a link that comes up later still gets its turn
        await until(lambda: len(done) == 101)
        assert done[-1] == peers[0]
        nursery.cancel_scope.cancel()


def test_cap_and_workers_must_be_positive() -> None:
    async def work(peer: bytes) -> None:
        pass

    with pytest.raises(ValueError):
        LinkUps(work, cap=0)
    with pytest.raises(ValueError):
        LinkUps(work, workers=0)


async def test_a_flood_of_strangers_links_leaves_the_submitter_no_tasks(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    a = RealNode(net, tmp_path, "a", 1)
    await start(nursery, a)
    before = _tasks(trio.lowlevel.current_root_task())

    async def unused(raw: bytes) -> None:
        raise AssertionError("the market sends through the context")

    for i in range(2_000):
        peer = os.urandom(32)
        a.market.link_up(peer, unused)
        if i % 16 == 0:
            await trio.lowlevel.checkpoint()  # the workers take some while links keep coming
        a.market.link_down(peer)
    assert len(a.submitter.link_ups) == 0
    # Before, each link left two tasks waiting on the store's one thread (4,000 here).
    assert _tasks(trio.lowlevel.current_root_task()) <= before + 10


def _tasks(task: trio.lowlevel.Task) -> int:
    """`task` and all its descendants."""
    return 1 + sum(_tasks(t) for n in task.child_nurseries for t in n.child_tasks)
