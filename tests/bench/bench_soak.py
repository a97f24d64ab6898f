"""Resident memory of a 3-node network over a long run of tiny jobs: is it flat?

    .venv/bin/python tests/bench/bench_soak.py [--quick] [--jobs 10000] [--interval 2]

Starts three `e31 node run` processes on 127.0.0.1 (one core each), runs a warm-up (caches,
compiled modules, allocator pools and SQLite's page cache fill up), then `--jobs` tiny jobs submitted
by several clients to the first node. Every `--interval` seconds it samples each node's resident
memory (the node process and its sandbox workers, from /proc) against the number of jobs done.
The slope of a least-squares line through those samples is the growth per job, printed for the
whole run and for its second half: a cache filling up (SQLite's page cache, allocator pools) flattens
out, a leak keeps its slope. Floor (issue 8: memory flat over the run, no growth per job beyond what
the store keeps on disk), judged on the second half: the three nodes together grow by at most
FLOOR_BYTES_PER_JOB bytes per job, about 10 MB per 10,000 jobs. A --quick run is short and its slope
is noisy: read it as a smoke test. Exits 1 if a job fails or the floor is missed.
"""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

from bench_jobs import BenchError, net, submit, throughput, tiny, wait
from e31.node.api.client import ApiClientError
from e31.node.demo.net import process_tree_rss

FLOOR_BYTES_PER_JOB = 1024
MIB = 1 << 20


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of y over x."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1,000 jobs instead of 10,000")
    parser.add_argument("--jobs", type=int)
    parser.add_argument("--warmup", type=int, default=300, help="jobs run before measuring")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between memory samples")
    args = parser.parse_args()
    if not Path("/proc/self/status").is_file():
        print("bench_soak: needs Linux /proc to measure memory", file=sys.stderr)
        return 1
    jobs = args.jobs or (1_000 if args.quick else 10_000)
    samples: list[tuple[int, list[int]]] = []
    try:
        with net(3, cores=1) as network:
            api = network.nodes[0].api(timeout=60)
            wait(api, submit(api, tiny(0)))
            throughput(network, args.warmup, args.clients, 1)
            pids = [n.pid for n in network.nodes]
            done_at: list[float] = []
            stop = threading.Event()

            def sample() -> None:
                while True:
                    rss = [process_tree_rss([pid]) or 0 for pid in pids]
                    samples.append((len(done_at), rss))
                    if stop.wait(args.interval):
                        return

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            try:
                rates = throughput(network, jobs, args.clients, 1_000_000, done_at)
            finally:
                stop.set()
                sampler.join()
            samples.append((len(done_at), [process_tree_rss([pid]) or 0 for pid in pids]))
    except (ApiClientError, BenchError) as e:
        print(f"bench_soak: {e}", file=sys.stderr)
        return 1
    first, last = samples[0], samples[-1]
    per_node = [slope([(done, rss[i]) for done, rss in samples]) for i in range(3)]
    half = [(done, rss) for done, rss in samples if done >= jobs // 2]
    per_node_half = [slope([(done, rss[i]) for done, rss in half]) for i in range(3)]
    whole = slope([(done, sum(rss)) for done, rss in samples])
    # a cache filling up (SQLite's pages, allocator pools) flattens out; a leak keeps its slope
    total = slope([(done, sum(rss)) for done, rss in half])
    peak = max(sum(rss) for _, rss in samples)
    print(
        f"e31 soak: {jobs} tiny jobs over 3 local nodes after {args.warmup} warm-up jobs, "
        f"{rates['overall']:.1f} jobs/s, {len(samples)} memory samples every {args.interval:g} s"
    )
    for i in range(3):
        print(
            f"  node{i + 1}: RSS {first[1][i] / MIB:6.1f} MiB -> {last[1][i] / MIB:6.1f} MiB, "
            f"slope {per_node[i]:8.1f} bytes/job, {per_node_half[i]:8.1f} over the second half"
        )
    print(
        f"  all nodes: RSS {sum(first[1]) / MIB:.1f} MiB -> {sum(last[1]) / MIB:.1f} MiB (peak "
        f"{peak / MIB:.1f} MiB), slope {whole:.1f} bytes/job over the run, {total:.1f} bytes/job "
        "over its second half (judged)"
    )
    if total > FLOOR_BYTES_PER_JOB:
        print(f"  FLOOR MISSED: memory grows {total:.0f} bytes per job (> {FLOOR_BYTES_PER_JOB})")
        return 1
    print(f"  flat: at most {FLOOR_BYTES_PER_JOB} bytes/job")
    return 0


if __name__ == "__main__":
    sys.exit(main())
