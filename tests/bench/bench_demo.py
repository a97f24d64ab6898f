"""Benchmark: `e31 demo` with its defaults (3 nodes, 24 tiles): wall time, and the nodes' memory.

Runs the real command as a child process with --keep in a temporary directory and, while it runs,
samples the resident memory of every node process (found by its --data-dir under that directory) and
of their descendants (the sandbox worker processes) from /proc, every 0.1 s. Prints the figures;
exits 1 if the demo fails or the nodes together ever hold 1 GB or more (the floor of issue 8).

    .venv/bin/python tests/bench/bench_demo.py [--nodes N] [--jobs M]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from e31.node.demo.net import process_tree_rss

FLOOR_BYTES = 1_000_000_000


def node_pids(root: Path) -> list[int]:
    marker = f"{root}/node".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if b"run" in argv and any(a.startswith(marker) for a in argv):
            pids.append(int(entry))
    return pids


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="3")
    parser.add_argument("--jobs", default="24")
    args = parser.parse_args()
    if not Path("/proc/self/status").is_file():
        print("bench_demo: needs Linux /proc to measure memory", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="bench-demo-") as tmp:
        root = Path(tmp)
        keep = root / "kept"
        started = time.monotonic()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "e31.node",
                "demo",
                "--nodes",
                args.nodes,
                "--jobs",
                args.jobs,
                "--json",
                "--keep",
                str(keep),
            ],
            cwd=root,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        peak, peak_nodes, samples = 0, 0, 0
        while proc.poll() is None:
            pids = node_pids(keep)
            total = process_tree_rss(pids) or 0
            if total > peak:
                peak, peak_nodes = total, len(pids)
            samples += 1
            time.sleep(0.1)
        out, err = proc.communicate()
        wall = time.monotonic() - started
    if proc.returncode != 0:
        print(f"bench_demo: the demo failed with exit status {proc.returncode}:\n{err}", file=sys.stderr)
        return 1
    report = json.loads(out)
    print(
        f"e31 demo --nodes {args.nodes} --jobs {args.jobs}: {wall:.2f} s wall "
        f"({report['jobs']} jobs, {report['verified']} verified, {report['reexecuted']} re-executed)"
    )
    print(
        f"peak resident memory of the {peak_nodes} node processes and their workers: "
        f"{peak / 2**20:.1f} MiB ({samples} samples); the demo's own sample: "
        f"{(report.get('peak_rss_bytes') or 0) / 2**20:.1f} MiB"
    )
    for row in report["per_node"]:
        print(
            f"  {row['node']}: {row['jobs']} jobs, {row['fuel']:,} fuel, "
            f"{row['compute_seconds']:.3f} s compute, {row['queue_wait_seconds']:.3f} s queued"
        )
    if peak >= FLOOR_BYTES:
        print(f"bench_demo: FLOOR MISSED: the nodes held {peak / 1e9:.2f} GB (floor: under 1 GB)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
