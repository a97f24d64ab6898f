"""Where a sweep's CPU goes: 3 local nodes and their sandbox workers under py-spy during one batch.

    .venv/bin/python tests/bench/profile_jobs.py [--jobs N] [--before K] [--rate HZ] [--nodes K] [--out DIR]
    .venv/bin/python tests/bench/profile_jobs.py --report DIR

Starts three (--nodes) `e31 node run` processes on 127.0.0.1 (bench_jobs.py's `net()`), runs a few warm-up
jobs, then records every node and sandbox worker with `py-spy record --format raw --gil --nonblocking`
while one batch of N tiny jobs runs (bench_jobs.py's sweep; with --before K after K unrecorded
sweeps of N jobs, so the stores hold their jobs and every node has run some), and writes
DIR/<process>.txt (the raw stacks) and DIR/result.json (CPU seconds per process from /proc, jobs
per executor, load). Then, or later with --report, prints per process its CPU per job and the share
of samples per bucket (the innermost frame that matches), the top innermost frames, the top
node/ and sandbox/ functions, and the samples by task: the coroutine each trio task started with (a
thread by its first frame past the thread machinery), which shows what a node spends per message or
per offer as well as per job.

`--gil` counts only samples taken while the thread holds the GIL. Without it, on a loaded host py-spy
counts threads waiting in fsync, epoll or a lock as busy. Shares are of samples, not exact CPU time:
a thread descheduled while it holds the GIL still counts (docs/benchmarks.md, "Jobs: where the time
goes"). Needs py-spy (`pip install py-spy`) and the right to trace the nodes (the same user, ptrace
allowed). Bounded: one batch of N jobs, each node given bench_jobs.py's timeouts.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_jobs

BUCKETS = (  # the first that matches the innermost frame it can, leaf first
    ("store: SQLite and node/store/", ("sqlite3", "node/store/")),
    ("signatures (PyNaCl)", ("nacl/",)),
    ("logging", ("logging/", "node/logs.py")),
    ("encoding: msgpack and protocol/", ("msgpack", "protocol/")),
    ("trio.to_thread and threading", ("trio/_threads", "threading.py", "concurrent/")),
    ("sandbox", ("sandbox/", "wasmtime/")),
    ("transport and peering", ("node/net/", "trio/_highlevel", "trio/_socket", "socket.py")),
    ("local API", ("node/api/",)),
    ("trio: scheduling, tasks, cancel scopes", ("trio/",)),
    ("market logic", ("node/market/",)),
)
OTHER = "other"


def _stat(pid: int) -> tuple[int, float]:
    """(parent pid, user + system CPU seconds) of `pid`, from /proc."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / bench_jobs.TICKS


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if _stat(int(entry))[0] == pid:
                    out.append(int(entry))
            except (OSError, IndexError):
                continue
    return sorted(out)


