"""The node's SQLite store: API, crash safety, migrations and refusing files that are not ours."""

from __future__ import annotations

import functools
import hashlib
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from e31.node.config import STORE_FILE
from e31.node.errors import StoreError
from e31.node.store.async_store import AsyncStore
from e31.node.store.db import Store, call
from e31.node.store.schema import APPLICATION_ID, SCHEMA_VERSION, migrate
from e31.protocol.blobs import PUSH_MAX

ALICE = "e31n" + "a" * 52
BOB = "e31n" + "b" * 52


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store.in_data_dir(tmp_path)
    yield s
    s.close()


def test_new_store_settings(tmp_path: Path, store: Store) -> None:
    assert store.path == tmp_path / STORE_FILE
    assert store.schema_version == SCHEMA_VERSION
    with store.transaction() as c:
        assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert c.execute("PRAGMA foreign_keys").fetchone()[0] == 1
        assert c.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL: durable by default
    with store.transaction(durable=False) as c:
        assert c.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
        assert c.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID


def test_kv(store: Store) -> None:
    assert store.kv_get("k") is None
    store.kv_set("k", b"1")
    store.kv_set("k", b"2")
    assert store.kv_get("k") == b"2"
    assert store.kv_delete("k") is True
    assert store.kv_delete("k") is False


def test_peers(store: Store) -> None:
    store.upsert_peer(ALICE, "main", ["10.0.0.1:1"], "bootstrap", now=100.0)
    store.upsert_peer(BOB, "main", ["10.0.0.2:1"], "mdns", now=150.0, contact=b"signed-record")
    store.upsert_peer(ALICE, "main", ["10.0.0.9:1", "10.0.0.1:1"], "exchange", now=200.0)
    alice = store.peer(ALICE)
    assert alice is not None
    assert alice.addresses == ("10.0.0.9:1", "10.0.0.1:1")
    assert (alice.source, alice.first_seen, alice.last_seen) == ("bootstrap", 100.0, 200.0)
    assert [p.node_id for p in store.peers()] == [ALICE, BOB]
    assert store.peers(network="other") == []
    assert store.peer_failed(BOB, now=160.0) == 1
    assert store.peer_failed(BOB, now=170.0) == 2
    assert store.peer_failed("e31nunknown", now=170.0) == 0
    bob = store.peer(BOB)
    assert bob is not None and (bob.failures, bob.last_failure, bob.contact) == (2, 170.0, b"signed-record")
    store.upsert_peer(BOB, "main", [], "mdns", now=180.0)
    bob = store.peer(BOB)
    assert bob is not None and bob.failures == 0 and bob.contact == b"signed-record"
    assert bob.addresses == ("10.0.0.2:1",)
    store.peer_failed(BOB, now=190.0)
    assert store.prune_peers(seen_before=190.0, min_failures=2) == 0
    assert store.prune_peers(seen_before=190.0, min_failures=1) == 1
    assert store.peer(BOB) is None
    assert store.remove_peer(ALICE) is True
    with pytest.raises(ValueError, match="source"):
        store.upsert_peer(ALICE, "main", [], "rumour", now=1.0)


def test_seen_messages(store: Store) -> None:
    assert store.mark_seen(b"m1", expires=100.0) is True
    assert store.mark_seen(b"m1", expires=100.0) is False
    store.mark_seen(b"m2", expires=200.0)
    assert store.is_seen(b"m1", now=50.0)
    assert not store.is_seen(b"m1", now=100.0)
    assert store.prune_seen(now=150.0) == 1
    assert store.mark_seen(b"m1", expires=300.0) is True
    assert store.is_seen(b"m2", now=150.0)


def _job(
    store: Store, job_id: bytes, role: str = "submitter", state: str = "queued", created: float = 1.0
) -> bool:
    return store.add_job(
        job_id=job_id,
        role=role,
        manifest=b"manifest:" + job_id,
        state=state,
        submitter=ALICE,
        created=created,
        deadline=1000.0,
        fuel_limit=10**9,
    )


def _job_fields(job_id: bytes, role: str = "submitter", state: str = "queued") -> dict[str, Any]:
    """Store.add_job's arguments for a small job (for calls through AsyncStore)."""
    return {
        "job_id": job_id,
        "role": role,
        "manifest": b"m",
        "state": state,
        "submitter": ALICE,
        "created": 1.0,
        "deadline": 2.0,
        "fuel_limit": 10,
    }


def test_jobs(store: Store) -> None:
    assert _job(store, b"j1") is True
    assert _job(store, b"j1") is False
    assert _job(store, b"j1", role="executor", state="fetching") is True
    _job(store, b"j2", created=2.0)
    job = store.job(b"j1", "submitter")
    assert job is not None
    assert (job.manifest, job.state, job.attempt, job.fuel_limit) == (b"manifest:j1", "queued", 0, 10**9)
    assert [j.job_id for j in store.jobs(role="submitter")] == [b"j1", b"j2"]
    assert [j.role for j in store.jobs(states=["fetching"])] == ["executor"]
    assert store.update_job(b"j1", "submitter", 5.0, state="assigned", executor=BOB, attempt=1) is True
    assert store.update_job(b"j1", "submitter", 6.0, expect_state="queued", state="offered") is False
    assert (
        store.update_job(b"j1", "submitter", 7.0, expect_state="assigned", state="running", started=7.0)
        is True
    )
    job = store.job(b"j1", "submitter")
    assert job is not None
    assert (job.state, job.executor, job.attempt, job.started, job.updated) == ("running", BOB, 1, 7.0, 7.0)
    with pytest.raises(ValueError, match="manifest"):
        store.update_job(b"j1", "submitter", 8.0, manifest=b"forged")
    with pytest.raises(ValueError, match="state"):
        store.update_job(b"j1", "submitter", 8.0, state="exploded")
    with pytest.raises(ValueError, match="role"):
        _job(store, b"j3", role="bystander")
    assert store.job(b"j9", "submitter") is None


def _sync_level_of_commits(store: Store) -> list[int]:
    """Record, for every COMMIT on the store's connection, the synchronous level it ran under."""
    levels: list[int] = []
    conn = store._conn

    def trace(statement: str) -> None:
        if statement == "COMMIT":
            levels.append(conn.execute("PRAGMA synchronous").fetchone()[0])

    conn.set_trace_callback(trace)
    return levels


def test_promises_are_durable_commits_and_caches_are_not(store: Store) -> None:
    """FULL (2) syncs the WAL at commit; NORMAL (1) leaves it to the next durable commit."""
    levels = _sync_level_of_commits(store)
    _job(store, b"j1", role="executor", state="fetching")
    store.update_job(b"j1", "executor", 2.0, state="fetching")
    store.update_job(b"j1", "executor", 3.0, state="running")  # resumed from the start after any stop
    store.put_envelope(b"res", "result", b"r", now=1.0, job_id=b"j1")
    store.kv_set("k", b"v")
    store.ref_blob("ab" * 32, "job:j1")
    store.put_result(
        job_id=b"j1", attempt=1, executor=BOB, message_id=b"res", status="ok", outputs={}, now=2.0
    )
    store.update_job(b"j1", "executor", 4.0, state="done")
    with store.transaction() as c:  # callers outside the store get durable commits unless they say not
        c.execute("DELETE FROM kv")
    store.put_envelope(b"rcpt", "receipt", b"r", now=5.0, job_id=b"j1")
    store.put_receipt(digest=b"rcpt", job_id=b"j1", attempt=1, executor=BOB, message_id=b"rcpt", now=5.0)
    # an ack is not durable (the receipt would be delivered again, and acknowledged again), alone or in many
    store.many([call(Store.put_acks, b"ack", b"a", 6.0, [(b"rcpt", b"j1")], durable=False)], durable=False)
    assert levels == [2, 1, 1, 1, 1, 1, 2, 2, 2, 1, 2, 1]
    with pytest.raises(ValueError, match="durable write inside"):
        store.many([call(Store.put_acks, b"ack", b"a", 6.0, [(b"rcpt", b"j1")])], durable=False)
    store._conn.set_trace_callback(None)


