"""The meter: what a run's signed usage receipt records of it (docs/protocol.md, section 9).

Billed: the fuel the sandbox counted and `compute_ms`, the time the guest held the CPU (the sandbox's
own `wall_seconds`, which a pause does not advance). Recorded and never billed: the wait in the queue
(`started_at - queued_at`), and, in the receipt's `meter` (version 2), the time the run was paused
while it held its worker (the machine's owner came back: `RunRecord.paused_ms`, from the scheduler)
and the time the executor spent fetching the job's module, inputs and stdin before queueing it
(`fetch_ms`, measured by the executor around its fetches). A job that never started, or was stopped
at its deadline, gets no receipt at all.
"""

from __future__ import annotations

import os

from e31.protocol.assignments import Assignment
from e31.protocol.blobs import BlobRef
from e31.protocol.envelope import VerifiedEnvelope, sign_verified
from e31.protocol.ids import NodeId
from e31.protocol.jobs import FileRef, JobManifest
from e31.protocol.receipts import TRAP_MAX, Meter, Outcome, UsageReceipt
from e31.sandbox.limits import RunResult, Status
from nacl.signing import SigningKey

from .scheduler import RunRecord

_TEST_LIE = 1 if os.environ.get("E31_TEST_CORRUPT_OUTPUT") == "1" else 0
"""TEST ONLY: E31_TEST_CORRUPT_OUTPUT=1 makes this node a lying executor that claims one fuel more than
it used (tests/node/test_faults_submitter.py catches it as `disputed`). Never set it otherwise."""


def receipt(
    *,
    network: str,
    executor: NodeId,
    identity: SigningKey,
    manifest: JobManifest,
    assign: Assignment,
    record: RunRecord,
    fetch_ms: int,
    stdout: BlobRef,
    stderr: BlobRef,
    outputs: tuple[FileRef, ...],
) -> VerifiedEnvelope[UsageReceipt]:
    """The signed receipt (version 2: with its meter) of a run whose outputs are stored."""
    result = record.result
    msg = UsageReceipt(
        network=network,
        job_id=manifest.job_id,
        assignment_id=assign.assignment_id,
        submitter=manifest.submitter,
        executor=executor,
        module=manifest.module,
        inputs=manifest.inputs,
        stdin=manifest.stdin,
        stdout=stdout,
        stderr=stderr,
        outputs=outputs,
        profile=manifest.profile,
        limits=manifest.limits,
        outcome=outcome(result),
        fuel_used=result.fuel_used + _TEST_LIE,
        peak_memory=min(result.peak_memory_bytes, manifest.limits.memory_bytes),
        compute_ms=record.compute_ms,
        queued_at=record.queued_at,
        started_at=record.started_at,
        finished_at=record.finished_at,
        meter=Meter(paused_ms=record.paused_ms, fetch_ms=max(0, fetch_ms)),
    )
    return sign_verified(msg, identity)


def outcome(result: RunResult) -> Outcome:
    """How the run ended, as a receipt says it."""
    if result.status is Status.EXITED:
        return Outcome("exited", result.exit_code if result.exit_code is not None else 0, None)
    if result.status is Status.TRAP:
        trap = (result.trap or "unknown")[:TRAP_MAX] or "unknown"
        return Outcome("trap", None, trap)
    return Outcome(str(result.status), None, None)
