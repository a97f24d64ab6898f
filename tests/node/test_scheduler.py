"""The executor's queue over a real sandbox worker pool: order, the meter, suspension, cancellation."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import trio
from e31.node.market.scheduler import RunRecord, Scheduler
from e31.sandbox.job import JobSpec
from e31.sandbox.limits import Limits, Status, whole_stream
from e31.sandbox.pool import WorkerPool
from e31.sandbox.runner import wat_to_wasm

WORKLOADS = Path(__file__).resolve().parents[2] / "sandbox" / "workloads"
LOOP = wat_to_wasm('(module (func (export "_start") (loop (br 0))))')


def montecarlo(seed: int, samples: int = 300_000) -> JobSpec:
    return JobSpec(module=(WORKLOADS / "montecarlo.wasm").read_bytes(), args=(str(seed), str(samples)))


@pytest.fixture
async def scheduler(tmp_path: Path, nursery: trio.Nursery) -> Scheduler:
    s = Scheduler(1, lambda: WorkerPool(1, tmp_path / "cache"))
    await nursery.start(s.run)
    return s


async def test_jobs_run_in_arrival_order_and_the_wait_is_visible_not_billed(
    scheduler: Scheduler, tmp_path: Path
) -> None:
    records = {}

    async def one(i: int) -> None:
        records[i] = await scheduler.execute(montecarlo(i), tmp_path / f"out{i}", estimate_ms=1000)

    scheduler.suspend()  # hold them all in the queue until every one has arrived
    async with trio.open_nursery() as n:
        for i in range(3):
            n.start_soon(one, i)
            await trio.sleep(0.01)  # arrival order
        assert scheduler.queue_length == 3
        assert scheduler.backlog_ms == 3000
        scheduler.resume()
    assert scheduler.queue_length == 0 and scheduler.backlog_ms == 0
    for i in range(3):
        r = records[i]
        assert r.result.status is Status.EXITED and r.result.exit_code == 0
        assert r.queued_at <= r.started_at <= r.finished_at
        assert r.compute_ms >= 1
    assert records[1].started_at >= records[0].finished_at
    assert records[2].started_at >= records[1].finished_at
    waited = records[2].started_at - records[2].queued_at
    assert waited >= records[0].finished_at - records[2].queued_at > 0
    # The meter is the sandbox's compute time, whatever the wait before it.
    assert records[2].compute_ms <= records[2].finished_at - records[2].started_at + 1
    assert scheduler.completed == 3
    assert all(records[i].result.fuel_used > 0 for i in range(3))


async def test_a_suspended_scheduler_holds_new_jobs_until_resumed(
    scheduler: Scheduler, tmp_path: Path
) -> None:
    scheduler.suspend()
    started: list[int] = []
    done = trio.Event()

    async def one() -> None:
        await scheduler.execute(
            montecarlo(1, 1000), tmp_path / "out", estimate_ms=10, on_start=started.append
        )
        done.set()

    async with trio.open_nursery() as n:
        n.start_soon(one)
        await trio.sleep(0.5)
        assert started == [] and scheduler.queue_length == 1
        scheduler.resume()
        with trio.fail_after(30):
            await done.wait()
    assert len(started) == 1


async def test_cancelling_a_run_stops_the_guest(scheduler: Scheduler, tmp_path: Path) -> None:
    spec = JobSpec(module=LOOP, limits=Limits(wall_seconds=600.0))
    with trio.move_on_after(1.0) as scope:
        await scheduler.execute(spec, tmp_path / "out", estimate_ms=1)
    assert scope.cancelled_caught
    # The worker is free again: the next job runs at once.
    with trio.fail_after(30):
        record = await scheduler.execute(montecarlo(2, 1000), tmp_path / "out2", estimate_ms=1)
    assert record.result.status is Status.EXITED


async def test_whole_streams_and_worker_pids_come_from_the_pool(scheduler: Scheduler, tmp_path: Path) -> None:
    assert len(scheduler.worker_pids()) == 1
    # short streams: whole in the result, and no file or directory is created for them
    record = await scheduler.execute(
        montecarlo(3, 1000), tmp_path / "a" / "out", estimate_ms=1, streams_dir=tmp_path / "a" / "streams"
    )
    assert whole_stream(record.result, tmp_path / "a" / "streams", "stdout") == record.result.stdout
    assert record.result.stdout_bytes > 0 and record.result.stderr_bytes == 0
    assert not (tmp_path / "a").exists()
    # a stdout longer than the result holds goes whole to streams_dir (a 1,200 x 1,000 PGM image)
    tile = JobSpec(
        module=(WORKLOADS / "mandelbrot.wasm").read_bytes(),
        args=("1200", "1000", "0", "0", "1200", "1000", "1"),
    )
    record = await scheduler.execute(
        tile, tmp_path / "b" / "out", estimate_ms=1, streams_dir=tmp_path / "b" / "streams"
    )
    stdout = (tmp_path / "b" / "streams" / "stdout").read_bytes()
    assert len(stdout) == record.result.stdout_bytes > len(record.result.stdout)
    assert stdout.startswith(record.result.stdout)
    assert hashlib.sha256(stdout).hexdigest() == record.result.stdout_sha256


async def test_suspending_a_running_job_changes_nothing_in_its_result(
    scheduler: Scheduler, tmp_path: Path
) -> None:
    baseline = await scheduler.execute(montecarlo(4, 20_000_000), tmp_path / "a", estimate_ms=1)
    result: list[RunRecord] = []
    started = trio.Event()

    async def one() -> None:
        result.append(
            await scheduler.execute(
                montecarlo(4, 20_000_000), tmp_path / "b", estimate_ms=1, on_start=lambda at: started.set()
            )
        )

    async with trio.open_nursery() as n:
        n.start_soon(one)
        with trio.fail_after(30):
            await started.wait()
        await trio.sleep(0.05)
        scheduler.suspend()
        await trio.sleep(0.5)
        scheduler.resume()
    (record,) = result
    assert (record.result.status, record.result.fuel_used, record.result.stdout) == (
        baseline.result.status,
        baseline.result.fuel_used,
        baseline.result.stdout,
    )
