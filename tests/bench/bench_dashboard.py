"""What an open dashboard costs the node: CPU of a real `e31 node run` process while pages follow it.

    .venv/bin/python tests/bench/bench_dashboard.py [SECONDS]

One node (one core, no peers) holding a finished sweep of 200 jobs; for each case the node's CPU
time (utime + stime from /proc) over SECONDS (default 20) is printed as a share of one core:
nobody watching; 1 and 4 pages long-polling GET /v1/overview (the dashboard's way: held until the
version changes, re-read at most every second); 1 page polling it every second without `after`;
plus the overview's size and its median latency. Every loop is bounded in time and count.
"""

from __future__ import annotations

import http.client
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "node"))
from dashboard_node import NodeProcess, wait_for

TICK = 1 / 100  # clock ticks per second of /proc's utime and stime (USER_HZ, 100 on Linux)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * TICK


def get(node: NodeProcess, path: str) -> bytes:
    conn = http.client.HTTPConnection("127.0.0.1", node.port, timeout=60)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {node.token}"})
        return conn.getresponse().read()
    finally:
        conn.close()


def follow(node: NodeProcess, stop: threading.Event, count: list[int], long_poll: bool) -> None:
    version = None
    for _ in range(100_000):
        if stop.is_set():
            return
        query = f"?after={version}&timeout=20" if long_poll and version else ""
        doc = json.loads(get(node, "/v1/overview" + query))
        version = doc["version"]
        count[0] += 1
        if not long_poll:
            stop.wait(1.0)


def measure(node: NodeProcess, seconds: float, pages: int, long_poll: bool) -> tuple[float, int]:
    stop = threading.Event()
    counts = [[0] for _ in range(pages)]
    threads = [threading.Thread(target=follow, args=(node, stop, c, long_poll), daemon=True) for c in counts]
    for t in threads:
        t.start()
    time.sleep(1.0)  # the first answers
    before, t0 = cpu_seconds(node.proc.pid), time.monotonic()
    time.sleep(seconds)
    used, elapsed = cpu_seconds(node.proc.pid) - before, time.monotonic() - t0
    stop.set()
    return used / elapsed, sum(c[0] for c in counts)


def main() -> None:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 20.0
    with tempfile.TemporaryDirectory() as tmp:
        node = NodeProcess(Path(tmp) / "a")
        try:
            sweep = node.sweep(200, 10_000)
            wait_for(
                "the sweep",
                lambda: node.api.get(f"/v1/batches/{sweep['batch_id']}?brief=1")["ended"] == 200,
                300,
            )
            time.sleep(3)  # acknowledgements and the log settle
            latencies = []
            size = 0
            for _ in range(50):
                t = time.perf_counter()
                size = len(get(node, "/v1/overview"))
                latencies.append(time.perf_counter() - t)
            print(
                f"overview: {size} bytes, median {statistics.median(latencies) * 1000:.1f} ms "
                f"over 50 calls (200 jobs in the store)"
            )
            for label, pages, long_poll in (
                ("nobody watching", 0, True),
                ("1 page, long-poll", 1, True),
                ("4 pages, long-poll", 4, True),
                ("1 page, polling every 1 s", 1, False),
            ):
                share, answers = measure(node, seconds, pages, long_poll)
                print(
                    f"{label:28s} node CPU {share * 100:5.1f}% of a core, {answers} answers in {seconds:g} s"
                )
        finally:
            node.stop()


if __name__ == "__main__":
    main()
