"""The offline auditor on realistic bundles: sound ones pass, every kind of tampering is named."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
from e31.node.audit.bundle import Bundle, Consistency, decode_bundle, encode_bundle
from e31.node.audit.checks import AuditReport, audit, render
from e31.node.store.db import Store
from e31.node.store.receiptlog import ReceiptLog
from e31.protocol.envelope import sign_message, verify
from e31.protocol.ids import Digest
from e31.protocol.merkle import MerkleLog
from e31.protocol.messages import (
    BY_ENTRY,
    BY_JOB,
    REGISTRY,
    Ack,
    Bid,
    BidItem,
    Decline,
    InclusionProof,
    TreeHead,
    UsageReceipt,
)
from e31.protocol.receipts import Meter, Outcome
from e31.protocol.schema import Message, Seq, Sub
from receipt_fixtures import (
    LIMITS,
    NET,
    T0,
    SignedJob,
    key,
    make_job,
    mandelbrot,
    mandelbrot_file,
    montecarlo,
    nid,
    offered_together,
    resign_receipt,
)


@pytest.fixture
def log(tmp_path: Path) -> Iterator[ReceiptLog]:
    store = Store(tmp_path / "node.sqlite")
    yield ReceiptLog(store, key("executor"), NET)
    store.close()


def bundle_of(
    jobs: list[SignedJob], log: ReceiptLog | None = None, *, blobs: bool = True, extra: tuple[bytes, ...] = ()
) -> Bundle:
    """The bundle an exporter would write, with inclusion proofs from `log` (which appends the receipts)."""
    envelopes = [e for j in jobs for e in j.envelopes]
    if log is not None:
        for j in jobs:
            log.append(j.receipt)
        envelopes += [log.inclusion(j.receipt_id.raw, T0 + 10_000) for j in jobs]
    data = {k: v for j in jobs for k, v in j.blobs.items()} if blobs else {}
    # Through the codec, as an auditor would receive it.
    return decode_bundle(encode_bundle(Bundle(tuple(dict.fromkeys(envelopes + list(extra))), data)))


def problems(report: AuditReport) -> list[tuple[str, str]]:
    return [(p.check, p.what) for p in report.problems]


def test_a_sound_bundle_passes_with_reexecution(log: ReceiptLog) -> None:
    jobs = [mandelbrot(), mandelbrot_file(), montecarlo()]
    report = audit(bundle_of(jobs, log), reexecute=True)
    assert report.sound, problems(report)
    assert report.notes == []
    assert (report.jobs, report.receipts, report.acks, report.proofs, report.reexecuted) == (3, 3, 3, 3, 3)
    [node] = report.nodes
    receipts = [verify(j.receipt, UsageReceipt).message for j in jobs]
    assert node.node == str(nid("executor"))
    assert (node.jobs, node.receipts, node.reexecuted) == (3, 3, 3)
    assert node.fuel == sum(r.fuel_used for r in receipts) > 0
    assert node.compute_ms == sum(r.compute_ms for r in receipts)
    assert node.queue_wait_ms == sum(r.waited_ms for r in receipts) == 1_500
    text = render(report)
    assert "result: sound (3 receipts checked, 3 jobs re-executed)" in text
    assert str(nid("executor")) in text


def test_a_flipped_byte_in_a_receipt_fails_its_signature(log: ReceiptLog) -> None:
    job = mandelbrot()
    receipt = bytearray(job.receipt)
    receipt[len(receipt) // 2] ^= 0x01
    bad = dataclasses.replace(job, receipt=bytes(receipt))
    report = audit(bundle_of([bad]))
    checks = problems(report)
    assert ("envelope", checks[0][1]) == checks[0] and "receipt envelope #2 does not verify" in checks[0][1]
    assert report.problems[0].node == job.executor
    assert any(c == "ack" and "none of them in the bundle" in w for c, w in checks)


def test_changed_fuel_re_signed_by_the_executor_is_caught_by_reexecution(log: ReceiptLog) -> None:
    job = mandelbrot()
    real = verify(job.receipt, UsageReceipt).message.fuel_used
    liar = resign_receipt(job, fuel_used=real + 1_000)
    bundle = bundle_of([liar], log)
    assert audit(bundle).sound, "signatures, manifest, ack and log are all in order"
    report = audit(bundle, reexecute=True)
    assert problems(report) == [
        (
            "reexecute",
            "re-execution disagrees with receipt "
            f"{liar.receipt_id.hex()[:16]}: "
            f"fuel_used {real + 1_000} claimed, {real} measured",
        )
    ]
    assert report.nodes[0].problems == 1 and report.nodes[0].reexecuted == 0


def test_an_altered_output_hash_is_caught_by_reexecution() -> None:
    job = mandelbrot_file()
    r = verify(job.receipt, UsageReceipt).message
    forged_stdout = dataclasses.replace(r.stdout, root=Digest(b"\x07" * 32))
    forged_file = dataclasses.replace(
        r.outputs[0], blob=dataclasses.replace(r.outputs[0].blob, root=Digest(b"\x08" * 32))
    )
    forged = resign_receipt(job, stdout=forged_stdout, outputs=(forged_file,))
    report = audit(bundle_of([forged]), reexecute=True)
    [(check, what)] = problems(report)
    assert check == "reexecute"
    assert "stdout hash 0707070707070707 claimed" in what and "output files tile.pgm differ" in what


def test_an_ack_for_another_receipt_is_refused() -> None:
    a, b = mandelbrot(), montecarlo()
    ack = verify(a.ack, Ack).message
    wrong = sign_message(
        dataclasses.replace(ack, executor=nid("executor2"), receipt_ids=(b.receipt_id,)), key("submitter")
    )
    report = audit(bundle_of([dataclasses.replace(a, ack=wrong), b]))
    assert (
        "ack",
        f"acknowledgement {verify(wrong).message_id.hex()[:16]} does not match receipt "
        f"{b.receipt_id.hex()[:16]}: ack and receipt name different executors",
    ) in problems(report)
    assert any(n.check == "ack" and a.receipt_id.hex()[:16] in n.what for n in report.notes)


def test_one_ack_of_a_batch_acknowledges_each_receipt_it_names_in_the_bundle(log: ReceiptLog) -> None:
    a, b, c = mandelbrot(), montecarlo(), mandelbrot(nonce=1)
    ids = tuple(sorted((a.receipt_id, b.receipt_id, c.receipt_id), key=lambda d: d.raw))
    batch = sign_message(dataclasses.replace(verify(a.ack, Ack).message, receipt_ids=ids), key("submitter"))
    exported = [dataclasses.replace(j, ack=batch) for j in (a, b)]  # c is not exported: no finding
    report = audit(bundle_of(exported, log))
    assert report.sound, problems(report)
    assert report.notes == [] and report.acks == 1
    stray = sign_message(dataclasses.replace(verify(c.ack, Ack).message), key("submitter"))
    report = audit(bundle_of(exported, log, extra=(stray,)))
    assert (
        "ack",
        f"acknowledgement {verify(stray).message_id.hex()[:16]} names 1 receipt, none of them "
        f"in the bundle (the first {c.receipt_id.hex()[:16]})",
    ) in problems(report)


def test_an_inclusion_proof_that_does_not_match_its_head(log: ReceiptLog) -> None:
    jobs = [mandelbrot(), montecarlo()]
    good = bundle_of(jobs, log)
    proof_raw = next(e for e in good.envelopes if verify(e).kind == "proof")
    proof = verify(proof_raw, InclusionProof).message
    head = verify(proof.treehead, TreeHead).message
    forged_head = sign_message(dataclasses.replace(head, root=Digest(b"\x05" * 32)), key("executor"))
    forged = sign_message(dataclasses.replace(proof, treehead=forged_head), key("executor"))
    bad = Bundle(tuple(forged if e == proof_raw else e for e in good.envelopes), good.blobs)
    report = audit(bad)
    checks = problems(report)
    assert any(c == "inclusion" and "does not match the signed tree head" in w for c, w in checks), checks
    assert any(c == "log" and "forked" in w for c, w in checks), "two heads of one size, two roots"
    foreign = sign_message(dataclasses.replace(proof, tree_size=head.size + 1), key("executor"))
    report = audit(Bundle(tuple(foreign if e == proof_raw else e for e in good.envelopes), good.blobs))
    assert any(c == "inclusion" and "its signed head for" in w for c, w in problems(report))


def test_heads_of_different_sizes_need_a_consistency_proof(log: ReceiptLog) -> None:
    a, b = mandelbrot(), montecarlo()
    first = bundle_of([a], log)
    second = bundle_of([b], log)
    merged = Bundle(tuple(dict.fromkeys(first.envelopes + second.envelopes)), first.blobs)
    report = audit(merged)
    assert report.sound
    gap = "sizes 1, 2: no consistency proof for 1 -> 2"
    assert any(n.check == "log" and gap in n.what for n in report.notes)
    executor = nid("executor").raw
    linked = dataclasses.replace(merged, consistency=(Consistency(executor, 1, 2, log.consistency(1, 2)),))
    assert [n for n in audit(linked).notes if n.check == "log"] == []
    broken = dataclasses.replace(merged, consistency=(Consistency(executor, 1, 2, (b"\x09" * 32,)),))
    assert any(c == "log" and "not consistent" in w for c, w in problems(audit(broken)))


def test_a_missing_blob_fails_reexecution_but_not_the_plain_audit(log: ReceiptLog) -> None:
    bundle = bundle_of([montecarlo()], log, blobs=False)
    assert audit(bundle).sound
    report = audit(bundle, reexecute=True)
    [(check, what)] = problems(report)
    assert check == "reexecute" and "lacks the module" in what


def test_two_disagreeing_receipts_are_a_dispute() -> None:
    honest = mandelbrot(nonce=5)
    other = make_job(
        "mandelbrot.wasm", ("64", "48", "0", "0", "32", "24", "200"), nonce=5, executor="executor2"
    )
    assert other.job_id == honest.job_id
    real = verify(other.receipt, UsageReceipt).message.fuel_used
    cheat = resign_receipt(other, fuel_used=real // 2)
    report = audit(bundle_of([honest, cheat]))
    [(check, what)] = problems(report)
    assert check == "dispute" and "disagree on fuel_used" in what
    assert report.problems[0].job == honest.job_id.hex()
    assert audit(bundle_of([honest, other])).sound, "two agreeing replicas are no dispute"
    report = audit(bundle_of([honest, cheat]), reexecute=True)
    assert {(p.check, p.node) for p in report.problems} == {
        ("dispute", str(nid("executor2"))),
        ("reexecute", str(nid("executor2"))),
    }


def test_receipts_that_do_not_match_offer_or_assignment() -> None:
    job = montecarlo()
    bigger = dataclasses.replace(LIMITS, fuel=LIMITS.fuel + 1)
    report = audit(bundle_of([resign_receipt(job, limits=bigger)]))
    changed = resign_receipt(job, limits=bigger).receipt_id.hex()[:16]
    assert problems(report) == [
        ("manifest", f"receipt {changed} does not match the offer: receipt names other limits")
    ]
    orphan = audit(bundle_of([dataclasses.replace(job, offer=job.ack, assign=job.ack)]))
    assert {c for c, _ in problems(orphan)} == {"manifest", "assignment"}


def test_a_timeout_is_not_re_verifiable_and_a_foreign_profile_cannot_be_re_executed(log: ReceiptLog) -> None:
    timed_out = resign_receipt(
        montecarlo(nonce=9), outcome=Outcome("timeout", None, None), fuel_used=LIMITS.fuel
    )
    foreign = make_job("montecarlo.wasm", ("42", "20000"), profile=Digest(b"\x0f" * 32))
    report = audit(bundle_of([timed_out, foreign], log), reexecute=True)
    assert report.sound, problems(report)
    notes = {(n.check, n.what.split(" (")[0]) for n in report.notes}
    assert ("reexecute", f"receipt {timed_out.receipt_id.hex()[:16]} is not re-verifiable") in notes
    assert ("reexecute", "cannot re-execute here") in notes
    assert report.reexecuted == 0


def test_an_empty_bundle_is_sound_and_garbage_envelopes_are_reported() -> None:
    assert audit(Bundle()).sound
    report = audit(Bundle((b"\x95\x01\xa7receipt", b"\x00", bytes(MerkleLog().root()))))
    assert len(report.problems) == 3
    assert all(p.check == "envelope" for p in report.problems)
    assert "1 problem found" not in render(report) and "3 problems found" in render(report)


def test_a_job_reading_stdin_re_executes_from_the_bundles_stdin_blob() -> None:
    job = make_job("echo.wasm", (), stdin=b"one line of input\n" * 100)
    receipt = verify(job.receipt, UsageReceipt).message
    assert receipt.stdout.size == 1_800 and job.manifest.stdin is not None
    report = audit(bundle_of([job]), reexecute=True)
    assert report.sound and report.reexecuted == 1
    module = job.manifest.module.root.raw
    without_stdin = Bundle(tuple(job.envelopes), {module: job.blobs[module]})
    [(check, what)] = problems(audit(without_stdin, reexecute=True))
    assert check == "reexecute" and "lacks the stdin" in what


def test_each_receipt_of_jobs_offered_together_is_checked_against_its_own_manifest(log: ReceiptLog) -> None:
    a, b = offered_together(nonce=3)
    report = audit(bundle_of([a, b], log), reexecute=True)
    assert report.sound, problems(report)
    assert (report.jobs, report.receipts, report.reexecuted) == (2, 2, 2)
    # one job of the set alone: the offer names the other one too, which is not a job of the bundle
    report = audit(bundle_of([a]), reexecute=True)
    assert report.sound and (report.jobs, report.reexecuted) == (1, 1)
    bigger = dataclasses.replace(LIMITS, fuel=LIMITS.fuel + 1)
    liar = resign_receipt(b, limits=bigger)
    what = f"receipt {liar.receipt_id.hex()[:16]} does not match the offer: receipt names other limits"
    assert problems(audit(bundle_of([a, liar]))) == [("manifest", what)]


def _broken(message: Message, signer: str) -> bytes:
    raw = bytearray(sign_message(message, key(signer)))
    raw[-1] ^= 0x01  # the last byte of the signature
    return bytes(raw)


def test_an_envelope_that_does_not_verify_is_labelled_with_the_one_job_it_names() -> None:
    a, b = offered_together()
    offer_id = verify(a.offer).message_id
    one, two = sorted((a.job_id, b.job_id), key=lambda d: d.raw)
    items = tuple(BidItem(j, T0, T0 + 1) for j in (one, two))
    cases = [
        (_broken(Bid(NET, offer_id, nid("executor"), T0, items[:1]), "executor"), one),
        (_broken(Bid(NET, offer_id, nid("executor"), T0, items), "executor"), None),
        (_broken(Decline(NET, (two,), offer_id, nid("executor"), T0, "busy", ""), "executor"), two),
        (_broken(Decline(NET, (one, two), offer_id, nid("executor"), T0, "busy", ""), "executor"), None),
        (_broken(verify(a.offer).message, "submitter"), None),
        (_broken(verify(b.assign).message, "submitter"), b.job_id),
        (_broken(verify(a.ack).message, "submitter"), None),  # an ack names receipts, not jobs
    ]
    report = audit(Bundle(tuple(raw for raw, _ in cases)))
    assert [(f.check, f.job) for f in report.problems] == [
        ("envelope", None if job is None else job.hex()) for _, job in cases
    ]
    assert [f.what.split(" envelope")[0] for f in report.problems] == [
        "bid",
        "bid",
        "decline",
        "decline",
        "offer",
        "assign",
        "ack",
    ]


def test_the_job_id_fields_peeked_at_are_those_of_the_messages() -> None:
    """Every kind whose body names jobs is in the audit's table, at the field that names them."""
    from e31.node.audit.peek import _JOB_ID_FIELD

    found: dict[str, tuple[int, str]] = {}
    for kind, cls in REGISTRY.items():
        for index, (name, codec) in enumerate(cls._FIELDS):
            if name == "job_id":
                found[kind] = (index, "one")
            elif name == "job_ids":
                found[kind] = (index, "list")
            elif (
                isinstance(codec, Seq)
                and isinstance(codec.inner, Sub)
                and codec.inner.cls._FIELDS[0][0] == "job_id"
            ):
                found[kind] = (index, "items" if codec.order_key in (BY_JOB, BY_ENTRY) else "?")
    assert "offer" not in found  # manifests: the job ids are hashes, not fields
    assert found == _JOB_ID_FIELD


