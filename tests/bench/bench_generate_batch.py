"""Benchmark: a 1,000-prompt `e31 generate` batch over 3 local node processes, audited by re-execution.

Starts a LocalNetwork of real `e31 node run` processes (node/demo/net.py), writes N prompts (KJV verse
openings, greedy and sampled, `max_tokens` 32), and runs the user's commands against the first node:
`e31 generate --prompts-per-job K`, polling `e31 jobs` until the batch has ended, then
`e31 results BATCH --merge`, `e31 receipts export --with-blobs` and `e31 audit --reexecute`. Checks
and prints:

- every job done and verified by its submitter, and the merged file holding one completion per prompt,
  in the prompts' order;
- the audit sound, with every job re-executed here and its outputs and fuel found identical;
- the blob bytes each node received (its GET /metrics, `blobchunk` messages) against the model's size:
  at most one copy of the model per executor, however many jobs it ran;
- tokens per second of the network, against a baseline in the same minutes: the same prompts through
  one `e31 sandbox run` of generate.wasm on this machine (one core, no network).

Exits 1 if any check fails. Every wait is bounded (--timeout).

    .venv/bin/python tests/bench/bench_generate_batch.py [--prompts 1000] [--per-job 20] [--timeout 1800]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from e31.node.demo.inference import blob_bytes_received
from e31.node.demo.net import LocalNetwork

ROOT = Path(__file__).resolve().parents[2]
WORKLOADS = ROOT / "sandbox" / "workloads"
MODELS = WORKLOADS / "models"
STARTS = [
    json.loads(line)["prompt"] for line in (MODELS / "prompts.jsonl").read_text().splitlines() if line.strip()
]


def e31(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "e31.node", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def write_prompts(path: Path, n: int) -> None:
    with open(path, "w") as f:
        for i in range(1, n + 1):
            doc: dict[str, Any] = {"id": i, "prompt": STARTS[i % len(STARTS)], "max_tokens": 32}
            if i % 3 == 0:
                doc.update({"temperature": 0.8, "top_p": 0.9, "seed": i})
            f.write(json.dumps(doc) + "\n")


def baseline(prompts: Path, work: Path) -> tuple[float, int]:
    """(seconds, completion tokens) of the prompts in one local sandbox run of generate.wasm."""
    inputs = work / "baseline-in"
    inputs.mkdir()
    shutil.copy(MODELS / "kjv.bin", inputs / "model.bin")
    shutil.copy(MODELS / "kjv-tok.bin", inputs / "tokenizer.bin")
    shutil.copy(prompts, inputs / "prompts.jsonl")
    out = work / "baseline-out"
    started = time.monotonic()
    done = e31(
        "sandbox", "run", str(WORKLOADS / "generate.wasm"), "--input", str(inputs), "--output", str(out),
        "--fuel", "10000G", "--memory", "256MiB", "--timeout", "30m", "--json", timeout=3600,
    )  # fmt: skip
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"baseline run failed: {done.stderr.strip()}")
    lines = (out / "completions.jsonl").read_text().splitlines()
    return seconds, sum(json.loads(line)["completion_tokens"] for line in lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=1000)
    parser.add_argument("--per-job", type=int, default=20)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds for the batch to end")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="e31-bench-generate-"))
    problems: list[str] = []
    try:
        prompts = work / "prompts.jsonl"
        write_prompts(prompts, args.prompts)
        print(f"load before: {os.getloadavg()[0]:.2f} (1-minute average, {os.cpu_count()} cores)")
        net = LocalNetwork(work / "net", args.nodes, startup_timeout=180.0, link_timeout=180.0)
        with net:
            net.start()
            first = net.nodes[0]
            data = ["--data-dir", str(first.data_dir)]
            started = time.monotonic()
            per_job = str(args.per_job)
            done = e31(
                "generate", str(prompts), "--prompts-per-job", per_job, "--deadline", "2h", "--json", *data,
                timeout=600,
            )  # fmt: skip
            if done.returncode != 0:
                raise SystemExit(f"e31 generate failed: {done.stderr.strip()}")
            answer = json.loads(done.stdout)
            batch, job_ids = answer["batch_id"], answer["job_ids"]
            took = time.monotonic() - started
            print(f"submitted {answer['prompts']} prompts as {len(job_ids)} jobs ({took:.1f} s)")
            end = time.monotonic() + args.timeout
            while True:
                net.check_alive()
                listed = json.loads(e31("jobs", batch, "--json", *data, timeout=120).stdout)
                ended = [
                    j for j in listed if j["state"] in ("done", "failed", "expired", "cancelled", "disputed")
                ]
                if len(ended) == len(job_ids):
                    break
                if time.monotonic() > end:
                    raise SystemExit(f"only {len(ended)} of {len(job_ids)} jobs ended in {args.timeout:g} s")
                time.sleep(2.0)
            batch_seconds = time.monotonic() - started
            failed = [j["job_id"] for j in listed if not (j["state"] == "done" and j.get("succeeded"))]
            if failed:
                problems.append(f"{len(failed)} jobs did not succeed: {failed[:3]}")
            received = {n.name: blob_bytes_received(n) for n in net.nodes}
            merged = work / "completions.jsonl"
            done = e31("results", batch, "--merge", str(merged), "--json", *data, timeout=600)
            if done.returncode != 0:
                raise SystemExit(f"the merge failed: {done.stderr.strip()}")
            completions = [json.loads(line) for line in merged.read_text().splitlines()]
            if [c["id"] for c in completions] != list(range(1, args.prompts + 1)):
                problems.append("the merged completions are not one per prompt in the prompts' order")
            if any(c["finish_reason"] == "error" for c in completions):
                problems.append("error lines in the merged completions")
            tokens = sum(c["completion_tokens"] for c in completions)
            bundle = work / "batch.e31bundle"
            done = e31(
                "receipts", "export", "--out", str(bundle), "--with-blobs", "--json", *data, timeout=900
            )
            if done.returncode != 0:
                raise SystemExit(f"the export failed: {done.stderr.strip()}")
            audit_started = time.monotonic()
            done = e31("audit", str(bundle), "--reexecute", "--json", timeout=3600)
            audit_seconds = time.monotonic() - audit_started
            report = json.loads(done.stdout)
            if not report.get("sound") or report.get("reexecuted") != len(job_ids):
                problems.append(
                    f"audit: sound={report.get('sound')}, re-executed {report.get('reexecuted')} of "
                    f"{len(job_ids)}, problems {report.get('problems')[:2]}"
                )
            per_node = {str(r["node"]): int(r["jobs"]) for r in report.get("nodes", [])}
            names = {n.node_id: n.name for n in net.nodes}
            ran = {names.get(k, k): v for k, v in per_node.items()}
        model = (MODELS / "kjv.bin").stat().st_size
        print(f"batch: {len(job_ids)} jobs, {tokens} completion tokens in {batch_seconds:.1f} s "
              f"({tokens / batch_seconds:.0f} tokens/s over the network)")  # fmt: skip
        sound = report.get("sound")
        print(f"audit: re-executed {report.get('reexecuted')} jobs in {audit_seconds:.1f} s, sound: {sound}")
        for name, n in received.items():
            copies = n / model
            print(
                f"{name}: ran {ran.get(name, 0)} jobs, received {n:,} blob bytes = {copies:.3f} model copies"
            )
            if copies >= 2 or (ran.get(name, 0) and name != "node1" and copies < 1):
                problems.append(f"{name} received {copies:.3f} copies of the model")
        base_seconds, base_tokens = baseline(prompts, work)
        print(f"baseline: one local sandbox run, {base_tokens} tokens in {base_seconds:.1f} s "
              f"({base_tokens / base_seconds:.0f} tokens/s)")  # fmt: skip
        print(f"ratio network / baseline: {(tokens / batch_seconds) / (base_tokens / base_seconds):.2f}x")
        if base_tokens != tokens:
            problems.append(f"baseline made {base_tokens} tokens, the network {tokens}")
        print(f"load after: {os.getloadavg()[0]:.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for p in problems:
        print(f"PROBLEM: {p}")
    print("ok" if not problems else "FAILED")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
