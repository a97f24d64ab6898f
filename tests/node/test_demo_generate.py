"""`e31 demo --workload generate` over three real `e31 node run` processes: `e31 generate` cuts the prompts
into jobs sharing one model blob, every job verifies by re-execution, `e31 results --merge` puts the
completions (an error line among them) back in the prompts' order with each job's receipt beside them,
and the model travels at most once to each executor, counted from the nodes' own metrics."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORKLOADS = ROOT / "sandbox" / "workloads"
MODEL = WORKLOADS / "models" / "kjv.bin"
SHARED_BLOBS = (MODEL, WORKLOADS / "models" / "kjv-tok.bin", WORKLOADS / "generate.wasm")
MESSAGE_SLACK = 64 * 1024
"""Envelope bytes around the chunks (about 200 a message; the model is 18 chunks) and the chunk lists."""


def test_the_generate_demo_verifies_every_job_and_moves_the_model_once_per_executor(tmp_path: Path) -> None:
    lines = [json.dumps({"id": i, "prompt": "And God said", "max_tokens": 6}) for i in range(1, 11)]
    lines[3:3] = ["", '{"id": "bad", "prompt": 7}']  # a blank line (no completion) and an error line
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(lines) + "\n")
    keep = tmp_path / "kept"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "e31.node",
            "demo",
            "--workload",
            "generate",
            "--nodes",
            "3",
            "--jobs",
            "11",
            "--prompts",
            str(prompts),
            "--json",
            "--keep",
            str(keep),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=540,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    report = json.loads(done.stdout)
    assert report["workload"] == "generate"
    assert report["jobs"] == report["verified"] == 11  # one prompt line a job
    assert report["reexecuted"] >= 11 and report["problems"] == [] and report["failed"] == []

    completions = [json.loads(line) for line in Path(report["completions"]).read_text().splitlines()]
    assert [c["id"] for c in completions] == [1, 2, 3, "bad", 4, 5, 6, 7, 8, 9, 10]
    error = completions[3]
    assert error["finish_reason"] == "error" and error["line"] == 5  # the prompts file's own line number
    assert all(
        c["finish_reason"] in ("stop", "length") and c["completion_tokens"] <= 6
        for c in completions
        if c != error
    )
    receipts = sorted((keep / "results").glob("*/receipt"))
    assert len(receipts) == 11 and all(r.stat().st_size > 0 for r in receipts)
    assert receipts[0].parent.name.startswith("0001-")

    # what each node received in blob chunks: at most the model, tokenizer and module once, and all of
    # the model if it ran a job (a node that lost its assignment, say a lease that ran out on a crowded
    # machine, may have fetched part of it, never more)
    shared = sum(p.stat().st_size for p in SHARED_BLOBS)
    spans = sum(len(line) + 1 for line in lines)
    ran = {row["node"]: row["jobs"] for row in report["per_node"]}
    assert sum(ran.values()) == 11
    received = report["blob_bytes_received"]
    assert received["node1"] == 0  # the submitter holds every blob
    for name in ("node2", "node3"):
        assert received[name] <= shared + spans + MESSAGE_SLACK, (name, ran, received)
        if ran[name]:
            assert received[name] >= MODEL.stat().st_size, (name, ran, received)
