"""The jobs an executor holds between their assignment and their run's end, and what handing one back
needs: its run's cancel scope, its deadline and its estimate.

While the node is suspended for its owner, the capacity service (adverts.py) calls `give_back_late`
every interval: the jobs that could no longer meet their deadline are stopped and given back (the
executor then tells their submitters, reason `deadline`). Built before both the capacity service and
the executor, it is what each of them is given.

A `withdraw` from a job's submitter takes one assignment back (`take_back`): a job held under that
assignment that has not been given a worker is stopped and marked `moved` (the executor then gives it
back, `release` reason `withdrawn`); a started one is left to run. A withdraw that comes while its
assignment is still being stored is remembered, so the job is given back as soon as it is held.
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
    assignment: bytes = b""
    """The message id of the assignment it is held under (a `withdraw` must name it)."""
    moved: bool = False
    """Its submitter took the assignment back (a `withdraw`) before it started: stopped, never started,
    given back (executor.py)."""


class HeldJobs(dict[bytes, Held]):
    """The jobs held here, by job id, and the jobs their submitters withdrew."""

    def __init__(self, clock: Callable[[], int]) -> None:
        super().__init__()
        self.clock = clock
        self._withdrawn: dict[bytes, bytes] = {}
        """Job id -> the submitter that withdrew it (WITHDRAWN_KEPT at most, the oldest forgotten)."""
        self._taken_back: dict[bytes, tuple[bytes, int]] = {}
        """Assignment id -> the submitter whose `withdraw` named it before the job was held here, and
        the withdraw's expiry (WITHDRAWN_KEPT at most, the oldest forgotten)."""

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

    def take_back(
        self,
        job_id: bytes,
        assignment: bytes,
        submitter: bytes,
        *,
        has_worker: Callable[[bytes], bool],
        expires: int,
    ) -> bool:
        """The job's submitter took one assignment back (a signed `withdraw`). A job held here under it
        that has not been given a worker (`has_worker`: the scheduler's word) is stopped and marked
        `moved`, and True returned: no await lies between this check and the stop, so it never starts.
        A started job, one ending, or one held under another assignment is left alone. A job not held
        (yet) has the withdrawal remembered until it `expires`, for `hold` once its assignment is stored."""
        held = self.get(job_id)
        if held is None:
            self._taken_back.pop(assignment, None)
            self._taken_back[assignment] = (submitter, expires)
            while len(self._taken_back) > WITHDRAWN_KEPT:
                del self._taken_back[next(iter(self._taken_back))]
            return False
        if held.submitter != submitter or held.assignment != assignment:
            return False
        if held.started or held.ran or held.ending or held.handed_back or held.withdrawn or held.moved:
            return False
        if has_worker(job_id):
            return False
        held.moved = True
        held.ending = True  # no `accepted` after the release
        held.scope.cancel()
        return True

    def hold(self, job_id: bytes, held: Held, assignment: bytes) -> Held:
        """Hold a job under an assignment; one its submitter took back while the assignment was being
        stored is stopped at once (`moved`: it never starts)."""
        held.assignment = assignment
        self[job_id] = held
        submitter, expires = self._taken_back.pop(assignment, (b"", 0))
        if submitter == held.submitter and expires > self.clock():
            held.moved = held.ending = True
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
