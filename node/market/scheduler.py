"""The executor's queue: jobs wait for a free worker of the sandbox pool, then run there.

`Scheduler.execute` enqueues one job and returns its RunRecord once it has run. Which waiting job
starts when a worker comes free is the policy's choice (policy.pick: fair share across submitters,
bounded slowdown, earliest deadline first among the jobs at risk), one per worker; while runs are
short, each worker's next job is picked when its current one starts and waits in the pool's queue
(`_ahead`; docs/scheduling.md, "Short runs"). A job whose
deadline passes while it waits never starts: `execute` raises JobExpired (at once: the queue watches the
earliest deadline); a running job still running at its deadline is stopped and `execute` raises
JobLate. The pool (sandbox/pool.py) is synchronous and never blocks `submit`; its supervisor thread makes
the spec, calls `then`, and wakes the job's task through the trio token (`run_sync_soon`), so no thread
waits per running job and starting one takes no thread hop. A trio cancellation cancels the job in its
worker.

The meter: `queued_at` is when the job entered the queue, `started_at` when it got a worker,
`finished_at` when it ended; the compute time billed is the sandbox's own `wall_seconds`, which
counts only while the guest holds the CPU (a suspended job's pause is excluded by the pool), and
fuel comes from the sandbox alone. The wait for a worker is visible (started_at - queued_at) and
never billed; so is the time a run was paused while it held its worker (`RunRecord.paused_ms`,
measured here from `suspend` to `resume`), which its receipt's meter records (meter.py).

Calibration: each run teaches the policy's Calibration its profile's fuel rate (fuel over the time the
run held its worker, not counting a pause) and the safety margin; a job stopped at its deadline raises
the margin. Each run also teaches `history` the fuel its module used and the time it took
(history.py): a job of a module run here often enough is estimated at what its module's runs use
and take, with headroom, not at its budget (`estimate_ms` with the module's root). Bids
(bidding.py) plan with `promised()` and `slots()`.

`suspend()` and `resume()` pause and continue every running job and hold back new ones (the
owner of the machine needs it back); `backlog_ms` and `queue_length` feed the bid estimates.
A scheduler of 0 workers (a submit-only node) starts no pool and runs nothing.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

import trio
from e31.protocol.jobs import JobManifest
from e31.sandbox.job import JobSpec
from e31.sandbox.limits import RunResult, Status

from .. import metrics
from .history import History
from .policy import Calibration, Slot, Task, Usage, pick

log = logging.getLogger("e31.scheduler")


class Handle(Protocol):
    def done(self) -> bool: ...
    @property
    def assigned(self) -> bool: ...
    def suspend(self) -> None: ...
    def resume(self) -> None: ...
    def cancel(self) -> None: ...
    def cancel_unassigned(self) -> bool: ...
    def wait(self, timeout: float | None = None) -> RunResult: ...


class Pool(Protocol):
    def submit(
        self,
        spec: JobSpec | Callable[[], JobSpec],
        output_dir: Path | None = None,
        *,
        streams_dir: Path | None = None,
        on_sent: Callable[[Handle], object] | None = None,
        on_done: Callable[[Handle], object] | None = None,
    ) -> Handle:
        """Never blocks; the callbacks come from a pool thread (sandbox/pool.py, WorkerPool.submit)."""
        ...

    def close(self, timeout: float = 10.0) -> None: ...


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class RunRecord:
    result: RunResult
    queued_at: int
    started_at: int
    finished_at: int
    after: object = None
    """What `execute`'s `then` returned (None without one)."""
    paused_ms: int = 0
    """Time the run was paused while it held its worker (the owner's return): not billed."""

    @property
    def compute_ms(self) -> int:
        return math.ceil(self.result.wall_seconds * 1000)


@dataclass(frozen=True, slots=True)
class JobInfo:
    """What the policy needs to know of a job to queue it (none: it waits behind nothing, in arrival order,
    with no deadline)."""

    key: bytes
    submitter: bytes
    deadline: int
    """ms since the Unix epoch."""
    fuel: int
    wall_ms: int
    profile: bytes
    module: bytes = b""
    """Its module's blob root (empty: unknown; the estimate is then its budget's)."""

    @classmethod
    def of(cls, manifest: JobManifest) -> JobInfo:
        lim = manifest.limits
        return cls(
            manifest.job_id.raw,
            manifest.submitter.raw,
            manifest.deadline,
            lim.fuel,
            lim.wall_ms,
            manifest.profile.raw,
            manifest.module.root.raw,
        )


