from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import vector_files as vectors
from e31.protocol.assignments import assignments
from e31.protocol.blobs import blob_ref
from e31.protocol.envelope import sign_message, verify
from e31.protocol.errors import InvalidMessage, Mismatch
from e31.protocol.messages import Ack, Assign, Offer, UsageReceipt
from e31.protocol.receipts import check_ack, check_receipt_assignment, check_receipt_manifest

GEN = vectors.generator()
BY_NAME = {name: (key_name, msg) for name, key_name, msg in GEN.samples()}


def _env(name: str) -> Any:
    key_name, msg = BY_NAME[name]
    return verify(sign_message(msg, GEN.key(key_name)))


OFFER = _env("offer")
ASSIGN = _env("assign")
RECEIPT = _env("receipt")
ACK = _env("ack")
MANIFEST = OFFER.message.manifest(RECEIPT.message.job_id)
ONE = assignments(ASSIGN)[0]


def test_the_sample_flow_checks_out() -> None:
    assert isinstance(OFFER.message, Offer) and isinstance(ASSIGN.message, Assign)
    assert MANIFEST is not None and ASSIGN.message.job_id == MANIFEST.job_id
    check_receipt_manifest(RECEIPT.message, MANIFEST)
    check_receipt_assignment(RECEIPT.message, assignments(ASSIGN)[0])
    check_ack(ACK.message, RECEIPT.message, RECEIPT.message_id)
    assert RECEIPT.message.waited_ms == 60_000


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"module": blob_ref(b"other module")}, "module"),
        ({"profile": GEN.digest("x")}, "profile"),
        ({"limits": dataclasses.replace(GEN.LIMITS, wall_ms=1)}, "limits"),
        ({"inputs": ()}, "inputs"),
        ({"stdin": blob_ref(b"")}, "stdin"),
        ({"job_id": GEN.digest("other job")}, "job"),
        ({"submitter": GEN.nid("executor")}, "submitter"),
    ],
)
def test_receipt_that_describes_another_run_is_a_mismatch(change: dict[str, Any], match: str) -> None:
    receipt = dataclasses.replace(RECEIPT.message, **change)
    with pytest.raises(Mismatch, match=match):
        check_receipt_manifest(receipt, MANIFEST)


def test_outputs_over_the_limit_are_a_mismatch() -> None:
    man = dataclasses.replace(MANIFEST, limits=dataclasses.replace(GEN.LIMITS, max_output_bytes=10))
    receipt = dataclasses.replace(RECEIPT.message, limits=man.limits, job_id=man.job_id)
    with pytest.raises(Mismatch, match="max_output_bytes"):
        check_receipt_manifest(receipt, man)


def test_receipt_for_another_assignment_is_a_mismatch() -> None:
    with pytest.raises(Mismatch, match="assignment"):
        check_receipt_assignment(RECEIPT.message, dataclasses.replace(ONE, assignment_id=OFFER.message_id))
    other_executor = dataclasses.replace(ONE, executor=GEN.nid("submitter"))
    with pytest.raises(Mismatch, match="not assigned"):
        check_receipt_assignment(RECEIPT.message, other_executor)


def test_ack_must_name_the_receipt() -> None:
    with pytest.raises(Mismatch, match="does not name the receipt"):
        check_ack(ACK.message, RECEIPT.message, ASSIGN.message_id)
    other_executor = dataclasses.replace(ACK.message, executor=GEN.nid("submitter"))
    with pytest.raises(Mismatch, match="executors"):
        check_ack(other_executor, RECEIPT.message, RECEIPT.message_id)
    other_network = dataclasses.replace(ACK.message, network="elsewhere")
    with pytest.raises(Mismatch, match="networks"):
        check_ack(other_network, RECEIPT.message, RECEIPT.message_id)
    assert isinstance(ACK.message, Ack)


def test_an_ack_of_a_batch_names_each_of_its_receipts() -> None:
    batch = _env("ack-two-receipts").message
    trap = verify(sign_message(BY_NAME["receipt-trap"][1], GEN.key("executor")))
    for receipt in (RECEIPT, trap):
        assert batch.names(receipt.message_id)
        check_ack(batch, receipt.message, receipt.message_id)
    assert not batch.names(ASSIGN.message_id)
    assert not ACK.message.names(trap.message_id)
    with pytest.raises(InvalidMessage):  # ids out of order
        dataclasses.replace(batch, receipt_ids=tuple(reversed(batch.receipt_ids)))
    with pytest.raises(InvalidMessage):  # none
        dataclasses.replace(batch, receipt_ids=())


def test_receipt_internal_rules() -> None:
    r: UsageReceipt = RECEIPT.message
    with pytest.raises(InvalidMessage, match="queued_at"):
        dataclasses.replace(r, started_at=r.queued_at - 1)
    with pytest.raises(InvalidMessage, match="fuel"):
        dataclasses.replace(r, fuel_used=r.limits.fuel + 1)
    with pytest.raises(InvalidMessage, match="peak_memory"):
        dataclasses.replace(r, peak_memory=r.limits.memory_bytes + 1)
    with pytest.raises(InvalidMessage, match="outcome"):
        dataclasses.replace(r, outcome="exited")
