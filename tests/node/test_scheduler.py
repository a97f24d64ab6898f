"""The executor's queue over a real sandbox worker pool: order (arrival order for jobs the policy knows
nothing of, fair turns across submitters), deadlines, calibration, the meter, suspension, cancellation."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest
import trio
from e31.node.market.scheduler import JobExpired, JobInfo, JobLate, RunRecord, Scheduler, wall_ms
from e31.sandbox.job import JobSpec
from e31.sandbox.limits import Limits, Status, whole_stream
from e31.sandbox.pool import WorkerPool
from e31.sandbox.runner import wat_to_wasm
from market_nodes import until

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
    baseline = await scheduler.execute(montecarlo(4, 50_000_000), tmp_path / "a", estimate_ms=1)
    result: list[RunRecord] = []
    started = trio.Event()

    async def one() -> None:
        result.append(
            await scheduler.execute(
                montecarlo(4, 50_000_000), tmp_path / "b", estimate_ms=1, on_start=lambda at: started.set()
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
    # the meter: the pause (at least the 0.5 s slept while suspended) is recorded, within the run's span
    assert baseline.paused_ms == 0
    assert 400 <= record.paused_ms <= record.finished_at - record.started_at


def info(key: bytes, submitter: bytes, deadline: int, fuel: int = 10**8) -> JobInfo:
    return JobInfo(key, submitter, deadline, fuel, 30_000, b"p" * 32)


async def test_two_submitters_queued_together_are_served_in_turn_not_batch_after_batch(
    scheduler: Scheduler, tmp_path: Path
) -> None:
    """Eight jobs of A queued before four of B: B's first job does not wait behind A's whole batch
    (the FIFO queue this replaced started them AAAAAAAABBBB)."""
    order: list[bytes] = []
    far = wall_ms() + 600_000

    async def one(sub: bytes, i: int) -> None:
        await scheduler.execute(
            montecarlo(i, 1000),
            tmp_path / f"{sub.decode()}{i}",
            estimate_ms=10,
            job=info(b"%s%d" % (sub, i), sub, far),
            on_start=lambda at: order.append(sub),
        )

    scheduler.suspend()
    async with trio.open_nursery() as n:
        for i in range(8):
            n.start_soon(one, b"A", i)
        await until_queued(scheduler, 8)
        for i in range(4):
            n.start_soon(one, b"B", i)
        await until_queued(scheduler, 12)
        scheduler.resume()
    assert len(order) == 12
    first_b = order.index(b"B")
    assert first_b <= 2, order  # not behind A's eight
    assert order[:8].count(b"B") >= 3, order  # and B's jobs interleaved with A's


async def until_queued(scheduler: Scheduler, n: int) -> None:
    await until(lambda: scheduler.queue_length >= n, 30)
    assert scheduler.queue_length == n


async def test_a_job_whose_deadline_passes_while_it_waits_never_starts(
    scheduler: Scheduler, tmp_path: Path
) -> None:
    started: list[str] = []
    long_started = trio.Event()

    async def long() -> None:
        await scheduler.execute(
            montecarlo(4, 100_000_000),
            tmp_path / "long",
            estimate_ms=1,
            on_start=lambda at: (started.append("long"), long_started.set()),
        )

    async with trio.open_nursery() as n:
        n.start_soon(long)
        with trio.fail_after(30):
            await long_started.wait()
        deadline = wall_ms() + 300
        with pytest.raises(JobExpired):
            await scheduler.execute(
                montecarlo(5, 1000),
                tmp_path / "short",
                estimate_ms=1,
                job=info(b"short", b"S", deadline),
                on_start=lambda at: started.append("short"),
            )
        assert wall_ms() >= deadline
        assert started == ["long"] and scheduler.expired == 1
        assert scheduler.queue_length == 1  # given back while the long job still runs, not after it
        n.cancel_scope.cancel()


async def test_a_job_still_running_at_its_deadline_is_stopped(scheduler: Scheduler, tmp_path: Path) -> None:
    before = scheduler.calibration.margin
    deadline = wall_ms() + 500
    # fuel for far longer than 500 ms even on a fast core (the default 1e10 can run out in 0.5 s there)
    long = dataclasses.replace(montecarlo(6, 2_000_000_000), limits=Limits(fuel=10**13, wall_seconds=120.0))
    with pytest.raises(JobLate):
        await scheduler.execute(long, tmp_path / "late", estimate_ms=1, job=info(b"late", b"S", deadline))
    assert wall_ms() >= deadline and scheduler.stopped_late == 1
    assert scheduler.calibration.margin > before  # a missed promise makes the next estimates more careful
    # its submitter, charged the 1e13 budget at the start, keeps only what 0.5 s at the rate could burn
    assert 0 < scheduler.usage.value(b"S", wall_ms()) < 10**13 / 100
    # the worker is free again
    with trio.fail_after(30):
        record = await scheduler.execute(montecarlo(7, 1000), tmp_path / "next", estimate_ms=1)
    assert record.result.status is Status.EXITED


async def test_runs_calibrate_the_fuel_rate_of_their_profile(scheduler: Scheduler, tmp_path: Path) -> None:
    profile = b"p" * 32
    assert profile not in scheduler.calibration.rates
    far = wall_ms() + 600_000
    record = await scheduler.execute(
        montecarlo(8, 20_000_000), tmp_path / "cal", estimate_ms=1, job=info(b"cal", b"S", far, fuel=10**11)
    )
    rate = scheduler.calibration.rates[profile]
    held_ms = record.finished_at - record.started_at
    assert rate == record.result.fuel_used * 1000 // held_ms
    assert scheduler.estimate_ms(profile, record.result.fuel_used, 10**9) >= held_ms  # margin included


async def test_a_scheduler_of_no_workers_starts_no_pool(nursery: trio.Nursery) -> None:
    def no_pool() -> WorkerPool:
        raise AssertionError("a submit-only node starts no sandbox pool")

    s = Scheduler(0, no_pool)
    await nursery.start(s.run)
    assert s.worker_pids() == [] and s.slots(wall_ms()) == []
