"""A job declined for want of room is offered again as soon as one of its submitter's jobs ends at an
executor (node/market/room.py), not after the re-offer delay."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import trio
import trio.testing
from e31.node.market import submitter
from e31.node.market.room import RoomWaits, for_room
from market_nodes import SETTINGS, Net, RealNode, start, wait_state


def test_only_declines_for_want_of_room_wait_for_room() -> None:
    assert for_room("busy: 64 jobs already queued")
    assert for_room("deadline: it cannot finish by its deadline behind the 3 job(s) promised here")
    assert for_room("busy")
    assert not for_room("no_profile: this node runs another execution profile")
    assert not for_room("policy: this node runs no jobs (cores = 0: it only submits)")
    assert not for_room(None)


async def test_each_freed_room_wakes_the_job_that_waited_longest_and_only_it() -> None:
    room = RoomWaits()
    woke: list[int] = []

    async def waiter(n: int) -> None:
        await room.wait(600.0)
        woke.append(n)

    async with trio.open_nursery() as nursery:
        for n in range(3):
            nursery.start_soon(waiter, n)
            await trio.testing.wait_all_tasks_blocked()
        assert room.waiting == 3
        room.freed()
        await trio.testing.wait_all_tasks_blocked()
        assert woke == [0] and room.waiting == 2
        room.freed()
        await trio.testing.wait_all_tasks_blocked()
        assert woke == [0, 1] and room.waiting == 1
        room.freed()
        room.freed()  # nobody left to wake: nothing happens
        await trio.testing.wait_all_tasks_blocked()
        assert woke == [0, 1, 2] and room.waiting == 0


async def test_a_wait_ends_after_its_delay_when_no_room_frees(autojump_clock: trio.abc.Clock) -> None:
    room = RoomWaits()
    start_at = trio.current_time()
    await room.wait(5.0)
    assert trio.current_time() - start_at == 5.0 and room.waiting == 0


async def test_a_job_declined_busy_goes_when_the_job_ahead_of_it_ends(
    net: Net, nursery: trio.Nursery, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    # a re-offer delay no test waits out: the second job can only go when room frees
    a.ctx.settings = replace(SETTINGS, reoffer_delay=600.0)
    monkeypatch.setattr(submitter, "REOFFER_MAX", 600.0)
    b.ctx.settings = replace(SETTINGS, max_queue_per_core=1)  # one job at a time in b's queue
    await start(nursery, a, b)
    first, second = (a.manifest((str(i), "200000")) for i in range(2))
    await a.submitter.submit_batch([first, second])
    await wait_state(a, first.job_id.raw, "done")
    await wait_state(a, second.job_id.raw, "done")
    assert (await a.job(second.job_id.raw)).attempt == 1  # offered again, assigned once
