"""Usage receipts, the submitter's acknowledgement, and the pure checks that tie them together.

A receipt is the executor's signed account of one run: what ran (module, inputs, profile,
limits), what came out (stdout, stderr, output files, outcome), what it used (fuel, peak memory,
compute time) and when it was queued, started and finished, so waiting is visible and never
billed. The submitter countersigns receipts with an `ack` naming their message ids: one ack may
answer a batch of receipts of one executor.
The check functions take already verified messages and raise Mismatch; they never look at a clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .blobs import BlobRef
from .errors import InvalidMessage, Mismatch
from .ids import Digest, NodeId
from .jobs import MAX_INPUTS, FileRef, JobManifest, Limits
from .schema import (
    BY_NAME,
    BY_RAW,
    NETWORK,
    TIME,
    U32,
    Hash,
    Key,
    Message,
    OneOf,
    Opt,
    Record,
    Seq,
    Sub,
    Text,
    UInt,
    find_sorted,
    message,
    record,
    w,
)

if TYPE_CHECKING:
    from .messages import Assign

STATUSES = ("exited", "out_of_fuel", "timeout", "memory_limit", "output_limit", "trap", "invalid_module")
MAX_OUTPUTS = MAX_INPUTS
TRAP_MAX = 64


@record
@dataclass(frozen=True, slots=True)
class Outcome(Record):
    """How a run ended: `exit_code` is set exactly when status is `exited`, `trap` exactly for `trap`."""

    status: str = field(metadata=w(OneOf(*STATUSES)))
    exit_code: int | None = field(metadata=w(Opt(UInt(U32))))
    trap: str | None = field(metadata=w(Opt(Text(TRAP_MAX, min_len=1))))

    def _validate(self) -> None:
        if (self.exit_code is not None) != (self.status == "exited"):
            raise InvalidMessage("Outcome: exit_code is set exactly when status is 'exited'")
        if (self.trap is not None) != (self.status == "trap"):
            raise InvalidMessage("Outcome: trap is set exactly when status is 'trap'")


@message("receipt", issuer="executor")
@dataclass(frozen=True, slots=True)
class UsageReceipt(Message):
    network: str = field(metadata=w(NETWORK))
    job_id: Digest = field(metadata=w(Hash()))
    assignment_id: Digest = field(metadata=w(Hash()))
    submitter: NodeId = field(metadata=w(Key()))
    executor: NodeId = field(metadata=w(Key()))
    module: BlobRef = field(metadata=w(Sub(BlobRef)))
    inputs: tuple[FileRef, ...] = field(metadata=w(Seq(Sub(FileRef), MAX_INPUTS, order_key=BY_NAME)))
    stdin: BlobRef | None = field(metadata=w(Opt(Sub(BlobRef))))
    stdout: BlobRef = field(metadata=w(Sub(BlobRef)))
    stderr: BlobRef = field(metadata=w(Sub(BlobRef)))
    outputs: tuple[FileRef, ...] = field(metadata=w(Seq(Sub(FileRef), MAX_OUTPUTS, order_key=BY_NAME)))
    profile: Digest = field(metadata=w(Hash()))
    limits: Limits = field(metadata=w(Sub(Limits)))
    outcome: Outcome = field(metadata=w(Sub(Outcome)))
    fuel_used: int = field(metadata=w(UInt()))
    peak_memory: int = field(metadata=w(UInt()))
    compute_ms: int = field(metadata=w(UInt()))
    queued_at: int = field(metadata=w(TIME))
    started_at: int = field(metadata=w(TIME))
    finished_at: int = field(metadata=w(TIME))

    def _validate(self) -> None:
        if not self.queued_at <= self.started_at <= self.finished_at:
            raise InvalidMessage("UsageReceipt: expected queued_at <= started_at <= finished_at")
        if self.fuel_used > self.limits.fuel:
            raise InvalidMessage("UsageReceipt: fuel_used exceeds limits.fuel")
        if self.peak_memory > self.limits.memory_bytes:
            raise InvalidMessage("UsageReceipt: peak_memory exceeds limits.memory_bytes")

    @property
    def output_bytes(self) -> int:
        return self.stdout.size + self.stderr.size + sum(f.blob.size for f in self.outputs)

    @property
    def waited_ms(self) -> int:
        return self.started_at - self.queued_at


MAX_ACKED = 256
"""Receipts one `ack` countersigns (32 bytes of id each: 8 KiB, far inside a frame)."""


@message("ack", issuer="submitter")
@dataclass(frozen=True, slots=True)
class Ack(Message):
    """The submitter's countersignature of receipts of one executor, named by their message ids
    (strictly increasing): one ack answers a batch of results."""

    network: str = field(metadata=w(NETWORK))
    submitter: NodeId = field(metadata=w(Key()))
    executor: NodeId = field(metadata=w(Key()))
    acked_at: int = field(metadata=w(TIME))
    receipt_ids: tuple[Digest, ...] = field(metadata=w(Seq(Hash(), MAX_ACKED, min_items=1, order_key=BY_RAW)))

    def names(self, receipt_id: Digest) -> bool:
        """Whether this ack countersigns that receipt."""
        return find_sorted(self.receipt_ids, receipt_id.raw, BY_RAW) is not None


def expect(ok: bool, what: str) -> None:
    """Raise Mismatch(what) unless `ok`: how the checks tying signed messages together read."""
    if not ok:
        raise Mismatch(what)


def check_receipt_manifest(receipt: UsageReceipt, manifest: JobManifest) -> None:
    """Raise Mismatch unless the receipt describes a run of exactly this manifest, within its limits."""
    expect(receipt.job_id == manifest.job_id, "receipt names another job")
    expect(receipt.submitter == manifest.submitter, "receipt names another submitter")
    expect(receipt.module == manifest.module, "receipt names another module")
    expect(receipt.inputs == manifest.inputs, "receipt names other inputs")
    expect(receipt.stdin == manifest.stdin, "receipt names another stdin")
    expect(receipt.profile == manifest.profile, "receipt names another execution profile")
    expect(receipt.limits == manifest.limits, "receipt names other limits")
    expect(
        receipt.output_bytes <= manifest.limits.max_output_bytes,
        "receipt's outputs exceed the job's max_output_bytes",
    )


def check_receipt_assignment(receipt: UsageReceipt, assignment: Assign, assignment_id: Digest) -> None:
    """Raise Mismatch unless the receipt fulfils this assignment (given with its message id)."""
    expect(receipt.assignment_id == assignment_id, "receipt names another assignment")
    expect(receipt.network == assignment.network, "receipt and assignment are on different networks")
    expect(receipt.job_id == assignment.job_id, "receipt and assignment name different jobs")
    expect(receipt.executor == assignment.executor, "receipt is signed by someone not assigned the job")
    expect(receipt.submitter == assignment.submitter, "receipt and assignment name different submitters")


def check_ack(ack: Ack, receipt: UsageReceipt, receipt_id: Digest) -> None:
    """Raise Mismatch unless the ack countersigns this receipt (given with its message id)."""
    expect(ack.names(receipt_id), "ack does not name the receipt")
    expect(ack.network == receipt.network, "ack and receipt are on different networks")
    expect(ack.submitter == receipt.submitter, "ack is not signed by the receipt's submitter")
    expect(ack.executor == receipt.executor, "ack and receipt name different executors")
