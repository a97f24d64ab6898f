"""A `result`: the receipt it carries and the outputs it carries (protocol/results.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import vector_files as vectors
from e31.protocol.blobs import PUSH_MAX, BlobRef, blob_ref
from e31.protocol.codec import MAX_FRAME
from e31.protocol.envelope import sign_message, sign_verified, verify
from e31.protocol.errors import BadSignature, Mismatch, UnknownKind
from e31.protocol.ids import Digest
from e31.protocol.jobs import FileRef
from e31.protocol.messages import MAX_PUSHED, Result, UsageReceipt
from e31.protocol.results import carried_outputs, make_result, open_result, outputs_of

GEN = vectors.generator()
BY_NAME = {name: (key_name, msg) for name, key_name, msg in GEN.samples()}
EXECUTOR = GEN.key("executor")


def _sample(name: str) -> Any:
    return BY_NAME[name][1]


RECEIPT: UsageReceipt = _sample("receipt")


def _receipt(**changes: Any) -> Any:
    return sign_verified(dataclasses.replace(RECEIPT, **changes), EXECUTOR)


def _signed(result: Result, key: Any = EXECUTOR) -> Any:
    return verify(sign_message(result, key), Result)


def test_the_sample_result_opens_to_its_receipt_and_carried_output() -> None:
    env = _signed(_sample("result"))
    receipt = open_result(env)
    assert receipt.message == RECEIPT and receipt.raw == env.message.receipt
    data = b"[[1,2],[3,4]]"
    assert carried_outputs(env.message, receipt.message) == {blob_ref(data).root.raw: data}


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("job_id", Digest(b"\x07" * 32), "another job"),
        ("assignment_id", Digest(b"\x07" * 32), "another assignment"),
        ("network", "e31-other", "another network"),
    ],
)
def test_a_result_carrying_a_receipt_of_something_else_is_a_mismatch(
    field: str, value: Any, match: str
) -> None:
    result = dataclasses.replace(_sample("result"), **{field: value})
    with pytest.raises(Mismatch, match=match):
        open_result(_signed(result))


def test_a_receipt_signed_by_another_node_than_its_result_is_a_mismatch() -> None:
    other = GEN.key("submitter")
    receipt = sign_message(dataclasses.replace(RECEIPT, executor=GEN.nid("submitter")), other)
    result = dataclasses.replace(_sample("result"), receipt=receipt)
    with pytest.raises(Mismatch, match="signed by another node"):
        open_result(_signed(result))


def test_the_carried_receipt_is_verified_and_must_be_a_receipt() -> None:
    raw = bytearray(_sample("result").receipt)
    raw[-1] ^= 1
    with pytest.raises(BadSignature):
        open_result(_signed(dataclasses.replace(_sample("result"), receipt=bytes(raw))))
    ping = sign_message(_sample("ping"), EXECUTOR)
    with pytest.raises(UnknownKind):
        open_result(_signed(dataclasses.replace(_sample("result"), receipt=ping)))


def test_carried_bytes_that_are_no_output_of_the_receipt_are_a_mismatch() -> None:
    result = dataclasses.replace(_sample("result"), outputs=(b"something else",))
    receipt = open_result(_signed(result))
    with pytest.raises(Mismatch, match="no output its receipt names"):
        carried_outputs(result, receipt.message)


def test_make_result_carries_the_small_outputs_in_order_within_its_bounds() -> None:
    small = [bytes([i]) * (i + 1) for i in range(MAX_PUSHED + 3)]
    files = tuple(FileRef(f"f{i:02}", blob_ref(d)) for i, d in enumerate(small))
    receipt = _receipt(outputs=files, stdout=blob_ref(b""), stderr=blob_ref(b"e" * (PUSH_MAX + 1)))
    too_big = (receipt.message.stderr, b"e" * (PUSH_MAX + 1))
    empty = (receipt.message.stdout, b"")
    wrong = (blob_ref(b"abc"), b"abcd")  # its bytes are not of its size
    offered = [empty, too_big, wrong, *((blob_ref(d), d) for d in small)]
    result = make_result(RECEIPT.network, receipt, 123, offered)
    assert result.outputs == tuple(small[:MAX_PUSHED])
    assert result.receipt == receipt.raw and result.assignment_id == RECEIPT.assignment_id
    env = _signed(result)  # it encodes, verifies and opens
    carried = carried_outputs(env.message, open_result(env).message)
    assert set(carried) == {blob_ref(d).root.raw for d in small[:MAX_PUSHED]}


def test_make_result_keeps_within_a_frame() -> None:
    big = [bytes([i]) * PUSH_MAX for i in range(MAX_PUSHED)]  # 16 x 64 KiB: more than a frame holds
    refs: list[tuple[BlobRef, bytes]] = [(blob_ref(d), d) for d in big]
    files = tuple(FileRef(f"f{i:02}", ref) for i, (ref, _) in enumerate(refs))
    receipt = _receipt(outputs=files)
    result = make_result(RECEIPT.network, receipt, 123, refs)
    raw = sign_message(result, EXECUTOR)
    assert len(raw) <= MAX_FRAME and 0 < len(result.outputs) < MAX_PUSHED
    assert set(outputs_of(receipt.message)) >= {blob_ref(d) for d in result.outputs}