def test_the_meter_of_version_2_receipts_is_shown_and_an_overrun_noted(log: ReceiptLog) -> None:
    """A version 2 receipt's pause and fetch times are summed per executor and shown; a receipt
    billing compute over time it also says was paused gets a note (not a problem: clocks differ);
    a version 1 receipt (no meter) audits as before."""
    old = mandelbrot(nonce=31)
    r = verify(old.receipt, UsageReceipt).message
    assert r.version == 1
    span = r.finished_at - r.started_at
    metered = resign_receipt(mandelbrot(nonce=32), meter=Meter(paused_ms=0, fetch_ms=2_500))
    # held its core 3 s past the run, paused all that time, and bills 2 s of compute besides the run's
    liar = resign_receipt(
        mandelbrot(nonce=33),
        compute_ms=r.compute_ms + 2_000,
        finished_at=r.started_at + span + 3_000,
        meter=Meter(paused_ms=span + 3_000, fetch_ms=0),
    )
    report = audit(bundle_of([old, metered, liar], log), reexecute=True)
    assert report.sound, problems(report)
    (node,) = report.nodes
    assert (node.paused_ms, node.fetch_ms, node.reexecuted) == (span + 3_000, 2_500, 3)
    notes = [(n.check, n.job) for n in report.notes]
    assert notes == [("meter", liar.job_id.hex())]
    text = render(report)
    assert "paused s" in text and "fetch s" in text and f"{(span + 3_000) / 1000:.3f}" in text
