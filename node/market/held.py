"""The jobs an executor holds between their assignment and their run's end, and what handing one back
needs: its run's cancel scope, its deadline and its estimate.

While the node is suspended for its owner, the capacity service (adverts.py) calls `give_back_late`
every interval: the jobs that could no longer meet their deadline are stopped and given back (the
executor then tells their submitters, reason `deadline`). Built before both the capacity service and
the executor, it is what each of them is given.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import trio

from .policy import Task

WITHDRAWN_KEPT = 4096
"""Withdrawn jobs remembered (a withdrawal matters only while an assignment of the job is on its way,
moments after it: it is also kept with the job's row when there is one)."""


@dataclass(eq=False, slots=True)
class Held:
    """A job between assignment and its run's end: what handing it back needs."""

    scope: trio.CancelScope
    deadline: int
    estimate_ms: int
    ran: bool = False
    started: bool = False
    """Its run has started (it holds a worker: bids plan it as a busy core, not a waiting job)."""
    handed_back: bool = False
    running: bool = False
    """Whether the store has it `running` (executor.RUNNING_MARK_DELAY after its run started)."""
    ending: bool = False
    """Its result or release is on its way: an `accepted` now would come after it."""
    submitter: bytes = b""
    """The job's submitter (its key): only its `cancel` withdraws the job."""
    fuel: int = 0
    """Its fuel budget."""
    withdrawn: bool = False
    """Its submitter withdrew it (a `cancel`): stopped if its run was not over, else its result is not
    delivered again (executor.py)."""


class HeldJobs(dict[bytes, Held]):
    """The jobs held here, by job id, and the jobs their submitters withdrew."""

    def __init__(self, clock: Callable[[], int]) -> None:
        super().__init__()
        self.clock = clock
        self._withdrawn: dict[bytes, bytes] = {}
        """Job id -> the submitter that withdrew it (WITHDRAWN_KEPT at most, the oldest forgotten)."""

    def withdraw(self, job_id: bytes, submitter: bytes) -> Held | None:
        """The job's submitter withdrew it (a signed `cancel`): remember that, so an assignment of it
        being stored or fetched now is never started (`was_withdrawn`), and stop the job if it is held
        here and its run is not over (the executor then ends it `cancelled`, sending nothing). Returns
        the job held here, if any (its run may be over: its result is then not delivered again)."""
        self._withdrawn.pop(job_id, None)
        self._withdrawn[job_id] = submitter
        while len(self._withdrawn) > WITHDRAWN_KEPT:
            del self._withdrawn[next(iter(self._withdrawn))]
        held = self.get(job_id)
        if held is None or held.submitter != submitter:
            return None
        held.withdrawn = True
        if not (held.ran or held.ending):
            held.scope.cancel()
        return held

    def waiting(self, queued: Iterable[Task], now: int) -> list[Task]:
        """Every job held here that has not started and is not ending, as the policy sees it: those in
        the queue (`queued`) as the queue has them, the others (fetching, being queued) from what is
        held. A started job is a busy core in the plan, not a waiting job."""
        known = {t.key: t for t in queued}
        return [
            known.get(key) or Task(key, h.submitter, h.deadline, h.estimate_ms, now, h.fuel)
            for key, h in self.items()
            if not (h.started or h.ran or h.ending or h.handed_back or h.withdrawn)
        ]

    def was_withdrawn(self, job_id: bytes, submitter: bytes) -> bool:
        return self._withdrawn.get(job_id) == submitter

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
