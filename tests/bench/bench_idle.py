"""What an idle node costs: CPU per second of K linked nodes with nothing to do, per node.

    .venv/bin/python tests/bench/bench_idle.py [--nodes K] [--seconds S] [--heartbeat H] [--settle W]

Starts K `e31 node run` processes on 127.0.0.1 (bench_jobs.py's local network, every node linked to
every other), runs one job so every path has run once, waits W s (default 10: the capacity adverts
and peer exchanges each new link sets off are over), then reads each node's CPU time over S seconds
from /proc/<pid>/task/*/schedstat (nanoseconds on the CPU per thread of the node process, finer than
the 10 ms ticks of /proc/<pid>/stat; its idle sandbox workers are not counted) and prints it per node
and in all, in ms of CPU per second. `--heartbeat` is the links' heartbeat interval: the local
network's 0.5 s (what the other benchmarks run with, so links form and fail fast) or a node's default
of 15 s. Linux only.
Bounded: one job, then W + S seconds.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_jobs
from e31.node.api.client import ApiClientError
from e31.node.demo.net import HEARTBEAT, LocalNetwork, NetworkError


def on_cpu_ns(pid: int) -> dict[int, int]:
    """Nanoseconds each thread of `pid` alive now has spent on a CPU, by thread id."""
    out: dict[int, int] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[int(task.name)] = int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):  # a thread that ended meanwhile
            continue
    return out


def spent_ns(before: dict[int, int], after: dict[int, int]) -> int:
    """CPU time between two readings: each thread alive at the second, from the first or its start (a
    thread that ended between them is not counted: the store's and trio's idle worker threads end after
    10 s, so a node at rest has none that ends within a window)."""
    return sum(ns - before.get(tid, 0) for tid, ns in after.items())


def measure(nodes: int, heartbeat: float, settle: float, seconds: float) -> tuple[list[int], float]:
    """Each node's CPU (ns) over about `seconds` at rest, and the seconds it was measured over."""
    with tempfile.TemporaryDirectory(prefix="e31-bench-") as tmp:
        extra = ("--cores", "1", *bench_jobs.NODE_ARGS)
        network = LocalNetwork(Path(tmp), nodes, extra_args=extra, heartbeat=heartbeat)
        try:
            network.start()
            api = network.nodes[0].api(timeout=60)
            bench_jobs.wait(api, bench_jobs.submit(api, bench_jobs.tiny(0)))
            time.sleep(settle)
            pids = [n.pid for n in network.nodes]
            before = [on_cpu_ns(p) for p in pids]
            began = time.monotonic()
            time.sleep(seconds)
            spent = [spent_ns(b, on_cpu_ns(p)) for p, b in zip(pids, before, strict=True)]
            return spent, time.monotonic() - began
        finally:
            network.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=3, help="linked nodes (default 3)")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long to measure (default 20)")
    parser.add_argument("--settle", type=float, default=10.0, help="wait before measuring, s (default 10)")
    parser.add_argument(
        "--heartbeat", type=float, default=HEARTBEAT, help=f"heartbeat interval, s (default {HEARTBEAT})"
    )
    args = parser.parse_args()
    if not 1 <= args.nodes <= 16:
        parser.error("--nodes is 1 to 16")
    if not 1 <= args.seconds <= 600:
        parser.error("--seconds is 1 to 600")
    if not 0 <= args.settle <= 600:
        parser.error("--settle is 0 to 600")
    if not 0.1 <= args.heartbeat <= 600:
        parser.error("--heartbeat is 0.1 to 600")
    if not Path("/proc/self/task").is_dir():
        parser.error("needs Linux's /proc")
    try:
        spent, seconds = measure(args.nodes, args.heartbeat, args.settle, args.seconds)
    except (NetworkError, ApiClientError, bench_jobs.BenchError) as e:
        print(f"bench_idle: {e}", file=sys.stderr)
        return 1
    per_node = [ns / 1e6 / seconds for ns in spent]
    shown = ", ".join(f"{x:.1f}" for x in per_node)
    print(f"{args.nodes} idle nodes, heartbeat {args.heartbeat:g} s, {seconds:.0f} s measured")
    total = sum(per_node)
    print(f"  CPU per node: {shown} ms/s; all: {total:.1f} ms/s ({total / 10:.2f}% of a core)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
