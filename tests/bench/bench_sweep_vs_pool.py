"""A sweep of tiny jobs on 3 local e31 nodes against a ProcessPoolExecutor(2), interleaved: the ratio.

    .venv/bin/python tests/bench/bench_sweep_vs_pool.py [--jobs N] [--rounds R]

Each round runs N tiny jobs (montecarlo, 1,000 samples, as bench_jobs.py's sweep) first through a
`ProcessPoolExecutor(2)` whose processes run them with e31's own sandbox runner (the module compiled
once per process, one job per task), then as one batch (`POST /v1/batches`) on three `e31 node run`
processes (bench_jobs.py's `net()`), so both are measured in the same minutes on the same loaded
host. Prints per round the pool's rate, the sweep's rate (first submit to last job ended), their ratio,
and the CPU per job of the submitting node (its process and sandbox workers) and of all the nodes,
from /proc; then the medians. Run it with another tree's venv to measure that tree's nodes: the
scripts are the same, `e31 node run` is the venv's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_jobs import TINY, BenchError, cpu_seconds, net, sweep, tiny, wait
from e31.node.api.client import ApiClientError
from e31.sandbox import runner
from e31.sandbox.job import JobSpec
from e31.sandbox.limits import Limits

_WORKER: dict[str, Any] = {}


def _warm() -> None:
    _WORKER["bytes"] = TINY.read_bytes()
    _WORKER["module"] = runner.compile_module(runner.default_engine(), _WORKER["bytes"])


def _run(seed: int) -> str:
    spec = JobSpec(
        module=_WORKER["bytes"],
        args=(str(seed), "1000"),
        limits=Limits(fuel=10**10, memory_bytes=64 << 20, wall_seconds=30, max_output_bytes=1 << 20),
    )
    return str(runner.run(spec, module=_WORKER["module"]).status)


def pool_rate(pool: ProcessPoolExecutor, jobs: int, first_seed: int) -> float:
    t0 = time.monotonic()
    statuses = list(pool.map(_run, range(first_seed, first_seed + jobs)))
    elapsed = time.monotonic() - t0
    if any(s != "exited" for s in statuses):
        raise BenchError(f"pool: jobs ended {sorted(set(statuses))}")
    return jobs / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000, help="jobs per sweep (default 1000)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    args = parser.parse_args()
    rows: list[tuple[float, float, float, float]] = []
    try:
        with ProcessPoolExecutor(2, initializer=_warm) as pool, net() as network:
            list(pool.map(time.sleep, [0.2, 0.2]))  # both processes started and warm
            api = network.nodes[0].api(timeout=60)
            wait(api, api.post("/v1/jobs", tiny(0))["job_id"])  # compiles the module on the nodes
            pids = [n.pid for n in network.nodes]
            seed = 1
            for r in range(args.rounds):
                pool_jobs_s = pool_rate(pool, args.jobs, seed)
                cpu_all, cpu_sub = cpu_seconds(pids), cpu_seconds(pids[:1])
                swept = sweep(network, args.jobs, 100_000 + seed)
                per_all = (cpu_seconds(pids) - cpu_all) / args.jobs
                per_sub = (cpu_seconds(pids[:1]) - cpu_sub) / args.jobs
                seed += args.jobs
                rows.append((pool_jobs_s, swept["overall"], per_sub, per_all))
                print(
                    f"round {r + 1}: pool {pool_jobs_s:.0f} jobs/s, e31 {swept['overall']:.1f} jobs/s "
                    f"({swept['overall'] / pool_jobs_s:.1%} of the pool); CPU per job: submitting node "
                    f"{per_sub * 1000:.1f} ms, all nodes {per_all * 1000:.1f} ms",
                    flush=True,
                )
    except (ApiClientError, BenchError) as e:
        print(f"bench_sweep_vs_pool: {e}", file=sys.stderr)
        return 1
    med = [statistics.median(col) for col in zip(*rows, strict=True)]
    ratios = statistics.median(e / p for p, e, _, _ in rows)
    print(
        f"median of {len(rows)} rounds, {args.jobs} jobs each: pool {med[0]:.0f} jobs/s, e31 {med[1]:.1f} "
        f"jobs/s, ratio {ratios:.1%}; CPU per job: submitting node {med[2] * 1000:.1f} ms, all nodes "
        f"{med[3] * 1000:.1f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
