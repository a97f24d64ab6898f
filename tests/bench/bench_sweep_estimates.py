"""What the executors' run estimates do to a sweep of tiny jobs with the default limits.

    .venv/bin/python tests/bench/bench_sweep_estimates.py [--jobs N] [--nodes K] [--deadline S]

Starts three (K) `e31 node run --cores 1` processes on 127.0.0.1 (bench_jobs.py's `net()`: node0
submits, all run jobs), runs three warm-up jobs (one module: what an executor needs to learn its
fuel, node/market/history.py), then one batch of N tiny jobs (montecarlo, 1,000 samples) with the
default limits (10 Gfuel, 60 s wall) and the default deadline (an hour; `--deadline S`: S seconds
after the submission). While it runs, it samples each node's GET /metrics every 50 ms: the run
queue's length and backlog (the sum of the queued jobs' estimates), so backlog over length is what a
node plans one job of the sweep for. Prints the sweep's time and rate, the jobs each node ran, the
median and largest per-job estimate seen on each node, and the bids,
declines and offer rounds the submitting node handled during the sweep (its message counters).
Bounded: one batch, bench_jobs.py's timeouts. Run it alternately against two trees (PYTHONPATH) in
the same minutes and compare; the host is shared.
"""

from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_jobs
from e31.node.demo.net import LocalNetwork, LocalNode

KINDS = ("offer", "bid", "decline", "award", "assign", "withdraw")


def scrape(node: LocalNode) -> dict[str, float]:
    """The node's metrics, one value per sample line (name with labels)."""
    doc = json.loads((node.data_dir / "api.json").read_text())
    conn = http.client.HTTPConnection(doc["host"], doc["port"], timeout=10)
    try:
        conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {doc['token']}"})
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def messages(sample: dict[str, float], direction: str) -> dict[str, float]:
    return {k: sample.get(f'e31_messages_{direction}_total{{kind="{k}"}}', 0.0) for k in KINDS}


def sweep(network: LocalNetwork, count: int, deadline_s: float | None) -> dict[str, float]:
    """bench_jobs.sweep with an optional deadline: the batch's time and rate to its last job's end."""
    api = network.nodes[0].api(timeout=120)
    t0 = time.time()
    jobs = [{"args": [str(seed), "1000"]} for seed in range(300_000, 300_000 + count)]
    body: dict[str, object] = {"module": str(bench_jobs.TINY), "jobs": jobs}
    if deadline_s is not None:
        body["deadline"] = int((t0 + deadline_s) * 1000)
    batch = api.post("/v1/batches", body)["batch_id"]
    while api.get(f"/v1/batches/{batch}/wait?timeout=30&brief=1")["ended"] < count:
        pass
    docs = api.get(f"/v1/batches/{batch}")["jobs"]
    bad = [d for d in docs if d["state"] != "done"]
    if bad:
        raise bench_jobs.BenchError(f"{len(bad)} jobs of the sweep did not succeed: {bad[0]['reason']}")
    seconds = max(d["updated"] for d in docs) - t0
    return {"overall": count / seconds, "seconds": seconds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=3, help="nodes (node0 submits)")
    parser.add_argument("--deadline", type=float, help="seconds from submission (default: the API's hour)")
    args = parser.parse_args()
    with bench_jobs.net(nodes=args.nodes, cores=1) as network:
        api = network.nodes[0].api(timeout=60)
        for seed in range(3):
            bench_jobs.wait(api, bench_jobs.submit(api, bench_jobs.tiny(seed)))
        per_job: list[list[float]] = [[] for _ in network.nodes]
        stop = threading.Event()

        def watch() -> None:
            while not stop.wait(0.05):
                for i, node in enumerate(network.nodes):
                    try:
                        s = scrape(node)
                    except (OSError, ValueError, KeyError, http.client.HTTPException):
                        continue
                    length = s.get("e31_run_queue_length", 0.0)
                    if length:
                        per_job[i].append(s.get("e31_run_queue_backlog_seconds", 0.0) / length)

        before = scrape(network.nodes[0])
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        t0 = time.time()
        try:
            swept = sweep(network, args.jobs, args.deadline)
        finally:
            stop.set()
            watcher.join()
        after = scrape(network.nodes[0])
        got = {k: messages(after, "received")[k] - messages(before, "received")[k] for k in KINDS}
        sent = {k: messages(after, "sent")[k] - messages(before, "sent")[k] for k in KINDS}
        ids = {str(n.node_id): i for i, n in enumerate(network.nodes)}
        ran = [0] * len(network.nodes)
        for doc in api.get("/v1/jobs"):
            if doc.get("created", 0) >= t0 and doc.get("executor") in ids:
                ran[ids[doc["executor"]]] += 1
    print(
        f"sweep of {args.jobs} tiny jobs (default limits, deadline {args.deadline or 3600:g} s) "
        f"over {args.nodes} nodes: "
        f"{swept['seconds']:.1f} s, {swept['overall']:.1f} jobs/s"
    )
    print("  jobs run per node:", " / ".join(map(str, ran)))
    seen = [(statistics.median(x), max(x)) if x else (0.0, 0.0) for x in per_job]
    print(
        "  estimate per queued job, median (largest), s:", " / ".join(f"{m:.3f} ({x:.3f})" for m, x in seen)
    )
    print(
        f"  node0 during the sweep: offers sent {sent['offer']:.0f}, bids received {got['bid']:.0f} "
        f"(and its own), declines received {got['decline']:.0f}, awards sent {sent['award']:.0f}, "
        f"withdraws sent {sent['withdraw']:.0f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
