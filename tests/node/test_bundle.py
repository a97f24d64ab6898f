"""Receipt bundles: the strict reader, the atomic writer, export from a real store, and the API handler."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from e31.node.api.export import export_handler
from e31.node.api.server import HttpError, Request
from e31.node.audit.bundle import (
    MAGIC,
    Bundle,
    BundleError,
    Consistency,
    decode_bundle,
    encode_bundle,
    export_bundle,
    read_bundle,
    write_bundle,
)
from e31.node.audit.checks import audit
from e31.node.store.async_store import AsyncStore
from e31.node.store.blobs import BlobStore
from e31.node.store.db import Store
from e31.node.store.receiptlog import ReceiptLog
from e31.protocol.blobs import blob_ref
from e31.protocol.codec import MAX_FRAME, pack
from e31.protocol.envelope import verify
from e31.protocol.messages import InclusionProof, Offer
from receipt_fixtures import (
    NET,
    T0,
    SignedJob,
    key,
    mandelbrot,
    mandelbrot_file,
    montecarlo,
    offered_together,
)


def sample() -> Bundle:
    jobs = [mandelbrot(), montecarlo()]
    return Bundle(
        tuple(e for j in jobs for e in j.envelopes),
        {k: v for j in jobs for k, v in j.blobs.items()},
        (Consistency(bytes(32), 1, 2, (b"\x01" * 32,)),),
    )


def test_round_trip_keeps_every_envelope_byte_for_byte() -> None:
    bundle = sample()
    again = decode_bundle(encode_bundle(bundle))
    assert again == bundle
    assert encode_bundle(again) == encode_bundle(bundle)


@pytest.mark.parametrize(
    ("doc", "error"),
    [
        (b"", "empty"),
        (b"\xc1", "not a bundle"),
        (pack(["e31-bundle", 1, [], [], []])[:-1], "not a bundle"),
        (pack(["e31-bundle", 1, [], [], []]) + b"\x00", "trailing"),
        (pack(["something", 1, [], [], []]), "does not start"),
        (pack({"e31-bundle": 1}), "does not start"),
        (pack(["e31-bundle", 2, [], [], []]), "version 2"),
        (pack(["e31-bundle", True, [], [], []]), "version True"),
        (pack(["e31-bundle", 1, [], []]), "5 items"),
        (pack(["e31-bundle", 1, {}, [], []]), "envelopes is not an array"),
        (pack(["e31-bundle", 1, ["text"], [], []]), r"envelopes\[0\] is not"),
        (pack(["e31-bundle", 1, [b"x" * (MAX_FRAME + 1)], [], []]), "larger than an envelope"),
        (pack(["e31-bundle", 1, [b"ab", b"ab"], [], []]), "twice"),
        (pack(["e31-bundle", 1, [], [[b"\x00" * 32, 3]], []]), "array of 3"),
        (pack(["e31-bundle", 1, [], [[b"\x00" * 31, 3, b"abc"]], []]), "root is not 32"),
        (pack(["e31-bundle", 1, [], [[blob_ref(b"abc").root.raw, 4, b"abc"]], []]), "says 4 bytes"),
        (pack(["e31-bundle", 1, [], [[blob_ref(b"abd").root.raw, 3, b"abc"]], []]), "does not hash"),
        (pack(["e31-bundle", 1, [], [[blob_ref(b"abc").root.raw, -3, b"abc"]], []]), "negative"),
        (pack(["e31-bundle", 1, [], [], [[b"k" * 32, 3, 2, []]]]), "old <= new"),
        (pack(["e31-bundle", 1, [], [], [[b"k" * 32, 1, 2, [b"x"]]]]), "32-byte hashes"),
        (pack(["e31-bundle", 1, [], [], [[b"k" * 31, 1, 2, []]]]), "32-byte key"),
    ],
)
def test_the_reader_refuses_malformed_bundles(doc: bytes, error: str) -> None:
    with pytest.raises(BundleError, match=error):
        decode_bundle(doc)


def test_any_damage_gives_only_bundle_errors() -> None:
    good = encode_bundle(sample())
    rng = random.Random(7)
    for _ in range(300):
        data = bytearray(good)
        if rng.random() < 0.5:
            data = data[: rng.randrange(len(data))]
        else:
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        with contextlib.suppress(BundleError):
            decode_bundle(bytes(data))


def test_read_and_write(tmp_path: Path) -> None:
    data = encode_bundle(sample())
    path = tmp_path / "receipts.e31"
    write_bundle(path, data)
    assert path.read_bytes() == data
    write_bundle(path, encode_bundle(Bundle()))
    assert read_bundle(path) == Bundle()
    assert [p.name for p in tmp_path.iterdir()] == ["receipts.e31"], "no temporary file left behind"
    with pytest.raises(BundleError, match="cannot read"):
        read_bundle(tmp_path / "missing")
    with pytest.raises(BundleError, match="directory"):
        read_bundle(tmp_path)
    with pytest.raises(BundleError, match="cannot write"):
        write_bundle(tmp_path / "no" / "such" / "dir.e31", data)
    (tmp_path / "junk").write_bytes(b"PK\x03\x04 not a bundle")
    with pytest.raises(BundleError, match="junk: not a bundle"):
        read_bundle(tmp_path / "junk")


def test_magic_is_the_documented_one() -> None:
    assert pack([MAGIC, 1, [], [], []]) == encode_bundle(Bundle())
    assert MAGIC == "e31-bundle"


# --- export from a node's store -------------------------------------------------------------------------


@pytest.fixture
def node(tmp_path: Path) -> Iterator[tuple[Store, BlobStore, ReceiptLog]]:
    store = Store(tmp_path / "node.sqlite")
    blobs = BlobStore(tmp_path / "blobs")
    yield store, blobs, ReceiptLog(store, key("executor"), NET)
    store.close()


def keep(
    store: Store, blobs: BlobStore, log: ReceiptLog | None, job: SignedJob, *, with_blob: bool = True
) -> None:
    """Store a job's records as the market would: the offer shared with the jobs it holds, the other
    envelopes by job, the receipt indexed, and its ack kept for it."""
    for raw in job.envelopes:
        env = verify(raw)
        if isinstance(env.message, Offer):
            store.put_shared_envelope(
                env.message_id.raw, env.kind, raw, 1.0, [m.job_id.raw for m in env.message.manifests]
            )
        elif env.kind == "ack":
            continue  # stored once, for the receipts it names, after the receipt
        else:
            store.put_envelope(env.message_id.raw, env.kind, raw, 1.0, job.job_id.raw)
    rid = job.receipt_id.raw
    store.put_receipt(
        digest=rid, job_id=job.job_id.raw, attempt=1, executor=job.executor, message_id=rid, now=1.0
    )
    store.put_acks(verify(job.ack).message_id.raw, job.ack, 2.0, [(rid, job.job_id.raw)])
    if with_blob:
        for data in job.blobs.values():
            blobs.put(data)
    if log is not None:
        log.append(job.receipt)


def test_export_of_every_job_audits_sound_with_reexecution(node: tuple[Store, BlobStore, ReceiptLog]) -> None:
    store, blobs, log = node
    jobs = [mandelbrot(), mandelbrot_file(), montecarlo()]
    for i, job in enumerate(jobs):
        keep(store, blobs, log, job)
        if i == 0:
            log.signed_tree_head(T0)  # a head of size 1, so the bundle links two heads
            first = export_bundle(store, blobs, [job.job_id.raw], False, receipt_log=log, now_ms=T0)
    export = export_bundle(store, blobs, None, True, receipt_log=log, now_ms=T0 + 1)
    bundle = decode_bundle(export.data)
    assert export.jobs == 3 and export.missing_blobs == ()
    assert set(bundle.blobs) == {r for j in jobs for r in j.blobs}
    assert all(raw in bundle.envelopes for j in jobs for raw in j.envelopes)
    proofs = [verify(e, InclusionProof) for e in bundle.envelopes if verify(e).kind == "proof"]
    assert len(proofs) == 1 and len(proofs[0].message.entries) == 3, "one fresh proof places all three"
    report = audit(bundle, reexecute=True)
    assert report.sound, report.problems
    assert report.reexecuted == 3 and report.nodes[0].reexecuted == 3
    assert not [f for f in report.notes if f.check in ("inclusion", "ack")]
    # An earlier export's proof (head of size 1) and a later one's (size 3) are linked by consistency.
    merged = Bundle(
        tuple(dict.fromkeys(decode_bundle(first.data).envelopes + bundle.envelopes)),
        bundle.blobs,
        decode_bundle(first.data).consistency + bundle.consistency,
    )
    assert {(c.old_size, c.new_size) for c in bundle.consistency} >= {(1, 3)}
    assert audit(merged).sound


def test_export_of_some_jobs_and_missing_blobs(node: tuple[Store, BlobStore, ReceiptLog]) -> None:
    store, blobs, _ = node
    a, b = mandelbrot(), montecarlo()
    keep(store, blobs, None, a)
    keep(store, blobs, None, b, with_blob=False)
    export = export_bundle(store, blobs, [b.job_id.raw], True, now_ms=T0)
    bundle = decode_bundle(export.data)
    assert export.jobs == 1 and set(bundle.envelopes) == set(b.envelopes)
    assert export.missing_blobs == tuple(r.hex() for r in b.blobs)
    report = audit(bundle, reexecute=True)
    assert not report.sound
    assert [p.check for p in report.problems] == ["reexecute"]
    assert "lacks the module" in report.problems[0].what


async def test_the_export_endpoint_writes_the_bundle(
    node: tuple[Store, BlobStore, ReceiptLog], tmp_path: Path
) -> None:
    store, blobs, log = node
    job = mandelbrot_file()
    await trio.to_thread.run_sync(lambda: keep(store, blobs, log, job))
    handle = export_handler(AsyncStore(store), blobs, lambda: log)
    out = tmp_path / "out.e31"

    def request(body: object) -> Request:
        return Request("POST", "/v1/receipts/export", {}, {}, body)

    answer = await handle(request({"jobs": [job.job_id.hex()], "with_blobs": True, "out": str(out)}))
    assert answer["path"] == str(out) and answer["jobs"] == 1 and answer["blobs"] == 1
    assert answer["bytes"] == len(out.read_bytes())
    assert audit(read_bundle(out), reexecute=True).sound
    for body, status in [
        ({"jobs": ["zz"], "out": str(out)}, 400),
        ({"jobs": None, "out": "relative.e31"}, 400),
        ({"with_blobs": "yes", "out": str(out)}, 400),
        ({"out": str(out), "extra": 1}, 400),
        ([], 400),
        ({"jobs": ["00" * 32], "out": str(out)}, 404),
        ({"out": str(tmp_path / "missing" / "x.e31")}, 400),
    ]:
        with pytest.raises(HttpError) as info:
            await handle(request(body))
        assert info.value.status == status, body


def test_jobs_forgotten_after_their_retention_still_export_and_audit_sound(
    node: tuple[Store, BlobStore, ReceiptLog],
) -> None:
    from e31.node.store.gc import collect

    store, blobs, log = node
    jobs = [mandelbrot(), montecarlo()]
    for job in jobs:
        keep(store, blobs, log, job, with_blob=False)
        store.add_job(
            job_id=job.job_id.raw,
            role="executor",
            manifest=b"m",
            state="done",
            submitter="s",
            created=1.0,
            deadline=2.0,
        )
    report = collect(store, blobs, now=10 * 86_400.0, retention_s=86_400.0)
    assert report.jobs_pruned == 2 and store.jobs() == []
    export = export_bundle(store, blobs, None, False, receipt_log=log, now_ms=T0)
    assert export.jobs == 2
    bundle = decode_bundle(export.data)
    assert all(raw in bundle.envelopes for j in jobs for raw in j.envelopes)
    assert audit(bundle).sound, audit(bundle).problems


def test_jobs_offered_together_export_alone_or_together_with_one_copy_of_their_offer(
    node: tuple[Store, BlobStore, ReceiptLog],
) -> None:
    store, blobs, log = node
    a, b = offered_together()
    assert a.offer == b.offer
    keep(store, blobs, log, a)
    keep(store, blobs, log, b, with_blob=False)  # b's module is not here
    alone = export_bundle(store, blobs, [a.job_id.raw], True, receipt_log=log, now_ms=T0)
    bundle = decode_bundle(alone.data)
    assert alone.jobs == 1 and set(a.envelopes) <= set(bundle.envelopes)
    assert not {b.assign, b.receipt, b.ack} & set(bundle.envelopes)
    # the offer names b's module too, but exporting a does not need it
    assert alone.missing_blobs == () and set(bundle.blobs) == set(a.blobs) != set(b.blobs)
    report = audit(bundle, reexecute=True)
    assert report.sound, report.problems
    assert (report.jobs, report.reexecuted) == (1, 1)
    together = export_bundle(store, blobs, None, True, receipt_log=log, now_ms=T0 + 1)
    bundle = decode_bundle(together.data)
    assert together.jobs == 2 and bundle.envelopes.count(a.offer) == 1
    assert together.missing_blobs == tuple(r.hex() for r in b.blobs)
    blobs.put(next(iter(b.blobs.values())))
    whole = export_bundle(store, blobs, None, True, receipt_log=log, now_ms=T0 + 2)
    report = audit(decode_bundle(whole.data), reexecute=True)
    assert report.sound and (report.jobs, report.reexecuted) == (2, 2)


def test_jobs_offered_together_and_forgotten_are_still_found_by_their_offer(
    node: tuple[Store, BlobStore, ReceiptLog],
) -> None:
    from e31.node.audit.bundle import all_job_ids
    from e31.node.store.gc import collect

    store, blobs, log = node
    jobs = offered_together()
    for job in jobs:
        keep(store, blobs, log, job, with_blob=False)
        store.add_job(
            job_id=job.job_id.raw,
            role="submitter",
            manifest=b"m",
            state="done",
            submitter="s",
            created=1.0,
            deadline=2.0,
        )
    assert collect(store, blobs, now=10 * 86_400.0, retention_s=86_400.0).jobs_pruned == 2
    assert store.jobs() == [] and all_job_ids(store) == sorted(j.job_id.raw for j in jobs)
    bundle = decode_bundle(export_bundle(store, blobs, None, False, receipt_log=log, now_ms=T0).data)
    assert set(bundle.envelopes) >= {e for j in jobs for e in j.envelopes}
    assert audit(bundle).sound
