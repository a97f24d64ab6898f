"""The jobs an executor holds between their assignment and their run's end, and what handing one back
needs: its run's cancel scope, its deadline and its estimate.

While the node is suspended for its owner, the capacity service (adverts.py) calls `give_back_late`
every interval: the jobs that could no longer meet their deadline are stopped and given back (the
executor then tells their submitters, reason `deadline`). Built before both the capacity service and
the executor, it is what each of them is given.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import trio


@dataclass(eq=False, slots=True)
class Held:
    """A job between assignment and its run's end: what handing it back needs."""

    scope: trio.CancelScope
    deadline: int
    estimate_ms: int
    ran: bool = False
    handed_back: bool = False
    running: bool = False
    """Whether the store has it `running` (executor.RUNNING_MARK_DELAY after its run started)."""
    ending: bool = False
    """Its result or release is on its way: an `accepted` now would come after it."""


class HeldJobs(dict[bytes, Held]):
    """The jobs held here, by job id."""

    def __init__(self, clock: Callable[[], int]) -> None:
        super().__init__()
        self.clock = clock

    async def give_back_late(self) -> int:
        """Hand back every job held here that would now miss its deadline (called while this node is
        suspended for its owner): its run is stopped and its submitter told, so it runs elsewhere."""
        now = self.clock()
        late = [
            h for h in self.values() if not h.ran and not h.handed_back and now + h.estimate_ms > h.deadline
        ]
        for held in late:
            held.handed_back = True
            held.scope.cancel()
        return len(late)