def test_a_commit_that_is_not_durable_is_still_kept(tmp_path: Path) -> None:
    with Store.in_data_dir(tmp_path) as s:
        s.kv_set("cache", b"1")
    with Store.in_data_dir(tmp_path) as s:
        assert s.kv_get("cache") == b"1"


def test_envelopes_keep_exact_bytes(store: Store) -> None:
    raw = bytes(range(256)) * 3
    assert store.put_envelope(b"id1", "offer", raw, now=1.0, job_id=b"j1") is True
    assert store.put_envelope(b"id1", "offer", b"other", now=2.0, job_id=b"j1") is False
    store.put_envelope(b"id2", "bid", b"bid-bytes", now=2.0, job_id=b"j1")
    store.put_envelope(b"id3", "contact", b"c", now=3.0)
    env = store.envelope(b"id1")
    assert env is not None and env.raw == raw and env.kind == "offer"
    assert [e.message_id for e in store.envelopes_for_job(b"j1")] == [b"id1", b"id2"]
    assert [e.kind for e in store.envelopes_for_job(b"j1", kind="bid")] == ["bid"]


def test_an_envelope_shared_by_jobs_is_kept_once_and_found_for_each(store: Store) -> None:
    levels = _sync_level_of_commits(store)
    assert store.put_shared_envelope(b"set", "offer", b"offer-bytes", 5.0, [b"j1", b"j2"]) is True
    store._conn.set_trace_callback(None)
    assert levels == [1]  # like put_envelope: not a durable commit
    # the same envelope again: not new, nothing duplicated, and a job it names later is linked too
    assert store.put_shared_envelope(b"set", "offer", b"other", 6.0, [b"j2", b"j3"]) is False
    env = store.envelope(b"set")
    assert env is not None and (env.raw, env.job_id, env.received) == (b"offer-bytes", None, 5.0)
    store.put_envelope(b"bid1", "bid", b"b1", 1.0, job_id=b"j1")  # stored for j1 alone, and earlier
    store.put_envelope(b"acc1", "accepted", b"a1", 9.0, job_id=b"j1")
    store.put_shared_envelope(b"bids", "bid", b"b2", 2.0, [b"j1"])
    # those stored for the job come first, each group by arrival
    assert [e.message_id for e in store.envelopes_for_job(b"j1")] == [b"bid1", b"acc1", b"bids", b"set"]
    assert [e.message_id for e in store.envelopes_for_job(b"j1", "bid")] == [b"bid1", b"bids"]
    assert [e.message_id for e in store.envelopes_for_job(b"j3", "offer")] == [b"set"]
    assert store.envelopes_for_job(b"j3", "bid") == [] and store.envelopes_for_job(b"j4") == []
    # one stored for a job and linked to it as well is still found once
    store.put_shared_envelope(b"acc1", "bid", b"a1", 9.0, [b"j1", b"j5"])
    assert [e.message_id for e in store.envelopes_for_job(b"j1")] == [b"bid1", b"acc1", b"bids", b"set"]
    assert [e.message_id for e in store.envelopes_for_job(b"j5")] == [b"acc1"]
    assert store.envelope_job_ids(["offer"]) == {b"j1", b"j2", b"j3"}
    assert store.envelope_job_ids(["bid", "accepted"]) == {b"j1", b"j5"}
    with pytest.raises(ValueError, match="kind 'assign'"):
        store.put_shared_envelope(b"as", "assign", b"x", 1.0, [b"j1"])
    with pytest.raises(ValueError, match="at least one job"):
        store.put_shared_envelope(b"o2", "offer", b"x", 1.0, [])
    assert store.envelope(b"as") is None and store.envelope(b"o2") is None


def test_the_envelopes_of_a_job_are_found_through_indexes(store: Store) -> None:
    from e31.node.store.envelopes import _ENVELOPES_FOR_JOB

    for kinds in ((None, None), ("offer", None), ("assign", "assigns")):  # (any; one kind; an assignment)
        with store.reading() as c:
            plan = [r[3] for r in c.execute("EXPLAIN QUERY PLAN " + _ENVELOPES_FOR_JOB, (b"j1", *kinds))]
        assert "SEARCH envelopes USING INDEX envelopes_job (job_id=?)" in plan, plan
        assert "SEARCH l USING PRIMARY KEY (job_id=?)" in plan, plan
        assert "SEARCH e USING PRIMARY KEY (message_id=?)" in plan, plan
        assert not [step for step in plan if step.startswith("SCAN")], plan


def test_pruning_finds_ended_jobs_and_the_referrers_of_envelopes_without_a_scan(store: Store) -> None:
    from e31.node.lifecycle import PRUNABLE, sql_in
    from e31.node.store.pruning import _ENDED

    assert sql_in(PRUNABLE) == _ENDED == "state IN ('cancelled', 'done', 'expired', 'failed')"
    with store.reading() as c:
        (index,) = c.execute("SELECT sql FROM sqlite_master WHERE name = 'jobs_ended'").fetchone()
    assert index.endswith(f"WHERE {_ENDED}"), "the partial index selects exactly lifecycle.PRUNABLE"
    with store.reading() as c:
        plans = [
            [r[3] for r in c.execute("EXPLAIN QUERY PLAN " + sql, args)]
            for sql, args in [
                (
                    f"SELECT job_id, role FROM jobs WHERE {_ENDED} AND updated < ? ORDER BY updated LIMIT ?",
                    (1.0, 10),
                ),
                ("DELETE FROM envelopes WHERE message_id = ?", (b"m",)),  # with its foreign key checks
            ]
        ]
    assert plans[0] == ["SEARCH jobs USING INDEX jobs_ended (updated<?)"]
    assert not [step for plan in plans for step in plan if step.startswith("SCAN")], plans


def test_the_latest_schema_lists_exactly_the_lifecycle_sets(store: Store) -> None:
    """The migrations' text is history, written with literal roles and states: the schema they build
    must still list exactly lifecycle's sets where it lists them (the jobs' role CHECK, the pruning
    index), and nowhere else."""
    from e31.node.lifecycle import PRUNABLE, Role, sql_in

    with store.reading() as c:
        schema = c.execute("SELECT name, sql FROM sqlite_schema WHERE sql IS NOT NULL").fetchall()
    lists = {
        (name, column): {v.strip(" '") for v in values.split(",")}
        for name, sql in schema
        for column, values in re.findall(r"(\w+) IN \(('[^)]*)\)", sql)
    }
    assert lists == {("jobs", "role"): set(Role), ("jobs_ended", "state"): set(PRUNABLE)}
    (ended,) = [sql for name, sql in schema if name == "jobs_ended"]
    assert ended.endswith(f"WHERE {sql_in(PRUNABLE)}")  # the very text a query must use to use the index


