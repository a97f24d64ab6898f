"""A `result`, the delivery of a finished job: the receipt it carries, and the outputs it carries.

An executor delivers a job in one message: a `result` holding the job's signed usage receipt whole and
the bytes of its small outputs. `make_result` builds one within a frame; `open_result` checks a
received one and returns its receipt, verified; `carried_outputs` matches the bytes it carries to the
BlobRefs the receipt names. Jobs that finish close together travel in one `results` carrier
(`make_results` packs them into as few carriers as fit in frames); its entries are the `result`s it
stands for (`Results.result`), each checked alone with `check_result`, so a bad entry is refused alone.
Sans-I/O: bytes in, checked values out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from .blobs import PUSH_MAX, BlobRef, blob_ref
from .envelope import VerifiedEnvelope, verify
from .errors import Mismatch
from .ids import NodeId
from .messages import BY_ENTRY, MAX_PUSHED, MAX_RESULTS, RECEIPT_MAX, Result, ResultEntry, Results
from .receipts import UsageReceipt, expect

PER_OUTPUT = 8
"""Bytes of msgpack header around each carried output (a bin 32 header is 5)."""


def make_result(
    network: str,
    receipt: VerifiedEnvelope[UsageReceipt],
    available_until: int,
    small: Iterable[tuple[BlobRef, bytes]] = (),
) -> Result:
    """The `result` delivering `receipt`, carrying as many of the `small` outputs (in order) as fit: each
    of 1..PUSH_MAX bytes and matching its BlobRef, at most MAX_PUSHED of them, the whole within a frame."""
    msg = receipt.message
    room = RECEIPT_MAX - len(receipt.raw)  # the frame less the result's own fields
    carried: list[bytes] = []
    seen: set[bytes] = set()
    for ref, data in small:
        if len(carried) == MAX_PUSHED:
            break
        if not 0 < ref.size <= PUSH_MAX or len(data) != ref.size or ref.root.raw in seen:
            continue
        if len(data) + PER_OUTPUT > room:
            continue
        carried.append(data)
        seen.add(ref.root.raw)
        room -= len(data) + PER_OUTPUT
    return Result(
        network, msg.job_id, msg.assignment_id, msg.executor, receipt.raw, available_until, tuple(carried)
    )


ENTRY_OVERHEAD = 128
"""Bytes of an entry in a `results` carrier beyond its receipt and outputs (ids, time, headers)."""
RESULTS_ROOM = RECEIPT_MAX
"""Bytes of entries one `results` carrier holds at most: a frame less the carrier's own fields and
envelope, so any one entry `make_result` builds fits alone."""

Delivered = tuple[VerifiedEnvelope[UsageReceipt], int, Iterable[tuple[BlobRef, bytes]]]
"""A finished job to deliver: its signed receipt, until when its outputs can be fetched, and the
bytes of its small outputs (offered to the carrier, which takes what fits)."""


def make_results(network: str, executor: NodeId, delivered: Sequence[Delivered]) -> list[Results]:
    """The `results` carriers delivering these jobs: entries in carrier order, at most MAX_RESULTS and
    RESULTS_ROOM bytes to a carrier, each with the small outputs `make_result` would carry. A receipt
    given twice (the same assignment and job) is carried once."""
    entries: dict[tuple[bytes, bytes], tuple[ResultEntry, int]] = {}
    for receipt, available_until, small in delivered:
        r = make_result(network, receipt, available_until, small)
        entry = ResultEntry(r.job_id, r.assignment_id, r.receipt, r.available_until, r.outputs)
        size = len(r.receipt) + sum(len(o) + PER_OUTPUT for o in r.outputs) + ENTRY_OVERHEAD
        entries.setdefault(BY_ENTRY(entry), (entry, size))
    carriers: list[Results] = []
    batch: list[ResultEntry] = []
    room = RESULTS_ROOM
    for _, (entry, size) in sorted(entries.items()):
        if batch and (len(batch) == MAX_RESULTS or size > room):
            carriers.append(Results(network, executor, tuple(batch)))
            batch, room = [], RESULTS_ROOM
        batch.append(entry)
        room -= size
    if batch:
        carriers.append(Results(network, executor, tuple(batch)))
    return carriers


def open_result(env: VerifiedEnvelope[Result]) -> VerifiedEnvelope[UsageReceipt]:
    """The receipt a verified `result` carries, verified in turn: raises a ProtocolError (Mismatch when
    it is a sound receipt of another job, assignment, network or executor than the result's)."""
    return check_result(env.message, env.signer)


def check_result(result: Result, signer: NodeId) -> VerifiedEnvelope[UsageReceipt]:
    """The receipt `result` carries, verified: `result` came signed by `signer`, alone or as an entry of
    a `results` carrier (`Results.result`). Raises a ProtocolError as `open_result` does."""
    receipt = verify(result.receipt, UsageReceipt, max_len=RECEIPT_MAX)
    msg = receipt.message
    expect(receipt.signer == signer, "the result carries a receipt signed by another node")
    expect(msg.executor == result.executor, "the result carries a receipt of another executor")
    expect(msg.network == result.network, "the result carries a receipt of another network")
    expect(msg.job_id == result.job_id, "the result carries a receipt of another job")
    expect(msg.assignment_id == result.assignment_id, "the result carries a receipt of another assignment")
    return receipt


def carried_outputs(result: Result, receipt: UsageReceipt) -> dict[bytes, bytes]:
    """The outputs a result carries, by blob root: raises Mismatch for bytes that are none of the
    receipt's stdout, stderr and output files (each is hashed in full here)."""
    if not result.outputs:
        return {}
    named: dict[bytes, BlobRef] = {ref.root.raw: ref for ref in outputs_of(receipt)}
    carried: dict[bytes, bytes] = {}
    for data in result.outputs:
        ref = blob_ref(data)
        if named.get(ref.root.raw) != ref:
            raise Mismatch(f"the result carries {len(data)} bytes that are no output its receipt names")
        carried[ref.root.raw] = data
    return carried


def outputs_of(receipt: UsageReceipt) -> tuple[BlobRef, ...]:
    """Every blob a receipt names as the job's output: stdout, stderr, then the output files."""
    return (receipt.stdout, receipt.stderr, *(f.blob for f in receipt.outputs))


__all__ = [
    "ENTRY_OVERHEAD",
    "PER_OUTPUT",
    "RESULTS_ROOM",
    "Delivered",
    "carried_outputs",
    "check_result",
    "make_result",
    "make_results",
    "open_result",
    "outputs_of",
]
