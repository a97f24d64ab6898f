"""The executor's queue: jobs wait for a free worker of the sandbox pool, then run there.

`Scheduler.execute` enqueues one job and returns its RunRecord once it has run. Jobs start in the
order they arrived (trio's Semaphore is FIFO), one per worker. The pool (sandbox/pool.py) is
synchronous; each job is handed to it and waited for in a worker thread, so the event loop never
blocks. A trio cancellation cancels the job in its worker.

The meter: `queued_at` is when the job entered the queue, `started_at` when it got a worker,
`finished_at` when it ended; the compute time billed is the sandbox's own `wall_seconds`, which
counts only while the guest holds the CPU (a suspended job's pause is excluded by the pool), and
fuel comes from the sandbox alone. The wait for a worker is visible (started_at - queued_at) and
never billed.

`suspend()` and `resume()` pause and continue every running job and hold back new ones (the
owner of the machine needs it back); `backlog_ms` and `queue_length` feed the bid estimates.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Protocol

import trio
from e31.sandbox.job import JobSpec
from e31.sandbox.limits import RunResult

from .. import metrics
from .rules import DEFAULT_FUEL_RATE, measured_fuel_rate

log = logging.getLogger("e31.scheduler")


class Handle(Protocol):
    def suspend(self) -> None: ...
    def resume(self) -> None: ...
    def cancel(self) -> None: ...
    def wait(self, timeout: float | None = None) -> RunResult: ...


class Pool(Protocol):
    def start_job(
        self,
        spec: JobSpec,
        output_dir: Path | None = None,
        *,
        timeout: float | None = None,
        streams_dir: Path | None = None,
    ) -> Handle: ...
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

    @property
    def compute_ms(self) -> int:
        return math.ceil(self.result.wall_seconds * 1000)


@dataclass(eq=False)
class _Entry:
    estimate_ms: int
    handle: Handle | None = None
    running: bool = False


@dataclass
class Scheduler:
    workers: int
    pool_factory: Callable[[], Pool]
    """Builds the worker pool (blocking: it starts processes); called in a thread when the service starts."""
    clock: Callable[[], int] = wall_ms
    fuel_rate: int = DEFAULT_FUEL_RATE
    _pool: Pool | None = None
    _ready: trio.Event = field(default_factory=trio.Event)
    _slots: trio.Semaphore = field(init=False)
    _entries: set[_Entry] = field(default_factory=set)
    _resumed: trio.Event = field(default_factory=trio.Event)
    completed: int = 0

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError("a scheduler needs at least one worker")
        self._slots = trio.Semaphore(self.workers)
        self._resumed.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start the pool, serve until cancelled, then close the pool (cancelling running jobs)."""
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
            task_status.started()
            await trio.sleep_forever()
        finally:
            pool, self._pool = self._pool, None
            if pool is not None:
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(pool.close)

    def worker_pids(self) -> list[int]:
        """The pids of the pool's worker processes (none before the pool has started)."""
        pids = getattr(self._pool, "pids", None)
        return list(pids()) if callable(pids) else []

    @property
    def queue_length(self) -> int:
        return len(self._entries)

    @property
    def backlog_ms(self) -> int:
        return sum(e.estimate_ms for e in self._entries)

    @property
    def suspended(self) -> bool:
        return not self._resumed.is_set()

    def suspend(self) -> None:
        if self.suspended:
            return
        self._resumed = trio.Event()
        for entry in self._entries:
            if entry.handle is not None:
                entry.handle.suspend()

    def resume(self) -> None:
        for entry in self._entries:
            if entry.handle is not None:
                entry.handle.resume()
        self._resumed.set()

    async def execute(
        self,
        spec: JobSpec | Callable[[], JobSpec],
        output_dir: Path,
        *,
        estimate_ms: int,
        on_start: Callable[[int], object] | None = None,
        streams_dir: Path | None = None,
        then: Callable[[RunResult], object] | None = None,
    ) -> RunRecord:
        """Queue the job, run it when a worker is free, return what it did and when.

        `spec` may be a function making the spec (reading the module, preparing directories): it is
        called in the thread that starts the run, once the job has a worker; `on_start` once the run
        has started. `then` is called with the run's result in the thread that waited for it (storing
        small outputs; the worker stays reserved meanwhile), its return value kept as the record's
        `after`; not, as a rule, once the wait was cancelled. Either may raise: `execute` raises it.
        One thread hop each way."""
        entry = _Entry(estimate_ms)
        queued_at = self.clock()
        self._entries.add(entry)
        try:
            await self._ready.wait()
            async with self._slots:
                await self._resumed.wait()
                pool = self._pool
                if pool is None:
                    raise trio.ClosedResourceError("the scheduler has stopped")
                started_at = max(self.clock(), queued_at)
                entry.handle = await trio.to_thread.run_sync(
                    partial(_start, pool, spec, output_dir, streams_dir)
                )
                if on_start is not None:
                    try:
                        on_start(started_at)
                    except BaseException:
                        entry.handle.cancel()  # started: nobody would wait for it otherwise
                        raise
                entry.running = True
                if self.suspended:
                    entry.handle.suspend()
                result, finished_at, after = await self._wait(entry.handle, started_at, then)
        finally:
            self._entries.discard(entry)
        record = RunRecord(result, queued_at, started_at, finished_at, after)
        self.completed += 1
        metrics.RUNS.inc(1, str(result.status))
        metrics.FUEL_SERVED.inc(result.fuel_used)
        metrics.COMPUTE_SERVED.inc(record.compute_ms / 1000)
        metrics.QUEUE_WAIT.observe((started_at - queued_at) / 1000)
        self.fuel_rate = measured_fuel_rate(self.fuel_rate, result.fuel_used, record.compute_ms)
        return record

    async def _wait(
        self, handle: Handle, started_at: int, then: Callable[[RunResult], object] | None
    ) -> tuple[RunResult, int, object]:
        cancelled = False

        def wait() -> tuple[RunResult, int, object]:
            result = handle.wait()
            finished_at = max(self.clock(), started_at)  # the run's end, before `then` works on it
            if then is None or cancelled:  # nobody waits for a cancelled run's `then` any more
                return result, finished_at, None
            return result, finished_at, then(result)

        try:
            return await trio.to_thread.run_sync(wait, abandon_on_cancel=True)
        except trio.Cancelled:
            cancelled = True
            handle.cancel()
            raise


def _start(
    pool: Pool, spec: JobSpec | Callable[[], JobSpec], output_dir: Path, streams_dir: Path | None
) -> Handle:
    job_spec = spec if isinstance(spec, JobSpec) else spec()
    return pool.start_job(job_spec, output_dir, streams_dir=streams_dir)
