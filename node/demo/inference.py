"""`e31 demo --workload generate`: the shipped model answers the shipped prompts across local nodes.

The steps, each through the command lines a user types (run.py's `e31` and `e31_process`):

1. start a LocalNetwork of N real nodes under a work dir;
2. `e31 generate PROMPTS --prompts-per-job K --pass-bad-lines` to the first node: one batch, its jobs
   sharing the model and tokenizer blobs (K from --jobs: the prompts spread over that many jobs);
3. poll `e31 jobs --json` until every job of the batch has ended;
4. `e31 results BATCH --merge ./e31-demo-completions.jsonl`, each job's results and receipt kept in the
   work dir;
5. export every receipt and `e31 audit --reexecute` the bundle (run.py's `_audit`), which re-runs each
   job and must get the same completions and the same fuel;
6. read each node's GET /metrics for the blob bytes it received (`blobchunk` messages): the model
   travels at most once to each executor, which the result reports per node.
"""

from __future__ import annotations

import http.client
import json
import math
import re
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from ..config import API_FILE
from .net import LocalNode
from .run import (
    BUNDLE_NAME,
    DemoError,
    DemoOptions,
    DemoResult,
    Events,
    _audit,
    _json,
    _since,
    _wait,
    _work_dir,
    demo_network,
    e31,
    shown,
    succeeded,
)

COMPLETIONS_NAME = "e31-demo-completions.jsonl"
DEFAULT_JOBS = 8
_BLOBCHUNK_BYTES = re.compile(r'^e31_message_bytes_received_total\{kind="blobchunk"\} (\S+)$', re.MULTILINE)


@dataclass(frozen=True, slots=True)
class Part:
    """One job of the batch: the lines of the prompts file it answers."""

    first: int
    last: int

    @property
    def name(self) -> str:
        return f"prompt lines {self.first}-{self.last}"


def shipped_prompts() -> Path:
    path = Path(str(resources.files("e31.sandbox") / "workloads" / "models" / "prompts.jsonl"))
    if not path.is_file():
        raise DemoError(f"the demo's prompts file is missing from this install: {path}")
    return path


def blob_bytes_received(node: LocalNode) -> int:
    """Bytes of `blobchunk` messages the node has received since it started (its GET /metrics)."""
    try:
        doc = json.loads((node.data_dir / API_FILE).read_text())
        conn = http.client.HTTPConnection(doc["host"], doc["port"], timeout=10.0)
        try:
            conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {doc['token']}"})
            text = conn.getresponse().read().decode()
        finally:
            conn.close()
    except (OSError, ValueError, KeyError, http.client.HTTPException) as e:
        raise DemoError(f"{node.name}: cannot read its metrics: {e}") from None
    m = _BLOBCHUNK_BYTES.search(text)
    return 0 if m is None else int(float(m.group(1)))


def run_generate_demo(options: DemoOptions, events: Events) -> DemoResult:
    """The generate workload's demo (see the module's docstring); the network is stopped before this
    returns or raises."""
    options.check()
    started = time.monotonic()
    prompts = options.prompts or shipped_prompts()
    work, keep = _work_dir(options.keep)
    result = DemoResult(nodes=options.nodes, jobs=0, work_dir=work, workload="generate")
    out = options.completions.absolute()
    bundle = work / BUNDLE_NAME if keep else out.with_name(out.stem + "-" + BUNDLE_NAME)
    with demo_network(options, events, result, work, keep, started) as net:
        names = {n.node_id: n.name for n in net.nodes}
        first = net.nodes[0]
        lines = sum(1 for line in prompts.read_text(encoding="utf-8").splitlines() if line.strip())
        per_job = max(1, math.ceil(lines / options.jobs))
        clock = time.monotonic()
        called = e31(
            "generate",
            str(prompts),
            "--prompts-per-job",
            str(per_job),
            "--deadline",
            "10m",
            "--pass-bad-lines",
            "--json",
            "--data-dir",
            str(first.data_dir),
        )
        if called.code != 0:
            raise DemoError(f"`e31 generate` on node1 failed: {called.error_line()}")
        answer = _json(called, "the batch")
        batch_id = str(answer["batch_id"])
        job_ids = [str(j) for j in answer["job_ids"]]
        spans = _spans(first, batch_id)
        jobs = {j: spans.get(j, Part(0, 0)) for j in job_ids}
        result.jobs = len(jobs)
        events.step(
            f"submitted {answer['prompts']} prompts as {len(jobs)} inference jobs (batch {batch_id}) "
            f"to node1 ({_since(clock)})"
        )
        finished = _wait(net, jobs, options, events, result)
        done = {j for j, row in finished.items() if succeeded(row)}
        result.done = len(done)
        result.failed = [
            f"{jobs[j].name} (job {j}): {row.get('state')}" for j, row in finished.items() if j not in done
        ]
        clock = time.monotonic()
        merged = e31(
            "results",
            batch_id,
            "--merge",
            str(out),
            "--out",
            str(work / "results"),
            "--overwrite",
            "--partial",
            "--json",
            "--data-dir",
            str(first.data_dir),
        )
        if merged.code != 0:
            result.problems.append(f"merging the completions failed: {merged.error_line()}")
        else:
            report = _json(merged, "the merge")
            result.output = out
            events.step(
                f"wrote {shown(out)} ({report['completions']} completions from {report['merged_jobs']} "
                f"jobs; {_since(clock)})"
            )
        _audit(first.data_dir, jobs, done, bundle, names, events, result)
        result.blob_bytes = {n.name: blob_bytes_received(n) for n in net.nodes}
    return result


def _spans(node: LocalNode, batch_id: str) -> dict[str, Part]:
    """Each job's span of prompt lines, from the batch as the node shows it."""
    from ..client.generate import span_of

    doc: Any = node.ask(f"/v1/batches/{batch_id}")
    out: dict[str, Part] = {}
    for job in (doc or {}).get("jobs", []):
        span = span_of(list(job.get("args") or []))
        if span is not None:
            out[str(job["job_id"])] = Part(*span)
    return out
