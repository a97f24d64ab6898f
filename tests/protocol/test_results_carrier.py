"""A `results` carrier: many finished jobs in one signed message, each entry checked alone
(protocol/results.py: make_results, check_result)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import vector_files as vectors
from e31.protocol.blobs import PUSH_MAX, BlobRef, blob_ref
from e31.protocol.codec import MAX_FRAME
from e31.protocol.envelope import sign_message, sign_verified, verify
from e31.protocol.errors import Mismatch, ProtocolError
from e31.protocol.ids import sha256
from e31.protocol.jobs import FileRef
from e31.protocol.messages import BY_ENTRY, MAX_PUSHED, MAX_RESULTS, Results, UsageReceipt
from e31.protocol.results import carried_outputs, check_result, make_results

GEN = vectors.generator()
BY_NAME = {name: msg for name, _, msg in GEN.samples() + GEN.results_samples()}
EXECUTOR = GEN.key("executor")
RECEIPT: UsageReceipt = BY_NAME["receipt"]  # type: ignore[assignment]


def _receipt(i: int, **changes: Any) -> Any:
    return sign_verified(
        dataclasses.replace(
            RECEIPT, job_id=sha256(b"job %d" % i), assignment_id=sha256(b"assignment %d" % i), **changes
        ),
        EXECUTOR,
    )


def _opened(carrier: Results) -> list[Any]:
    """Each entry checked as the result it stands for: its receipt, or the error refusing it."""
    env = verify(sign_message(carrier, EXECUTOR), Results)
    out: list[Any] = []
    for entry in env.message.entries:
        try:
            out.append(check_result(env.message.result(entry), env.signer))
        except ProtocolError as e:
            out.append(e)
    return out


def test_the_sample_carrier_opens_to_each_receipt_and_its_outputs() -> None:
    carrier = BY_NAME["results"]
    assert isinstance(carrier, Results) and len(carrier.entries) == 2
    receipts = _opened(carrier)
    assert all(r.signer == GEN.nid("executor") for r in receipts)
    for entry, receipt in zip(carrier.entries, receipts, strict=True):
        assert receipt.raw == entry.receipt and receipt.message.job_id == entry.job_id
        carried = carried_outputs(carrier.result(entry), receipt.message)
        assert carried == {blob_ref(d).root.raw: d for d in entry.outputs}


def test_a_bad_entry_is_refused_alone() -> None:
    carrier = BY_NAME["results-entry-receipt-of-another-signer"]
    assert isinstance(carrier, Results)
    opened = _opened(carrier)
    bad = [i for i, o in enumerate(opened) if isinstance(o, ProtocolError)]
    assert len(bad) == 1 and isinstance(opened[bad[0]], Mismatch)
    assert "signed by another node" in str(opened[bad[0]])
    good = opened[1 - bad[0]]
    assert good.raw == BY_NAME["result"].receipt  # type: ignore[attr-defined]


def test_a_receipt_moved_to_another_entry_is_a_mismatch() -> None:
    carrier = BY_NAME["results"]
    assert isinstance(carrier, Results)
    one, two = carrier.entries
    swapped = dataclasses.replace(one, receipt=two.receipt, outputs=())
    opened = _opened(Results(carrier.network, carrier.executor, tuple(sorted((swapped, two), key=BY_ENTRY))))
    assert sum(isinstance(o, Mismatch) for o in opened) == 1


def test_make_results_fills_carriers_up_to_max_results_in_entry_order() -> None:
    count = 2 * MAX_RESULTS + 3
    receipts = [_receipt(i) for i in range(count)]
    delivered = [(r, 1000 + i, ()) for i, r in enumerate(receipts)]
    carriers = make_results(RECEIPT.network, GEN.nid("executor"), delivered + delivered[:5])  # 5 given twice
    assert [len(c.entries) for c in carriers] == [MAX_RESULTS, MAX_RESULTS, 3]
    entries = [e for c in carriers for e in c.entries]
    assert [BY_ENTRY(e) for e in entries] == sorted(BY_ENTRY(e) for e in entries)
    assert sorted(e.receipt for e in entries) == sorted(r.raw for r in receipts)
    for carrier in carriers:
        assert all(not isinstance(o, ProtocolError) for o in _opened(carrier))


def test_make_results_keeps_each_carrier_within_a_frame() -> None:
    big = [bytes([i]) * PUSH_MAX for i in range(MAX_PUSHED)]
    refs: list[tuple[BlobRef, bytes]] = [(blob_ref(d), d) for d in big]
    files = tuple(FileRef(f"f{i:02}", ref) for i, (ref, _) in enumerate(refs))
    small = [(blob_ref(b"%d" % i), b"%d" % i) for i in range(3)]
    delivered = [(_receipt(i, outputs=files), 5, refs) for i in range(3)]
    delivered += [(_receipt(10 + i, stdout=small[i][0]), 5, [small[i]]) for i in range(3)]
    carriers = make_results(RECEIPT.network, GEN.nid("executor"), delivered)
    assert sum(len(c.entries) for c in carriers) == 6 and len(carriers) < 6
    for carrier in carriers:
        assert len(sign_message(carrier, EXECUTOR)) <= MAX_FRAME
    carried = sorted(len(e.outputs) for c in carriers for e in c.entries)
    assert carried[:3] == [1, 1, 1]  # the small ones, each whole
    assert len(set(carried[3:])) == 1 and 0 < carried[3] < MAX_PUSHED  # as many as fit in a frame


def test_nothing_to_deliver_makes_no_carrier() -> None:
    assert make_results(RECEIPT.network, GEN.nid("executor"), []) == []


@pytest.mark.parametrize("name", ["results-no-entries", "results-entries-unsorted", "results-entry-twice"])
def test_a_carrier_breaking_its_own_rules_is_refused_whole(name: str) -> None:
    vector = next(v for v in vectors.load() if v["name"] == name)
    with pytest.raises(ProtocolError):
        verify(bytes.fromhex(vector["envelope"]))