def test_results_receipts_and_acks(store: Store) -> None:
    _job(store, b"j1", role="executor", state="done")
    store.put_envelope(b"res", "result", b"r", now=1.0, job_id=b"j1")
    store.put_envelope(b"rct", "receipt", b"R", now=1.0, job_id=b"j1")
    assert (
        store.put_result(
            job_id=b"j1",
            attempt=1,
            executor=BOB,
            message_id=b"res",
            status="ok",
            outputs={"stdout": "ab" * 32},
            now=2.0,
            fuel_used=77,
        )
        is True
    )
    [result] = store.results_for_job(b"j1")
    assert (result.status, result.fuel_used, result.outputs) == ("ok", 77, {"stdout": "ab" * 32})
    digest = hashlib.sha256(b"R").digest()
    assert (
        store.put_receipt(
            digest=digest,
            job_id=b"j1",
            attempt=1,
            executor=BOB,
            message_id=b"rct",
            now=2.0,
            next_delivery=3.0,
        )
        is True
    )
    assert [r.digest for r in store.receipts_due(now=2.5)] == []
    assert [r.digest for r in store.receipts_due(now=3.0)] == [digest]
    store.receipt_delivery_failed(digest, next_delivery=10.0)
    store.set_receipt_log_index(digest, 0)
    receipt = store.receipt(digest)
    assert receipt is not None and (receipt.delivery_tries, receipt.log_index) == (1, 0)
    store.put_acks(b"ack", b"A", 6.0, [(digest, b"j1")])
    store.put_acks(b"ack2", b"A2", 7.0, [(digest, b"j1")])  # the first ack stays the receipt's
    assert store.receipts_due(now=100.0) == []
    receipt = store.receipt(digest)
    assert receipt is not None and receipt.delivered == 6.0
    ack = store.ack_for(digest)
    assert ack is not None and (ack.raw, ack.kind, ack.job_id) == (b"A", "ack", None)
    assert [r.digest for r in store.receipts_for_job(b"j1")] == [digest]


def test_a_submitter_records_a_verified_receipt_and_its_outputs_in_one_commit(store: Store) -> None:
    _job(store, b"j1", role="submitter", state="assigned")
    rct = hashlib.sha256(b"R").digest()
    store.put_envelope(rct, "receipt", b"R", now=1.0, job_id=b"j1")
    outputs = ["ab" * 32, "cd" * 32]
    now = time.time()
    for at in (now, now + 1):  # a second delivery of the same outcome changes nothing
        store.record_verified_receipt(
            receipt_digest=rct, job_id=b"j1", attempt=1, executor=BOB, now=at, blobs=outputs
        )
    [receipt] = store.receipts_for_job(b"j1")
    assert (receipt.digest, receipt.message_id, receipt.attempt, receipt.executor) == (rct, rct, 1, BOB)
    assert (receipt.delivered, receipt.next_delivery) == (now, None)
    assert store.ack_for(rct) is None  # its ack comes with the next batch
    assert [r.digest for r in store.verified_unacked()] == [rct]
    assert set(outputs) <= store.live_blobs(now=1e12)
    with pytest.raises(sqlite3.IntegrityError):  # the receipt's envelope must be stored first
        store.record_verified_receipt(
            receipt_digest=b"x" * 32, job_id=b"j1", attempt=1, executor=BOB, now=5.0, blobs=["ef" * 32]
        )
    assert store.receipt(b"x" * 32) is None and "ef" * 32 not in store.live_blobs(now=1e12)  # all or nothing
    seen = hashlib.sha256(b"S").digest()  # indexed before it was verified (say, as delivery came due)
    store.put_envelope(seen, "receipt", b"S", now=1.0, job_id=b"j1")
    store.put_receipt(
        digest=seen, job_id=b"j1", attempt=2, executor=BOB, message_id=seen, now=1.0, next_delivery=9.0
    )
    store.record_verified_receipt(receipt_digest=seen, job_id=b"j1", attempt=2, executor=BOB, now=7.0)
    row = store.receipt(seen)
    assert row is not None and (row.delivered, row.next_delivery, row.created) == (7.0, None, 1.0)


def test_one_ack_acknowledges_a_batch_of_receipts_once(store: Store) -> None:
    digests = [hashlib.sha256(b"R%d" % i).digest() for i in range(3)]
    for i, digest in enumerate(digests):
        job = b"j%d" % i
        _job(store, job, role="submitter", state="done")
        store.put_envelope(digest, "receipt", b"R%d" % i, now=1.0, job_id=job)
        store.record_verified_receipt(
            receipt_digest=digest, job_id=job, attempt=1, executor=BOB, now=time.time()
        )
    _job(store, b"other", role="executor", state="done")  # executed here: not ours to acknowledge
    other = hashlib.sha256(b"O").digest()
    store.put_envelope(other, "receipt", b"O", now=1.0, job_id=b"other")
    store.put_receipt(digest=other, job_id=b"other", attempt=1, executor=BOB, message_id=other, now=1.0)
    store.put_acks(b"ack", b"A", 3.0, [(digests[0], b"j0"), (digests[1], b"j1")])
    assert [r.digest for r in store.verified_unacked()] == [digests[2]]
    assert [store.ack_for(d).raw for d in digests[:2]] == [b"A", b"A"]  # type: ignore[union-attr]
    with store.reading() as c:  # one ack for both
        assert c.execute("SELECT count(*) FROM envelopes WHERE kind = 'ack'").fetchone()[0] == 1
    assert {r.message_id for r in store.envelopes_for_job(b"j0", "ack")} == {b"ack"}
    assert {r.message_id for r in store.envelopes_for_job(b"j1", "ack")} == {b"ack"}


def test_foreign_keys_are_enforced(store: Store) -> None:
    with pytest.raises(sqlite3.IntegrityError):
        store.put_result(
            job_id=b"j",
            attempt=0,
            executor=BOB,
            message_id=b"no-such-envelope",
            status="ok",
            outputs={},
            now=1.0,
        )
    assert store.results_for_job(b"j") == []


def test_blob_refs(store: Store) -> None:
    store.ref_blob("aa" * 32, "job:01", retain_until=100.0)
    store.ref_blob("bb" * 32, "job:01")
    store.ref_blob("aa" * 32, "pin:demo", retain_until=50.0)
    assert store.live_blobs(now=60.0) == {"aa" * 32, "bb" * 32}
    assert store.live_blobs(now=100.0) == {"bb" * 32}
    assert store.expire_blob_refs(now=100.0) == 2
    assert store.unref_owner("job:01") == 1
    assert store.live_blobs(now=0.0) == set()


def test_transaction_rolls_back_on_error(store: Store) -> None:
    with pytest.raises(RuntimeError), store.transaction() as c:
        c.execute("INSERT INTO kv (key, value) VALUES ('a', x'00')")
        raise RuntimeError("boom")
    assert store.kv_get("a") is None


def test_state_survives_reopening(tmp_path: Path) -> None:
    with Store.in_data_dir(tmp_path) as s:
        s.upsert_peer(ALICE, "main", ["10.0.0.1:1"], "bootstrap", now=1.0)
    with Store.in_data_dir(tmp_path) as s:
        assert [p.node_id for p in s.peers()] == [ALICE]


# --- migrations and refusal ------------------------------------------------------------------------


def _store_at_version(path: Path, version: int) -> sqlite3.Connection:
    """A connection to a new store file migrated only up to `version` (an older node's store)."""
    conn = sqlite3.connect(path, isolation_level=None)
    migrate(conn, version)
    return conn


