"""What a run that ends with no result gives back to its submitter's fair share: only the time it ran,
never the time it was paused on its worker (the meter's `paused_ms`, billed nowhere)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import trio
from e31.node.market.scheduler import JobInfo, JobLate, Scheduler, wall_ms
from e31.sandbox.job import JobSpec
from e31.sandbox.limits import Limits, Status
from e31.sandbox.pool import WorkerPool

WORKLOADS = Path(__file__).resolve().parents[2] / "sandbox" / "workloads"
PROFILE = b"p" * 32
BUDGET = 10**11
"""A hundred seconds or so of fuel at the default rate: the run outlives its deadline, and the decay of
the budget charged at its start (its half-life is minutes) stays far below the run time billed."""


@pytest.fixture
async def scheduler(tmp_path: Path, nursery: trio.Nursery) -> Scheduler:
    s = Scheduler(1, lambda: WorkerPool(1, tmp_path / "cache"))
    await nursery.start(s.run)
    return s


def long_run() -> JobSpec:
    # far longer than its deadline even on a fast core
    spec = JobSpec(module=(WORKLOADS / "montecarlo.wasm").read_bytes(), args=("6", "2000000000"))
    return dataclasses.replace(spec, limits=Limits(fuel=BUDGET, wall_seconds=120.0))


async def test_a_run_paused_until_its_deadline_is_refunded_its_paused_time(
    scheduler: Scheduler, tmp_path: Path
) -> None:
    deadline = wall_ms() + 1500
    rate = scheduler.calibration.rate(PROFILE)
    started: list[int] = []
    paused_by: list[int] = []

    def pause_at_once(started_at: int) -> None:
        started.append(started_at)
        scheduler.suspend()  # the machine's owner is back: the run holds its worker, paused
        paused_by.append(wall_ms())

    job = JobInfo(b"k" * 32, b"S", deadline, BUDGET, 120_000, PROFILE)
    with pytest.raises(JobLate):
        await scheduler.execute(long_run(), tmp_path / "late", estimate_ms=1, job=job, on_start=pause_at_once)
    assert wall_ms() >= deadline and scheduler.stopped_late == 1
    # It ran at most from its start to its pause; paused until its deadline, it burnt nothing more.
    ran_ms = paused_by[0] - started[0]
    assert ran_ms < deadline - started[0]
    assert scheduler.usage.value(b"S", wall_ms()) <= ran_ms * rate // 1000
    scheduler.resume()
    with trio.fail_after(60):
        spec = JobSpec(module=(WORKLOADS / "montecarlo.wasm").read_bytes(), args=("7", "1000"))
        record = await scheduler.execute(spec, tmp_path / "next", estimate_ms=1)
    assert record.result.status is Status.EXITED
