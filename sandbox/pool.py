"""A pool of long-lived worker processes that run jobs, one job per worker at a time.

Why subprocesses with our own pipe protocol (worker.py) and not multiprocessing: a worker runs untrusted
code, so its replies are plain msgpack checked field by field, never unpickled; `spawn` would also re-run
the parent's `__main__` in every worker and `fork` would copy the node's threads and sockets. A worker is
`python -m e31.sandbox.worker` in its own session (a Ctrl-C at the node's terminal does not reach it)
that exits when its request pipe closes, so it never outlives the pool for long.

Each worker slot has one supervisor thread. It hands the worker its job, then waits on the reply pipe
with a watchdog: until the worker says `started` (a tick of its own watchdog after the guest started, or
never for a job that ends first) the budget is `compile_timeout`; after that it is the job's wall limit
plus `grace_seconds` (the runner's own epoch watchdog should stop the guest well before).
A worker that dies, breaks the protocol or outlives its watchdog is SIGKILLed and replaced, and its job
ends with a RunResult of status `trap` and one of the WORKER_TRAPS names (no new Status: these are host
events, not guest behaviour; `fuel_used` is 0 because the count is unknown, and they are never
re-verifiable). The one exception is a worker that died before it read the job's request (its death not
yet seen when the job was sent: the send fails, or FIONREAD of the request pipe shows the request still
there): the job goes once to a new worker. A worker that read it may have run the guest, so its death is
the job's and is reported, never run again.

Suspend and resume are SIGSTOP and SIGCONT of the worker. The stopped time is added to the worker's
shared counter while it is still stopped (before SIGCONT), and the worker's job clock subtracts that
counter, so the job's own wall limit does not run while it is paused; the supervisor's deadline moves
by the same amount. Fuel and outputs are untouched: the guest simply does not run.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .cache import load_or_create_key
from .errors import SandboxError
from .job import JobSpec
from .limits import Limits, RunResult, Status
from .orphans import kill_orphaned_workers
from .profile import PROFILE
from .worker import ERRORS, EXIT_OUT_OF_MEMORY, ProtocolViolation, decode_result, encode_spec
from .worker_process import PoolError, _Worker, describe_exit

log = logging.getLogger(__name__)

WORKER_CRASHED = "worker_crashed"
"""The worker process died (a signal, an abort, an unexpected exit) while running the job."""
WORKER_KILLED = "worker_killed"
"""The worker outlived its watchdog (compile timeout, or wall limit plus grace) or broke the protocol."""
WORKER_LIMIT = "worker_limit"
"""The worker broke one of its OS limits (RLIMIT_DATA, RLIMIT_FSIZE)."""
CANCELLED = "cancelled"
"""The job was cancelled (JobHandle.cancel or WorkerPool.close)."""
WORKER_TRAPS = frozenset({WORKER_CRASHED, WORKER_KILLED, WORKER_LIMIT, CANCELLED})

DEFAULT_DATA_LIMIT = Limits.DEFAULT_MEMORY_BYTES + Limits.DEFAULT_MAX_OUTPUT_BYTES + 512 * 1024 * 1024
"""RLIMIT_DATA of a worker: a guest's linear memory, its /output held in memory, and about 500 MB for
Python, wasmtime, compilation and the engine. Raise it with the largest memory limit the node accepts."""
DEFAULT_FILE_SIZE_LIMIT = Limits.MAX_OUTPUT_BYTES
"""RLIMIT_FSIZE of a worker. It also bounds wasmtime's memfds (compiled code, memory images), so it must
stay well above the largest module: a worker passing it is killed by SIGXFSZ (`worker_limit`)."""
GRACE_SECONDS = 5.0
COMPILE_TIMEOUT = 120.0
START_TIMEOUT = 60.0
_EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def cores_available() -> int:
    """CPUs this process may run on (its affinity mask, not the machine's count): a default pool size."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _classify_exit(code: int) -> tuple[str, str]:
    if code == -signal.SIGXFSZ:
        return WORKER_LIMIT, "broke its file size limit (RLIMIT_FSIZE, SIGXFSZ)"
    if code == EXIT_OUT_OF_MEMORY:
        return WORKER_LIMIT, "ran out of memory under its data limit (RLIMIT_DATA)"
    return WORKER_CRASHED, f"died ({describe_exit(code)})"


def _host_result(limits: Limits, trap: str, message: str, wall: float) -> RunResult:
    return RunResult(
        status=Status.TRAP,
        exit_code=None,
        trap=trap,
        message=message,
        fuel_used=0,
        fuel_limit=limits.fuel,
        wall_seconds=round(max(wall, 0.0), 6),
        peak_memory_bytes=0,
        stdout=b"",
        stdout_sha256=_EMPTY_SHA256,
        stderr_sha256=_EMPTY_SHA256,
        output_files={},
        output_bytes=0,
        profile_digest=PROFILE.digest_hex,
        reverifiable=False,
    )


Callback = Callable[["JobHandle"], object]


class JobHandle:
    """One job submitted to the pool. All methods are thread-safe."""

    def __init__(
        self,
        job_id: int,
        spec: JobSpec | Callable[[], JobSpec],
        output_dir: Path | None,
        streams_dir: Path | None = None,
        on_sent: Callback | None = None,
        on_done: Callback | None = None,
    ) -> None:
        self.job_id = job_id
        self.spec: JobSpec | None = spec if isinstance(spec, JobSpec) else None
        """None until a spec made by a function (WorkerPool.submit) has been made."""
        self._make_spec = None if isinstance(spec, JobSpec) else spec
        self.output_dir = output_dir
        self.streams_dir = streams_dir
        self._on_sent = on_sent
        self._on_done = on_done
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._started = threading.Event()
        self._result: RunResult | None = None
        self._error: Exception | None = None
        self._worker: _Worker | None = None
        self._slot: _Slot | None = None
        self._suspended_at: float | None = None
        self._paused_total = 0.0
        self._cancelled = False
        self._assigned = False
        self._pool: WorkerPool | None = None
        """The pool while the job waits in its queue (WorkerPool.submit with every worker busy)."""

    @property
    def pid(self) -> int | None:
        """The worker process running this job (None before it has one and after it ends)."""
        with self._lock:
            return None if self._worker is None else self._worker.pid

    @property
    def suspended(self) -> bool:
        with self._lock:
            return self._suspended_at is not None

    def done(self) -> bool:
        return self._done.is_set()

    @property
    def assigned(self) -> bool:
        """Whether a worker has been chosen for the job (it may have begun to run). A job cancelled while
        this is False never runs; one cancelled after is stopped by killing its worker."""
        with self._lock:
            return self._assigned

    def wait_started(self, timeout: float | None = None) -> bool:
        """True once the module is compiled or loaded and the guest runs (or the job has ended)."""
        return self._started.wait(timeout)

    def suspend(self) -> None:
        """Stops the job where it is (SIGSTOP of its worker). Idempotent; no effect once it ended."""
        with self._lock:
            if self._done.is_set() or self._cancelled or self._suspended_at is not None:
                return
            self._suspended_at = time.monotonic()
            if self._worker is not None:
                self._worker.signal(signal.SIGSTOP)
            slot = self._slot
        if slot is not None:
            slot.wake()

    def resume(self) -> None:
        """Continues a suspended job; the paused time counts against neither wall limit."""
        with self._lock:
            self._resume_locked()
            slot = self._slot
        if slot is not None:
            slot.wake()

    def _resume_locked(self) -> None:
        if self._suspended_at is None:
            return
        paused = time.monotonic() - self._suspended_at
        self._suspended_at = None
        self._paused_total += paused
        if self._worker is not None:
            # Written while the worker is stopped, so its clock never sees the pause as a jump.
            self._worker.add_paused(int(paused * 1e9))
            self._worker.signal(signal.SIGCONT)

    def cancel(self) -> None:
        """Ends the job now (its worker is killed and replaced; a job still in the pool's queue is taken
        out of it); wait() then returns trap `cancelled`."""
        with self._lock:
            if self._done.is_set():
                return
            self._cancelled = True
            if self._worker is not None:
                self._worker.signal(signal.SIGKILL)
            slot, pool = self._slot, self._pool
        if slot is not None:
            slot.wake()
        elif pool is not None and pool._unqueue(self):
            limits = Limits() if self.spec is None else self.spec.limits
            self._finish(_host_result(limits, CANCELLED, "cancelled before it started", 0.0))

    def cancel_unassigned(self) -> bool:
        """Cancels the job only if no worker has been chosen for it yet: True if so, or if it ended
        without one (it never runs), False if a worker has it (it runs on; nothing is changed). The
        check and the cancel are one step under the job's lock, which a slot takes to choose it."""
        with self._lock:
            if self._assigned:
                return False
            if self._done.is_set():
                return True
            self._cancelled = True
            pool = self._pool
        if pool is not None and pool._unqueue(self):
            limits = Limits() if self.spec is None else self.spec.limits
            self._finish(_host_result(limits, CANCELLED, "cancelled before it started", 0.0))
        return True

    def wait(self, timeout: float | None = None) -> RunResult:
        """The job's result. Raises TimeoutError if it has not ended within `timeout` seconds, the
        SandboxError (JobSpecError, ...) the worker raised for a job that could not be run, and what the
        spec's function (WorkerPool.submit) raised."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"job {self.job_id} still running after {timeout} s")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def _finish(self, result: RunResult | None, error: Exception | None = None) -> None:
        with self._lock:
            if self._done.is_set():
                return
            if self._suspended_at is not None:
                self._resume_locked()
            self._result, self._error = result, error
            self._worker = None
            self._slot = None
            self._started.set()
            self._done.set()
        self._call(self._on_done)

    def _call(self, callback: Callback | None) -> None:
        if callback is None:
            return
        try:
            callback(self)
        except Exception:  # the caller's bug: logged, never the slot's end
            log.exception("callback of job %d failed", self.job_id)

    def _paused(self) -> float:
        """Seconds spent suspended so far, including a pause in progress."""
        with self._lock:
            current = 0.0 if self._suspended_at is None else time.monotonic() - self._suspended_at
            return self._paused_total + current


class _Slot:
    """A worker process and the supervisor thread that runs the slot's jobs on it."""

    def __init__(self, pool: WorkerPool, index: int) -> None:
        self.pool = pool
        self.index = index
        self.worker: _Worker | None = None
        self._job: JobHandle | None = None
        self._has_job = threading.Condition()
        self._stopping = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self.thread = threading.Thread(target=self._loop, name=f"e31-pool-slot-{index}", daemon=True)

    def wake(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"!")

    def _drain_wake(self) -> None:
        with contextlib.suppress(OSError):
            while os.read(self._wake_r, 4096):
                pass

    def submit(self, job: JobHandle) -> None:
        with self._has_job:
            self._job = job
            self._has_job.notify()

    def stop(self) -> None:
        with self._has_job:
            self._stopping = True
            self._has_job.notify()
        self.wake()

    def _loop(self) -> None:
        try:
            while True:
                with self._has_job:
                    while self._job is None and not self._stopping:
                        self._has_job.wait()
                    if self._job is None:
                        return
                    job = self._job
                try:
                    self._run(job)
                except Exception as e:  # a bug here must not strand the caller in wait()
                    log.exception("worker slot %d failed", self.index)
                    self.discard_worker()
                    job._finish(None, SandboxError(f"worker pool failure: {e}"))
                with self._has_job:
                    self._job = None
                self.pool._release(self, job)
        finally:
            if self.worker is not None:
                self.worker.quit(timeout=2.0)
                self.worker = None
            os.close(self._wake_r)
            os.close(self._wake_w)

    def ensure_worker(self) -> _Worker:
        if self.worker is not None and self.worker.proc.poll() is not None:
            log.warning(
                "worker %d exited while idle (%s)",
                self.worker.pid,
                describe_exit(self.worker.proc.returncode),
            )
            self.worker.reap()
            self.worker = None
        if self.worker is None:
            self.worker = self.pool._spawn()
        return self.worker

    def discard_worker(self) -> None:
        if self.worker is not None:
            self.worker.kill()
            self.worker = None

    def _run(self, job: JobHandle) -> None:
        # A worker can die while idle just before it is handed a job (its death not yet visible): a
        # worker that died before it read the request is replaced and the job sent once more. One that
        # read it may have run the guest (`started` comes up to a tick late), so its death is the job's.
        for attempt in range(2):
            try:
                worker = self.ensure_worker()
            except (PoolError, OSError) as e:
                job._finish(None, e if isinstance(e, PoolError) else PoolError(f"cannot start a worker: {e}"))
                return
            with job._lock:
                cancelled = job._cancelled
                if not cancelled:
                    job._worker, job._slot, job._assigned = worker, self, True
                    if job._suspended_at is not None:
                        worker.signal(signal.SIGSTOP)
            if cancelled:
                limits = Limits() if job.spec is None else job.spec.limits
                job._finish(_host_result(limits, CANCELLED, "cancelled before it started", 0.0))
                return
            if job.spec is None:
                assert job._make_spec is not None
                try:
                    spec = job._make_spec()
                    if not isinstance(spec, JobSpec):
                        raise TypeError("the spec function must return a JobSpec")
                    job.spec = spec
                except Exception as e:  # the caller's function: raised by wait()
                    job._finish(None, e)
                    return
            # A worker that died meanwhile fails the send; the receive loop reports how it ended.
            sent = False
            with contextlib.suppress(ValueError, OSError):
                worker.send(
                    [
                        "run",
                        job.job_id,
                        encode_spec(job.spec, worker.memo),
                        None if job.output_dir is None else os.fsencode(job.output_dir),
                        None if job.streams_dir is None else os.fsencode(job.streams_dir),
                    ]
                )
                sent = True
            if attempt == 0:
                job._call(job._on_sent)
            if not self._supervise(job, worker, may_retry=attempt == 0, sent=sent):
                return
            log.warning(
                "worker %d died before reading job %d; sending it to a new worker", worker.pid, job.job_id
            )

    def _supervise(self, job: JobHandle, worker: _Worker, *, may_retry: bool, sent: bool) -> bool:
        """Sees the job to its end on `worker`; True if the worker died before reading the request
        (the send failed, or the request was still in its pipe) and the job should be sent again
        (only when `may_retry`)."""
        assert job.spec is not None
        limits = job.spec.limits
        t0 = time.monotonic()
        budget = self.pool.compile_timeout
        deadline = t0 + budget
        started = False

        def elapsed() -> float:
            return time.monotonic() - t0 - job._paused()

        def end(trap: str, message: str) -> None:
            self.discard_worker()
            job._finish(_host_result(limits, trap, message, elapsed()))

        while True:
            with job._lock:
                cancelled, suspended = job._cancelled, job._suspended_at is not None
            if cancelled:
                end(CANCELLED, "cancelled")
                return False
            timeout = None if suspended else max(0.0, deadline + job._paused() - time.monotonic())
            try:
                messages, eof = worker.receive(timeout, self._wake_r)
            except ProtocolViolation as e:
                end(WORKER_KILLED, f"worker {worker.pid} broke the protocol: {e}")
                return False
            self._drain_wake()
            for message in messages:
                outcome = self._handle(job, message)
                if isinstance(outcome, str):
                    end(WORKER_KILLED, f"worker {worker.pid}: {outcome}")
                    return False
                if outcome:
                    return False
                if not started:
                    started = True
                    budget = limits.wall_seconds + self.pool.grace_seconds
                    deadline = time.monotonic() - job._paused() + budget
                    job._started.set()
            if eof:
                unread = worker.unread_request_bytes() if sent else None
                code = worker.reap()
                self.worker = None
                with job._lock:
                    cancelled = job._cancelled
                if cancelled:
                    job._finish(_host_result(limits, CANCELLED, "cancelled", elapsed()))
                elif may_retry and not started and (not sent or (unread is not None and unread > 0)):
                    return True
                else:
                    trap, why = _classify_exit(code)
                    job._finish(
                        _host_result(
                            limits, trap, f"worker {worker.pid} {why} while running the job", elapsed()
                        )
                    )
                return False
            with job._lock:
                suspended = job._suspended_at is not None
            if not suspended and time.monotonic() >= deadline + job._paused():
                phase = "the guest started" if started else "the job was sent"
                end(WORKER_KILLED, f"worker {worker.pid} still busy {budget:g} s after {phase}; killed")
                return False

    @staticmethod
    def _handle(job: JobHandle, message: list[Any]) -> str | bool:
        """False: `started`; True: the job is finished; a string: a protocol violation."""
        kind = message[0]
        if len(message) < 2 or message[1] != job.job_id:
            return f"replied {kind!r} for another job"
        if kind == "started" and len(message) == 2:
            return False
        if kind == "result" and len(message) == 3:
            try:
                result = decode_result(message[2])
            except (ProtocolViolation, SandboxError, TypeError, ValueError) as e:
                return f"sent a malformed result: {e}"
            job._finish(result)
            return True
        if kind == "error" and len(message) == 4 and isinstance(message[3], str):
            cls = ERRORS.get(message[2]) if isinstance(message[2], str) else None
            job._finish(None, (cls or SandboxError)(message[3]))
            return True
        return f"sent an unexpected {kind!r} message"


class WorkerPool:
    """`size` worker processes, each running one job at a time.

    `run` and `start_job` are thread-safe and block while all workers are busy (up to `timeout`).
    Use as a context manager, or call `close()`: it cancels running jobs and leaves no processes.
    """

    def __init__(
        self,
        size: int,
        cache_dir: Path,
        *,
        data_limit_bytes: int | None = DEFAULT_DATA_LIMIT,
        file_size_limit_bytes: int | None = DEFAULT_FILE_SIZE_LIMIT,
        grace_seconds: float = GRACE_SECONDS,
        compile_timeout: float = COMPILE_TIMEOUT,
        start_timeout: float = START_TIMEOUT,
    ) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"pool size must be a positive integer, got {size!r}")
        if grace_seconds < 0 or compile_timeout <= 0 or start_timeout <= 0:
            raise ValueError("grace_seconds must be >= 0 and the timeouts > 0")
        self.size = size
        self.cache_dir = Path(cache_dir)
        self.grace_seconds = grace_seconds
        self.compile_timeout = compile_timeout
        self.start_timeout = start_timeout
        self.cache_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        load_or_create_key(self.cache_dir / "key")  # once here, so workers never race to create it
        cache = os.fspath(self.cache_dir.absolute())
        self.orphans_killed = kill_orphaned_workers(cache)
        """Workers of a dead pool of this cache that were still there (stopped) and were killed."""
        self._worker_args = ["--cache-dir", cache, "--parent", str(os.getpid())]
        if data_limit_bytes is not None:
            self._worker_args += ["--data-limit", str(int(data_limit_bytes))]
        if file_size_limit_bytes is not None:
            self._worker_args += ["--file-size-limit", str(int(file_size_limit_bytes))]
        self._ids = itertools.count(1)
        self._cond = threading.Condition()
        self._closed = False
        self._slots = [_Slot(self, i) for i in range(size)]
        self._running: set[JobHandle] = set()
        self._queued: deque[JobHandle] = deque()
        """Jobs given to `submit` while every worker was busy, first come first served."""
        try:
            self._start_workers()
        except BaseException:
            for slot in self._slots:
                slot.discard_worker()
                os.close(slot._wake_r)
                os.close(slot._wake_w)
            raise
        self._free = list(self._slots)
        for slot in self._slots:
            slot.thread.start()

    def _start_workers(self) -> None:
        errors: list[BaseException] = []

        def start(slot: _Slot) -> None:
            try:
                slot.worker = self._spawn()
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=start, args=(s,)) for s in self._slots]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]

    def _spawn(self) -> _Worker:
        return _Worker(self._worker_args, self.start_timeout)

    def worker_pids(self) -> list[int]:
        """The pids of the live worker processes."""
        return [w.pid for w in (s.worker for s in self._slots) if w is not None and not w.closed]

    pids = worker_pids

    def start_job(
        self,
        spec: JobSpec,
        output_dir: Path | None = None,
        *,
        timeout: float | None = None,
        streams_dir: Path | None = None,
    ) -> JobHandle:
        """Hands the job to a free worker (waiting up to `timeout` for one) and returns at once.
        With `streams_dir`, the job's whole stdout and stderr are written there (runner.run)."""
        if not isinstance(spec, JobSpec):
            raise TypeError("spec must be a JobSpec")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not self._free and not self._closed:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise PoolError(f"all {self.size} workers busy for {timeout:g} s")
                self._cond.wait(remaining)
            if self._closed:
                raise PoolError("the worker pool is closed")
            slot = self._free.pop()
            out = None if output_dir is None else Path(output_dir).absolute()
            streams = None if streams_dir is None else Path(streams_dir).absolute()
            job = JobHandle(next(self._ids), spec, out, streams)
            job._slot = slot
            self._running.add(job)
        slot.submit(job)
        return job

    def submit(
        self,
        spec: JobSpec | Callable[[], JobSpec],
        output_dir: Path | None = None,
        *,
        streams_dir: Path | None = None,
        on_sent: Callback | None = None,
        on_done: Callback | None = None,
    ) -> JobHandle:
        """Like `start_job`, but never blocks: with every worker busy the job waits in the pool's queue
        for the next free one. `spec` may be a function that makes the spec: it is called in the
        worker's supervisor thread once the job has a worker (what it raises, wait() raises). Callbacks,
        called with the handle in a pool thread (or, for a job cancelled while in the queue, in the
        thread that cancels it), must be quick and must not call back into the pool's waits: `on_sent`
        once the spec is made and sent to the worker (not for a job that ends before), `on_done` once
        the job has ended, whatever the end (wait(0) then returns or raises at once)."""
        if not (isinstance(spec, JobSpec) or callable(spec)):
            raise TypeError("spec must be a JobSpec or a function returning one")
        out = None if output_dir is None else Path(output_dir).absolute()
        streams = None if streams_dir is None else Path(streams_dir).absolute()
        with self._cond:
            if self._closed:
                raise PoolError("the worker pool is closed")
            job = JobHandle(next(self._ids), spec, out, streams, on_sent, on_done)
            self._running.add(job)
            if not self._free:
                job._pool = self
                self._queued.append(job)
                return job
            slot = self._free.pop()
            job._slot = slot
        slot.submit(job)
        return job

    def run(
        self,
        spec: JobSpec,
        output_dir: Path | None = None,
        *,
        timeout: float | None = None,
        streams_dir: Path | None = None,
    ) -> RunResult:
        """Runs one job to its end on a worker (blocking). `timeout` bounds the wait for a free worker."""
        return self.start_job(spec, output_dir, timeout=timeout, streams_dir=streams_dir).wait()

    def _release(self, slot: _Slot, ended: JobHandle) -> None:
        with self._cond:
            self._running.discard(ended)  # (not a scan of them all: a long queue made that quadratic)
            if self._closed:
                return
            if self._queued:
                job = self._queued.popleft()
                job._pool, job._slot = None, slot
                slot.submit(job)  # straight to the slot: it never looks free to start_job meanwhile
                return
            self._free.append(slot)
            self._cond.notify()

    def _unqueue(self, job: JobHandle) -> bool:
        """Takes a job out of the queue; False if it is not there (a slot took it meanwhile)."""
        with self._cond:
            try:
                self._queued.remove(job)
            except ValueError:
                return False
            self._running.discard(job)
            return True

    def close(self, timeout: float = 10.0) -> None:
        """Cancels running jobs, stops every worker, and joins the supervisor threads."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            running = list(self._running)
            queued, self._queued = list(self._queued), deque()
            self._cond.notify_all()
        for job in queued:
            limits = Limits() if job.spec is None else job.spec.limits
            job._finish(_host_result(limits, CANCELLED, "cancelled before it started (pool closed)", 0.0))
        for job in running:
            job.cancel()
        for slot in self._slots:
            slot.stop()
        for slot in self._slots:
            slot.thread.join(timeout)
            if slot.thread.is_alive():
                log.error("worker slot %d did not stop within %g s", slot.index, timeout)
                slot.discard_worker()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = [
    "CANCELLED",
    "WORKER_CRASHED",
    "WORKER_KILLED",
    "WORKER_LIMIT",
    "WORKER_TRAPS",
    "JobHandle",
    "PoolError",
    "WorkerPool",
    "cores_available",
    "describe_exit",
]
