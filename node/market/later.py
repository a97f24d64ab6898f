"""Calls made a fixed delay after they were asked for, unless withdrawn first: one task for all of them.

The executor does two things a moment after a job starts, and only if the job is still going then:
it tells the submitter the job is `accepted` (ACCEPT_DELAY after it is queued) and records it
`running` (RUNNING_MARK_DELAY after its run starts). A sleeping task per job for each made two tasks,
two timers and four task steps per job, and a tiny job ends before either delay, so nearly all of
them woke only to find nothing to do. A `Later` keeps the calls in a deque (one delay for all, so
they fall due in the order they were asked for) and one task that sleeps until the first live one is
due; a call withdrawn before it is due costs an entry and no task. A call that falls due runs in a
task of its own in the given nursery, so a slow one (a store write, a send) holds up no other.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable

import trio


class Pending:
    """One call asked for: `withdraw` it before it is due and it never runs."""

    __slots__ = ("begun", "due", "fn", "still", "withdrawn")

    def __init__(self, due: float, fn: Callable[[], Awaitable[object]], still: Callable[[], bool]) -> None:
        self.due = due
        self.fn = fn
        self.still = still
        self.withdrawn = False
        self.begun = False

    def dead(self) -> bool:
        return self.withdrawn or not self.still()

    def withdraw(self) -> bool:
        """Withdraw the call; True if it had not begun (it never will), False if it already runs (or
        ran)."""
        self.withdrawn = True
        return not self.begun


class Later:
    def __init__(self, delay: float) -> None:
        self.delay = delay
        self._line: deque[Pending] = deque()
        self._added = trio.Event()

    def __len__(self) -> int:
        return len(self._line)

    def add(self, fn: Callable[[], Awaitable[object]], still: Callable[[], bool] = lambda: True) -> Pending:
        """Have `fn()` run `delay` seconds from now (in a task of its own), unless withdrawn first or
        `still()` is false by then. Once false, `still()` must stay false: an entry found dead is
        dropped at once, before it is due."""
        entry = Pending(trio.current_time() + self.delay, fn, still)
        self._line.append(entry)
        self._added.set()
        return entry

    async def run(self, nursery: trio.Nursery) -> None:
        """Run the calls as they fall due, each in a task of `nursery`; until cancelled."""
        line = self._line
        while True:
            while line and line[0].dead():
                line.popleft()
            if not line:
                self._added = trio.Event()
                await self._added.wait()
                continue
            head = line[0]
            if head.due > trio.current_time():
                await trio.sleep_until(head.due)  # (dead meanwhile: dropped at the next turn)
                continue
            line.popleft()
            head.begun = True
            nursery.start_soon(head.fn)
