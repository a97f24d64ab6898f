"""What a sweep costs each node, and how the sweep is spread: CPU per job of one batch, per node.

    .venv/bin/python tests/bench/bench_sweep_cpu.py [--jobs N] [--cores C] [--nodes K] [--before B]

Starts three (K) `e31 node run` processes on 127.0.0.1 (bench_jobs.py's `net()`: node0 submits, all three run
jobs), runs a warm-up job and B unmeasured batches (default none), then one batch of N tiny jobs (montecarlo,
1,000 samples; what `e31 submit --batch` sends), and prints for each node the jobs it ran and its CPU per job
of the batch (the node process and its sandbox workers, from /proc), and the messages each received and sent
during the batch by kind (offers heard, bids and declines made, awards, assignment sets, results carriers and
acks: from each node's /metrics). A node that runs few of the jobs spends its CPU mostly on hearing and
answering the sweep's offers (bidding); the last line splits the executors' CPU into what each pays whatever
it runs and what each run costs (a line through the executors' points: at six nodes five points, at three only
two, so compare it within a run). Without `--before`, a batch on a network just started also pays for its
links, peer exchange and first adverts (at six nodes 30-40 `capacity` messages per node); `--before 1`
measures one on links that are up. Bounded: B + 1 batches, bench_jobs.py's timeouts. Compare ratios measured
in the same minutes (the host is shared).
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_jobs
from e31.node.api.client import ApiClient

KINDS = ("offer", "bid", "decline", "award", "assigns", "results", "ack")
"""The market's messages around an offer, counted per node."""
SAMPLE = re.compile(r'^e31_messages_(received|sent)_total\{kind="([a-z_]+)"\} ([0-9.e+]+)$')


def messages(api: ApiClient) -> collections.Counter[tuple[str, str]]:
    """Signed messages the node received and sent on its links since it started, by (way, kind)."""
    host, port, token = api._endpoint()
    headers = {"Authorization": f"Bearer {token}"}
    request = urllib.request.Request(f"http://{host}:{port}/metrics", headers=headers)
    with urllib.request.urlopen(request, timeout=60) as response:
        text = response.read().decode()
    out: collections.Counter[tuple[str, str]] = collections.Counter()
    for line in text.splitlines():
        if m := SAMPLE.match(line):
            out[m[1], m[2]] = int(float(m[3]))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--cores", type=int, default=1, help="--cores of each node")
    parser.add_argument("--nodes", type=int, default=3, help="nodes (node0 submits)")
    parser.add_argument(
        "--before",
        type=int,
        default=0,
        help="unmeasured sweeps of --jobs first (default 0): the nodes' links, peer exchange and first "
        "adverts are over by the measured one",
    )
    args = parser.parse_args()
    if not 1 <= args.nodes <= 16 or args.before < 0:
        parser.error("--nodes is 1 to 16, --before 0 or more")
    with bench_jobs.net(nodes=args.nodes, cores=args.cores) as network:
        api = network.nodes[0].api(timeout=60)
        bench_jobs.wait(api, bench_jobs.submit(api, bench_jobs.tiny(0)))
        for i in range(args.before):
            bench_jobs.sweep(network, args.jobs, 100_000 + i * args.jobs)
        pids = [n.pid for n in network.nodes]
        apis = [n.api(timeout=60) for n in network.nodes]
        sent0 = [messages(a) for a in apis]
        before = [bench_jobs.cpu_seconds([p]) for p in pids]
        t0 = time.time()
        swept = bench_jobs.sweep(network, args.jobs, 300_000)
        cpu = [bench_jobs.cpu_seconds([p]) - b for p, b in zip(pids, before, strict=True)]
        sent = [messages(a) - s0 for a, s0 in zip(apis, sent0, strict=True)]
        ids = {str(n.node_id): i for i, n in enumerate(network.nodes)}
        ran = [0] * len(pids)
        for doc in api.get("/v1/jobs"):
            if doc.get("created", 0) >= t0 and doc.get("executor") in ids:  # (one clock: one host)
                ran[ids[doc["executor"]]] += 1
    where = f"{args.nodes} nodes (--cores {args.cores})"
    print(f"sweep of {args.jobs} tiny jobs over {where}: {swept['seconds']:.1f} s")
    for i, (c, n) in enumerate(zip(cpu, ran, strict=True)):
        print(f"  node{i}: ran {n:5d} jobs, CPU {c * 1000 / args.jobs:6.2f} ms per job of the sweep")
        counts = ", ".join(f"{k} {sent[i]['received', k]}/{sent[i]['sent', k]}" for k in KINDS)
        print(f"    messages received/sent: {counts}")
        others = sorted({k for _, k in sent[i]} - set(KINDS))
        if others:
            rest = ", ".join(f"{k} {sent[i]['received', k]}/{sent[i]['sent', k]}" for k in others)
            print(f"    others: {rest}")
    print(f"  all: {sum(cpu) * 1000 / args.jobs:.2f} ms per job")
    fit = per_run_fit(ran[1:], cpu[1:])
    if fit is not None:
        fixed, per_run = fit
        print(
            f"  executors (node1..): CPU = {fixed * 1000:.0f} ms over the sweep whatever each runs"
            f" + {per_run * 1000:.2f} ms"
            " per run (least squares over the executors; compare within a run of this script)"
        )
    return 0


def per_run_fit(ran: list[int], cpu: list[float]) -> tuple[float, float] | None:
    """(seconds an executor spends on the sweep whatever it runs, seconds per run it makes): the
    least-squares line through (jobs run, CPU seconds) of the executors; None with fewer than two
    executors or when they all ran the same number of jobs."""
    n = len(ran)
    if n < 2:
        return None
    mean_x, mean_y = sum(ran) / n, sum(cpu) / n
    spread = sum((x - mean_x) ** 2 for x in ran)
    if spread == 0:
        return None
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(ran, cpu, strict=True)) / spread
    return mean_y - slope * mean_x, slope


if __name__ == "__main__":
    raise SystemExit(main())
