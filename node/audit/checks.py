"""The offline auditor: everything a bundle's envelopes claim, checked without the network.

The checks, in order (each failure is a Finding with the job, the node and what is wrong):
1. every envelope verifies (canonical encoding, signature, issuer, message rules);
2. each receipt matches its offer's manifest and its assignment (protocol.receipts checks);
3. each acknowledgement matches the receipt it names;
4. each `proof` places its receipt in its executor's log under a signed tree head of that executor;
   two heads of one executor with one size and two roots are a forked log, and heads of different
   sizes are checked with the bundle's consistency proofs where it has them;
5. receipts for one job that disagree on outcome, outputs or fuel are a dispute;
6. with reexecute, each job runs again in the local sandbox (audit_rerun.py) and every re-verifiable
   receipt must match the run exactly: outcome, fuel, stdout, stderr and output files.
Problems make the audit fail; notes (a timeout that cannot be re-verified, a profile this machine
does not run, a receipt without an inclusion proof, heads without a consistency proof) do not.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, cast

from e31.protocol.assignments import assignment_of
from e31.protocol.envelope import VerifiedEnvelope, verify
from e31.protocol.errors import BadProof, Mismatch, ProtocolError
from e31.protocol.ids import Digest, NodeId
from e31.protocol.jobs import JobManifest
from e31.protocol.merkle import verify_consistency, verify_entry_inclusion
from e31.protocol.messages import Ack, Assign, AssignSet, InclusionProof, Offer, TreeHead, UsageReceipt
from e31.protocol.receipts import (
    METER_SLACK_MS,
    check_ack,
    check_receipt_assignment,
    check_receipt_manifest,
    meter_overrun_ms,
)

from .bundle import Bundle
from .peek import peek
from .rerun import blobs_of, rerun_job


@dataclass(frozen=True, slots=True)
class Finding:
    severity: str
    """"problem" (the audit fails) or "note"."""
    check: str
    """Which check: envelope, manifest, assignment, meter, ack, inclusion, log, dispute, reexecute."""
    what: str
    job: str | None = None
    node: str | None = None


@dataclass(slots=True)
class NodeSummary:
    node: str
    jobs: int = 0
    receipts: int = 0
    fuel: int = 0
    compute_ms: int = 0
    queue_wait_ms: int = 0
    paused_ms: int = 0
    fetch_ms: int = 0
    """From version 2 receipts' meters (a version 1 receipt says nothing of either)."""
    reexecuted: int = 0
    problems: int = 0


@dataclass(slots=True)
class AuditReport:
    envelopes: int = 0
    jobs: int = 0
    """Jobs the bundle holds a receipt or an assignment of (an offer of a set of jobs also names jobs
    that were not exported with it)."""
    receipts: int = 0
    acks: int = 0
    proofs: int = 0
    blobs: int = 0
    reexecuted: int = 0
    nodes: list[NodeSummary] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    @property
    def problems(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "problem"]

    @property
    def notes(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "note"]

    @property
    def sound(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "sound": self.sound,
            "envelopes": self.envelopes,
            "jobs": self.jobs,
            "receipts": self.receipts,
            "acks": self.acks,
            "proofs": self.proofs,
            "blobs": self.blobs,
            "reexecuted": self.reexecuted,
            "nodes": [asdict(n) for n in self.nodes],
            "problems": [_finding_json(f) for f in self.problems],
            "notes": [_finding_json(f) for f in self.notes],
        }


def _finding_json(f: Finding) -> dict[str, Any]:
    return {"job": f.job, "node": f.node, "check": f.check, "what": f.what}