def test_migration_from_version_1(tmp_path: Path) -> None:
    path = tmp_path / STORE_FILE
    conn = _store_at_version(path, 1)
    conn.execute(
        "INSERT INTO peers (node_id, network, addresses, source, first_seen, last_seen) "
        "VALUES (?, 'main', '[\"10.0.0.1:1\"]', 'bootstrap', 1.0, 2.0)",
        (ALICE,),
    )
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
    conn.close()
    with Store(path) as s:
        assert s.schema_version == SCHEMA_VERSION
        peer = s.peer(ALICE)
        assert peer is not None and peer.addresses == ("10.0.0.1:1",)
        assert _job(s, b"j1") is True


def test_migration_from_version_3_keeps_every_envelope_and_adds_links(tmp_path: Path) -> None:
    path = tmp_path / STORE_FILE
    conn = _store_at_version(path, 3)
    conn.execute(
        "INSERT INTO jobs (job_id, role, manifest, state, submitter, created, deadline, updated) "
        "VALUES (x'01', 'submitter', x'00', 'done', ?, 1.0, 2.0, 1.0)",
        (ALICE,),
    )
    conn.executemany(
        "INSERT INTO envelopes (message_id, kind, raw, job_id, received) VALUES (?, ?, ?, ?, ?)",
        [
            (b"offer", "offer", b"o", b"\x01", 1.0),
            (b"rct", "receipt", b"r", b"\x01", 2.0),
            (b"contact", "contact", b"c", None, 3.0),
        ],
    )
    conn.execute(
        "INSERT INTO receipts (digest, job_id, attempt, executor, message_id, created) "
        "VALUES (x'aa', x'01', 1, ?, ?, 2.0)",
        (BOB, b"rct"),
    )
    conn.close()
    with Store(path) as s:
        assert s.schema_version == SCHEMA_VERSION
        assert [e.message_id for e in s.envelopes_for_job(b"\x01")] == [b"offer", b"rct"]
        assert [r.message_id for r in s.receipts_for_job(b"\x01")] == [b"rct"]
        assert s.put_shared_envelope(b"set", "offer", b"s", 4.0, [b"\x01", b"\x02"]) is True
        assert [e.message_id for e in s.envelopes_for_job(b"\x01", "offer")] == [b"offer", b"set"]
        assert s.prune_finished_jobs(ended_before=10.0) == 1
        # the job had a receipt: its offers stay, the one stored for it and the one it shares
        assert [e.message_id for e in s.envelopes_for_job(b"\x01")] == [b"offer", b"rct", b"set"]
        assert s.envelope(b"contact") is not None


def test_migration_to_version_5_drops_proofs_of_the_old_form(tmp_path: Path) -> None:
    path = tmp_path / STORE_FILE
    conn = _store_at_version(path, 4)
    conn.executemany(
        "INSERT INTO jobs (job_id, role, manifest, state, submitter, created, deadline, "
        "updated) VALUES (?, 'submitter', x'00', 'done', ?, 1.0, 2.0, 1.0)",
        [(b"\x01", ALICE), (b"\x02", ALICE)],
    )
    conn.executemany(
        "INSERT INTO envelopes (message_id, kind, raw, job_id, received) VALUES (?, ?, ?, ?, ?)",
        [
            (b"r1", "receipt", b"r", b"\x01", 1.0),
            (b"r2", "receipt", b"r", b"\x02", 1.0),
            (b"p1", "proof", b"old form", b"\x01", 2.0),
        ],
    )
    conn.executemany(
        "INSERT INTO receipts (digest, job_id, attempt, executor, message_id, created, "
        "log_index) VALUES (?, ?, 1, ?, ?, 1.0, ?)",
        [(b"r1", b"\x01", BOB, b"r1", 7), (b"r2", b"\x02", BOB, b"r2", 3)],
    )
    conn.close()
    with Store(path) as s:
        assert s.schema_version == SCHEMA_VERSION
        assert s.envelope(b"p1") is None and s.envelope(b"r1") is not None
        # proven by the dropped proof: asked for again; one set by a log (no proof stored): kept
        assert [r.log_index for r in s.receipts_for_job(b"\x01")] == [None]
        assert [r.log_index for r in s.receipts_for_job(b"\x02")] == [3]


def test_migration_to_version_6_drops_acks_of_the_old_form(tmp_path: Path) -> None:
    path = tmp_path / STORE_FILE
    conn = _store_at_version(path, 5)
    conn.execute(
        "INSERT INTO jobs (job_id, role, manifest, state, submitter, created, deadline, "
        "updated) VALUES (x'01', 'submitter', x'00', 'done', ?, 1.0, 2.0, 1.0)",
        (ALICE,),
    )
    conn.executemany(
        "INSERT INTO envelopes (message_id, kind, raw, job_id, received) VALUES (?, ?, ?, ?, ?)",
        [(b"r1", "receipt", b"r", b"\x01", 1.0), (b"a1", "ack", b"old form", b"\x01", 2.0)],
    )
    conn.execute(
        "INSERT INTO receipts (digest, job_id, attempt, executor, message_id, created, delivered) "
        "VALUES (?, x'01', 1, ?, ?, 1.0, 2.0)",
        (b"r1", BOB, b"r1"),
    )
    conn.execute("INSERT INTO acks (receipt_digest, message_id, created) VALUES (?, ?, 2.0)", (b"r1", b"a1"))
    conn.close()
    with Store(path) as s:
        assert s.schema_version == SCHEMA_VERSION
        assert s.envelope(b"a1") is None and s.ack_for(b"r1") is None and s.envelope(b"r1") is not None
        # still delivered (its executor does not deliver it again), and not acknowledged again: a node
        # upgraded with a week of jobs would otherwise sign and send acks for all of them at its start
        assert [r.delivered for r in s.receipts_for_job(b"\x01")] == [2.0]
        assert s.verified_unacked() == []
        s.put_envelope(b"r2", "receipt", b"r", 1.0, b"\x01")  # one verified after the upgrade is
        s.record_verified_receipt(
            receipt_digest=b"r2", job_id=b"\x01", attempt=2, executor=BOB, now=time.time()
        )
        assert [r.digest for r in s.verified_unacked()] == [b"r2"]


def test_a_failing_migration_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import e31.node.store.schema as schema

    path = tmp_path / STORE_FILE
    Store(path).close()
    broken = (*schema.MIGRATIONS, "CREATE TABLE extra (a INTEGER);\nTHIS IS NOT SQL;\n")
    monkeypatch.setattr(schema, "MIGRATIONS", broken)
    conn = sqlite3.connect(path, isolation_level=None)
    with pytest.raises(sqlite3.OperationalError):
        migrate(conn, SCHEMA_VERSION + 1)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert conn.execute("SELECT count(*) FROM sqlite_schema WHERE name = 'extra'").fetchone()[0] == 0
    conn.close()


def _snapshot(path: Path) -> bytes:
    return path.read_bytes()


def test_not_a_database_is_refused_and_kept(tmp_path: Path) -> None:
    path = tmp_path / STORE_FILE
    path.write_bytes(b"these are my holiday photos, not a database" * 100)
    before = _snapshot(path)
    with pytest.raises(StoreError, match="not an SQLite database"):
        Store(path)
    assert _snapshot(path) == before


