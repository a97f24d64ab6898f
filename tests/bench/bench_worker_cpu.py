"""CPU per tiny job in a sandbox worker process against the same run in-process.

    .venv/bin/python tests/bench/bench_worker_cpu.py [--jobs N] [--rounds R]

The job is the sweep's tiny job (sandbox/workloads/montecarlo.wasm, 1,000 samples, an output dir and a
streams dir per job, as the executor gives them). Three ways, interleaved in each round so the host's
load hits them alike:
- `in-process`: `runner.run` in this process with the module compiled once (the floor a worker can
  reach: no pipes, no process);
- `pool, one at a time`: `WorkerPool(1).run`, each job sent when the last one ended (what a worker
  does when the scheduler feeds it one job per round trip);
- `pool, queued`: all N jobs handed to `WorkerPool(1).submit` at once (when the pool has it), so the
  next job waits in the pool while one runs.
CPU is user+sys from /proc/PID/stat (the worker's) and `time.process_time()` (this process, all its
threads: for the pool, the supervisor thread's side). Per job, in ms: the median and the least of the
rounds (on a loaded host the least is the figure the neighbours disturbed least).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

from e31.sandbox.cache import ModuleCache
from e31.sandbox.job import JobSpec
from e31.sandbox.limits import Status
from e31.sandbox.pool import WorkerPool
from e31.sandbox.profile import new_engine
from e31.sandbox.runner import run

ROOT = Path(__file__).resolve().parents[2]
TINY = (ROOT / "sandbox" / "workloads" / "montecarlo.wasm").read_bytes()
TICKS = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def switches(pid: int) -> int:
    """Context switches (voluntary and not) of all the process's threads: each is a wake-up or a
    preemption, a count the host's load does not change much for voluntary ones."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith("voluntary_ctxt_switches"):
                total += int(line.split()[1])
    return total


def spec(i: int) -> JobSpec:
    return JobSpec(TINY, args=(str(i), "1000"))


def in_process(jobs: int, work: Path) -> float:
    engine = new_engine()
    module = ModuleCache(work / "cache-inproc").get(engine, TINY)
    run(spec(0), work / "warm", engine=engine, module=module)
    t = time.process_time()
    for i in range(jobs):
        r = run(spec(i), work / f"in{i}", engine=engine, module=module, streams_dir=work / f"ins{i}")
        assert r.status is Status.EXITED, r
    return (time.process_time() - t) / jobs


def one_at_a_time(pool: WorkerPool, jobs: int, work: Path) -> tuple[float, float, float, float]:
    [pid] = pool.worker_pids()
    w, t, n, m = proc_cpu(pid), time.process_time(), switches(pid), switches(os.getpid())
    for i in range(jobs):
        r = pool.run(spec(i), work / f"one{i}", streams_dir=work / f"ones{i}")
        assert r.status is Status.EXITED, r
    return (
        (proc_cpu(pid) - w) / jobs,
        (time.process_time() - t) / jobs,
        (switches(pid) - n) / jobs,
        (switches(os.getpid()) - m) / jobs,
    )


def queued(pool: WorkerPool, jobs: int, work: Path) -> tuple[float, float, float, float] | None:
    submit = getattr(pool, "submit", None)
    if submit is None:
        return None
    [pid] = pool.worker_pids()
    left = [jobs]
    all_done = threading.Condition()

    def done(_: object) -> None:
        with all_done:
            left[0] -= 1
            all_done.notify()

    w, t, n, m = proc_cpu(pid), time.process_time(), switches(pid), switches(os.getpid())
    handles = [
        submit(spec(i), work / f"q{i}", streams_dir=work / f"qs{i}", on_done=done) for i in range(jobs)
    ]
    with all_done:
        all_done.wait_for(lambda: left[0] == 0)
    cpu = (
        (proc_cpu(pid) - w) / jobs,
        (time.process_time() - t) / jobs,
        (switches(pid) - n) / jobs,
        (switches(os.getpid()) - m) / jobs,
    )
    assert all(h.wait(0).status is Status.EXITED for h in handles)
    return cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows: dict[str, list[float]] = {}
    waits: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp, WorkerPool(1, Path(tmp) / "cache") as pool:
        pool.run(spec(0), Path(tmp) / "warm")  # compiled and cached in the worker
        for r in range(args.rounds):
            work = Path(tmp) / f"r{r}"
            rows.setdefault("in-process", []).append(in_process(args.jobs, work))
            worker, parent, n, m = one_at_a_time(pool, args.jobs, work)
            rows.setdefault("pool, one at a time: worker", []).append(worker)
            rows.setdefault("pool, one at a time: this process", []).append(parent)
            waits.setdefault("pool, one at a time: worker", []).append(n)
            waits.setdefault("pool, one at a time: this process", []).append(m)
            got = queued(pool, args.jobs, work)
            if got is not None:
                rows.setdefault("pool, queued: worker", []).append(got[0])
                rows.setdefault("pool, queued: this process", []).append(got[1])
                waits.setdefault("pool, queued: worker", []).append(got[2])
                waits.setdefault("pool, queued: this process", []).append(got[3])
    print(f"{args.jobs} tiny jobs x {args.rounds} rounds; CPU per job, ms: median and least of the rounds")
    for name, values in rows.items():
        print(f"  {name:36s} {statistics.median(values) * 1000:6.3f} {min(values) * 1000:6.3f}")
    print("voluntary context switches (all the process's threads) per job, median of rounds")
    for name, values in waits.items():
        print(f"  {name:36s} {statistics.median(values):6.2f}")


if __name__ == "__main__":
    main()
