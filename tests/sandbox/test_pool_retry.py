"""A job is sent to a second worker only when the first died before it read the request: a guest that
kills its worker at once (before the worker's first `started`) is reported once, classified, and never
run again."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from e31.sandbox.job import JobSpec
from e31.sandbox.limits import Limits, Status
from e31.sandbox.pool import WORKER_LIMIT, WorkerPool
from e31.sandbox.worker_process import _Worker
from guests import O_CREAT, RIGHTS_WRITE, command

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="worker limits are tested on Linux")

MIB = 1024 * 1024
# Opens /output/big.bin and writes 2 MiB to it in one call: a worker whose RLIMIT_FSIZE is 1 MiB dies
# of SIGXFSZ a few milliseconds after the guest starts, before its watchdog's first tick.
BIG_WRITE = command(
    f"""
  (call $check (call $open (i32.const 4) (i32.const 256) (i32.const 7) (i32.const {O_CREAT})
                           (i64.const {RIGHTS_WRITE})))
  (drop (call $write (i32.load (i32.const 12)) (i32.const 1024) (i32.const {2 * MIB})))""",
    data='(data (i32.const 256) "big.bin")',
    memory='(memory (export "memory") 48)',
)


def wait_until(what: str, check: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.005)


def _state(pid: int) -> str:
    """The process state letter of /proc/PID/stat (after the parenthesised command name)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


class CountingPool(WorkerPool):
    """A real pool that counts the workers it starts."""

    spawned = 0

    def _spawn(self) -> _Worker:
        worker = super()._spawn()
        self.spawned += 1
        return worker


def test_a_guest_that_kills_its_worker_at_once_is_reported_once_and_not_rerun(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="e31.sandbox.pool")
    with CountingPool(1, tmp_path / "cache", file_size_limit_bytes=MIB) as p:
        assert p.spawned == 1
        [pid] = p.worker_pids()
        r = p.run(JobSpec(BIG_WRITE, limits=Limits(memory_bytes=4 * MIB)), tmp_path / "out")
        assert (r.status, r.trap) == (Status.TRAP, WORKER_LIMIT)
        assert "RLIMIT_FSIZE" in r.message and str(pid) in r.message
        assert p.spawned == 1  # no second worker was started to run the job again
        assert "sending it to a new worker" not in caplog.text
        assert p.run(JobSpec(BIG_WRITE, limits=Limits(memory_bytes=4 * MIB)), None).status is Status.EXITED
        assert p.spawned == 2  # the next job gets a fresh worker


def test_a_job_sent_to_a_worker_that_died_unseen_is_sent_to_a_new_one(tmp_path: Path) -> None:
    # The worker is killed and its death not yet seen by the pool (its pipes stay open until reaped):
    # the request lands unread in its pipe, so the job goes to a new worker and runs there once.
    with CountingPool(1, tmp_path / "cache") as p:
        [worker] = [s.worker for s in p._slots]
        assert worker is not None
        os.kill(worker.pid, signal.SIGKILL)
        os.waitid(os.P_PID, worker.pid, os.WEXITED | os.WNOWAIT)  # dead, still unreaped
        r = p.run(JobSpec(BIG_WRITE, limits=Limits(memory_bytes=4 * MIB)), tmp_path / "out")
        assert r.status is Status.EXITED
        assert (tmp_path / "out" / "big.bin").stat().st_size == 2 * MIB
        assert p.spawned == 2


def test_a_job_left_unread_by_a_worker_that_died_is_sent_to_a_new_one(tmp_path: Path) -> None:
    # The worker is stopped behind the pool's back, so the request waits unread in its pipe; then it
    # is killed. It never read the job: the job goes to a new worker and runs there once.
    with CountingPool(1, tmp_path / "cache") as p:
        [worker] = [s.worker for s in p._slots]
        assert worker is not None
        os.kill(worker.pid, signal.SIGSTOP)
        wait_until("the worker is stopped", lambda: _state(worker.pid) == "T")
        handle = p.start_job(JobSpec(BIG_WRITE, limits=Limits(memory_bytes=4 * MIB)), tmp_path / "out")
        wait_until("the request is in the worker's pipe", lambda: (worker.unread_request_bytes() or 0) > 0)
        os.kill(worker.pid, signal.SIGKILL)
        r = handle.wait(timeout=60)
        assert r.status is Status.EXITED
        assert (tmp_path / "out" / "big.bin").stat().st_size == 2 * MIB
        assert p.spawned == 2
