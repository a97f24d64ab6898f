"""The demo's verdict: which jobs verified, from `e31 audit --json` and the exported bundle itself.

The audit reports problems and notes (each naming a job and node), a count of re-executed jobs, and a
per-node summary; it does not list the jobs it found sound. So a job counts as verified here when it
succeeded, the bundle holds its receipt and the submitter's acknowledgement (read from the bundle, through
the same envelope verification the audit uses), no problem names it, and the audit re-executed at least as
many jobs as are counted verified (with every job of the demo re-executed, a skipped one shows up there).
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import NodeError


class VerdictError(NodeError):
    """The exported bundle cannot be read."""


@dataclass
class NodeRow:
    name: str
    node_id: str
    jobs: int = 0
    fuel: int = 0
    compute_seconds: float = 0.0
    queue_wait_seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.name,
            "node_id": self.node_id,
            "jobs": self.jobs,
            "fuel": self.fuel,
            "compute_seconds": round(self.compute_seconds, 6),
            "queue_wait_seconds": round(self.queue_wait_seconds, 6),
        }


@dataclass
class Verdict:
    verified: int = 0
    reexecuted: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    rows: list[NodeRow] = field(default_factory=list)


def bundle_jobs(path: Path) -> tuple[set[str], set[str]]:
    """(jobs with a receipt, jobs with an acknowledgement) among the bundle's envelopes that verify."""
    from e31.protocol.envelope import verify
    from e31.protocol.errors import ProtocolError
    from e31.protocol.receipts import Ack, UsageReceipt

    from ..audit.bundle import BundleError, read_bundle

    try:
        bundle = read_bundle(path)
    except BundleError as e:
        raise VerdictError(f"cannot read the exported bundle: {e}") from None
    jobs_of: dict[bytes, str] = {}  # receipt id -> its job
    acked_ids: set[bytes] = set()
    for raw in bundle.envelopes:
        try:
            env = verify(raw)
        except ProtocolError:
            continue  # the audit reports it
        message = env.message
        if isinstance(message, UsageReceipt):
            jobs_of[env.message_id.raw] = message.job_id.hex()
        elif isinstance(message, Ack):
            acked_ids.update(r.raw for r in message.receipt_ids)
    receipted = set(jobs_of.values())
    acked = {job for receipt_id, job in jobs_of.items() if receipt_id in acked_ids}
    return receipted, acked


def judge(
    report: Mapping[str, Any],
    labels: Mapping[str, str],
    done: Set[str],
    receipted: Set[str],
    acked: Set[str],
    names: Mapping[str, str],
) -> Verdict:
    """The verdict on the demo's jobs (`labels`: job id -> what the user calls it, e.g. its tile; `done`:
    the jobs that succeeded; `names`: node id -> node1, node2, ...) from an audit report."""

    def where(job: str) -> str:
        return f"{labels[job]} (job {job})" if job in labels else (f"job {job}" if job else "the bundle")

    def finding(f: Mapping[str, Any]) -> str:
        return f"{where(str(f.get('job') or ''))}: {f.get('check', '?')}: {f.get('what', '?')}"

    verdict = Verdict(reexecuted=int(report.get("reexecuted") or 0))
    problems = [p for p in report.get("problems", []) if isinstance(p, Mapping)]
    verdict.problems = [f"audit: {finding(p)}" for p in problems]
    verdict.notes = [finding(n) for n in report.get("notes", []) if isinstance(n, Mapping)]
    verdict.problems += [f"{where(job)}: no receipt in the bundle" for job in sorted(done - receipted)]
    verdict.problems += [
        f"{where(job)}: the receipt was never acknowledged" for job in sorted((done & receipted) - acked)
    ]
    sound = (done & receipted & acked) - {str(p.get("job")) for p in problems}
    if verdict.reexecuted < len(sound):
        verdict.problems.append(
            f"the audit re-executed only {verdict.reexecuted} of {len(sound)} jobs"
            + (f"; its first note: {verdict.notes[0]}" if verdict.notes else "")
        )
    else:
        verdict.verified = len(sound)
    rows = []
    for entry in report.get("nodes", []):
        if isinstance(entry, Mapping):
            node_id = str(entry.get("node", "?"))
            rows.append(
                NodeRow(
                    names.get(node_id, "other"),
                    node_id,
                    int(entry.get("jobs") or 0),
                    int(entry.get("fuel") or 0),
                    int(entry.get("compute_ms") or 0) / 1000,
                    int(entry.get("queue_wait_ms") or 0) / 1000,
                )
            )
    present = {r.node_id for r in rows}
    rows += [NodeRow(name, node_id) for node_id, name in names.items() if node_id not in present]
    verdict.rows = sorted(rows, key=lambda r: (len(r.name), r.name))
    return verdict