class JobExpired(Exception):
    """The job's deadline passed while it waited: it was never started."""


class JobLate(Exception):
    """The job was still running at its deadline: it was stopped."""


NO_DEADLINE = 1 << 62
AHEAD_MS = 250
"""A run that held its worker at most this long is short; after SHORT_RUNS of them in a row each worker
is handed its next job before it is free (`_ahead`), until a run is not short."""
SHORT_RUNS = 2
_ids = itertools.count()


async def _wait(event: trio.Event) -> None:
    """`event.wait()`, without the turn of the event loop it costs when the event is already set (a
    pending cancel is still raised)."""
    if event.is_set():
        await trio.lowlevel.checkpoint_if_cancelled()
    else:
        await event.wait()


@dataclass(eq=False)
class _Entry:
    estimate_ms: int
    task: Task
    job: JobInfo | None
    go: trio.Event = field(default_factory=trio.Event)
    expired: bool = False
    started_at: int = 0
    handle: Handle | None = None
    running: bool = False
    paused: bool = False
    """Suspended at some time while it held its worker."""
    charged: bool = False
    """Its submitter's usage was charged its fuel budget when it got a worker."""
    paused_ms: int = 0
    """Time it was paused while it held its worker, up to `paused_since` (the meter: not billed)."""
    paused_since: int | None = None
    """When its current pause began (None: not paused now)."""
    ahead: bool = False
    """Handed to the pool while every worker was busy: it waits there for the first one free."""
    turn: trio.Event = field(default_factory=trio.Event)
    """Set when every job given a worker before it has been handed to the pool (`_order`)."""

    def pause(self, now: int) -> None:
        self.paused = True
        if self.paused_since is None:
            self.paused_since = now

    def unpause(self, now: int) -> None:
        if self.paused_since is not None:
            self.paused_ms += max(0, now - self.paused_since)
            self.paused_since = None