def test_other_programs_database_is_refused_and_kept(tmp_path: Path) -> None:
    path = tmp_path / STORE_FILE
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE recipes (name TEXT)")
    conn.commit()
    conn.close()
    before = _snapshot(path)
    with pytest.raises(StoreError, match="not an e31 store"):
        Store(path)
    assert _snapshot(path) == before


def test_newer_schema_is_refused_and_kept(tmp_path: Path) -> None:
    path = tmp_path / STORE_FILE
    Store(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    before = _snapshot(path)
    with pytest.raises(StoreError, match="newer e31"):
        Store(path)
    assert _snapshot(path) == before


def test_corrupt_pages_are_refused_and_kept(tmp_path: Path) -> None:
    path = tmp_path / STORE_FILE
    with Store(path) as s:
        for i in range(300):
            s.put_envelope(i.to_bytes(4, "big"), "offer", b"x" * 200, now=float(i))
    page = 4096
    data = bytearray(path.read_bytes())
    assert len(data) > 6 * page
    data[3 * page : 5 * page] = b"\xa5" * (2 * page)
    path.write_bytes(bytes(data))
    with pytest.raises(StoreError, match="corrupt"):
        Store(path)
    assert _snapshot(path) == bytes(data)


def test_a_directory_in_the_way(tmp_path: Path) -> None:
    (tmp_path / STORE_FILE).mkdir()
    with pytest.raises(StoreError, match="is a directory"):
        Store.in_data_dir(tmp_path)


def test_closed_store_gives_store_error(tmp_path: Path) -> None:
    s = Store.in_data_dir(tmp_path)
    s.close()
    with pytest.raises(StoreError):
        s.kv_get("x")


# --- crash safety ----------------------------------------------------------------------------------

_WRITER = textwrap.dedent("""
    import sys
    from e31.node.store.db import Store
    store = Store(sys.argv[1])
    batch = 0
    while True:
        with store.transaction() as c:
            for i in range(50):
                c.execute("INSERT INTO kv (key, value) VALUES (?, ?)", (f"b{batch}-{i}", b"v" * 300))
        print(batch, flush=True)
        batch += 1
""")


def test_sigkill_mid_write_leaves_only_whole_transactions(tmp_path: Path) -> None:
    path = tmp_path / STORE_FILE
    Store(path).close()
    child = subprocess.Popen([sys.executable, "-c", _WRITER, str(path)], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    committed = -1
    try:
        while committed < 30:
            line = child.stdout.readline()
            assert line, "the writer stopped early"
            committed = int(line)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert child.returncode == -signal.SIGKILL
    with Store(path) as s, s.transaction() as c:
        keys = [row[0] for row in c.execute("SELECT key FROM kv WHERE key GLOB 'b[0-9]*'")]  # the writer's
    sizes = Counter(k.split("-")[0] for k in keys)
    assert set(sizes.values()) == {50}, "a transaction was torn"
    batches = sorted(int(b[1:]) for b in sizes)
    assert batches == list(range(len(batches)))
    assert len(batches) >= committed + 1, "a reported commit was lost"


# --- trio ------------------------------------------------------------------------------------------


async def test_async_store(tmp_path: Path) -> None:
    db = await AsyncStore.open(tmp_path / STORE_FILE)
    try:
        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(db.run, Store.mark_seen, f"m{i}".encode(), 100.0)
        assert await db.run(Store.mark_seen, b"m3", 100.0) is False
        assert await db.run(Store.prune_seen, now=200.0) == 20
        await db.run(Store.upsert_peer, ALICE, "main", ["127.0.0.1:1"], "inbound", 5.0)
        peers = await db.run(Store.peers)
        assert [p.node_id for p in peers] == [ALICE]
    finally:
        await db.aclose()
    with pytest.raises(StoreError):
        await AsyncStore.open(tmp_path)


async def test_short_calls_run_on_the_event_loop_durable_ones_included(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = await AsyncStore.open(tmp_path / STORE_FILE)
    seen: list[tuple[str, bool]] = []

    def recording(method: Any) -> Any:
        def wrapper(self: Store, *args: Any, **kwargs: Any) -> Any:
            on_loop = threading.current_thread() is threading.main_thread()
            seen.append((kwargs.get("state", method.__name__), on_loop))
            return method(self, *args, **kwargs)

        wrapper.__name__ = method.__name__
        return wrapper

    for name in ("update_job", "put_envelope", "put_shared_envelope", "job"):
        monkeypatch.setattr(Store, name, recording(getattr(Store, name)))
    job_id = b"j" * 32
    job = _job_fields(job_id)
    try:
        assert await db.run(Store.add_job, **job)
        assert await db.run(Store.update_job, job_id, "submitter", 1.5, state="offered")
        assert await db.run(Store.update_job, job_id, "submitter", 1.6, state="assigned")
        await db.run(Store.put_envelope, b"e" * 32, "ping", b"raw", 1.0)
        await db.run(Store.put_shared_envelope, b"o" * 32, "offer", b"raw", 1.0, [job_id])
        assert (await db.run(Store.job, job_id, "submitter")).state == "assigned"  # type: ignore[union-attr]
        # all on the loop: a durable state too (its fsync is the group commit's, in a thread)
        assert seen == [
            ("offered", True),
            ("assigned", True),
            ("put_envelope", True),
            ("put_shared_envelope", True),
            ("job", True),
        ]
        # a function that is not the Store's own method never runs inline, whatever its name
        seen.clear()
        impostor = recording(lambda self, *a, **k: None)
        impostor.__name__ = "job"
        await db.run(impostor)
        assert seen == [("<lambda>", False)]
        # nor does a partial (it has no name)
        await db.run(functools.partial(Store.kv_set, key="k", value=b"v"))
        assert await db.run(Store.kv_get, "k") == b"v"
    finally:
        await db.aclose()


def test_the_inline_names_are_store_methods_found_on_store_itself() -> None:
    """AsyncStore runs a call inline by its name and `getattr(Store, name) is method`: every name it
    lists is a method Store gets from one of its table families, the very function passed as Store.NAME."""
    from e31.node.store.async_store import INLINE_READS, INLINE_WRITES, _short_write
    from e31.node.store.blob_refs import BlobRefs

    for name in INLINE_READS | INLINE_WRITES:
        assert callable(getattr(Store, name, None)), name
    assert Store.small_blobs is BlobRefs.small_blobs
    assert _short_write(Store.put_small_blob) and not _short_write(Store.live_blobs)


async def test_an_inline_call_never_waits_on_a_store_busy_in_another_thread(tmp_path: Path) -> None:
    """While another thread holds the store (as during a durable commit's fsync), a point read runs at
    once on its own connection and sees every earlier commit; a short write goes to the worker thread
    and waits there, and the event loop keeps running meanwhile."""
    import threading

    db = await AsyncStore.open(tmp_path / STORE_FILE)
    await db.run(Store.kv_set, "before", b"1")
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with db.store._lock:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10)
        assert await db.run(Store.kv_get, "before") == b"1"
        ticks = 0
        done = trio.Event()

        async def write() -> None:
            await db.run(Store.kv_set, "k", b"v")
            done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(write)
            for _ in range(5):
                await trio.sleep(0.01)
                ticks += 1
            assert not done.is_set() and ticks == 5  # the loop ran while the write waited
            release.set()
        assert done.is_set() and await db.run(Store.kv_get, "k") == b"v"
    finally:
        release.set()
        holder.join()
        await db.aclose()


def _count_checkpoints(db: AsyncStore, taking: float = 0.0) -> list[int]:
    """Count the store's WAL checkpoints (in the list's one item), each taking `taking` seconds more."""
    count = [0]
    checkpoint = db.store.checkpoint

    def counting() -> None:
        count[0] += 1
        time.sleep(taking)
        checkpoint()

    db.store.checkpoint = counting  # type: ignore[method-assign]
    return count


async def test_the_wal_is_checkpointed_off_the_event_loop(tmp_path: Path) -> None:
    from e31.node.store.async_store import CHECKPOINT_EVERY

    db = await AsyncStore.open(tmp_path / STORE_FILE)
    wal = tmp_path / (STORE_FILE + "-wal")
    try:
        checkpoints = _count_checkpoints(db)
        for i in range(CHECKPOINT_EVERY + 1):
            await db.run(Store.kv_set, f"k{i % 7}", b"v" * 2000)
        assert checkpoints == [1] and wal.exists()
        with sqlite3.connect(tmp_path / STORE_FILE) as other:
            assert other.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[0] == 0
        assert await db.run(Store.kv_get, "k3") == b"v" * 2000
    finally:
        await db.aclose()


async def test_a_short_write_waits_for_the_thread_to_let_go_and_writes_on_the_event_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Queued behind the worker thread, a short write would keep the connection in the thread for as long
    as writes keep coming (each a thread hop): it waits for the thread's call instead, then runs inline."""
    db = await AsyncStore.open(tmp_path / STORE_FILE)
    where: list[int] = []
    original = Store.kv_set

    @functools.wraps(original)
    def kv_set(self: Store, key: str, value: bytes) -> None:
        where.append(threading.get_ident())
        original(self, key, value)

    monkeypatch.setattr(Store, "kv_set", kv_set)
    release = threading.Event()

    def slow(store: Store) -> None:
        with store.transaction(durable=False):  # holds the connection in the worker thread
            release.wait(10)

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(db.run, functools.partial(slow))
            await trio.sleep(0.05)
            nursery.start_soon(db.run, Store.kv_set, "k", b"v")
            await trio.sleep(0.05)
            assert where == []  # waiting for the thread's call to end
            release.set()
        assert where == [threading.get_ident()]  # then written here, on the event loop's thread
        assert await db.run(Store.kv_get, "k") == b"v"
    finally:
        release.set()
        await db.aclose()


async def test_writers_arriving_during_a_wal_checkpoint_do_not_checkpoint_again(tmp_path: Path) -> None:
    from e31.node.store.async_store import CHECKPOINT_EVERY

    db = await AsyncStore.open(tmp_path / STORE_FILE)
    try:
        checkpoints = _count_checkpoints(db, taking=0.05)  # 100 writers come in meanwhile
        for i in range(CHECKPOINT_EVERY - 1):
            await db.run(Store.kv_set, f"k{i % 7}", b"v")
        async with trio.open_nursery() as nursery:
            for i in range(100):
                nursery.start_soon(db.run, Store.kv_set, f"c{i}", b"v")
        assert checkpoints == [1]
    finally:
        await db.aclose()


async def test_group_commit_one_fsync_serves_many_durable_writes_and_each_waits_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = await AsyncStore.open(tmp_path / STORE_FILE)
    syncs: list[int] = []  # `unsynced` when each sync began: it covers every commit counted by then
    real_sync = Store.sync

    def sync(self: Store) -> int:
        syncs.append(self.unsynced)
        return real_sync(self)

    real_add = Store.add_job
    groups: dict[bytes, Any] = {}  # each job's write: the group (commit) it joined
    committed: dict[int, int] = {}  # each group: `unsynced` right after its commit

    def add_job(self: Store, **job: Any) -> bool:
        added = real_add(self, **job)
        groups[job["job_id"]] = db._group
        return added

    real_commit = AsyncStore._commit_group

    def commit_group(self: AsyncStore, group: Any) -> None:
        real_commit(self, group)
        committed[id(group)] = self.store.unsynced

    add_job.__name__ = "add_job"
    monkeypatch.setattr(Store, "sync", sync)
    monkeypatch.setattr(Store, "add_job", add_job)
    monkeypatch.setattr(AsyncStore, "_commit_group", commit_group)
    covered: list[bool] = []

    async def add(i: int) -> None:
        job_id = bytes([i]) * 32
        job = _job_fields(job_id)
        assert await db.run(Store.add_job, **job)
        covered.append(db._synced >= committed[id(groups[job_id])])  # its commit was synced before

    try:
        await db.run(Store.put_envelope, b"e" * 32, "ping", b"raw", 1.0)
        assert syncs == []  # a write that is not durable waits for nothing
        async with trio.open_nursery() as nursery:
            for i in range(1, 21):
                nursery.start_soon(add, i)
        assert len(covered) == 20 and all(covered)
        assert 1 <= len(syncs) < 20  # shared: far fewer fsyncs than durable writes
        assert 1 <= len(committed) < 20  # and far fewer commits: the writes of a burst commit together
        assert syncs[-1] == db.store.unsynced
        assert len(await db.run(Store.jobs)) == 20
    finally:
        await db.aclose()


async def test_a_read_waits_while_a_durable_commit_is_not_yet_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = await AsyncStore.open(tmp_path / STORE_FILE)
    release = threading.Event()
    real_sync = Store.sync

    def slow_sync(self: Store) -> int:
        release.wait(10)
        return real_sync(self)

    monkeypatch.setattr(Store, "sync", slow_sync)
    job_id = b"j" * 32
    job = _job_fields(job_id)
    order: list[str] = []

    async def write() -> None:
        await db.run(Store.add_job, **job)
        order.append("write returned")

    async def read() -> None:
        row = await db.run(Store.job, job_id, "submitter")
        assert row is not None  # the commit is visible on the read connection...
        order.append("read returned")  # ...but the read returns only once it is on disk

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(write)
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(read)
            await trio.testing.wait_all_tasks_blocked()
            assert order == []  # both wait for the sync in progress
            release.set()
        assert sorted(order) == ["read returned", "write returned"]
    finally:
        release.set()
        await db.aclose()


def test_a_durable_commit_outside_asyncstore_is_still_a_full_one(tmp_path: Path) -> None:
    """Only calls made through AsyncStore defer their fsync (and it waits for it); any other
    durable commit is synchronous=FULL, on disk when it returns."""
    store = Store(tmp_path / STORE_FILE)
    try:
        with store.transaction() as c:
            c.execute("INSERT INTO kv (key, value) VALUES ('a', x'01')")
            assert c.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert store.unsynced == 0
        store.deferring.on = True
        with store.transaction() as c:
            c.execute("INSERT INTO kv (key, value) VALUES ('b', x'01')")
            assert c.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL: the sync comes after
        with store.transaction() as c:
            c.execute("SELECT 1")  # changes nothing: nothing to sync
        store.deferring.on = False
        assert store.unsynced == 1
        store.sync()
    finally:
        store.close()


def test_many_calls_commit_together_or_not_at_all(store: Store) -> None:
    from e31.node.store.db import call

    _job(store, b"j1", role="executor", state="running")
    done = store.many(
        [
            call(Store.put_envelope, b"res", "result", b"r", 1.0, job_id=b"j1"),
            call(Store.update_job, b"j1", "executor", 2.0, expect_state="running", state="done"),
        ]
    )
    assert done == [True, True]
    assert store.envelope(b"res") is not None and store.job(b"j1", "executor").state == "done"  # type: ignore[union-attr]
    with pytest.raises(sqlite3.IntegrityError):  # the last call fails: the first is undone with it
        store.many(
            [
                call(Store.put_envelope, b"res2", "result", b"r2", 3.0, job_id=b"j1"),
                call(
                    Store.put_result,
                    job_id=b"j1",
                    attempt=1,
                    executor=BOB,
                    message_id=b"missing",
                    status="ok",
                    outputs={},
                    now=3.0,
                ),
            ]
        )
    assert store.envelope(b"res2") is None
    store.put_envelope(b"res3", "result", b"r3", 4.0, job_id=b"j1")  # the store is usable after it
    assert store.envelope(b"res3") is not None
    with pytest.raises(ValueError), store.transaction(durable=False):  # it would commit without its fsync
        store.record_verified_receipt(receipt_digest=b"x", job_id=b"j1", attempt=1, executor=BOB, now=5.0)


async def test_atomically_runs_short_writes_inline_in_one_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from e31.node.store.db import call

    db = await AsyncStore.open(tmp_path / STORE_FILE)
    syncs: list[int] = []
    real_sync = Store.sync
    monkeypatch.setattr(Store, "sync", lambda self: (syncs.append(self.unsynced), real_sync(self))[1])
    job = _job_fields(b"j" * 32, "executor", state="fetching")
    try:
        *_, added = await db.atomically(
            call(Store.put_envelope, b"a" * 32, "assign", b"raw", 1.0, job_id=b"j" * 32),
            call(Store.add_job, **job),
        )
        assert added is True and db.store.unsynced == 1 and syncs == [1]  # one durable commit, one sync
        # with a call the event loop does not run (a scan), the whole transaction goes to the thread
        rows, _ = await db.atomically(call(Store.jobs), call(Store.kv_set, "k", b"v"))
        assert [r.job_id for r in rows] == [b"j" * 32] and await db.run(Store.kv_get, "k") == b"v"
    finally:
        await db.aclose()


def test_a_sync_waits_for_a_transaction_still_committing(store: Store) -> None:
    """The count a sync covers is read under the lock: a transaction counted but not yet committed
    (counting comes just before COMMIT) finishes first, so its commit is in the fsync."""
    inside, leave = threading.Event(), threading.Event()

    def writer() -> None:
        store.deferring.on = True
        with store.transaction() as c:
            c.execute("INSERT INTO kv (key, value) VALUES ('w', x'01')")
            inside.set()
            leave.wait(10)

    t = threading.Thread(target=writer)
    t.start()
    assert inside.wait(10)
    covered: list[int] = []
    s = threading.Thread(target=lambda: covered.append(store.sync()))
    s.start()
    s.join(0.3)
    assert covered == []  # still waiting for the writer's transaction
    leave.set()
    t.join(10)
    s.join(10)
    assert covered == [1]


async def test_a_call_waits_only_for_the_commits_made_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sync covers what was counted when it began; a call whose commit it covers returns then, even
    if more durable commits came meanwhile (they wait for the next sync, not it: no call waits for as
    long as others keep writing)."""
    db = await AsyncStore.open(tmp_path / STORE_FILE)
    gates = [threading.Event(), threading.Event()]
    started: list[int] = []
    first_sync = threading.Event()
    real_sync = Store.sync

    def gated_sync(self: Store) -> int:
        covered = real_sync(self)
        started.append(covered)
        first_sync.set()
        gates[len(started) - 1].wait(10)
        return covered

    monkeypatch.setattr(Store, "sync", gated_sync)
    returned: list[str] = []
    first_back = trio.Event()

    async def write(name: str, n: int) -> None:
        await _durable_write(db, n)
        returned.append(name)
        first_back.set()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(write, "first", 1)
            assert await trio.to_thread.run_sync(first_sync.wait, 10)  # under way, covering "first"
            nursery.start_soon(write, "second", 2)
            await trio.testing.wait_all_tasks_blocked()
            gates[0].set()
            with trio.fail_after(5):  # with the second sync held back, the first write still returns
                await first_back.wait()
            assert returned == ["first"] and started[0] == 1
            gates[1].set()
        assert returned == ["first", "second"] and started == [1, 2]
    finally:
        for gate in gates:
            gate.set()
        await db.aclose()


async def _durable_write(db: AsyncStore, n: int) -> None:
    await db.run(Store.add_job, **_job_fields(n.to_bytes(32, "big")))


async def test_a_failed_sync_fails_the_store_for_good(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = await AsyncStore.open(tmp_path / STORE_FILE)

    def broken(self: Store) -> int:
        raise StoreError("node.sqlite-wal: fsync failed: Input/output error")

    monkeypatch.setattr(Store, "sync", broken)
    try:
        with pytest.raises(StoreError, match="could not be synced"):
            await _durable_write(db, 1)
        monkeypatch.undo()  # a later sync would succeed: the pages it failed to write may be gone
        with pytest.raises(StoreError, match="could not be synced"):
            await db.run(Store.kv_get, "k")
        with pytest.raises(StoreError, match="could not be synced"):
            await db.run(Store.kv_set, "k", b"v")
    finally:
        await db.aclose()


async def test_flush_puts_writes_made_without_a_sync_on_disk_with_a_sync_begun_after_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = await AsyncStore.open(tmp_path / STORE_FILE)
    real_sync = Store.sync
    started, release = threading.Event(), threading.Event()
    syncs: list[int] = []  # the rows on disk-to-be when each sync began

    def sync(self: Store) -> int:
        with self.reading() as c:
            syncs.append(c.execute("SELECT count(*) FROM jobs").fetchone()[0])
        if len(syncs) == 1:
            started.set()
            release.wait(10)  # the first sync is still running when the second write commits
        return real_sync(self)

    monkeypatch.setattr(Store, "sync", sync)
    try:
        await db.run(Store.add_job, **_job_fields(b"a" * 32), durable=False)
        assert syncs == [], "a write made not durable waits for no sync"
        async with trio.open_nursery() as nursery:
            nursery.start_soon(db.flush)
            await trio.to_thread.run_sync(started.wait, 10)
            await db.run(Store.add_job, **_job_fields(b"b" * 32), durable=False)
            flushed = trio.Event()

            async def second() -> None:
                await db.flush()
                flushed.set()

            nursery.start_soon(second)
            await trio.sleep(0.1)
            assert not flushed.is_set(), "a sync begun before the write does not cover it"
            release.set()
        assert syncs == [1, 2], "the second flush ran a sync of its own, after the write"
        monkeypatch.setattr(Store, "sync", lambda self: (_ for _ in ()).throw(StoreError("fsync failed")))
        with pytest.raises(StoreError, match="could not be synced"):
            await db.flush()
    finally:
        release.set()
        await db.aclose()


def test_receipts_are_read_with_their_envelopes_by_the_batch(store: Store) -> None:
    job = b"\x33" * 32
    store.add_job(**_job_fields(job))
    digests = [bytes([0xA0, i % 256, i // 256]) + b"\x00" * 29 for i in range(600)]  # past one query's 500
    for i, digest in enumerate(digests):
        store.put_envelope(digest, "receipt", b"receipt %d" % i, 1.0, job)
        store.put_receipt(digest=digest, job_id=job, attempt=1, executor="exec-a", message_id=digest, now=1.0)
    found = store.receipts_with_envelopes([*digests, b"\x02" * 32])  # one this store does not hold
    assert sorted((row.digest, raw) for row, raw in found) == sorted(
        (d, b"receipt %d" % i) for i, d in enumerate(digests)
    )
    assert all(row.executor == "exec-a" and row.job_id == job for row, _ in found)
    assert store.receipts_with_envelopes([]) == []


def test_small_blobs_live_in_the_database_while_a_live_reference_names_them(store: Store) -> None:
    kept, expiring, orphan = "aa" * 32, "bb" * 32, "cc" * 32
    with store.transaction():
        for h in (kept, expiring, orphan):
            store.put_small_blob(h, h.encode())
        store.put_small_blob(kept, b"ignored: it is there")  # a no-op
        store.ref_blob(kept, "job:01")
        store.ref_blob(expiring, "result:02", retain_until=100.0)
    assert store.small_blobs([kept, expiring, orphan, "dd" * 32]) == {
        kept: kept.encode(),
        expiring: expiring.encode(),
        orphan: orphan.encode(),
    }
    assert store.drop_small_blobs(now=50.0) == 1  # the one no reference names
    assert set(store.small_blobs([kept, expiring, orphan])) == {kept, expiring}
    assert store.drop_small_blobs(now=100.0) == 1  # its reference's retention is over
    store.unref_owner("job:01")
    assert store.drop_small_blobs(now=100.0) == 1 and store.small_blobs([kept]) == {}
    with pytest.raises(ValueError, match="at most"):
        store.put_small_blob("ee" * 32, b"x" * (PUSH_MAX + 1))


def test_acknowledged_receipts_without_a_proof_are_found_per_receipt_newest_first(store: Store) -> None:
    job = b"\x31" * 32
    store.add_job(**_job_fields(job))
    for i, executor in enumerate(("exec-a", "exec-b")):  # one job, two replicas
        digest = bytes([0x40 + i]) * 32
        store.put_envelope(digest, "receipt", b"r", 1.0, job)
        store.record_verified_receipt(
            receipt_digest=digest, job_id=job, attempt=1 + i, executor=executor, now=2.0 + i
        )
    gone = b"\x32" * 32  # a receipt of a job the store no longer holds (pruned) is not asked for
    store.put_envelope(b"\x60" * 32, "receipt", b"r", 1.0, gone)
    store.record_verified_receipt(
        receipt_digest=b"\x60" * 32, job_id=gone, attempt=1, executor="exec-a", now=9.0
    )
    assert [r.digest for r in store.acked_without_proof("exec-a")] == [b"\x40" * 32]
    assert [r.digest for r in store.acked_without_proof("exec-b")] == [b"\x41" * 32]
    store.set_receipt_log_index(b"\x40" * 32, 7)  # a proof of the first replica's receipt is kept
    assert store.acked_without_proof("exec-a") == []
    assert [r.digest for r in store.acked_without_proof("exec-b")] == [b"\x41" * 32], "per receipt"
    with store.reading() as c:
        plan = " ".join(
            str(tuple(r))
            for r in c.execute(
                "EXPLAIN QUERY PLAN SELECT digest FROM receipts r WHERE r.executor = ? "
                "AND r.delivered IS NOT NULL AND r.log_index IS NULL ORDER BY r.delivered DESC",
                ("exec-b",),
            )
        )
    assert "receipts_unproved" in plan


def test_acknowledged_receipts_without_a_proof_come_a_page_at_a_time(store: Store) -> None:
    digests = []
    for i in range(5):
        job = bytes([0x70 + i]) * 32
        store.add_job(**_job_fields(job))
        digest = bytes([0x80 + i]) * 32
        store.put_envelope(digest, "receipt", b"r", 1.0, job)
        store.record_verified_receipt(
            receipt_digest=digest, job_id=job, attempt=1, executor="exec-a", now=10.0 + (i // 2)
        )  # ties too
        digests.append(digest)
    newest_first = sorted(digests, key=lambda d: (10.0 + (digests.index(d) // 2), d), reverse=True)
    pages, before = [], None
    while True:
        page = store.acked_without_proof("exec-a", 2, before)
        pages.append([r.digest for r in page])
        if len(page) < 2:
            break
        before = (page[-1].delivered, page[-1].digest)
    assert [d for page in pages for d in page] == newest_first, "every one once, in order"
    assert [len(p) for p in pages] == [2, 2, 1]


async def test_a_burst_of_short_writes_commits_once_and_a_failing_one_is_undone_alone(tmp_path: Path) -> None:
    db = await AsyncStore.open(tmp_path / STORE_FILE)
    commits: list[str] = []
    db.store._conn.set_trace_callback(lambda sql: commits.append(sql) if sql == "COMMIT" else None)

    async def good(i: int) -> None:
        await db.run(Store.kv_set, f"k{i}", b"v")

    async def bad() -> None:  # its first write goes, then its second breaks a foreign key: neither stays
        with pytest.raises(sqlite3.IntegrityError):
            await db.atomically(
                call(Store.put_envelope, b"x" * 32, "ping", b"raw", 1.0),
                call(
                    Store.put_receipt,
                    digest=b"d" * 32,
                    job_id=b"j" * 32,
                    attempt=1,
                    executor="e",
                    message_id=b"n" * 32,
                    now=1.0,
                ),
            )

    try:
        async with trio.open_nursery() as nursery:
            for i in range(5):
                nursery.start_soon(good, i)
            nursery.start_soon(bad)
            for i in range(5, 10):
                nursery.start_soon(good, i)
        assert all([await db.run(Store.kv_get, f"k{i}") == b"v" for i in range(10)])
        assert await db.run(Store.envelope, b"x" * 32) is None
        assert 1 <= len(commits) < 10, "the burst's writes share commits"
        await good(10)  # and the connection is fine for the next one
        assert await db.run(Store.kv_get, "k10") == b"v"
    finally:
        await db.aclose()


async def test_a_synchronous_write_on_the_event_loop_cannot_join_an_open_write_group_unseen(
    tmp_path: Path,
) -> None:
    db = await AsyncStore.open(tmp_path / STORE_FILE)
    try:
        assert db.store._lock.acquire(blocking=False)
        group = db._open_group()  # what the first short write of a burst does
        with pytest.raises(RuntimeError, match=r"through AsyncStore\.run"):
            db.store.kv_set("k", b"v")  # the same thread: the lock would let it in
        db._commit_group(group)
        assert group.error is None
        db.store.kv_set("k", b"v")  # no group open: a plain synchronous write is fine
        assert await db.run(Store.kv_get, "k") == b"v"
    finally:
        await db.aclose()


def test_a_failed_transaction_rolls_back_whole_and_leaves_the_store_usable(store: Store) -> None:
    """An SQLite error in a transaction inside another is a StoreError naming the file; the outer one is
    rolled back with it, and the lock is free for the next write, from this thread or another."""
    with pytest.raises(StoreError, match=re.escape(STORE_FILE)), store.transaction():
        store.kv_set("kept?", b"no")
        with store.transaction() as c:
            c.execute("INSERT INTO no_such_table VALUES (1)")
    assert store.kv_get("kept?") is None, "the outer transaction's write went with it"
    refused = pytest.raises(ValueError, match="durable write inside")  # before anything is written
    with refused, store.transaction(durable=False):
        store.kv_set("inner", b"x")
        with store.transaction():
            pass
    assert store.kv_get("inner") is None
    done: list[bytes | None] = []

    def write() -> None:
        store.kv_set("after", b"yes")
        done.append(store.kv_get("after"))

    writer = threading.Thread(target=write)
    writer.start()
    writer.join(10)
    assert done == [b"yes"], "the lock was released: another thread writes at once"
