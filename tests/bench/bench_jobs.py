"""Jobs through a real 3-node network on 127.0.0.1: throughput and submit-to-done latency of tiny jobs.

    .venv/bin/python tests/bench/bench_jobs.py [--jobs 60] [--latency-jobs 10] [--cores 1]

Starts three `e31 node run` processes (temporary data dirs, port 0, no mDNS) bootstrapped from the
first, then, through the first node's local API:
- latency: tiny jobs (montecarlo, 1,000 samples) one at a time; each is timed from the submit
  request to the moment the node reports it done (verified, outputs fetched, acknowledged);
- throughput: a burst of tiny jobs submitted back to back; jobs/s from the first submit to the last done.
Prints the figures; exits 1 if a job fails or a floor is missed (floors are far below what this
machine does, to catch breakage, not to grade speed).
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from e31.node.api_client import ApiClient, ApiClientError

ROOT = Path(__file__).resolve().parents[2]
MODULE = ROOT / "sandbox" / "workloads" / "montecarlo.wasm"
READY = re.compile(r"node (e31n[a-z2-7]{52}) on network \S+ listening on (\S+)$", re.MULTILINE)
FLOOR_JOBS_PER_S = 1.0
FLOOR_LATENCY_S = 10.0


def start(data_dir: Path, cores: int, *extra: str) -> tuple[subprocess.Popen[bytes], str, str]:
    log = data_dir.with_suffix(".log")
    argv = [sys.executable, "-m", "e31.node.cli", "node", "run", "--data-dir", str(data_dir), "--listen",
            "127.0.0.1:0", "--no-mdns", "--heartbeat", "1", "--cores", str(cores), *extra]
    with open(log, "wb") as err:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    end = time.monotonic() + 30
    while time.monotonic() < end:
        if proc.poll() is not None:
            sys.exit(f"node {data_dir.name} exited: {log.read_text()}")
        match = READY.search(log.read_text())
        if match:
            return proc, match[1], match[2]
        time.sleep(0.05)
    sys.exit(f"node {data_dir.name} did not start")


def state(api: ApiClient, job: str) -> str:
    doc = api.get(f"/v1/jobs/{job}")
    return str(doc["state"]) + ("" if doc["state"] != "done" or doc["succeeded"] else "-unsuccessful")


def submit(api: ApiClient, seed: int) -> str:
    job: str = api.post("/v1/jobs", {"module": str(MODULE), "args": [str(seed), "1000"]})["job_id"]
    return job


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=60)
    parser.add_argument("--latency-jobs", type=int, default=10)
    parser.add_argument("--cores", type=int, default=1)
    args = parser.parse_args()
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            a, a_id, a_addr = start(Path(tmp) / "a", args.cores)
            procs.append(a)
            for name in "bc":
                procs.append(start(Path(tmp) / name, args.cores, "--bootstrap", a_addr)[0])
            api = ApiClient(Path(tmp) / "a", timeout=60)
            end = time.monotonic() + 30
            while len([p for p in api.get("/v1/peers") if p["state"] == "connected"]) < 2:
                if time.monotonic() > end:
                    sys.exit("the nodes did not connect")
                time.sleep(0.1)
            submit(api, 0)  # warm-up: the first submission compiles the module
            time.sleep(1.0)

            latencies = []
            for seed in range(1, args.latency_jobs + 1):
                t0 = time.monotonic()
                job = submit(api, seed)
                while (s := state(api, job)) not in ("done", "failed", "expired", "done-unsuccessful"):
                    time.sleep(0.005)
                if s != "done":
                    print(f"job {job} ended {s}")
                    return 1
                latencies.append(time.monotonic() - t0)

            t0 = time.monotonic()
            ids = [submit(api, 1000 + i) for i in range(args.jobs)]
            submitted = time.monotonic() - t0
            pending = set(ids)
            while pending:
                listed = {j["job_id"]: j for j in api.get("/v1/jobs")}
                for job in list(pending):
                    doc = listed[job]
                    if doc["state"] in ("done", "failed", "expired"):
                        if not doc["succeeded"]:
                            print(f"job {job} ended {doc['state']}: {doc.get('reason')}")
                            return 1
                        pending.discard(job)
                if time.monotonic() - t0 > 300:
                    print(f"{len(pending)} jobs still pending after 300 s")
                    return 1
                time.sleep(0.02)
            elapsed = time.monotonic() - t0
            by_node = Counter(api.get(f"/v1/jobs/{j}")["executor"] == a_id for j in ids)
        except ApiClientError as e:
            print(f"API error: {e}")
            return 1
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(timeout=30)
    rate = args.jobs / elapsed
    p50 = statistics.median(latencies)
    print(f"latency, one tiny job at a time over 3 nodes: median {p50 * 1000:.0f} ms, "
          f"min {min(latencies) * 1000:.0f} ms, max {max(latencies) * 1000:.0f} ms ({len(latencies)} jobs)")
    print(f"throughput, {args.jobs} tiny jobs in a burst: submitted in {submitted:.2f} s, all done in "
          f"{elapsed:.2f} s: {rate:.1f} jobs/s; ran on the submitting node: {by_node[True]}, "
          f"on the others: {by_node[False]}")
    ok = rate >= FLOOR_JOBS_PER_S and p50 <= FLOOR_LATENCY_S
    if not ok:
        print(f"FLOOR MISSED: need >= {FLOOR_JOBS_PER_S} jobs/s and median latency <= {FLOOR_LATENCY_S} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
