"""The scheduler's interface to the sandbox pool: no thread hop per job (the pool's thread wakes the task),
the spec made and `then` called in the pool's thread, and their errors raised by `execute`."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from e31.node.market.scheduler import JobInfo, Scheduler, wall_ms
from e31.sandbox.job import JobSpec
from e31.sandbox.limits import RunResult, Status
from e31.sandbox.pool import WorkerPool

WORKLOADS = Path(__file__).resolve().parents[2] / "sandbox" / "workloads"
TINY = (WORKLOADS / "montecarlo.wasm").read_bytes()


def tiny(seed: int) -> JobSpec:
    return JobSpec(module=TINY, args=(str(seed), "1000"))


@pytest.fixture
async def scheduler(tmp_path: Path, nursery: trio.Nursery) -> Scheduler:
    s = Scheduler(2, lambda: WorkerPool(2, tmp_path / "cache"))
    await nursery.start(s.run)
    return s


async def test_a_burst_of_jobs_runs_with_no_thread_hop(
    scheduler: Scheduler, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hops: list[object] = []
    real = trio.to_thread.run_sync

    async def counted(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        hops.append(fn)
        return await real(fn, *args, **kwargs)

    monkeypatch.setattr(trio.to_thread, "run_sync", counted)
    loop_thread = threading.current_thread()
    where: list[str] = []

    def then(result: RunResult) -> bytes:
        where.append("loop" if threading.current_thread() is loop_thread else "pool")
        return result.stdout

    records = {}

    async def one(i: int) -> None:
        records[i] = await scheduler.execute(tiny(i), tmp_path / f"o{i}", estimate_ms=5, then=then)

    async with trio.open_nursery() as n:
        for i in range(12):  # more than the pool's two workers
            n.start_soon(one, i)
    assert hops == []
    assert where == ["pool"] * 12
    assert all(r.result.status is Status.EXITED and r.after == r.result.stdout for r in records.values())
    assert scheduler.completed == 12 and scheduler.queue_length == 0


async def test_the_spec_is_made_in_the_pool_and_its_error_is_raised(
    scheduler: Scheduler, tmp_path: Path
) -> None:
    started: list[int] = []
    made: list[bool] = []
    loop_thread = threading.current_thread()

    def make() -> JobSpec:
        made.append(threading.current_thread() is loop_thread)
        return tiny(1)

    record = await scheduler.execute(make, tmp_path / "a", estimate_ms=5, on_start=started.append)
    assert record.result.status is Status.EXITED and made == [False] and started == [record.started_at]

    def broken() -> JobSpec:
        raise OSError("the module's blob is gone")

    with pytest.raises(OSError, match="blob is gone"):
        await scheduler.execute(broken, tmp_path / "b", estimate_ms=5, on_start=started.append)
    assert len(started) == 1  # never sent: on_start not called

    def failing_then(result: RunResult) -> None:
        raise ValueError("cannot store the outputs")

    with pytest.raises(ValueError, match="cannot store"):
        await scheduler.execute(tiny(2), tmp_path / "c", estimate_ms=5, then=failing_then)
    assert scheduler.queue_length == 0
    assert (await scheduler.execute(tiny(3), tmp_path / "d", estimate_ms=5)).result.status is Status.EXITED


async def test_a_run_that_ended_in_time_is_not_late_while_then_stores_its_outputs(
    scheduler: Scheduler, tmp_path: Path
) -> None:
    deadline = wall_ms() + 1000
    job = JobInfo(b"k" * 32, b"s" * 32, deadline, 10**9, 5000, b"p" * 32)
    in_then, release = trio.Event(), threading.Event()
    token = trio.lowlevel.current_trio_token()

    def slow_then(result: RunResult) -> str:
        trio.from_thread.run_sync(in_then.set, trio_token=token)
        release.wait(60)  # a large output being stored, past the job's deadline
        return "stored"

    async def past_the_deadline() -> None:
        await in_then.wait()
        await trio.sleep(max(0.0, (deadline + 100 - wall_ms()) / 1000))  # the deadline is a time
        release.set()

    async with trio.open_nursery() as n:
        n.start_soon(past_the_deadline)
        record = await scheduler.execute(tiny(4), tmp_path / "o", estimate_ms=5, job=job, then=slow_then)
    assert record.result.status is Status.EXITED and record.after == "stored"
    assert record.finished_at <= deadline and scheduler.stopped_late == 0
