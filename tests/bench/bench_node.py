"""Benchmark: the resident memory of an idle node (daemon, local API, links; no jobs).

Starts real `e31 node run` processes on 127.0.0.1 with their default services (mDNS kept to the
loopback interface), the second bootstrapping from the first, lets them idle, and reads VmRSS and
VmHWM (peak) from /proc/PID/status. Floor: at most 120 MB
resident for an idle node. Linux only (reads /proc).

    .venv/bin/python tests/bench/bench_node.py [--idle SECONDS]
"""

from __future__ import annotations

import argparse
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FLOOR_MB = 120.0
READY = re.compile(r"node e31n\S+ on network \S+ listening on (\S+)$", re.MULTILINE)


def start(data_dir: Path, log: Path, *args: str) -> tuple[subprocess.Popen[bytes], str]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "e31.node",
                "node",
                "run",
                "--data-dir",
                str(data_dir),
                "--listen",
                "127.0.0.1:0",
                "--dial-private",
                "--mdns-interfaces",
                "127.0.0.1",
                "--heartbeat",
                "1",
                *args,
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=out,
        )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the node exited with {proc.returncode}:\n{log.read_text()}")
        match = READY.search(log.read_text())
        if match:
            return proc, match[1]
        time.sleep(0.05)
    proc.kill()
    raise SystemExit("the node did not start within 30 s")


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
    procs: list[subprocess.Popen[bytes]] = []
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        try:
            lone, address = start(root / "a", root / "a.log")
            procs.append(lone)
            linked, _ = start(root / "b", root / "b.log", "--bootstrap", address)
            procs.append(linked)
            time.sleep(args.idle)
            if "connected" not in (root / "b.log").read_text():
                print("warning: the second node did not link to the first", file=sys.stderr)
            print(f"idle node memory after {args.idle:g} s (floor: at most {FLOOR_MB:.0f} MB resident)")
            for name, proc in (("a (1 inbound peer)", lone), ("b (1 outbound peer)", linked)):
                rss, peak = memory_mb(proc.pid)
                worst = max(worst, rss)
                print(f"  {name:<22} resident {rss:6.1f} MB   peak {peak:6.1f} MB")
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            codes = [proc.wait(timeout=30) for proc in procs]
            print(f"  exit codes after SIGTERM: {codes}")
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
    if worst > FLOOR_MB:
        print(f"FAIL: {worst:.1f} MB resident is above the {FLOOR_MB:.0f} MB floor")
        return 1
    print(f"ok: {worst:.1f} MB <= {FLOOR_MB:.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