class _Audit:
    def __init__(self, bundle: Bundle) -> None:
        self.bundle = bundle
        self.report = AuditReport(envelopes=len(bundle.envelopes), blobs=len(bundle.blobs))
        self.offers: dict[Digest, JobManifest] = {}
        self.assigns: dict[Digest, VerifiedEnvelope[Assign] | VerifiedEnvelope[AssignSet]] = {}
        """Assignments by id: `assign`s and `assigns` sets (a set's id assigns each of its jobs)."""
        self.receipts: list[VerifiedEnvelope[UsageReceipt]] = []
        self.receipt_by_id: dict[Digest, VerifiedEnvelope[UsageReceipt]] = {}
        self.acks: list[VerifiedEnvelope[Ack]] = []
        self.proofs: list[VerifiedEnvelope[InclusionProof]] = []
        self.heads: list[TreeHead] = []
        self.bad_receipts: set[Digest] = set()

    def add(
        self,
        severity: str,
        check: str,
        what: str,
        job: Digest | str | None = None,
        node: NodeId | str | None = None,
    ) -> None:
        self.report.findings.append(
            Finding(
                severity, check, what, None if job is None else str(job), None if node is None else str(node)
            )
        )

    # 1. signatures
    def load(self) -> None:
        for i, raw in enumerate(self.bundle.envelopes):
            try:
                env = verify(raw)
            except ProtocolError as e:
                kind, node, job = peek(raw)
                self.add(
                    "problem",
                    "envelope",
                    f"{kind} envelope #{i} does not verify: {type(e).__name__}: {_one_line(str(e))}",
                    job,
                    node,
                )
                continue
            msg = env.message
            if isinstance(msg, Offer):
                for manifest in msg.manifests:
                    self.offers.setdefault(manifest.job_id, manifest)
            elif isinstance(msg, Assign | AssignSet):
                self.assigns[env.message_id] = cast(
                    "VerifiedEnvelope[Assign] | VerifiedEnvelope[AssignSet]", env
                )
            elif isinstance(msg, UsageReceipt):
                receipt = cast("VerifiedEnvelope[UsageReceipt]", env)
                self.receipts.append(receipt)
                self.receipt_by_id[env.message_id] = receipt
            elif isinstance(msg, Ack):
                self.acks.append(cast("VerifiedEnvelope[Ack]", env))
            elif isinstance(msg, InclusionProof):
                self.proofs.append(cast("VerifiedEnvelope[InclusionProof]", env))
            elif isinstance(msg, TreeHead):
                self.heads.append(msg)
        self.report.receipts = len(self.receipts)
        self.report.acks = len(self.acks)
        self.report.proofs = len(self.proofs)
        self.report.jobs = len(  # a set names jobs the bundle may not be about: those with a receipt
            {r.message.job_id for r in self.receipts}
            | {env.message.job_id for env in self.assigns.values() if isinstance(env.message, Assign)}
        )

    # 2. receipts against manifests and assignments
    def check_receipts(self) -> None:
        for env in self.receipts:
            r = env.message
            manifest = self.offers.get(r.job_id)
            if manifest is None:
                self._bad(
                    env,
                    "manifest",
                    "no offer for this job in the bundle: the receipt cannot be checked against its manifest",
                )
            else:
                try:
                    check_receipt_manifest(r, manifest)
                except Mismatch as e:
                    self._bad(
                        env, "manifest", f"receipt {_short(env.message_id)} does not match the offer: {e}"
                    )
            carrier = self.assigns.get(r.assignment_id)
            assign = None if carrier is None else assignment_of(carrier, r.job_id)
            if carrier is None:
                self._bad(
                    env,
                    "assignment",
                    f"receipt {_short(env.message_id)} names assignment "
                    f"{_short(r.assignment_id)}, which is not in the bundle",
                )
            elif assign is None:
                self._bad(
                    env,
                    "assignment",
                    f"receipt {_short(env.message_id)} names assignment {_short(r.assignment_id)}, "
                    "which does not assign its job",
                )
            else:
                try:
                    check_receipt_assignment(r, assign)
                except Mismatch as e:
                    self._bad(
                        env,
                        "assignment",
                        f"receipt {_short(env.message_id)} does not match its assignment: {e}",
                    )
            if (over := meter_overrun_ms(r)) > METER_SLACK_MS:
                what = f"receipt {_short(env.message_id)} bills {over} ms of compute while the run was paused"
                self.add("note", "meter", what, r.job_id, r.executor)

    def _bad(self, env: VerifiedEnvelope[UsageReceipt], check: str, what: str) -> None:
        self.bad_receipts.add(env.message_id)
        self.add("problem", check, what, env.message.job_id, env.message.executor)

    # 3. acknowledgements
    def check_acks(self) -> set[Digest]:
        acked: set[Digest] = set()
        for env in self.acks:
            a = env.message
            named = [self.receipt_by_id[r] for r in a.receipt_ids if r in self.receipt_by_id]
            if not named:  # (an ack of a batch may name receipts of jobs not exported: no note for those)
                n = len(a.receipt_ids)
                self.add(
                    "problem",
                    "ack",
                    f"acknowledgement {_short(env.message_id)} names {n} "
                    f"receipt{'' if n == 1 else 's'}, none of them in the bundle (the first "
                    f"{_short(a.receipt_ids[0])})",
                    None,
                    a.executor,
                )
                continue
            for receipt in named:
                try:
                    check_ack(a, receipt.message, receipt.message_id)
                except Mismatch as e:
                    self.add(
                        "problem",
                        "ack",
                        f"acknowledgement {_short(env.message_id)} does not match "
                        f"receipt {_short(receipt.message_id)}: {e}",
                        receipt.message.job_id,
                        a.executor,
                    )
                    continue
                acked.add(receipt.message_id)
        for r in self.receipts:
            if r.message_id not in acked:
                self.add(
                    "note",
                    "ack",
                    f"receipt {_short(r.message_id)} has no acknowledgement from its submitter in the bundle",
                    r.message.job_id,
                    r.message.executor,
                )
        return acked

    # 4. log inclusion and consistency
    def check_log(self, acked: set[Digest]) -> None:
        tried: set[Digest] = set()
        for env in self.proofs:
            p = env.message
            self._keep_head(p)
            known = self.receipt_by_id
            placed = [known[e.receipt_id] for e in p.entries if e.receipt_id in known]
            if not placed:  # (a proof placing some receipts of the bundle may place others too: no note)
                n = len(p.entries)
                self.add(
                    "note",
                    "inclusion",
                    f"inclusion proof for {n} receipt{'' if n == 1 else 's'}, "
                    f"none of them in the bundle (the first {_short(p.entries[0].receipt_id)})",
                    None,
                    p.executor,
                )
                continue
            for receipt in placed:
                tried.add(receipt.message_id)
                try:
                    check_inclusion(env, receipt)
                except (ProtocolError, Mismatch) as e:
                    self.add(
                        "problem",
                        "inclusion",
                        f"receipt {_short(receipt.message_id)}: {_one_line(str(e))}",
                        receipt.message.job_id,
                        p.executor,
                    )
        for receipt_id in sorted(acked - tried, key=lambda d: d.raw):
            r = self.receipt_by_id[receipt_id].message
            self.add(
                "note",
                "inclusion",
                f"receipt {_short(receipt_id)} is acknowledged but the bundle "
                "holds no inclusion proof for it",
                r.job_id,
                r.executor,
            )
        self._check_heads()

    def _keep_head(self, p: InclusionProof) -> None:
        """A head the proof's executor signed is its statement about its log, whatever the proof is worth."""
        try:
            head = verify(p.treehead, TreeHead).message
        except ProtocolError:
            return
        if head.executor == p.executor:
            self.heads.append(head)

    def _check_heads(self) -> None:
        roots: dict[tuple[bytes, int], set[bytes]] = defaultdict(set)
        for h in self.heads:
            roots[(h.executor.raw, h.size)].add(h.root.raw)
        for (executor, size), rs in sorted(roots.items()):
            if len(rs) > 1:
                self.add(
                    "problem",
                    "log",
                    f"{len(rs)} signed tree heads of size {size} with different "
                    "roots: the executor's log forked",
                    None,
                    NodeId(executor),
                )
        linked: set[tuple[bytes, int, int]] = set()
        for c in self.bundle.consistency:
            old, new = roots.get((c.executor, c.old_size)), roots.get((c.executor, c.new_size))
            if not old or not new:
                self.add(
                    "note",
                    "log",
                    f"consistency proof {c.old_size} -> {c.new_size} for sizes the "
                    "bundle holds no signed head of",
                    None,
                    NodeId(c.executor),
                )
                continue
            try:
                verify_consistency(c.old_size, c.new_size, min(old), min(new), c.proof)
            except BadProof as e:
                self.add(
                    "problem",
                    "log",
                    f"tree heads of sizes {c.old_size} and {c.new_size} are not consistent: {e}",
                    None,
                    NodeId(c.executor),
                )
                continue
            linked.add((c.executor, c.old_size, c.new_size))
        sizes: dict[bytes, list[int]] = defaultdict(list)
        for executor, size in roots:
            sizes[executor].append(size)
        for executor, ss in sorted(sizes.items()):
            ss.sort()
            gaps = [f"{a} -> {b}" for a, b in itertools.pairwise(ss) if (executor, a, b) not in linked]
            if gaps:
                self.add(
                    "note",
                    "log",
                    f"tree heads of sizes {', '.join(map(str, ss))}: no consistency "
                    f"proof for {', '.join(gaps)} in the bundle (only the executor can give one)",
                    None,
                    NodeId(executor),
                )

    # 5. disputes
    def check_disputes(self) -> None:
        by_job: dict[Digest, list[VerifiedEnvelope[UsageReceipt]]] = defaultdict(list)
        for env in self.receipts:
            if env.message.outcome.status != "timeout":
                by_job[env.message.job_id].append(env)
        for job_id, envs in by_job.items():
            first = envs[0].message
            for other in envs[1:]:
                diff = _differences(first, other.message)
                if diff:
                    self.add(
                        "problem",
                        "dispute",
                        f"receipts {_short(envs[0].message_id)} "
                        f"({first.executor}) and {_short(other.message_id)} ({other.message.executor}) "
                        f"disagree on {', '.join(diff)}",
                        job_id,
                        other.message.executor,
                    )

    # 6. re-execution
    def reexecute(
        self, verified: dict[Digest, int], progress: Callable[[int, int], None] | None = None
    ) -> None:
        from e31.sandbox.profile import PROFILE

        by_job: dict[Digest, list[VerifiedEnvelope[UsageReceipt]]] = defaultdict(list)
        for env in self.receipts:
            by_job[env.message.job_id].append(env)
        modules: dict[bytes, Any] = {}
        for number, (job_id, envs) in enumerate(by_job.items()):
            if progress is not None:
                progress(number, len(by_job))
            checkable = []
            for env in envs:
                if env.message.outcome.status == "timeout":
                    self.add(
                        "note",
                        "reexecute",
                        f"receipt {_short(env.message_id)} is not re-verifiable "
                        "(status timeout: stopped by the wall clock)",
                        job_id,
                        env.message.executor,
                    )
                else:
                    checkable.append(env)
            manifest = self.offers.get(job_id)
            if not checkable or manifest is None:
                continue
            if manifest.profile.raw != PROFILE.digest:
                for env in checkable:
                    self.add(
                        "note",
                        "reexecute",
                        f"cannot re-execute here (profile "
                        f"{manifest.profile.hex()[:16]}; this machine runs {PROFILE.digest_hex[:16]})",
                        job_id,
                        env.message.executor,
                    )
                continue
            missing = [
                f"{what} {ref.root.hex()[:16]}"
                for what, ref in blobs_of(manifest)
                if ref.root.raw not in self.bundle.blobs
            ]
            if missing:
                for env in checkable:
                    self.add(
                        "problem",
                        "reexecute",
                        f"cannot re-execute: the bundle lacks the {', '.join(missing)} blob(s)",
                        job_id,
                        env.message.executor,
                    )
                continue
            rerun = rerun_job(manifest, self.bundle.blobs, modules=modules)
            if rerun.error is not None:
                for env in checkable:
                    self.add(
                        "problem",
                        "reexecute",
                        f"cannot re-execute: {rerun.error}",
                        job_id,
                        env.message.executor,
                    )
                continue
            self.report.reexecuted += 1
            for env in checkable:
                diff = rerun.differences(env.message)
                if rerun.stopped_by_clock and diff:
                    self.add(
                        "note",
                        "reexecute",
                        f"the re-run was stopped by the wall clock on this machine "
                        f"({rerun.wall_seconds:g} s), so receipt {_short(env.message_id)} is not judged",
                        job_id,
                        env.message.executor,
                    )
                elif diff:
                    self.add(
                        "problem",
                        "reexecute",
                        f"re-execution disagrees with receipt {_short(env.message_id)}: {'; '.join(diff)}",
                        job_id,
                        env.message.executor,
                    )
                else:
                    verified[env.message_id] = 1
                    for note in rerun.unchecked:
                        self.add("note", "reexecute", note, job_id, env.message.executor)

    def summarise(self, verified: dict[Digest, int]) -> None:
        nodes: dict[NodeId, NodeSummary] = {}
        jobs: dict[NodeId, set[Digest]] = defaultdict(set)
        for env in self.receipts:
            r = env.message
            s = nodes.setdefault(r.executor, NodeSummary(str(r.executor)))
            jobs[r.executor].add(r.job_id)
            s.receipts += 1
            s.fuel += r.fuel_used
            s.compute_ms += r.compute_ms
            s.queue_wait_ms += r.waited_ms
            s.paused_ms += r.meter.paused_ms if r.meter else 0
            s.fetch_ms += r.meter.fetch_ms if r.meter else 0
            s.reexecuted += verified.get(env.message_id, 0)
        for node, s in nodes.items():
            s.jobs = len(jobs[node])
            s.problems = sum(1 for f in self.report.problems if f.node == str(node))
        self.report.nodes = sorted(nodes.values(), key=lambda s: s.node)


