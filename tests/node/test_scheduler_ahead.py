"""Jobs handed to the pool ahead of a free worker while runs are short (Scheduler.ahead_ms, SHORT_RUNS):
they start in the policy's order, are cancelled without touching the running job, and one whose deadline
passes while it waits for a worker never starts."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from e31.node.market.scheduler import SHORT_RUNS, JobExpired, JobInfo, Scheduler, wall_ms
from e31.sandbox.job import JobSpec
from e31.sandbox.limits import Limits, Status
from e31.sandbox.pool import WorkerPool
from e31.sandbox.runner import wat_to_wasm
from market_nodes import until

WORKLOADS = Path(__file__).resolve().parents[2] / "sandbox" / "workloads"
LOOP = wat_to_wasm('(module (func (export "_start") (loop (br 0))))')
ECHO = (WORKLOADS / "echo.wasm").read_bytes()


def echo(word: str) -> JobSpec:
    return JobSpec(module=ECHO, args=(word,))


@pytest.fixture
async def scheduler(tmp_path: Path, nursery: trio.Nursery) -> Scheduler:
    s = Scheduler(1, lambda: WorkerPool(1, tmp_path / "cache"), ahead_ms=60_000)  # every run counts short
    await nursery.start(s.run)
    for i in range(SHORT_RUNS):  # short runs in a row: from now on a job is handed ahead
        record = await s.execute(echo(str(i)), tmp_path / f"warm{i}", estimate_ms=1)
        assert record.result.status is Status.EXITED
    assert s.short_runs >= SHORT_RUNS
    return s


async def long_run(scheduler: Scheduler, tmp_path: Path, started: list[str], job: JobInfo | None) -> None:
    """A loop of up to 600 s, recorded as "long" in `started` when it starts."""
    spec = JobSpec(LOOP, limits=Limits(wall_seconds=600.0))
    await scheduler.execute(
        spec, tmp_path / "long", estimate_ms=1, job=job, on_start=lambda at: started.append("long")
    )


async def test_jobs_handed_ahead_start_in_arrival_order_each_after_the_last_ended(
    scheduler: Scheduler, tmp_path: Path
) -> None:
    records = {}
    held: list[int] = []  # jobs the scheduler had given a worker or handed ahead, as each one started

    async def one(i: int) -> None:
        records[i] = await scheduler.execute(
            echo(str(i)),
            tmp_path / f"out{i}",
            estimate_ms=1,
            on_start=lambda at: held.append(len(scheduler._running)),
        )

    scheduler.suspend()  # all of them queued before any starts
    async with trio.open_nursery() as n:
        for i in range(6):
            n.start_soon(one, i)
            await trio.sleep(0.01)
        await until(lambda: scheduler.queue_length == 6, 30)
        scheduler.resume()
    assert max(held) == 2  # one running, the next waiting in the pool
    assert [records[i].result.stdout for i in range(6)] == [b"%d\n" % i for i in range(6)]
    for i in range(1, 6):
        assert records[i].started_at >= records[i - 1].finished_at
        assert records[i].queued_at <= records[i].started_at <= records[i].finished_at


async def test_a_job_ahead_cancelled_never_runs_and_the_running_one_goes_on(
    scheduler: Scheduler, tmp_path: Path
) -> None:
    started: list[str] = []
    long_done: list[Status] = []

    async def long() -> None:
        spec = JobSpec(LOOP, limits=Limits(wall_seconds=1.0))
        record = await scheduler.execute(
            spec, tmp_path / "long", estimate_ms=1, on_start=lambda at: started.append("long")
        )
        long_done.append(record.result.status)

    async with trio.open_nursery() as n:
        n.start_soon(long)
        await until(lambda: started == ["long"], 30)
        with trio.move_on_after(0.2) as scope:
            await scheduler.execute(
                echo("never"), tmp_path / "ahead", estimate_ms=1, on_start=lambda at: started.append("ahead")
            )
        assert scope.cancelled_caught
    assert started == ["long"] and long_done == [Status.TIMEOUT]  # ran to its own wall limit
    record = await scheduler.execute(echo("after"), tmp_path / "after", estimate_ms=1)
    assert record.result.stdout == b"after\n"


async def test_a_job_ahead_whose_deadline_passes_behind_a_long_run_never_starts(
    scheduler: Scheduler, tmp_path: Path
) -> None:
    started: list[str] = []

    async with trio.open_nursery() as n:
        n.start_soon(long_run, scheduler, tmp_path, started, None)
        await until(lambda: started == ["long"], 30)
        deadline = wall_ms() + 300
        job = JobInfo(b"short", b"S", deadline, 10**8, 30_000, b"p" * 32)
        with pytest.raises(JobExpired):
            await scheduler.execute(
                echo("late"),
                tmp_path / "short",
                estimate_ms=1,
                job=job,
                on_start=lambda at: started.append("short"),
            )
        assert wall_ms() >= deadline and started == ["long"] and scheduler.expired == 1
        n.cancel_scope.cancel()


async def test_a_job_ahead_behind_a_long_run_is_held_back_for_a_withdraw_and_never_runs(
    scheduler: Scheduler, tmp_path: Path
) -> None:
    """A withdraw is for a job no worker has yet (docs/protocol.md, `withdraw`): one handed ahead waits
    in the pool's queue behind the running job, however long that runs, so it is taken back out of
    it in the step that checks no worker was chosen for it (hold_back); the running job is left alone
    (no withdrawal ever stops a started job)."""
    started: list[str] = []

    async with trio.open_nursery() as n:
        job = JobInfo(b"long", b"S", wall_ms() + 900_000, 10**8, 600_000, b"p" * 32)
        n.start_soon(long_run, scheduler, tmp_path, started, job)
        await until(lambda: started == ["long"], 30)
        ahead = JobInfo(b"ahead", b"S", wall_ms() + 600_000, 10**8, 30_000, b"p" * 32)
        with trio.CancelScope() as scope:  # the executor's scope for the job (held.py)

            async def withdraw_once_handed_ahead() -> None:
                await until(lambda: any(e.ahead and e.handle is not None for e in scheduler._running), 30)
                assert not scheduler.hold_back(b"long")  # a worker has it: left alone
                assert scheduler.hold_back(b"ahead")  # taken out of the pool's queue
                scope.cancel()

            n.start_soon(withdraw_once_handed_ahead)
            await scheduler.execute(
                echo("never"),
                tmp_path / "ahead",
                estimate_ms=1,
                job=ahead,
                on_start=lambda at: started.append("x"),
            )
        assert scope.cancelled_caught
        await trio.sleep(0.5)  # (were it still queued, the pool would hand it on only after the loop)
        assert started == ["long"] and any(e.job and e.job.key == b"long" for e in scheduler._running)
        assert scheduler.hold_back(b"not queued here")
        n.cancel_scope.cancel()


async def test_a_job_handed_ahead_moves_its_workers_end_on_and_never_takes_the_worker_out_of_the_plan(
    scheduler: Scheduler, tmp_path: Path
) -> None:
    """Bids plan on `slots()` (bidding.py): a job waiting in the pool for the busy worker runs after the
    running one, so that worker comes free after both; and while a job handed ahead has not started
    (its task learns that the pool sent it a turn later) the worker is still a core to plan on, not
    gone from the plan (which would make every offered job look late)."""
    started: list[str] = []
    async with trio.open_nursery() as n:
        n.start_soon(long_run, scheduler, tmp_path, started, None)  # estimated at 1 ms, runs 600 s
        await until(lambda: started == ["long"], 30)

        async def ahead() -> None:
            await scheduler.execute(echo("ahead"), tmp_path / "ahead", estimate_ms=5_000)

        n.start_soon(ahead)
        await until(lambda: any(e.ahead and e.handle is not None for e in scheduler._running), 30)
        now = wall_ms()
        slots = scheduler.slots(now)
        assert len(slots) == 1 and slots[0].free_at >= now + 5_000  # after the long run, then the one ahead
        # the long run's entry gone, its worker taken by the job ahead (not started yet): one slot still
        running = next(e for e in scheduler._running if not e.ahead)
        scheduler._running.discard(running)
        try:
            slots = scheduler.slots(now)
            assert len(slots) == 1 and now + 5_000 <= slots[0].free_at <= now + 5_001
        finally:
            scheduler._running.add(running)
        n.cancel_scope.cancel()
