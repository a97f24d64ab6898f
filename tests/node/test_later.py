"""Later (node/market/later.py): calls made a fixed delay after they were asked for, unless withdrawn."""

from __future__ import annotations

import trio
import trio.testing
from e31.node.market.later import Later


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