def record(jobs: int, rate: int, out: Path, spy: str, before: int = 0, nodes: int = 3) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with bench_jobs.net(nodes=nodes) as network:
        api = network.nodes[0].api(timeout=120)
        for seed in range(2 * nodes):  # every node compiles the module and starts its workers
            bench_jobs.wait(api, bench_jobs.submit(api, bench_jobs.tiny(seed)))
        for k in range(before):  # earlier sweeps: the recorded one runs with their jobs in the stores
            bench_jobs.sweep(network, jobs, 100_000 + k * jobs)
        procs: dict[str, int] = {}
        for i, node in enumerate(network.nodes):
            procs[f"node{i}"] = node.pid
            for j, child in enumerate(_children(node.pid)):
                procs[f"node{i}-worker{j}"] = child
        spies = []
        for name, pid in procs.items():
            command = [spy, "record", "--pid", str(pid), "--format", "raw", "--rate", str(rate), "--gil"]
            command += ["--nonblocking", "-o", str(out / f"{name}.txt")]
            spies.append(subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        try:
            time.sleep(3)  # py-spy attached
            cpu0 = {name: _stat(pid)[1] for name, pid in procs.items()}
            swept = bench_jobs.sweep(network, jobs, 300_000)
            cpu = {name: _stat(pid)[1] - cpu0[name] for name, pid in procs.items()}
        finally:
            for s in spies:
                s.send_signal(signal.SIGINT)
            for s in spies:
                s.wait(60)
        ran: dict[str, int] = collections.Counter(doc["executor"] for doc in api.get("/v1/jobs"))
        result = {
            "jobs": jobs,
            "before": before,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "load": os.getloadavg(),
            "sweep": swept,
            "cpu_ms_per_job": {name: seconds / jobs * 1000 for name, seconds in cpu.items()},
            "ran": {f"node{i}": ran.get(node.node_id, 0) for i, node in enumerate(network.nodes)},
        }
    (out / "result.json").write_text(json.dumps(result, indent=1) + "\n")


def _bucket(frames: list[str]) -> str:
    for frame in reversed(frames):
        for name, keys in BUCKETS:
            if any(k in frame for k in keys):
                return name
    return OTHER


def _task(frames: list[str]) -> str:
    """The trio task a stack ran in (the frame the event loop called), the event loop itself, or a
    thread by its first frame past the thread machinery (threading, trio.to_thread, outcome)."""
    loop = "the event loop itself (between tasks)"
    for i, frame in enumerate(frames):
        if frame.startswith("unrolled_run "):  # what it calls is a task's coroutine, or trio's own work
            return frames[i + 1] if i + 1 < len(frames) and "(trio/_core/" not in frames[i + 1] else loop
    if any(f.startswith("run (trio/_core/_run.py") for f in frames):
        return loop
    plumbing = r"\((threading|<frozen runpy>|trio/_core/_thread_cache|trio/_threads|outcome/)"
    own = [f for f in frames if not re.search(plumbing, f)]
    return f"thread: {own[0] if own else frames[0]}"


def report(out: Path, top: int = 15) -> None:
    result = json.loads((out / "result.json").read_text())
    print(f"{result['jobs']} jobs, {result['date']}, load {', '.join(f'{x:.1f}' for x in result['load'])}")
    print(f"jobs run per node (warm-up included): {result['ran']}")
    for name, cpu_ms in result["cpu_ms_per_job"].items():
        buckets: collections.Counter[str] = collections.Counter()
        leaves: collections.Counter[str] = collections.Counter()
        inclusive: collections.Counter[str] = collections.Counter()
        tasks: collections.Counter[str] = collections.Counter()
        for line in (out / f"{name}.txt").read_text().splitlines():
            if not line.strip():
                continue
            stack, count = line.rsplit(" ", 1)
            frames = [re.sub(r":\d+\)$", ")", f) for f in stack.split(";")]
            n = int(count)
            buckets[_bucket(frames)] += n
            leaves[frames[-1]] += n
            tasks[_task(frames)] += n
            for f in set(frames):
                if re.search(r"\((node|sandbox)/", f) and not re.search(r"\(node/(cli/|daemon|__main__)", f):
                    inclusive[f] += n
        total = sum(buckets.values()) or 1
        print(f"\n{name}: {cpu_ms:.2f} ms CPU per job of the sweep, {total} samples")
        for bucket, n in buckets.most_common():
            print(f"  {bucket:40} {100 * n / total:5.1f}%  {cpu_ms * n / total:5.2f} ms")
        print("  innermost frames:")
        for frame, n in leaves.most_common(top):
            print(f"    {100 * n / total:5.1f}%  {frame}")
        print("  node/ and sandbox/ functions, inclusive:")
        for frame, n in inclusive.most_common(top):
            print(f"    {100 * n / total:5.1f}%  {frame}")
        print("  by task (trio task or thread):")
        for frame, n in tasks.most_common(top):
            print(f"    {100 * n / total:5.1f}%  {cpu_ms * n / total:5.2f} ms  {frame}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000, help="jobs in the batch")
    parser.add_argument(
        "--before", type=int, default=0, help="sweeps of as many jobs run before the recorded one"
    )
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--nodes", type=int, default=3, help="nodes (node0 submits)")
    parser.add_argument("--out", type=Path, help="where the profiles go (default: a new temporary dir)")
    parser.add_argument("--report", type=Path, metavar="DIR", help="only print the report of DIR")
    args = parser.parse_args()
    if args.report is not None:
        report(args.report)
        return 0
    if not 1 <= args.nodes <= 16:
        parser.error("--nodes is 1 to 16")
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        print("profile_jobs: py-spy not found (pip install py-spy)", file=sys.stderr)
        return 1
    out = args.out or Path(tempfile.mkdtemp(prefix="e31-profile-"))
    try:
        record(args.jobs, args.rate, out, spy, args.before, args.nodes)
    except (bench_jobs.ApiClientError, bench_jobs.BenchError) as e:
        print(f"profile_jobs: {e}", file=sys.stderr)
        return 1
    report(out)
    print(f"\nraw stacks in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