def audit(
    bundle: Bundle, *, reexecute: bool = False, progress: Callable[[int, int], None] | None = None
) -> AuditReport:
    """Check a bundle; never raises for anything in it. `progress(done, total)` is called before each
    job is re-executed."""
    a = _Audit(bundle)
    a.load()
    a.check_receipts()
    acked = a.check_acks()
    a.check_log(acked)
    a.check_disputes()
    verified: dict[Digest, int] = {}
    if reexecute:
        a.reexecute(verified, progress)
    a.summarise(verified)
    return a.report


def check_inclusion(
    proof: VerifiedEnvelope[InclusionProof], receipt: VerifiedEnvelope[UsageReceipt]
) -> TreeHead:
    """Check that a verified `proof` places the receipt in its executor's log (docs/protocol.md 10.5); return
    its tree head.

    Raises Mismatch, BadProof or another ProtocolError naming what is wrong.
    """
    p = proof.message
    entry = p.entry(receipt.message_id)
    if entry is None:
        raise Mismatch("the proof does not place that receipt")
    if p.executor != receipt.message.executor:
        raise Mismatch("the proof is not signed by the receipt's executor")
    if p.network != receipt.message.network:
        raise Mismatch("the proof and the receipt are on different networks")
    try:
        head = verify(p.treehead, TreeHead).message
    except ProtocolError as e:
        raise type(e)(f"the proof's tree head does not verify: {e}") from None
    if head.executor != p.executor:
        raise Mismatch("the proof's tree head is signed by another node")
    if head.network != p.network:
        raise Mismatch("the proof's tree head is for another network")
    if head.size != p.tree_size:
        raise Mismatch(f"the proof is for a tree of {p.tree_size} leaves, its signed head for {head.size}")
    try:
        verify_entry_inclusion(
            receipt.raw, entry.leaf_index, p.tree_size, [h.raw for h in entry.path], head.root.raw
        )
    except BadProof as e:
        raise BadProof(f"the inclusion proof does not match the signed tree head: {e}") from None
    return head


