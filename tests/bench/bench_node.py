"""Benchmark: the resident memory of an idle node (daemon, local API, links; no jobs).

Starts real `e31 node run` processes on 127.0.0.1 (tests/node/node_process.py) with their default
services (mDNS kept to the loopback interface), the second bootstrapping from the first, lets them
idle, and reads VmRSS and VmHWM (peak) from /proc/PID/status. Floor: at most 120 MB resident for an
idle node. Linux only (reads /proc).

    .venv/bin/python tests/bench/bench_node.py [--idle SECONDS]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "node"))

from node_process import NodeProcess

FLOOR_MB = 120.0
NODE_ARGS = ("--mdns-interfaces", "127.0.0.1", "--heartbeat", "1")


def memory_mb(pid: int) -> tuple[float, float]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--idle", type=float, default=5.0, help="seconds to idle before measuring")
    args = parser.parse_args()
    nodes: list[NodeProcess] = []
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        try:
            lone = NodeProcess(root / "a", *NODE_ARGS)
            nodes.append(lone)
            linked = NodeProcess(root / "b", *NODE_ARGS, "--bootstrap", lone.address)
            nodes.append(linked)
            time.sleep(args.idle)  # idle on purpose: the figure is an idle node's
            if lone.node_id not in linked.connected():
                print("warning: the second node did not link to the first", file=sys.stderr)
            print(f"idle node memory after {args.idle:g} s (floor: at most {FLOOR_MB:.0f} MB resident)")
            for name, node in (("a (1 inbound peer)", lone), ("b (1 outbound peer)", linked)):
                rss, peak = memory_mb(node.proc.pid)
                worst = max(worst, rss)
                print(f"  {name:<22} resident {rss:6.1f} MB   peak {peak:6.1f} MB")
            codes = [node.stop() for node in nodes]
            print(f"  exit codes after SIGTERM: {codes}")
        finally:
            for node in nodes:
                node.kill()
    if worst > FLOOR_MB:
        print(f"FAIL: {worst:.1f} MB resident is above the {FLOOR_MB:.0f} MB floor")
        return 1
    print(f"ok: {worst:.1f} MB <= {FLOOR_MB:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
