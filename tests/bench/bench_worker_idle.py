"""CPU per tiny job in a sandbox worker when jobs come with pauses between them: one at a time, or in sets.

    .venv/bin/python tests/bench/bench_worker_idle.py [--jobs N] [--rounds R] [--gap-ms G] [--set K]

In a sweep a node's worker gets a job, then waits for the next one (the results go out, the next
assignment comes in): it is idle between jobs, not fed back to back as in bench_worker_cpu.py. This
runs the same tiny job (montecarlo, 1,000 samples, an output and a streams dir) on `WorkerPool(1)`
three ways, interleaved in each round: back to back (each job sent when the last ended), one at a
time with a pause of G ms after each, and in sets of K (handed to `submit` at once, so they run back
to back) with a pause of G ms after each set; and the in-process run as the floor. CPU per job in ms
(the worker's from /proc, the pool's process from `time.process_time()`, sleeping excluded): median
and least of the rounds.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from bench_worker_cpu import in_process, proc_cpu, spec
from e31.sandbox.limits import Status
from e31.sandbox.pool import WorkerPool


def paced(pool: WorkerPool, jobs: int, work: Path, set_size: int, gap: float) -> tuple[float, float]:
    [pid] = pool.worker_pids()
    w, t = proc_cpu(pid), time.process_time()
    for first in range(0, jobs, set_size):
        handles = [
            pool.submit(spec(i), work / f"o{i}", streams_dir=work / f"s{i}")
            for i in range(first, min(jobs, first + set_size))
        ]
        for h in handles:
            assert h.wait(60).status is Status.EXITED
        if gap:
            time.sleep(gap)
    return (proc_cpu(pid) - w) / jobs, (time.process_time() - t) / jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=320)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--gap-ms", type=float, default=30.0)
    parser.add_argument("--set", type=int, default=8, dest="set_size")
    args = parser.parse_args()
    gap = args.gap_ms / 1000
    ways = {
        "back to back": (1, 0.0),
        f"one at a time, {args.gap_ms:g} ms apart": (1, gap),
        f"sets of {args.set_size}, {args.gap_ms:g} ms apart": (args.set_size, gap),
    }
    rows: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp, WorkerPool(1, Path(tmp) / "cache") as pool:
        pool.run(spec(0), Path(tmp) / "warm")
        for r in range(args.rounds):
            work = Path(tmp) / f"r{r}"
            rows.setdefault("in-process (the floor)", []).append(in_process(args.jobs, work))
            for name, (size, pause) in ways.items():
                worker, parent = paced(pool, args.jobs, work / name.split(",")[0], size, pause)
                rows.setdefault(f"{name}: worker", []).append(worker)
                rows.setdefault(f"{name}: pool's process", []).append(parent)
    print(f"{args.jobs} tiny jobs x {args.rounds} rounds; CPU per job, ms: median and least of the rounds")
    for name, values in rows.items():
        print(f"  {name:44s} {statistics.median(values) * 1000:6.3f} {min(values) * 1000:6.3f}")


if __name__ == "__main__":
    main()
