"""The executor's queue learns, from real runs on a real sandbox pool, the fuel each module uses and the
time its runs take: a job of a module run often enough is estimated at that, not at its budget; a
heavier run raises it at once, and a run stopped at its deadline counts what its time could burn."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest
import trio
from e31.node.market.history import HEADROOM, MIN_RUNS
from e31.node.market.scheduler import JobInfo, JobLate, Scheduler, wall_ms
from e31.sandbox.job import JobSpec
from e31.sandbox.limits import Limits
from e31.sandbox.pool import WorkerPool
from market_nodes import until

WORKLOADS = Path(__file__).resolve().parents[2] / "sandbox" / "workloads"
PROFILE = b"p" * 32
BUDGET = 10_000_000_000
"""The default budget (node/api/jobs.py)."""
WALL_MS = 60_000
MODULE = (WORKLOADS / "montecarlo.wasm").read_bytes()
ROOT = hashlib.sha256(MODULE).digest()  # (any bytes naming the module: the scheduler only compares them)


@pytest.fixture
async def scheduler(tmp_path: Path, nursery: trio.Nursery) -> Scheduler:
    s = Scheduler(1, lambda: WorkerPool(1, tmp_path / "cache"))
    await nursery.start(s.run)
    return s


def job(key: bytes, deadline: int, fuel: int = BUDGET, module: bytes = ROOT) -> JobInfo:
    return JobInfo(key, b"S", deadline, fuel, WALL_MS, PROFILE, module)


def spec(seed: int, samples: int, fuel: int = BUDGET) -> JobSpec:
    return JobSpec(module=MODULE, args=(str(seed), str(samples)), limits=Limits(fuel=fuel, wall_seconds=60.0))


async def test_a_modules_runs_teach_its_jobs_estimate_and_a_heavier_run_raises_it(
    scheduler: Scheduler, tmp_path: Path
) -> None:
    far = wall_ms() + 600_000
    used = []
    for i in range(MIN_RUNS):
        assert scheduler.estimate_ms(PROFILE, BUDGET, WALL_MS, ROOT) == scheduler.estimate_ms(
            PROFILE, BUDGET, WALL_MS
        )  # not yet: planned at its budget
        record = await scheduler.execute(
            spec(i, 1000), tmp_path / f"o{i}", estimate_ms=1, job=job(b"%d" % i, far)
        )
        used.append(record.result.fuel_used)
    planned = scheduler.history.fuel(PROFILE, ROOT, BUDGET)
    assert used[-1] * HEADROOM <= planned <= max(used) * HEADROOM  # (a decayed maximum)
    by_fuel = scheduler.estimate_ms(PROFILE, BUDGET, WALL_MS, ROOT)
    assert by_fuel < scheduler.estimate_ms(PROFILE, BUDGET, WALL_MS)
    assert by_fuel == scheduler.calibration.estimate_ms(PROFILE, planned, WALL_MS)
    # once timed often enough (the first run's time, its compile's, is not counted), at most what its
    # runs took here: a tiny run's time is mostly fixed cost, so the rate such runs teach is far too
    # low and the fuel's estimate far too long
    assert scheduler.history.run_ms(PROFILE, ROOT) is None
    record = await scheduler.execute(spec(7, 1000), tmp_path / "o7", estimate_ms=1, job=job(b"7", far))
    used.append(record.result.fuel_used)
    by_time = scheduler.history.run_ms(PROFILE, ROOT)
    assert by_time is not None
    planned = scheduler.history.fuel(PROFILE, ROOT, BUDGET)
    learned_ms = scheduler.estimate_ms(PROFILE, BUDGET, WALL_MS, ROOT)
    assert learned_ms == min(scheduler.calibration.estimate_ms(PROFILE, planned, WALL_MS), by_time)
    # the queue plans a waiting job of that module at the learned estimate
    scheduler.suspend()
    async with trio.open_nursery() as n:
        waiting = partial(scheduler.execute, spec(9, 1000), tmp_path / "w", estimate_ms=1, job=job(b"w", far))
        n.start_soon(waiting)
        await until(scheduler.promised)
        assert [t.estimate_ms for t in scheduler.promised()] == [
            scheduler.estimate_ms(PROFILE, BUDGET, WALL_MS, ROOT)
        ]
        scheduler.resume()
    # a run of the same module using far more fuel (its input asks more) is a miss: planned at once for it
    assert scheduler.fuel_misses == 0
    heavy = await scheduler.execute(spec(5, 200_000), tmp_path / "h", estimate_ms=1, job=job(b"h", far))
    assert heavy.result.fuel_used > max(used) * HEADROOM
    assert scheduler.fuel_misses == 1
    assert scheduler.history.fuel(PROFILE, ROOT, BUDGET) == heavy.result.fuel_used * HEADROOM
    # another module's jobs are untouched
    assert scheduler.history.fuel(PROFILE, b"another module", BUDGET) == BUDGET


async def test_a_run_stopped_at_its_deadline_counts_what_its_time_could_burn(
    scheduler: Scheduler, tmp_path: Path
) -> None:
    far = wall_ms() + 600_000
    big = 10**13
    for i in range(MIN_RUNS):
        await scheduler.execute(
            spec(i, 1000, big), tmp_path / f"o{i}", estimate_ms=1, job=job(b"%d" % i, far, big)
        )
    planned = scheduler.history.fuel(PROFILE, ROOT, big)
    scheduler.calibration = replace(scheduler.calibration, rates={PROFILE: 10**9})  # (tiny runs say little)
    deadline = wall_ms() + 500
    long = spec(6, 2_000_000_000, big)  # far longer than 500 ms even on a fast core
    with pytest.raises(JobLate):
        await scheduler.execute(long, tmp_path / "late", estimate_ms=1, job=job(b"late", deadline, big))
    # its fuel is not known: at least what 500 ms or so at the calibrated rate burns
    seen = scheduler.history.seen(PROFILE, ROOT)
    assert seen is not None and seen.peak >= 10**9 * 400 // 1000 > planned
    assert scheduler.history.fuel(PROFILE, ROOT, big) < big
    assert scheduler.fuel_misses == 1


async def test_a_job_of_no_known_module_keeps_the_budgets_estimate(
    scheduler: Scheduler, tmp_path: Path
) -> None:
    far = wall_ms() + 600_000
    for i in range(MIN_RUNS + 1):
        await scheduler.execute(
            spec(i, 1000), tmp_path / f"o{i}", estimate_ms=1, job=job(b"%d" % i, far, module=b"")
        )
    assert len(scheduler.history) == 0
    assert scheduler.estimate_ms(PROFILE, BUDGET, WALL_MS, b"") == scheduler.calibration.estimate_ms(
        PROFILE, BUDGET, WALL_MS
    )


async def test_waiting_jobs_of_a_module_are_planned_anew_as_it_is_learned(
    scheduler: Scheduler, tmp_path: Path
) -> None:
    far = wall_ms() + 600_000
    budget_ms = scheduler.estimate_ms(PROFILE, BUDGET, WALL_MS)
    scheduler.suspend()  # they wait
    async with trio.open_nursery() as n:
        for i in range(2):
            n.start_soon(
                partial(
                    scheduler.execute,
                    spec(i, 1000),
                    tmp_path / f"w{i}",
                    estimate_ms=1,
                    job=job(b"w%d" % i, far),
                )
            )
        other = JobInfo(b"x", b"S", far, BUDGET, WALL_MS, PROFILE, b"another module")
        n.start_soon(partial(scheduler.execute, spec(2, 1000), tmp_path / "x", estimate_ms=1, job=other))
        await until(lambda: len(scheduler.promised()) == 3)
        assert {t.estimate_ms for t in scheduler.promised()} == {budget_ms}
        for _ in range(MIN_RUNS):  # runs of the module elsewhere in this queue
            scheduler.learn(job(b"r", far), 100_000)
        learned = scheduler.estimate_ms(PROFILE, BUDGET, WALL_MS, ROOT)
        assert learned < budget_ms
        by_key = {t.key: t.estimate_ms for t in scheduler.promised()}
        assert by_key == {b"w0": learned, b"w1": learned, b"x": budget_ms}
        assert scheduler.backlog_ms == 2 * learned + 1  # the /metrics backlog (x: the estimate it came with)
        scheduler.learn(job(b"r", far), 100_000_000)  # a miss: planned for it at once
        assert scheduler.fuel_misses == 1
        heavier = scheduler.estimate_ms(PROFILE, BUDGET, WALL_MS, ROOT)
        assert heavier > learned
        assert {t.key: t.estimate_ms for t in scheduler.promised()}[b"w0"] == heavier
        scheduler.resume()
