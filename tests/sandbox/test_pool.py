"""The worker pool with real worker processes: jobs run out of process, crashes, hangs and limit
breaches end in a clear result and a fresh worker, suspend/resume changes nothing, close() cleans up."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from e31.sandbox.errors import JobSpecError
from e31.sandbox.job import JobSpec
from e31.sandbox.limits import Limits, RunResult, Status
from e31.sandbox.pool import (
    CANCELLED,
    WORKER_CRASHED,
    WORKER_KILLED,
    WORKER_LIMIT,
    JobHandle,
    PoolError,
    WorkerPool,
    cores_available,
)
from e31.sandbox.runner import wat_to_wasm

WORKLOADS = Path(__file__).resolve().parents[2] / "sandbox" / "workloads"
ECHO = (WORKLOADS / "echo.wasm").read_bytes()
MONTECARLO = (WORKLOADS / "montecarlo.wasm").read_bytes()
MANDELBROT = (WORKLOADS / "mandelbrot.wasm").read_bytes()
# Grows its memory 1 MiB at a time (touching every page) up to 600 MiB; exits with the MiB it got.
GROW = wat_to_wasm("""
(module
 (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
 (memory (export "memory") 1)
 (func (export "_start") (local $mib i32) (local $p i32) (local $end i32)
  (block $done
   (loop $more
    (local.set $p (memory.grow (i32.const 16)))
    (br_if $done (i32.eq (local.get $p) (i32.const -1)))
    (local.set $p (i32.mul (local.get $p) (i32.const 65536)))
    (local.set $end (i32.add (local.get $p) (i32.const 1048576)))
    (loop $touch
     (i32.store8 (local.get $p) (i32.const 1))
     (local.set $p (i32.add (local.get $p) (i32.const 4096)))
     (br_if $touch (i32.lt_u (local.get $p) (local.get $end))))
    (local.set $mib (i32.add (local.get $mib) (i32.const 1)))
    (br_if $more (i32.lt_u (local.get $mib) (i32.const 600)))))
  (call $exit (local.get $mib))))
""")
SPIN = wat_to_wasm('(module (memory 1) (export "memory" (memory 0)) (func (export "_start") (loop (br 0))))')

pytestmark = pytest.mark.skipif(
    sys.platform != "linux", reason="worker limits and signals are tested on Linux"
)


def spin_spec(wall: float = 30.0) -> JobSpec:
    return JobSpec(SPIN, limits=Limits(fuel=Limits.MAX_FUEL, wall_seconds=wall))


def montecarlo_spec(samples: int = 4_000_000, wall: float = 60.0) -> JobSpec:
    return JobSpec(MONTECARLO, args=("11", str(samples)), limits=Limits(wall_seconds=wall))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def started(handle: JobHandle) -> int:
    assert handle.wait_started(timeout=60)
    pid = handle.pid
    assert pid is not None
    return pid


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerPool]:
    with WorkerPool(2, tmp_path_factory.mktemp("cache"), grace_seconds=1.0) as p:
        yield p


def test_jobs_run_in_worker_processes(pool: WorkerPool, tmp_path: Path) -> None:
    handle = pool.start_job(JobSpec(ECHO, args=("hi",)))
    r = handle.wait(timeout=60)
    assert (r.status, r.exit_code, r.stdout) == (Status.EXITED, 0, b"hi\n")
    pids = pool.worker_pids()
    assert len(pids) == 2 and os.getpid() not in pids
    assert all(int(Path(f"/proc/{pid}/stat").read_text().split()[3]) == os.getpid() for pid in pids)
    assert any(p.name.endswith(".cwasm") for p in pool.cache_dir.iterdir())


def test_outputs_are_written_by_the_worker(pool: WorkerPool, tmp_path: Path) -> None:
    spec = JobSpec(MANDELBROT, args=("30", "20", "0", "0", "30", "20", "30", "/output/tile.pgm"))
    r = pool.run(spec, tmp_path / "out")
    assert r.status is Status.EXITED and r.exit_code == 0
    assert (tmp_path / "out" / "tile.pgm").read_bytes().startswith(b"P5\n30 20\n255\n")
    assert set(r.output_files) == {"tile.pgm"}


def test_guest_outcomes_pass_through_unchanged(pool: WorkerPool) -> None:
    before = set(pool.worker_pids())
    timeout = pool.run(spin_spec(wall=0.3))
    assert timeout.status is Status.TIMEOUT
    invalid = pool.run(JobSpec(b"\x00asm\x01\x00\x00\x00\x05"))
    assert invalid.status is Status.INVALID_MODULE
    fuel = pool.run(JobSpec(SPIN, limits=Limits(fuel=1000)))
    assert (fuel.status, fuel.fuel_used) == (Status.OUT_OF_FUEL, 1000)
    assert set(pool.worker_pids()) == before  # guest outcomes never cost a worker


def test_host_side_errors_are_raised_to_the_caller(pool: WorkerPool, tmp_path: Path) -> None:
    data = tmp_path / "data.txt"
    data.write_text("words")
    spec = JobSpec(ECHO, inputs={"data.txt": data})
    data.unlink()  # gone between submission and run: the worker's re-validation refuses it
    with pytest.raises(JobSpecError, match=r"data\.txt"):
        pool.run(spec)
    assert pool.run(JobSpec(ECHO, args=("still", "fine"))).stdout == b"still fine\n"


def test_concurrency_up_to_size(pool: WorkerPool) -> None:
    a = pool.start_job(spin_spec())
    b = pool.start_job(spin_spec())
    assert started(a) != started(b)  # both running at once, in two processes
    a.suspend()
    b.suspend()
    with pytest.raises(PoolError, match="busy"):
        pool.start_job(JobSpec(ECHO), timeout=0.2)
    a.resume()
    b.resume()
    for h in (a, b):
        h.cancel()
        assert h.wait(timeout=60).trap == CANCELLED
    assert pool.run(JobSpec(ECHO, args=("free",)), timeout=60).stdout == b"free\n"


def test_suspend_resume_keeps_fuel_and_output_and_pauses_the_wall_clock(pool: WorkerPool) -> None:
    baseline = pool.run(montecarlo_spec(samples=15_000_000))
    assert baseline.status is Status.EXITED
    # A wall limit shorter than the pause: only time spent running may count against it.
    wall = max(1.5, 4 * baseline.wall_seconds)
    handle = pool.start_job(montecarlo_spec(samples=15_000_000, wall=wall))
    started(handle)
    handle.suspend()
    assert handle.suspended
    time.sleep(wall + 0.5)
    assert not handle.done()
    handle.resume()
    r = handle.wait(timeout=60)
    assert (r.status, r.exit_code) == (Status.EXITED, 0), r
    assert (r.stdout, r.fuel_used) == (baseline.stdout, baseline.fuel_used)
    assert r.wall_seconds < wall


def test_suspend_before_start_and_after_end_are_harmless(pool: WorkerPool) -> None:
    done = pool.start_job(JobSpec(ECHO, args=("x",)))
    r = done.wait(timeout=60)
    done.suspend()
    done.resume()
    done.cancel()
    assert done.wait() is r and not done.suspended


def test_a_crashed_worker_is_replaced_and_its_job_reported(pool: WorkerPool) -> None:
    for sig in (signal.SIGKILL, signal.SIGABRT):
        handle = pool.start_job(spin_spec())
        pid = started(handle)
        os.kill(pid, sig)
        r = handle.wait(timeout=60)
        assert (r.status, r.trap) == (Status.TRAP, WORKER_CRASHED)
        assert sig.name in r.message and str(pid) in r.message
        assert not r.reverifiable and r.fuel_used == 0
        assert pid not in pool.worker_pids()
        assert pool.run(JobSpec(ECHO, args=("after",))).stdout == b"after\n"


def test_a_worker_that_dies_while_idle_is_replaced(pool: WorkerPool) -> None:
    for pid in pool.worker_pids():
        os.kill(pid, signal.SIGKILL)
    results = [pool.start_job(JobSpec(ECHO, args=(str(i),))) for i in range(2)]
    assert sorted(h.wait(timeout=60).stdout for h in results) == [b"0\n", b"1\n"]


def test_a_hung_worker_is_killed_by_the_watchdog(pool: WorkerPool) -> None:
    handle = pool.start_job(spin_spec(wall=0.5))
    pid = started(handle)
    os.kill(pid, signal.SIGSTOP)  # behind the pool's back: to the pool it is simply not answering
    r = handle.wait(timeout=60)
    assert (r.status, r.trap) == (Status.TRAP, WORKER_KILLED)
    assert "killed" in r.message
    assert not alive(pid)
    assert pool.run(JobSpec(ECHO, args=("ok",))).stdout == b"ok\n"


def test_cancel_kills_the_job_and_replaces_the_worker(pool: WorkerPool) -> None:
    handle = pool.start_job(spin_spec())
    pid = started(handle)
    handle.suspend()
    handle.cancel()
    r = handle.wait(timeout=60)
    assert (r.status, r.trap) == (Status.TRAP, CANCELLED)
    assert not alive(pid)
    assert pool.run(JobSpec(ECHO, args=("ok",))).stdout == b"ok\n"


def test_worker_os_limits_are_applied(tmp_path: Path) -> None:
    with WorkerPool(1, tmp_path / "cache", data_limit_bytes=900 * 2**20, file_size_limit_bytes=2**30) as p:
        [pid] = p.worker_pids()
        limits = Path(f"/proc/{pid}/limits").read_text().splitlines()
    row = {line[:26].strip(): line[26:].split() for line in limits[1:]}
    assert row["Max data size"][0] == str(900 * 2**20)
    assert row["Max file size"][0] == str(2**30)
    assert row["Max core file size"][0] == "0"
    assert row["Max address space"][0] == "unlimited"


def test_a_worker_breaking_its_file_size_limit_is_replaced(tmp_path: Path) -> None:
    with WorkerPool(1, tmp_path / "cache", file_size_limit_bytes=2**20) as p:
        [pid] = p.worker_pids()
        spec = JobSpec(MANDELBROT, args=("2048", "1024", "0", "0", "2048", "1024", "5", "/output/big.pgm"))
        r = p.run(spec, tmp_path / "out")
        assert (r.status, r.trap) == (Status.TRAP, WORKER_LIMIT)
        assert "RLIMIT_FSIZE" in r.message
        assert not alive(pid)
        small = JobSpec(MANDELBROT, args=("100", "100", "0", "0", "100", "100", "5", "/output/small.pgm"))
        ok = p.run(small, tmp_path / "out2")
        assert ok.status is Status.EXITED and (tmp_path / "out2" / "small.pgm").stat().st_size > 10_000
        assert p.worker_pids() != [pid]


def test_the_data_limit_fences_guest_memory(tmp_path: Path) -> None:
    # The job's own memory limit (1 GiB) is above the worker's RLIMIT_DATA (300 MiB): the OS refuses
    # the growth (memory.grow returns -1), the guest copes, and the worker survives.
    with WorkerPool(1, tmp_path / "cache", data_limit_bytes=300 * 2**20) as p:
        [pid] = p.worker_pids()
        r = p.run(JobSpec(GROW, limits=Limits(memory_bytes=2**30)))
        assert r.status is Status.EXITED and r.exit_code is not None
        assert 0 < r.exit_code < 300
        within = p.run(JobSpec(GROW, limits=Limits(memory_bytes=50 * 2**20)))
        assert within.exit_code == 49  # the job's own limit: 1 page + 49 MiB
        assert p.worker_pids() == [pid]


def test_close_cancels_running_jobs_and_leaves_no_processes(tmp_path: Path) -> None:
    p = WorkerPool(2, tmp_path / "cache")
    pids = p.worker_pids()
    handle = p.start_job(spin_spec())
    started(handle)
    p.close()
    r: RunResult = handle.wait(timeout=5)
    assert (r.status, r.trap) == (Status.TRAP, CANCELLED)
    assert [pid for pid in pids if alive(pid)] == []
    assert p.worker_pids() == []
    with pytest.raises(PoolError, match="closed"):
        p.start_job(JobSpec(ECHO))
    p.close()  # idempotent


def test_cores_available_is_a_sane_default_size() -> None:
    assert 1 <= cores_available() <= (os.cpu_count() or 1)


def test_bad_pool_arguments(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        WorkerPool(0, tmp_path)
    with pytest.raises(ValueError):
        WorkerPool(1, tmp_path, grace_seconds=-1)
