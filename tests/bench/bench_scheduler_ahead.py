"""CPU per tiny job through the executor's scheduler and its pool, with and without jobs handed ahead.

    .venv/bin/python tests/bench/bench_scheduler_ahead.py [--burst N] [--bursts B] [--rounds R]

A `Scheduler(1)` over a real `WorkerPool(1)` is given bursts of N tiny jobs at once (montecarlo, 1,000
samples, an output and a streams dir each), B bursts 30 ms apart, as an executor is given the jobs a
bid won together. Two ways, interleaved in each round: jobs handed ahead while runs are short (the
default: docs/scheduling.md, "Short runs"), and never (`ahead_ms=0`: no run counts as short, so a
worker is given its next job only when it is free). Prints CPU per job in ms of the worker (/proc) and
of this process (the event loop, the pool's supervisor thread: `time.process_time()`), and the
voluntary context switches of this process per job; medians of the rounds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path

import trio
from bench_worker_cpu import proc_cpu, spec, switches
from e31.node.market.scheduler import AHEAD_MS, Scheduler
from e31.sandbox.pool import WorkerPool


async def bursts(ahead_ms: int, burst: int, count: int, work: Path) -> tuple[float, float, float]:
    s = Scheduler(1, lambda: WorkerPool(1, work / "cache"), ahead_ms=ahead_ms)
    async with trio.open_nursery() as nursery:
        await nursery.start(s.run)
        for i in range(3):  # compiled, cached, and (by default) runs counted short
            await s.execute(spec(i), work / f"warm{i}", estimate_ms=1)
        [pid] = s.worker_pids()
        w, t, n = proc_cpu(pid), time.process_time(), switches(os.getpid())
        for b in range(count):
            async with trio.open_nursery() as jobs:
                for i in range(burst):
                    jobs.start_soon(partial(s.execute, spec(i), work / f"b{b}-{i}", estimate_ms=1))
            await trio.sleep(0.03)
        total = burst * count
        got = (
            (proc_cpu(pid) - w) / total,
            (time.process_time() - t) / total,
            (switches(os.getpid()) - n) / total,
        )
        nursery.cancel_scope.cancel()
    return got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--burst", type=int, default=16)
    parser.add_argument("--bursts", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows: dict[str, list[tuple[float, float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name, ahead_ms in (("handed ahead", AHEAD_MS), ("never ahead", 0)):
                work = Path(tmp) / f"{r}-{ahead_ms}"
                rows.setdefault(name, []).append(trio.run(bursts, ahead_ms, args.burst, args.bursts, work))
    print(f"{args.bursts} bursts of {args.burst} tiny jobs, 30 ms apart, x {args.rounds} rounds; medians")
    print(f"  {'':14s} {'worker ms/job':>14s} {'this process ms/job':>20s} {'switches/job':>13s}")
    for name, values in rows.items():
        worker, parent, sw = (statistics.median(v[k] for v in values) for k in range(3))
        print(f"  {name:14s} {worker * 1000:14.3f} {parent * 1000:20.3f} {sw:13.2f}")


if __name__ == "__main__":
    main()
