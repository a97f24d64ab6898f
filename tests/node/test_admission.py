"""Admission: a free slot with nobody waiting admits at once; waiting jobs are admitted in groups."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from e31.node.market.admission import Admission


async def test_a_free_slot_with_nobody_waiting_admits_at_once() -> None:
    gate = Admission(2, 2)
    async with gate:
        assert gate.free == 1
        async with gate:
            assert gate.free == 0
    assert gate.free == 2


async def test_waiting_jobs_are_admitted_a_step_at_a_time_and_the_last_ones_together() -> None:
    gate = Admission(4, 2)
    held = [trio.Event() for _ in range(4)]
    admitted: list[int] = []
    release: dict[int, trio.Event] = {}

    async def job(i: int, done: trio.Event) -> None:
        async with gate:
            admitted.append(i)
            await done.wait()

    async with trio.open_nursery() as nursery:
        for i in range(4):
            nursery.start_soon(job, i, held[i])
        await trio.testing.wait_all_tasks_blocked()
        for i in range(4, 7):
            release[i] = trio.Event()
            nursery.start_soon(job, i, release[i])
        await trio.testing.wait_all_tasks_blocked()
        assert sorted(admitted) == [0, 1, 2, 3] and gate.waiting == 3
        held[0].set()  # one slot free: less than a step, and three wait
        await trio.testing.wait_all_tasks_blocked()
        assert gate.waiting == 3 and gate.free == 1
        held[1].set()  # two free: a step's worth goes together
        await trio.testing.wait_all_tasks_blocked()
        assert gate.waiting == 1 and len(admitted) == 6  # two of the three (trio starts them in any order)
        held[2].set()  # one free, and one waits: it fits, so it goes
        await trio.testing.wait_all_tasks_blocked()
        assert gate.waiting == 0 and sorted(admitted) == list(range(7))
        for event in (held[3], *release.values()):
            event.set()
    assert gate.free == 4


async def test_a_cancelled_waiter_leaves_no_slot_behind() -> None:
    gate = Admission(1, 1)
    async with gate:
        with trio.move_on_after(0.01):
            async with gate:
                pytest.fail("admitted while the only slot was held")
        assert gate.waiting == 0
    assert gate.free == 1


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError):
        Admission(0, 1)
    with pytest.raises(ValueError):
        Admission(4, 5)


async def test_a_job_cancelled_as_it_enters_takes_no_slot() -> None:
    gate = Admission(4, 2)
    for _ in range(3):
        with trio.move_on_after(0):
            async with gate:
                pytest.fail("ran although cancelled")
    assert gate.free == 4


async def test_when_a_waiter_leaves_the_others_are_admitted_if_they_now_fit() -> None:
    gate = Admission(3, 2)
    entered: list[int] = []
    done = {i: trio.Event() for i in range(4)}

    async def job(i: int) -> None:
        async with gate:
            entered.append(i)
            await done[i].wait()

    async with trio.open_nursery() as nursery:
        for i in range(3):
            nursery.start_soon(job, i)
        await trio.testing.wait_all_tasks_blocked()
        leaver = trio.CancelScope()

        async def leaving() -> None:
            with leaver:
                await job(9)

        nursery.start_soon(job, 3)
        nursery.start_soon(leaving)
        await trio.testing.wait_all_tasks_blocked()
        done[0].set()  # one slot free, two wait: less than a step, and not all of them fit
        await trio.testing.wait_all_tasks_blocked()
        assert gate.waiting == 2 and gate.free == 1
        leaver.cancel()  # one waiter leaves: the one left fits the free slot, and goes
        await trio.testing.wait_all_tasks_blocked()
        assert gate.waiting == 0 and sorted(entered) == [0, 1, 2, 3]
        for event in done.values():
            event.set()
    assert gate.free == 3
