"""WorkerPool.submit: never blocks (jobs past the pool's size wait in its queue), makes the spec in the
pool's thread, and reports through callbacks: `on_sent` once the spec is sent, `on_done` at every end."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest
from e31.sandbox.errors import JobSpecError
from e31.sandbox.job import JobSpec
from e31.sandbox.limits import Limits, Status
from e31.sandbox.pool import CANCELLED, JobHandle, PoolError, WorkerPool
from e31.sandbox.runner import wat_to_wasm

WORKLOADS = Path(__file__).resolve().parents[2] / "sandbox" / "workloads"
ECHO = (WORKLOADS / "echo.wasm").read_bytes()
SPIN = wat_to_wasm('(module (memory 1) (export "memory" (memory 0)) (func (export "_start") (loop (br 0))))')

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="worker pools are tested on Linux")


class Seen:
    """What the callbacks reported, with the thread each came from."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: list[tuple[str, int, str]] = []
        self.all_done = threading.Condition(self.lock)

    def sent(self, handle: JobHandle) -> None:
        with self.lock:
            self.events.append(("sent", handle.job_id, threading.current_thread().name))

    def done(self, handle: JobHandle) -> None:
        assert handle.done()
        with self.lock:
            self.events.append(("done", handle.job_id, threading.current_thread().name))
            self.all_done.notify_all()

    def wait_done(self, n: int) -> None:
        with self.lock:
            assert self.all_done.wait_for(lambda: sum(e[0] == "done" for e in self.events) >= n, 60)


def test_jobs_past_the_size_queue_and_all_run_with_callbacks_from_pool_threads(tmp_path: Path) -> None:
    seen = Seen()
    with WorkerPool(1, tmp_path / "cache") as pool:
        handles = [
            pool.submit(JobSpec(ECHO, args=(str(i),)), on_sent=seen.sent, on_done=seen.done) for i in range(5)
        ]  # returns at once though one worker is busy
        seen.wait_done(5)
        assert [h.wait(0).stdout for h in handles] == [b"%d\n" % i for i in range(5)]
    ids = [h.job_id for h in handles]
    assert [(kind, i) for kind, i, _ in seen.events] == [(k, i) for i in ids for k in ("sent", "done")]
    assert all(name.startswith("e31-pool-slot-") for _, _, name in seen.events)


def test_the_spec_function_runs_in_the_pool_and_its_error_is_raised_by_wait(tmp_path: Path) -> None:
    seen = Seen()
    made: list[str] = []

    def make() -> JobSpec:
        made.append(threading.current_thread().name)
        return JobSpec(ECHO, args=("made",))

    def fail() -> JobSpec:
        raise FileNotFoundError("no module here")

    def bad() -> JobSpec:
        data = tmp_path / "gone.txt"
        return JobSpec(ECHO, inputs={"gone.txt": data})  # refused by JobSpec itself

    with WorkerPool(1, tmp_path / "cache") as pool:
        ok = pool.submit(make, on_sent=seen.sent, on_done=seen.done)
        failed = pool.submit(fail, on_sent=seen.sent, on_done=seen.done)
        refused = pool.submit(bad, on_sent=seen.sent, on_done=seen.done)
        seen.wait_done(3)
        assert ok.wait(0).stdout == b"made\n"
        with pytest.raises(FileNotFoundError, match="no module here"):
            failed.wait(0)
        with pytest.raises(JobSpecError):
            refused.wait(0)
        assert pool.run(JobSpec(ECHO, args=("still", "fine"))).stdout == b"still fine\n"
    assert made == ["e31-pool-slot-0"]
    assert [k for k, i, _ in seen.events if i == failed.job_id] == ["done"]  # never sent
    assert [k for k, i, _ in seen.events if i == refused.job_id] == ["done"]


def test_cancel_and_close_end_running_and_queued_jobs_with_their_callbacks(tmp_path: Path) -> None:
    seen = Seen()
    spin = JobSpec(SPIN, limits=Limits(fuel=Limits.MAX_FUEL, wall_seconds=30))
    pool = WorkerPool(1, tmp_path / "cache")
    running = pool.submit(spin, on_done=seen.done)
    cancelled_in_queue = pool.submit(spin, on_done=seen.done)
    queued = pool.submit(spin, on_done=seen.done)
    assert running.wait_started(60)
    cancelled_in_queue.cancel()
    running.cancel()
    seen.wait_done(2)  # the running one, then the cancelled one when the slot takes it
    assert (running.wait(0).status, running.wait(0).trap) == (Status.TRAP, CANCELLED)
    assert cancelled_in_queue.wait(0).trap == CANCELLED
    assert queued.wait_started(60)  # the queue goes on
    pool.close()
    seen.wait_done(3)
    assert queued.wait(0).trap == CANCELLED
    with pytest.raises(PoolError, match="closed"):
        pool.submit(spin)


def test_close_ends_jobs_still_waiting_in_the_queue(tmp_path: Path) -> None:
    seen = Seen()
    spin = JobSpec(SPIN, limits=Limits(fuel=Limits.MAX_FUEL, wall_seconds=30))
    pool = WorkerPool(1, tmp_path / "cache")
    running = pool.submit(spin, on_done=seen.done)
    waiting = [pool.submit(spin, on_done=seen.done) for _ in range(3)]
    assert running.wait_started(60)
    pool.close()
    seen.wait_done(4)
    assert {h.wait(0).trap for h in (running, *waiting)} == {CANCELLED}
    assert all(h.wait(0).message.startswith("cancelled before it started") for h in waiting)


def test_a_queued_job_cancelled_leaves_the_queue_at_once_and_never_runs(tmp_path: Path) -> None:
    seen = Seen()
    with WorkerPool(1, tmp_path / "cache") as pool:
        busy = pool.submit(JobSpec(SPIN, limits=Limits(wall_seconds=600.0)))
        assert busy.wait_started(60) and busy.assigned
        queued = pool.submit(JobSpec(ECHO, args=("never",)), on_sent=seen.sent, on_done=seen.done)
        assert not queued.assigned
        queued.cancel()
        result = queued.wait(0)  # ended at once, while the worker still runs the first job
        assert (result.status, result.trap) == (Status.TRAP, CANCELLED) and not busy.done()
        after = pool.submit(JobSpec(ECHO, args=("next",)))
        busy.cancel()
        assert after.wait(60).stdout == b"next\n"  # the queue goes on with the next job
    assert [kind for kind, _, _ in seen.events] == ["done"]  # never sent
