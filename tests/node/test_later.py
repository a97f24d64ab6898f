"""Later (node/market/later.py): calls made a fixed delay after they were asked for, unless withdrawn."""

from __future__ import annotations

import trio
import trio.testing
from e31.node.market.later import At, Later


async def test_a_call_runs_its_delay_after_it_was_asked_for_in_order(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    later = Later(0.5)
    nursery.start_soon(later.run, nursery)
    ran: list[tuple[str, float]] = []

    async def record(name: str) -> None:
        ran.append((name, trio.current_time()))

    t0 = trio.current_time()
    later.add(lambda: record("a"))
    await trio.sleep(0.2)
    later.add(lambda: record("b"))
    await trio.sleep(0.1)
    assert ran == []
    await trio.sleep(1.0)
    assert [name for name, _ in ran] == ["a", "b"]
    assert [round(at - t0, 6) for _, at in ran] == [0.5, 0.7]


async def test_a_withdrawn_call_never_runs_and_a_begun_one_says_so(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    later = Later(0.1)
    nursery.start_soon(later.run, nursery)
    begun, release = trio.Event(), trio.Event()
    ran: list[str] = []

    async def slow() -> None:
        begun.set()
        await release.wait()
        ran.append("slow")

    async def quick(name: str) -> None:
        ran.append(name)

    gone = later.add(lambda: quick("withdrawn"))
    running = later.add(slow)
    later.add(lambda: quick("after"))
    assert gone.withdraw()  # not begun: it never will
    await begun.wait()
    assert not running.withdraw()  # it runs already: the caller waits for its end another way
    await trio.sleep(0.5)
    assert ran == ["after"]  # the slow call holds up no other
    release.set()
    await trio.sleep(0.1)
    assert ran == ["after", "slow"]


async def test_a_call_no_longer_wanted_is_dropped_before_it_is_due(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    later = Later(1.0)
    nursery.start_soon(later.run, nursery)
    wanted = {i: True for i in range(1000)}
    ran: list[int] = []

    async def call(i: int) -> None:
        ran.append(i)

    for i in range(1000):
        later.add(lambda i=i: call(i), still=lambda i=i: wanted[i])
        await trio.sleep(0.0005)
    for i in range(1000):
        if i != 999:
            wanted[i] = False  # (a tiny job ended)
    assert len(later) == 1000 and ran == []
    await trio.sleep(0.6)  # the first falls due: every dead entry goes, not only the due ones
    assert len(later) == 1 and ran == []
    await trio.sleep(1.0)
    assert ran == [999] and len(later) == 0


async def test_at_runs_each_call_at_its_own_time_whatever_the_order_it_was_added_in(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    at = At()
    nursery.start_soon(at.run, nursery)
    ran: list[tuple[str, float]] = []

    async def record(name: str) -> None:
        ran.append((name, trio.current_time()))

    t0 = trio.current_time()
    at.add(t0 + 5.0, lambda: record("late"))
    await trio.sleep(0.1)  # the task sleeps towards the late one; an earlier one added now wakes it
    at.add(t0 + 1.0, lambda: record("early"))
    gone = at.add(t0 + 2.0, lambda: record("withdrawn"))
    at.add(t0 + 3.0, lambda: record("no longer wanted"), still=lambda: False)
    assert gone.withdraw()
    await trio.sleep(10.0)
    assert [(name, round(when - t0, 6)) for name, when in ran] == [("early", 1.0), ("late", 5.0)]
    assert len(at) == 0


async def test_at_sweeps_calls_that_died_long_before_they_were_due(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    """A sweep's tiny jobs each add a look due minutes later and end within milliseconds: the heap must
    not keep one entry (and its job) per job of the sweep until then."""
    at = At()
    nursery.start_soon(at.run, nursery)
    ended: set[int] = set()
    ran: list[int] = []

    async def look(i: int) -> None:
        ran.append(i)

    for i in range(10_000):
        at.add(trio.current_time() + 120.0, lambda i=i: look(i), still=lambda i=i: i not in ended)
        if i >= 10:
            ended.add(i - 10)  # each ends soon after its look was asked for; ten live at a time
    assert len(at) < 200  # swept as it grows, not 10,000
    await trio.sleep(200.0)
    assert sorted(ran) == list(range(9_990, 10_000))  # the live ones ran (each in a task of its own)