@dataclass
class Scheduler:
    workers: int
    pool_factory: Callable[[], Pool]
    """Builds the worker pool (blocking: it starts processes); called in a thread when the service starts."""
    clock: Callable[[], int] = wall_ms
    calibration: Calibration = field(default_factory=Calibration)
    history: History = field(default_factory=History)
    """The fuel each module's recent runs used here (per profile): a known module's jobs are estimated
    at that, with headroom, rather than at their budget."""
    weights: dict[bytes, float] = field(default_factory=dict)
    """Fair-share weight per submitter (1 for any not named)."""
    usage: Usage = field(default_factory=Usage)
    _pool: Pool | None = None
    _ready: trio.Event = field(default_factory=trio.Event)
    _waiting: list[_Entry] = field(default_factory=list)
    _running: set[_Entry] = field(default_factory=set)
    _order: deque[_Entry] = field(default_factory=deque)
    """Jobs given a worker and not yet handed to the pool, in the policy's order: the pool's queue takes
    them in that order (their tasks may run in any)."""
    _changed: trio.Event = field(default_factory=trio.Event)
    _resumed: trio.Event = field(default_factory=trio.Event)
    completed: int = 0
    expired: int = 0
    """Jobs whose deadline passed before they started (never started)."""
    stopped_late: int = 0
    """Jobs stopped at their deadline."""
    ahead_ms: int = AHEAD_MS
    short_runs: int = 0
    """Runs in a row, up to the last one, that held their worker at most `ahead_ms`."""
    fuel_misses: int = 0
    """Runs that used more fuel than their module's history planned them for."""

    def __post_init__(self) -> None:
        if self.workers < 0:
            raise ValueError("a scheduler needs 0 or more workers")
        self._resumed.set()

    @property
    def fuel_rate(self) -> int:
        """The calibrated fuel rate of this node's profile (the default before any run)."""
        rates = self.calibration.rates
        return next(iter(rates.values())) if len(rates) == 1 else self.calibration.default_rate

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start the pool, serve until cancelled, then close the pool (cancelling running jobs)."""
        if self.workers == 0:  # a submit-only node: nothing ever runs here
            task_status.started()
            await trio.sleep_forever()
        try:
            self._pool = await trio.to_thread.run_sync(self.pool_factory)
            self._ready.set()
            log.info("sandbox pool of %d worker(s) ready", self.workers)
            orphans = getattr(self._pool, "orphans_killed", None)
            if orphans:
                log.warning(
                    "killed %d sandbox worker(s) that a stopped run of this node left behind "
                    "(suspended for the owner when it died): pid %s",
                    len(orphans),
                    ", ".join(map(str, orphans)),
                )
            self._dispatch()
            task_status.started()
            await self._watch_deadlines()
        finally:
            pool, self._pool = self._pool, None
            if pool is not None:
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(pool.close)

    async def _watch_deadlines(self) -> None:
        """Wake at the earliest deadline of a waiting job (or when the queue changes), so a job whose
        deadline passes while it waits is given back at once, not when a worker comes free."""
        while True:
            self._changed = trio.Event()
            deadlines = [e.task.deadline for e in self._waiting if e.task.deadline < NO_DEADLINE]
            if not deadlines:
                await self._changed.wait()
            else:
                with trio.move_on_after(max(0.01, (min(deadlines) - self.clock()) / 1000)):
                    await self._changed.wait()
            self._dispatch()

    def worker_pids(self) -> list[int]:
        """The pids of the pool's worker processes (none before the pool has started)."""
        pids = getattr(self._pool, "pids", None)
        return list(pids()) if callable(pids) else []

    @property
    def queue_length(self) -> int:
        return len(self._waiting) + len(self._running)

    @property
    def backlog_ms(self) -> int:
        return sum(e.estimate_ms for e in (*self._waiting, *self._running))

    def promised(self) -> list[Task]:
        """The jobs waiting here, as the policy sees them (the jobs bids must plan with)."""
        return [e.task for e in self._waiting]

    def hold_back(self, key: bytes) -> bool:
        """Keep the job with this key from ever reaching a worker if none has it yet (a withdrawal):
        True if it never will (waiting for its turn here, not queued here, or handed ahead to the pool
        and taken out of its queue in the same step that checks no worker was chosen for it), False if
        a worker has it or is about to (it may have begun to run: a withdrawal leaves it alone)."""
        entry = next((e for e in self._running if e.job is not None and e.job.key == key), None)
        if entry is None:
            return True
        return entry.ahead and entry.handle is not None and entry.handle.cancel_unassigned()

    def slots(self, now: int) -> list[Slot]:
        """The workers, earliest free first: each free now, or at the estimated end of its running job
        (at least 1 ms from now) and of a job handed to the pool ahead for it. A job handed ahead that
        has not started yet (`started_at` still 0: the pool sends it when a worker frees, and its task
        learns of it a turn later) holds no worker of its own: it runs after the job that frees the
        earliest one, so it moves that worker's end on by its estimate. Never fewer slots than workers:
        a worker whose jobs are all ahead of it is still a core to plan on."""
        ends = [max(now + 1, e.started_at + e.task.estimate_ms) for e in self._running if e.started_at]
        ends += [now + e.task.estimate_ms for e in self._running if not e.started_at and not e.ahead]
        ends += [now] * max(0, self.workers - len(ends))
        heapq.heapify(ends)
        for e in self._running:
            if e.ahead and not e.started_at and ends:
                heapq.heappush(ends, max(now, heapq.heappop(ends)) + e.task.estimate_ms)
        return [Slot(end) for end in sorted(ends)]

    def estimate_ms(self, profile: bytes, fuel: int, wall_ms: int, module: bytes = b"") -> int:
        """How long a job may hold a core (policy.Calibration.estimate_ms) for the fuel it is planned
        for: its budget `fuel`, or less when its `module` (blob root) has run here often enough; then
        also at most what its module's runs took here (history.run_ms)."""
        if not module:
            return self.calibration.estimate_ms(profile, fuel, wall_ms)
        estimate = self.calibration.estimate_ms(profile, self.history.fuel(profile, module, fuel), wall_ms)
        by_time = self.history.run_ms(profile, module)
        return estimate if by_time is None else min(estimate, by_time)

    def learn(self, job: JobInfo, fuel_used: int, elapsed_ms: int | None = None) -> None:
        """Teach the history the fuel a run of the job's module used and the time it held a core (None:
        not known), and plan the module's waiting jobs anew (down as it is learned, up at once after a
        miss)."""
        if not job.module:
            return
        if self.history.ran(job.profile, job.module, fuel_used, elapsed_ms):
            self.fuel_misses += 1
        # a sweep's waiting jobs share their limits: each estimate is worked out once per run, and a
        # job's task is made anew only when its estimate moved (seldom once the module is known)
        estimates: dict[tuple[int, int], int] = {}
        for e in self._waiting:
            if (j := e.job) is not None and j.module == job.module and j.profile == job.profile:
                estimate = estimates.get((j.fuel, j.wall_ms))
                if estimate is None:
                    estimate = estimates[j.fuel, j.wall_ms] = self.estimate_ms(
                        j.profile, j.fuel, j.wall_ms, j.module
                    )
                e.estimate_ms = estimate
                if estimate != e.task.estimate_ms:
                    e.task = replace(e.task, estimate_ms=estimate)

    @property
    def suspended(self) -> bool:
        return not self._resumed.is_set()

    def suspend(self) -> None:
        if self.suspended:
            return
        self._resumed = trio.Event()
        now = self.clock()
        for entry in self._running:
            if entry.handle is not None:
                entry.pause(now)
                entry.handle.suspend()

    def resume(self) -> None:
        now = self.clock()
        for entry in self._running:
            if entry.handle is not None:
                entry.handle.resume()
                entry.unpause(now)
        self._resumed.set()
        self._dispatch()

    def _dispatch(self) -> None:
        """Give every free worker the job the policy picks; give back the jobs whose deadline passed."""
        self._changed.set()
        now = self.clock()
        gone = [e for e in self._waiting if e.task.deadline <= now]  # given back even while suspended
        for entry in gone:
            self._waiting.remove(entry)
            entry.expired = True
            entry.go.set()
        if not self._ready.is_set() or self.suspended:
            return
        while self._waiting and len(self._running) < self.workers + self._ahead():
            ahead = len(self._running) >= self.workers
            task = pick([e.task for e in self._waiting], self._others(now), now, self.usage, self.weights)
            if task is None:
                return
            entry = next(e for e in self._waiting if e.task is task)
            self._waiting.remove(entry)
            self._running.add(entry)
            entry.ahead = ahead
            self._order.append(entry)
            if self._order[0] is entry:
                entry.turn.set()
            if entry.job is not None:
                self.usage.charge(entry.job.submitter, entry.job.fuel, now)
                entry.charged = True
            entry.go.set()

    def _ahead(self) -> int:
        """Jobs handed to the pool beyond its workers: one per worker while runs are short (a worker then
        goes from one job to the next without a round trip through this loop), none otherwise. Such a
        job is chosen by the policy up to one short run early; it counts as having a worker (a withdraw
        leaves it alone: it starts within about AHEAD_MS), and is cancelled like any other."""
        return self.workers if self.short_runs >= SHORT_RUNS else 0

    def _others(self, now: int) -> list[Slot]:
        """The cores other than the one the next pick is for: every core but the one expected to be free
        first (a free one; when every worker is busy, a pick ahead, the first to come free)."""
        slots = self.slots(now)  # earliest first
        return slots[len(slots) - self.workers + 1 :]

    async def execute(
        self,
        spec: JobSpec | Callable[[], JobSpec],
        output_dir: Path,
        *,
        estimate_ms: int,
        job: JobInfo | None = None,
        on_start: Callable[[int], object] | None = None,
        streams_dir: Path | None = None,
        then: Callable[[RunResult], object] | None = None,
    ) -> RunRecord:
        """Queue the job, run it when the policy gives it a worker, return what it did and when.

        `spec` may be a function making the spec (reading the module, preparing directories): it is
        called in the pool's thread once the job has a worker; `on_start` (in the task) once the spec
        is sent to the worker. `then` is called with the run's result in the pool's thread (storing
        small outputs; the worker stays reserved meanwhile), its return value kept as the record's
        `after`; not, as a rule, once the wait was cancelled. Either may raise: `execute` raises it.
        Raises JobExpired if the job's deadline passed before it started (it never did), JobLate if
        it was still running at its deadline (it was stopped). No thread hop: the pool's thread wakes
        the task."""
        queued_at = self.clock()
        if job is None:
            task = Task(b"~%d" % next(_ids), b"", NO_DEADLINE, max(1, estimate_ms), queued_at)
        else:
            est = self.estimate_ms(job.profile, job.fuel, job.wall_ms, job.module)
            task = Task(job.key, job.submitter, job.deadline, est, queued_at, job.fuel)
        entry = _Entry(estimate_ms, task, job)
        self._waiting.append(entry)
        self._dispatch()
        try:
            await _wait(entry.go)
            if entry.expired:
                self.expired += 1
                raise JobExpired(
                    f"its deadline passed after {queued_at and self.clock() - queued_at} ms queued"
                )
            await _wait(entry.turn)
            await _wait(self._resumed)
            pool = self._pool
            if pool is None:
                raise trio.ClosedResourceError("the scheduler has stopped")
            started_at = max(self.clock(), queued_at)
            entry.started_at = 0 if entry.ahead else started_at
            run = _Run(self, started_at, then, ahead=entry.ahead)
            entry.handle = run.submit(pool, spec, output_dir, streams_dir)
            self._leave_order(entry)
            if self.suspended:
                entry.pause(self.clock())
                entry.handle.suspend()
            if entry.ahead:  # it waits in the pool for a worker: it starts when it is sent
                await run.wait_sent(entry.handle, task.deadline)
                started_at = entry.started_at = run.started_at
            else:
                await run.wait_sent(entry.handle)
            if run.sent and on_start is not None:
                try:
                    on_start(started_at)
                except BaseException:
                    run.abandoned = True  # no `then` for it
                    entry.handle.cancel()  # started: nobody would wait for it otherwise
                    raise
            entry.running = True
            result, finished_at, after = await run.wait_done(entry.handle, task.deadline)
        except BaseException as e:
            if isinstance(e, JobLate) and job is not None and entry.started_at:  # it needed more than its
                # time could burn (one stopped at its deadline before it was sent ran nothing)
                now = self.clock()
                self.learn(job, self._burnt(entry, now), self._held_ms(entry, now))
            self._refund(entry)
            raise
        finally:
            if entry in self._waiting:
                self._waiting.remove(entry)
            self._leave_order(entry)
            self._running.discard(entry)
            self._dispatch()
        entry.unpause(finished_at)  # (a run that ended while paused: its pause ends with it)
        paused_ms = min(entry.paused_ms, finished_at - started_at)
        record = RunRecord(result, queued_at, started_at, finished_at, after, paused_ms)
        self.completed += 1
        metrics.RUNS.inc(1, str(result.status))
        metrics.FUEL_SERVED.inc(result.fuel_used)
        metrics.COMPUTE_SERVED.inc(record.compute_ms / 1000)
        metrics.QUEUE_WAIT.observe((started_at - queued_at) / 1000)
        if job is not None:  # its submitter was charged the budget at the start: now what it used
            self.usage.charge(job.submitter, min(result.fuel_used, job.fuel) - job.fuel, finished_at)
        if job is not None:  # a run stopped by the wall clock used an unknown count: count its budget
            fuel = result.fuel_limit if result.status is Status.TIMEOUT else result.fuel_used
            self.learn(job, fuel, None if entry.paused else finished_at - started_at)
        if job is not None and not entry.paused:  # a paused run's elapsed time says nothing of the rate
            self.calibration = self.calibration.ran(job.profile, result.fuel_used, finished_at - started_at)
        short = not entry.paused and finished_at - started_at <= self.ahead_ms
        self.short_runs = self.short_runs + 1 if short else 0
        return record

    def _leave_order(self, entry: _Entry) -> None:
        """The job is in the pool's hands (or will never be): the next in `_order` may go."""
        if entry not in self._order:
            return
        first = self._order[0] is entry
        self._order.remove(entry)
        if first and self._order:
            self._order[0].turn.set()

    def _refund(self, entry: _Entry) -> None:
        """A job charged its budget that ended with no result (stopped at its deadline, cancelled, or
        never started): its submitter keeps only what the time it held its worker, less the time it was
        paused there (the meter's `paused_ms`: the guest did not run), could have burnt."""
        job = entry.job
        if job is None or not entry.charged:
            return
        now = self.clock()
        self.usage.charge(job.submitter, self._burnt(entry, now) - job.fuel, now)
        entry.charged = False

    def _burnt(self, entry: _Entry, now: int) -> int:
        """The fuel a job that ended with no fuel count could have burnt: the time it held its worker
        up to `now`, less the time it was paused there, at the calibrated rate (at most its budget)."""
        job = entry.job
        if job is None:
            return 0
        return min(job.fuel, self._held_ms(entry, now) * self.calibration.rate(job.profile) // 1000)

    @staticmethod
    def _held_ms(entry: _Entry, now: int) -> int:
        """The time a job has held its worker up to `now`, less the time it was paused there."""
        entry.unpause(now)
        return max(0, now - entry.started_at - entry.paused_ms) if entry.started_at else 0


class _Run:
    """One job's run on the pool, seen from its trio task: the pool's thread reports that the spec was
    sent and that the run ended (calling `then` first) through the trio token, no thread hop."""

    def __init__(
        self,
        scheduler: Scheduler,
        started_at: int,
        then: Callable[[RunResult], object] | None,
        *,
        ahead: bool = False,
    ) -> None:
        self._scheduler = scheduler
        self.started_at = started_at
        """When the run started: given, or for a job handed ahead, when the pool sent it to a worker."""
        self._ahead = ahead
        self._then = then
        self._token = trio.lowlevel.current_trio_token()
        self._sent = trio.Event()
        self._ended = trio.Event()
        self.sent = False
        """The spec was made and sent to a worker (False: the job ended before, e.g. its spec failed)."""
        self.abandoned = False
        """Nobody waits for the run any more (cancelled, or stopped at its deadline): no `then`."""
        self._then_lock = threading.Lock()
        """Makes `_on_done`'s choice to call `then` and the deadline's `abandoned` one or the other."""
        self._outcome: tuple[RunResult, int, object] | BaseException | None = None

    def submit(
        self, pool: Pool, spec: JobSpec | Callable[[], JobSpec], output_dir: Path, streams_dir: Path | None
    ) -> Handle:
        return pool.submit(
            spec, output_dir, streams_dir=streams_dir, on_sent=self._on_sent, on_done=self._on_done
        )

    def _wake(self, fn: Callable[[], object]) -> None:
        with contextlib.suppress(trio.RunFinishedError):  # the node has stopped: nobody waits
            self._token.run_sync_soon(fn)

    def _ended_in_trio(self) -> None:
        self._sent.set()
        self._ended.set()

    def _on_sent(self, handle: Handle) -> None:  # in the pool's thread
        if self._ahead:
            self.started_at = max(self._scheduler.clock(), self.started_at)
        self.sent = True
        self._wake(self._sent.set)

    def _on_done(self, handle: Handle) -> None:  # in the pool's thread
        try:
            result = handle.wait(0)
            finished_at = max(self._scheduler.clock(), self.started_at)  # before `then` works on it
            with self._then_lock:
                then = None if self.abandoned else self._then
            self._outcome = (result, finished_at, None if then is None else then(result))
        except BaseException as e:  # raised by `execute`: the spec's function's or `then`'s error
            self._outcome = e
        self._wake(self._ended_in_trio)  # one wake-up of the event loop for both

    async def wait_sent(self, handle: Handle, deadline: int = NO_DEADLINE) -> None:
        """Until the spec is sent (or the job ended before). With a deadline (a job waiting in the pool
        for a worker), one not given a worker by then is taken out: JobExpired, as if it had waited in
        the queue; one given a worker just then is stopped: JobLate."""
        scheduler = self._scheduler
        timeout = math.inf if deadline >= NO_DEADLINE else max(0.0, (deadline - scheduler.clock()) / 1000)
        try:
            with trio.move_on_after(timeout):
                await self._sent.wait()
                return
        except trio.Cancelled:
            self.abandoned = True
            handle.cancel()
            raise
        with self._then_lock:
            self.abandoned = True
        handle.cancel()
        if not handle.assigned:
            scheduler.expired += 1
            raise JobExpired("its deadline passed while it waited for a worker")
        scheduler.stopped_late += 1
        scheduler.calibration = scheduler.calibration.missed()
        raise JobLate("it was still running at its deadline")

    async def wait_done(self, handle: Handle, deadline: int) -> tuple[RunResult, int, object]:
        scheduler = self._scheduler
        timeout = math.inf if deadline >= NO_DEADLINE else max(0.0, (deadline - scheduler.clock()) / 1000)
        try:
            with trio.move_on_after(timeout):
                await self._ended.wait()
            with self._then_lock:  # a run that ends now either is abandoned or has its `then`
                late = not self._ended.is_set() and not handle.done()
                if late:
                    self.abandoned = True
            if late:
                # still running at its deadline: it cannot be on time any more
                handle.cancel()
                scheduler.stopped_late += 1
                scheduler.calibration = scheduler.calibration.missed()
                raise JobLate("it was still running at its deadline")
            await _wait(self._ended)  # the run ended in time; `then` may still be at work on it
        except trio.Cancelled:
            self.abandoned = True
            handle.cancel()
            raise
        outcome = self._outcome
        if isinstance(outcome, BaseException):
            raise outcome
        assert outcome is not None
        return outcome
