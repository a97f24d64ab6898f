"""Usage receipts, the submitter's acknowledgement, and the pure checks that tie them together.

A receipt is the executor's signed account of one run: what ran (module, inputs, profile,
limits), what came out (stdout, stderr, output files, outcome), what it used (fuel, peak memory,
compute time) and when it was queued, started and finished, so waiting is visible and never
billed. Version 2 adds the `meter` (a 21st field): the time the run was paused and the time spent
fetching the job's inputs, neither of them billed. A version 1 receipt has 20 fields (no meter) and
still decodes, to `meter=None`, and encodes back to the same 20 fields: the version is the array's
length; a 21st field that is nil is refused (one receipt, one encoding).
The submitter countersigns receipts with an `ack` naming their message ids: one ack may answer a
batch of receipts of one executor.
The check functions take already verified messages and raise Mismatch; they never look at a clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

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
    Codec,
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
    compiled_decoder,
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


ABSENT = object()
"""Stands, in a wire array made longer to the newer shape, for a field the older version lacks."""


class Added(Opt):
    """A field a newer version of a record added at its end: absent from an older version's array
    (ABSENT there: decoded as None), never nil on the wire. Encoded, checked and shown as `Opt` is
    (None: the record drops the field); only decoding differs, where nil is refused."""

    inline = Codec.inline  # (Opt's generated check would take nil; the reference decode refuses it)

    def dec(self, w: object) -> Any:
        return None if w is ABSENT else self.inner.dec(w)

    def decode(self, w: object) -> Any:
        return None if w is ABSENT else self.inner.decode(w)

    def describe(self) -> str:
        return f"{self.inner.describe()} (version 2; a version 1 array ends before it; never nil)"


@record
@dataclass(frozen=True, slots=True)
class Meter(Record):
    """What a run's job spent apart from compute, none of it billed (receipt version 2)."""

    paused_ms: int = field(metadata=w(UInt()))
    """Time the run was paused while it held its core (the machine's owner came back; preemption)."""
    fetch_ms: int = field(metadata=w(UInt()))
    """Time spent fetching the job's module, inputs and stdin before it was queued."""


RECEIPT_V1_FIELDS = 20
"""Fields of a version 1 receipt (no `meter`); a version 2 receipt has one more."""


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
    meter: Meter | None = field(default=None, metadata=w(Added(Sub(Meter))))
    """Version 2: the unbilled time; None in a version 1 receipt (which has no such field at all)."""

    def _validate(self) -> None:
        if not self.queued_at <= self.started_at <= self.finished_at:
            raise InvalidMessage("UsageReceipt: expected queued_at <= started_at <= finished_at")
        if self.meter is not None and self.meter.paused_ms > self.finished_at - self.started_at:
            raise InvalidMessage("UsageReceipt: meter.paused_ms exceeds finished_at - started_at")
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

    @property
    def version(self) -> int:
        """1: no meter; 2: with one."""
        return 1 if self.meter is None else 2

    def to_wire(self) -> tuple[Any, ...]:
        wire = Record.to_wire(self)
        return wire[:RECEIPT_V1_FIELDS] if self.meter is None else wire

    def to_json(self) -> dict[str, Any]:
        doc = Record.to_json(self)
        if self.meter is None:  # a version 1 receipt, as it was written
            del doc["meter"]
        return doc

    @classmethod
    def from_json(cls, j: object) -> UsageReceipt:
        if isinstance(j, dict) and "meter" not in j:
            j = {**j, "meter": None}
        return Record.from_json.__func__(cls, j)  # type: ignore[attr-defined,no-any-return]

    @classmethod
    def from_wire_reference(cls, wire: object) -> UsageReceipt:
        return Record.from_wire_reference.__func__(cls, _receipt_v2_shape(wire))  # type: ignore[attr-defined,no-any-return]


def _receipt_v2_shape(wire: object) -> object:
    """A version 1 receipt's wire array in the version 2 shape: its meter ABSENT (decoded as None)."""
    if type(wire) is tuple and len(wire) == RECEIPT_V1_FIELDS:
        return (*wire, ABSENT)
    return wire


_decode_receipt_fields = None


def _receipt_from_wire(wire: object) -> UsageReceipt:
    """UsageReceipt's decoder: both versions (the compiled decoder of its fields, built on first use);
    a refusal raises the reference decoder's error for the wire as it came."""
    global _decode_receipt_fields
    if _decode_receipt_fields is None:
        _decode_receipt_fields = compiled_decoder(UsageReceipt)
    try:
        return _decode_receipt_fields(_receipt_v2_shape(wire))
    except InvalidMessage:
        UsageReceipt.from_wire_reference(wire)
        raise


UsageReceipt.from_wire = _receipt_from_wire  # type: ignore[method-assign]


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


METER_SLACK_MS = 1_000
"""How far a receipt's compute and pause may exceed its run's span before an auditor notes it (the
executor measures them with different clocks)."""


def meter_overrun_ms(receipt: UsageReceipt) -> int:
    """How far `compute_ms + meter.paused_ms` exceeds `finished_at - started_at` (0 if it does not, or
    the receipt has no meter): billed time the executor also says the run was paused."""
    if receipt.meter is None:
        return 0
    return max(0, receipt.compute_ms + receipt.meter.paused_ms - (receipt.finished_at - receipt.started_at))


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