# --- helpers ------------------------------------------------------------------------------------------


def _differences(a: UsageReceipt, b: UsageReceipt) -> list[str]:
    out = []
    for name in ("outcome", "fuel_used", "stdout", "stderr", "outputs"):
        if getattr(a, name) != getattr(b, name):
            out.append(name)
    return out


def _short(d: Digest) -> str:
    return d.hex()[:16]


def _one_line(text: str) -> str:
    return " ".join(text.split())


# --- rendering ----------------------------------------------------------------------------------------


def render(report: AuditReport) -> str:
    counts = (
        (report.envelopes, "envelope"),
        (report.jobs, "job"),
        (report.receipts, "receipt"),
        (report.acks, "acknowledgement"),
        (report.proofs, "inclusion proof"),
        (report.blobs, "blob"),
    )
    lines = ["bundle: " + ", ".join(f"{n} {noun}{'' if n == 1 else 's'}" for n, noun in counts)]
    if report.nodes:
        lines.append("")
        head: tuple[str, ...] = ("node", "jobs", "receipts", "fuel", "compute s", "queue wait s")
        head += ("paused s", "fetch s", "re-executed", "problems")
        rows = [head] + [
            (
                n.node,
                str(n.jobs),
                str(n.receipts),
                f"{n.fuel:,}",
                f"{n.compute_ms / 1000:.3f}",
                f"{n.queue_wait_ms / 1000:.3f}",
                f"{n.paused_ms / 1000:.3f}",
                f"{n.fetch_ms / 1000:.3f}",
                str(n.reexecuted),
                str(n.problems),
            )
            for n in report.nodes
        ]
        widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
        for r in rows:
            lines.append(
                "  ".join(
                    c.ljust(w) if i == 0 else c.rjust(w)
                    for i, (c, w) in enumerate(zip(r, widths, strict=True))
                ).rstrip()
            )
    for title, items in (("problems", report.problems), ("notes", report.notes)):
        if items:
            lines.append("")
            lines.append(f"{title} ({len(items)}):")
            for f in items:
                where = " ".join(
                    x for x in (f"job {f.job[:16]}" if f.job else "", f"node {f.node}" if f.node else "") if x
                )
                lines.append(f"  [{f.check}] {where + ': ' if where else ''}{f.what}")
    lines.append("")
    if report.sound:
        rerun, checked = report.reexecuted, report.receipts
        extra = f", {rerun} job{'' if rerun == 1 else 's'} re-executed" if rerun else ""
        lines.append(f"result: sound ({checked} receipt{'' if checked == 1 else 's'} checked{extra})")
    else:
        n = len(report.problems)
        lines.append(f"result: {n} problem{'s' if n != 1 else ''} found")
    return "\n".join(lines)
