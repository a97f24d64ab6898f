"""Garbage collection over a real store and blob store, with the clock passed in: what is collected,
what is kept (retention, active jobs, recent writes, partial downloads), stale run dirs, and the
periodic service."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import trio
import trio.testing
from e31.node.store.async_store import AsyncStore
from e31.node.store.blobs import BlobStore
from e31.node.store.db import Store
from e31.node.store.gc import collect, keep_set, run_gc
from e31.protocol.blobs import blob_ref
from e31.protocol.codec import pack
from e31.protocol.ids import Digest, NodeId
from e31.protocol.jobs import FileRef, JobManifest, Limits

NOW = 1_900_000_000.0
DAY = 86_400.0
LIMITS = Limits(fuel=1_000_000, memory_bytes=64 << 20, wall_ms=60_000, max_output_bytes=1 << 20)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "node.sqlite")
    yield s  # type: ignore[misc]
    s.close()


@pytest.fixture
def blobs(tmp_path: Path) -> BlobStore:
    return BlobStore(tmp_path / "blobs")


def put(blobs: BlobStore, data: bytes, age: float) -> str:
    digest = blobs.put(data)
    os.utime(blobs.path(digest), (NOW - age, NOW - age))
    return digest


def add_job(
    store: Store, module: bytes, inp: bytes, *, role: str, state: str, updated: float, n: int = 0
) -> bytes:
    manifest = JobManifest(
        module=blob_ref(module),
        inputs=(FileRef("in.txt", blob_ref(inp)),),
        args=(),
        env=(),
        stdin=None,
        limits=LIMITS,
        deadline=int((NOW + DAY) * 1000),
        retention_ms=int(DAY * 1000),
        replicas=1,
        profile=Digest(bytes(32)),
        submitter=NodeId(bytes(32)),
        nonce=n.to_bytes(16, "big"),
        created_at=int(updated * 1000),
    )
    job_id = manifest.job_id.raw
    store.add_job(
        job_id=job_id,
        role=role,
        manifest=pack(manifest.to_wire()),
        state=state,
        submitter="s",
        created=updated,
        deadline=NOW + DAY,
    )
    return job_id


def test_expired_and_unreferenced_blobs_go_retained_ones_stay(store: Store, blobs: BlobStore) -> None:
    orphan = put(blobs, b"nobody needs me", age=2 * DAY)
    served = put(blobs, b"a result still served", age=2 * DAY)
    expired = put(blobs, b"a result past its retention", age=2 * DAY)
    forever = put(blobs, b"a submitter's output", age=2 * DAY)
    fresh = put(blobs, b"just written, no reference yet", age=10)
    store.ref_blob(served, "result:1", NOW + 60)
    store.ref_blob(expired, "result:2", NOW - 60)
    store.ref_blob(forever, "job:3")
    report = collect(store, blobs, now=NOW, retention_s=DAY)
    assert {h for h in (orphan, served, expired, forever, fresh) if blobs.has(h)} == {served, forever, fresh}
    assert (report.blobs_deleted, report.refs_expired, report.blobs_kept) == (2, 1, 3)
    assert report.bytes_freed == len(b"nobody needs me") + len(b"a result past its retention")
    assert report.bytes_used == blobs.total_size()
    assert store.live_blobs(NOW) == {served, forever}
    # The retention of `served` ends: the next collection takes it.
    later = collect(store, blobs, now=NOW + 61, retention_s=DAY)
    assert later.blobs_deleted == 1 and not blobs.has(served) and blobs.has(forever)


def test_blobs_of_active_and_recently_finished_jobs_are_kept(store: Store, blobs: BlobStore) -> None:
    running = (put(blobs, b"module A", 2 * DAY), put(blobs, b"input A", 2 * DAY))
    recent = (put(blobs, b"module B", 2 * DAY), put(blobs, b"input B", 2 * DAY))
    old = (put(blobs, b"module C", 3 * DAY), put(blobs, b"input C", 3 * DAY))
    add_job(store, b"module A", b"input A", role="executor", state="running", updated=NOW - 2 * DAY)
    add_job(store, b"module B", b"input B", role="submitter", state="done", updated=NOW - DAY / 2, n=1)
    add_job(store, b"module C", b"input C", role="submitter", state="done", updated=NOW - 2 * DAY, n=2)
    keep = keep_set(store, now=NOW, retention_s=DAY)
    assert keep is not None and set(running) | set(recent) <= keep and not set(old) & keep
    collect(store, blobs, now=NOW, retention_s=DAY)
    assert all(blobs.has(h) for h in (*running, *recent))
    assert not any(blobs.has(h) for h in old)


def test_partial_downloads_are_never_touched(store: Store, blobs: BlobStore) -> None:
    data = b"x" * 5000
    partial = blobs.partial(blob_ref(data).root.raw, len(data))
    collect(store, blobs, now=NOW + 10 * DAY, retention_s=DAY, grace_s=0)
    assert blobs.partials() == [partial.hash] and (partial.dir / "size").is_file()


def test_run_dirs_of_jobs_no_longer_running_are_removed(
    store: Store, blobs: BlobStore, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    live = add_job(store, b"m", b"i", role="executor", state="running", updated=NOW)
    gone = add_job(store, b"m", b"i", role="executor", state="done", updated=NOW, n=1)
    for job in (live, gone):
        (runs / job.hex() / "output").mkdir(parents=True)
    report = collect(store, blobs, now=NOW, retention_s=DAY, runs_dir=runs)
    assert report.runs_removed == 1
    assert sorted(p.name for p in runs.iterdir()) == [live.hex()]


async def test_the_periodic_service_collects(store: Store, blobs: BlobStore, nursery: trio.Nursery) -> None:
    # Real time, not autojump_clock: a collection runs in a worker thread, and a mock clock would jump
    # past many intervals while that thread is still working.
    orphan = put(blobs, b"orphan", age=2 * DAY)
    await nursery.start(
        lambda task_status: run_gc(
            AsyncStore(store),
            blobs,
            interval=0.05,
            retention_s=DAY,
            clock=lambda: NOW,
            task_status=task_status,
        )
    )
    for _ in range(400):  # up to 20 s of polling
        if not blobs.has(orphan):
            break
        await trio.sleep(0.05)
    assert not blobs.has(orphan)


def _evidence(store: Store, job_id: bytes, tag: bytes, at: float) -> dict[str, bytes]:
    """Envelope rows of a finished job: offer, bid, assignment, result (indexed), receipt (indexed,
    acknowledged) and its ack."""
    kinds = ("offer", "bid", "assign", "result", "receipt", "ack")
    ids = {kind: hashlib.sha256(tag + kind.encode()).digest() for kind in kinds}
    for kind, mid in ids.items():
        if kind != "ack":  # an ack is shared by the jobs of the receipts it names (put_acks)
            store.put_envelope(mid, kind, b"raw " + kind.encode(), at, job_id=job_id)
    store.put_result(
        job_id=job_id,
        attempt=1,
        executor="x",
        message_id=ids["result"],
        status="ok",
        outputs={"stdout": "00" * 32},
        now=at,
    )
    store.put_receipt(
        digest=ids["receipt"], job_id=job_id, attempt=1, executor="x", message_id=ids["receipt"], now=at
    )
    store.put_acks(ids["ack"], b"raw ack", at, [(ids["receipt"], job_id)])
    store.ref_blob("ab" * 32, f"job:{job_id.hex()}")
    stdout = hashlib.sha256(b"stdout of " + tag).hexdigest()  # an output its result carried
    store.put_small_blob(stdout, b"stdout of " + tag)
    store.ref_blob(stdout, f"job:{job_id.hex()}")
    return ids


def test_jobs_past_their_retention_are_forgotten_but_their_receipts_and_acks_stay(
    store: Store, blobs: BlobStore
) -> None:
    old = add_job(store, b"m", b"i", role="submitter", state="done", updated=NOW - 2 * DAY)
    never_ran = add_job(store, b"m", b"i", role="submitter", state="expired", updated=NOW - 2 * DAY, n=5)
    store.put_envelope(b"o" * 32, "offer", b"raw offer", NOW - 3 * DAY, job_id=never_ran)
    recent = add_job(store, b"m", b"i", role="submitter", state="failed", updated=NOW - DAY / 2, n=1)
    running = add_job(store, b"m", b"i", role="executor", state="running", updated=NOW - 3 * DAY, n=2)
    disputed = add_job(store, b"m", b"i", role="submitter", state="disputed", updated=NOW - 3 * DAY, n=3)
    both = add_job(store, b"m", b"i", role="submitter", state="done", updated=NOW - 2 * DAY, n=4)
    row = store.job(both, "submitter")
    assert row is not None  # ...and it ran its own job, which ended later there
    store.add_job(
        job_id=both,
        role="executor",
        manifest=row.manifest,
        state="done",
        submitter="s",
        created=NOW - DAY / 2,
        deadline=NOW + DAY,
    )
    old_ids = _evidence(store, old, b"old", NOW - 2 * DAY)
    recent_ids = _evidence(store, recent, b"recent", NOW - DAY / 2)
    both_ids = _evidence(store, both, b"both", NOW - 2 * DAY)
    report = collect(store, blobs, now=NOW, retention_s=DAY)
    assert report.jobs_pruned == 3  # `old`, `never_ran`, and the submitter row of `both`
    # the outputs kept in the database go with the job, unless another row of it still holds them
    assert report.small_blobs_dropped == 1
    small = [hashlib.sha256(b"stdout of " + tag).hexdigest() for tag in (b"old", b"recent", b"both")]
    assert set(store.small_blobs(small)) == set(small[1:])
    assert store.job(old, "submitter") is None and store.job(never_ran, "submitter") is None
    assert store.results_for_job(old) == []
    assert store.envelope(old_ids["result"]) is None and store.envelope(old_ids["bid"]) is None
    assert f"job:{old.hex()}" not in {o for _, o in _refs(store)}
    # the signed evidence stays, found as before: the receipt, its ack, and the offer and assignment
    # an audit checks it against
    assert [r.digest for r in store.receipts_for_job(old)] == [old_ids["receipt"]]
    assert all(store.envelope(old_ids[k]) is not None for k in ("receipt", "ack", "offer", "assign"))
    assert store.ack_for(old_ids["receipt"]) is not None
    assert store.envelopes_for_job(never_ran) == []  # no receipt: nothing of it is evidence
    # within retention, not ended, disputed: untouched
    assert store.job(recent, "submitter") is not None and store.envelope(recent_ids["offer"]) is not None
    assert store.job(running, "executor") is not None and store.job(disputed, "submitter") is not None
    # a job still held in another role keeps what both rows share
    assert store.job(both, "submitter") is None and store.job(both, "executor") is not None
    assert store.envelope(both_ids["offer"]) is not None and store.results_for_job(both) != []
    assert collect(store, blobs, now=NOW, retention_s=DAY).jobs_pruned == 0


def test_pruning_goes_in_chunks_and_forgets_batch_entries(
    store: Store, blobs: BlobStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    import e31.node.store.gc as gc
    from e31.node.store.batches import get_batch

    monkeypatch.setattr(gc, "PRUNE_CHUNK", 3)
    ids = [
        add_job(store, b"m", b"i", role="submitter", state="done", updated=NOW - 2 * DAY, n=i)
        for i in range(7)
    ]
    keep = add_job(store, b"m", b"i", role="submitter", state="done", updated=NOW, n=99)
    with store.transaction() as c:  # a batch over some old jobs and the recent one
        c.executemany(
            "INSERT INTO batch_jobs (batch_id, seq, job_id, created) VALUES (?, ?, ?, ?)",
            [("batch-00000000000000aa", i, j, NOW) for i, j in enumerate([*ids[:2], keep])],
        )
        c.executemany(
            "INSERT INTO batch_jobs (batch_id, seq, job_id, created) VALUES (?, ?, ?, ?)",
            [("batch-00000000000000bb", i, j, NOW) for i, j in enumerate(ids[2:])],
        )
    assert collect(store, blobs, now=NOW, retention_s=DAY).jobs_pruned == 7
    assert [r.job_id for r in store.jobs()] == [keep]
    left = get_batch(store, "batch-00000000000000aa")
    assert left is not None and left.job_ids == (keep,)
    assert get_batch(store, "batch-00000000000000bb") is None  # all its jobs gone: the batch too


def _refs(store: Store) -> list[tuple[str, str]]:
    with store.transaction(durable=False) as c:
        return [(r[0], r[1]) for r in c.execute("SELECT blob_hash, owner FROM blob_refs")]


def test_a_forgotten_job_is_not_offered_to_its_submitter_again(store: Store, blobs: BlobStore) -> None:
    job = add_job(store, b"m", b"i", role="executor", state="done", updated=NOW - 2 * DAY)
    store.put_envelope(b"r" * 32, "receipt", b"raw receipt", NOW - 2 * DAY, job_id=job)
    store.put_receipt(
        digest=b"r" * 32,
        job_id=job,
        attempt=1,
        executor="x",
        message_id=b"r" * 32,
        now=NOW - 2 * DAY,
        next_delivery=NOW - DAY,
    )  # never acknowledged
    assert [r.digest for r in store.receipts_due(NOW)] == [b"r" * 32]
    collect(store, blobs, now=NOW, retention_s=DAY)
    assert store.receipts_due(NOW) == []
    assert [r.digest for r in store.receipts_for_job(job)] == [b"r" * 32]


def test_an_offer_of_a_set_stays_while_one_of_its_jobs_remains_or_has_a_receipt(
    store: Store, blobs: BlobStore
) -> None:
    a, b, c, d = (
        add_job(store, b"m", b"i", role="submitter", state="queued", updated=NOW, n=n) for n in range(4)
    )
    offer, bids, lone, given = (
        name.ljust(32, b".") for name in (b"set offer", b"set bid", b"lone offer", b"assigns")
    )
    store.put_shared_envelope(offer, "offer", b"raw offer", NOW, [a, b, c])
    store.put_shared_envelope(given, "assigns", b"raw assigns", NOW, [a, b, c])
    store.put_shared_envelope(bids, "bid", b"raw bid", NOW, [a, b])
    store.put_shared_envelope(lone, "offer", b"raw lone offer", NOW, [d])
    store.put_envelope(b"c" * 32, "contact", b"raw contact", NOW)  # no job: never pruned with one

    def end(job: bytes, at: float) -> None:
        store.update_job(job, "submitter", at, state="done")

    def prune(at: float) -> int:
        return collect(store, blobs, now=at + DAY + 1, retention_s=DAY).jobs_pruned

    end(a, NOW)
    assert prune(NOW) == 1
    assert store.envelope(offer) is not None and store.envelope(bids) is not None  # b and c remain
    assert store.envelopes_for_job(a) == []
    assert [e.message_id for e in store.envelopes_for_job(b)] == [given, bids, offer]  # same time: by id
    ids = _evidence(store, b, b"b", NOW + 1)  # b ran: a receipt makes its offer evidence
    end(b, NOW + 1)
    assert prune(NOW + 1) == 1
    assert store.envelope(bids) is None, "no job left links the bid"
    assert [e.message_id for e in store.assignments_for_job(b)] == [ids["assign"], given]  # evidence too
    assert store.envelope(ids["receipt"]) is not None and store.envelope(ids["bid"]) is None
    assert [e.message_id for e in store.envelopes_for_job(b, "offer")] == [ids["offer"], offer]
    end(c, NOW + 2)
    assert prune(NOW + 2) == 1
    assert [e.message_id for e in store.envelopes_for_job(b, "offer")] == [ids["offer"], offer]
    assert store.envelopes_for_job(c) == [] and store.envelope(offer) is not None
    assert [e.message_id for e in store.assignments_for_job(b)] == [ids["assign"], given]
    end(d, NOW + 3)
    assert prune(NOW + 3) == 1
    assert store.envelope(lone) is None, "its only job went without a receipt"
    assert store.envelope(b"c" * 32) is not None


def test_an_offer_stored_for_one_job_and_shared_later_stays_for_the_others(
    store: Store, blobs: BlobStore
) -> None:
    a, b = (
        add_job(store, b"m", b"i", role="executor", state="done", updated=NOW - 2 * DAY, n=n)
        for n in range(2)
    )
    offer = b"o" * 32
    store.put_envelope(offer, "offer", b"raw offer", NOW, job_id=a)
    store.put_shared_envelope(offer, "offer", b"raw offer", NOW, [b])
    store.update_job(b, "executor", NOW, state="running")
    assert collect(store, blobs, now=NOW, retention_s=DAY).jobs_pruned == 1
    assert store.envelopes_for_job(a) == []
    [kept] = store.envelopes_for_job(b)
    assert (kept.message_id, kept.job_id) == (offer, None)
    store.update_job(b, "executor", NOW - 2 * DAY, state="failed")
    assert collect(store, blobs, now=NOW, retention_s=DAY).jobs_pruned == 1
    assert store.envelope(offer) is None
