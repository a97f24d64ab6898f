"""Calls made later, unless withdrawn first: one task for all of them (`Later`: a fixed delay after they
were asked for; `At`: each at a time of its own).

The executor does two things a moment after a job starts, and only if the job is still going then:
it tells the submitter the job is `accepted` (ACCEPT_DELAY after it is queued) and records it
`running` (RUNNING_MARK_DELAY after its run starts). A sleeping task per job for each made two tasks,
two timers and four task steps per job, and a tiny job ends before either delay, so nearly all of
them woke only to find nothing to do. A `Later` keeps the calls in a deque (one delay for all, so
they fall due in the order they were asked for) and one task that sleeps until the first live one is
due; a call withdrawn before it is due costs an entry and no task. A call that falls due runs in a
task of its own in the given nursery, so a slow one (a store write, a send) holds up no other.

The submitter does the same for each job it waits on: it sends the assignment again if no `accepted`
has come `delivery_interval` after it was made (a `Later`), and looks at whether the executor fell
behind its promise once the promised finish and its grace have passed (replan.py; an `At`, since each
bid promises its own finish). A tiny job's result comes before either, so neither starts a task. An
`At` keeps its calls in a heap; entries found dead are dropped when they reach its top, and the whole
heap is swept of them once it has doubled since the last sweep, so calls withdrawn long before they
were due take no memory beyond that.
"""

from __future__ import annotations

import heapq
import itertools
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


class At:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Pending]] = []
        self._order = itertools.count()
        self._added = trio.Event()
        self._swept = 0
        """The heap's size after its last sweep of dead entries."""

    def __len__(self) -> int:
        return len(self._heap)

    def add(
        self, due: float, fn: Callable[[], Awaitable[object]], still: Callable[[], bool] = lambda: True
    ) -> Pending:
        """Have `fn()` run at trio time `due` (in a task of its own), unless withdrawn first or `still()`
        is false by then. Once false, `still()` must stay false (the entry may be dropped at any time)."""
        entry = Pending(due, fn, still)
        if len(self._heap) >= 2 * self._swept + 64:
            self._heap = [e for e in self._heap if not e[2].dead()]
            heapq.heapify(self._heap)
            self._swept = len(self._heap)
        heapq.heappush(self._heap, (due, next(self._order), entry))
        self._added.set()
        return entry

    async def run(self, nursery: trio.Nursery) -> None:
        """Run the calls as they fall due, each in a task of `nursery`; until cancelled."""
        while True:
            heap = self._heap
            while heap and heap[0][2].dead():
                heapq.heappop(heap)
            if not heap:
                self._added = trio.Event()
                await self._added.wait()
                continue
            due, _, head = heap[0]
            if due > trio.current_time():
                self._added = trio.Event()  # an earlier call may be added meanwhile
                with trio.move_on_at(due):
                    await self._added.wait()
                continue
            heapq.heappop(heap)
            head.begun = True
            nursery.start_soon(head.fn)
