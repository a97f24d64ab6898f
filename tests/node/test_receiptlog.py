"""The executor's receipt log: appends, signed heads, inclusion and consistency proofs, durability."""

from __future__ import annotations

import dataclasses
import gc
import subprocess
import sys
import textwrap
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
from e31.node.audit.checks import check_inclusion
from e31.node.store.db import Store
from e31.node.store.receiptlog import ReceiptLog, ReceiptLogError
from e31.protocol.envelope import sign_message, verify
from e31.protocol.errors import BadProof, Mismatch
from e31.protocol.merkle import MerkleLog, verify_consistency
from e31.protocol.messages import MAX_PROOF_ENTRIES, InclusionProof, TreeHead, UsageReceipt
from receipt_fixtures import NET, T0, key, mandelbrot, mandelbrot_file, montecarlo, resign_receipt


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "node.sqlite")
    yield s
    s.close()


def receipts(n: int) -> list[bytes]:
    """n distinct receipts by "executor": one real run, re-signed with distinct compute times."""
    job = mandelbrot()
    return [resign_receipt(job, compute_ms=1 + i, finished_at=T0 + 3_000 + i).receipt for i in range(n)]


def test_append_is_ordered_idempotent_and_matches_the_merkle_tree(store: Store) -> None:
    log = ReceiptLog(store, key("executor"), NET)
    entries = receipts(5)
    assert [log.append(r) for r in entries] == [0, 1, 2, 3, 4]
    assert log.append(entries[2]) == 2
    assert log.size == 5
    reference = MerkleLog()
    for r in entries:
        reference.append(r)
    assert log.root() == reference.root()


def test_a_batch_appends_in_one_go_and_matches_single_appends(store: Store, tmp_path: Path) -> None:
    entries = receipts(6)
    log = ReceiptLog(store, key("executor"), NET)
    assert log.append_many([entries[0], entries[1]]) == [0, 1]
    # known ones keep their index, a repeat inside the batch is one leaf, new ones follow in order
    again = [entries[1], entries[2], entries[2], verify(entries[3], UsageReceipt)]
    assert log.append_many(again) == [1, 2, 2, 3]
    with Store(tmp_path / "other.sqlite") as other:
        single = ReceiptLog(other, key("executor"), NET)
        for r in entries[:4]:
            single.append(r)
        assert single.root() == log.root() and log.size == 4


def test_one_bad_receipt_appends_none_of_its_batch(store: Store) -> None:
    log = ReceiptLog(store, key("executor"), NET)
    entries = receipts(3)
    elsewhere = resign_receipt(mandelbrot(), network="another-net").receipt
    with pytest.raises(ReceiptLogError, match="for network"):
        log.append_many([entries[0], elsewhere, entries[1]])
    assert log.size == 0
    assert log.append_many(entries) == [0, 1, 2]


def test_a_batch_is_placed_by_one_proof_under_one_new_head(store: Store) -> None:
    log = ReceiptLog(store, key("executor"), NET)
    entries = receipts(5)
    log.append_many(entries[:3])
    ids = [verify(r).message_id.raw for r in entries]
    (raw,) = log.inclusions([ids[0], ids[4], ids[2], ids[0]], T0 + 50)
    proof = verify(raw, InclusionProof)
    assert [e.receipt_id.raw for e in proof.message.entries] == sorted((ids[0], ids[2])), (
        "a receipt not in the log is left out; each is placed once, in order"
    )
    assert [verify(h, TreeHead).message.size for h in log.heads()] == [3]
    for r in (entries[0], entries[2]):
        assert check_inclusion(proof, verify(r, UsageReceipt)).size == 3
    with pytest.raises(Mismatch, match="does not place that receipt"):
        check_inclusion(proof, verify(entries[1], UsageReceipt))
    assert log.inclusions([ids[3]], T0 + 60) == []


def test_a_batch_larger_than_a_proof_holds_takes_several(store: Store) -> None:
    log = ReceiptLog(store, key("executor"), NET)
    entries = receipts(MAX_PROOF_ENTRIES + 3)
    log.append_many(entries)
    ids = [verify(r).message_id.raw for r in entries]
    proofs = [verify(p, InclusionProof).message for p in log.inclusions(ids, T0)]
    assert [len(p.entries) for p in proofs] == [MAX_PROOF_ENTRIES, 3]
    assert len({p.treehead for p in proofs}) == 1
    assert sorted(e.receipt_id.raw for p in proofs for e in p.entries) == sorted(ids)


def test_the_proofs_of_a_batch_read_each_stored_hash_once(store: Store) -> None:
    """Receipts acknowledged together are neighbours in the log: their paths share most hashes, read
    once for the batch (one query finds their indexes), and each path is the one proved alone."""
    log = ReceiptLog(store, key("executor"), NET)
    entries = receipts(200)
    log.append_many(entries)
    ids = [verify(r).message_id.raw for r in entries]
    batch = ids[150:190]
    alone = {
        e.receipt_id.raw: e.path
        for r in batch
        for e in verify(log.inclusion(r, T0), InclusionProof).message.entries
    }
    statements: list[str] = []
    store._conn.set_trace_callback(statements.append)
    try:
        proofs = [verify(p, InclusionProof).message for p in log.inclusions(batch, T0)]
    finally:
        store._conn.set_trace_callback(None)
    together = {e.receipt_id.raw: e.path for p in proofs for e in p.entries}
    assert together == alone and len(together) == len(batch)
    hashes = [s for s in statements if "receipt_log_nodes" in s or "leaf_hash FROM" in s]
    assert len(hashes) == len(set(hashes)), "no stored hash is read twice"
    assert len(hashes) < 2 * len(batch) + 16, f"a few reads per receipt, not one per level: {len(hashes)}"
    assert sum("receipt_id IN" in s for s in statements) == 1
    assert not [s for s in statements if s.startswith(("BEGIN", "PRAGMA"))], "reads open no transaction"


def test_the_log_survives_reopening(tmp_path: Path) -> None:
    entries = receipts(3)
    with Store(tmp_path / "node.sqlite") as store:
        log = ReceiptLog(store, key("executor"), NET)
        for r in entries:
            log.append(r)
        head = log.signed_tree_head(T0)
        root = log.root()
    with Store(tmp_path / "node.sqlite") as store:
        again = ReceiptLog(store, key("executor"), NET)
        assert again.size == 3 and again.root() == root
        assert again.signed_tree_head(T0 + 5) == head
        assert again.index_of(verify(entries[1]).message_id.raw) == 1


def test_refuses_receipts_it_did_not_sign_and_garbage(store: Store) -> None:
    log = ReceiptLog(store, key("executor"), NET)
    foreign = mandelbrot(executor="executor2").receipt
    with pytest.raises(ReceiptLogError, match="not by this node"):
        log.append(foreign)
    with pytest.raises(ReceiptLogError, match="not a valid receipt"):
        log.append(b"\x95garbage")
    with pytest.raises(ReceiptLogError, match="not a valid receipt"):
        log.append(mandelbrot().ack)
    other_net = sign_message(
        dataclasses.replace(verify(mandelbrot().receipt, UsageReceipt).message, network="elsewhere"),
        key("executor"),
    )
    with pytest.raises(ReceiptLogError, match="network"):
        log.append(other_net)
    with pytest.raises(ReceiptLogError, match="not by this node"):  # as an envelope verified here too
        log.append(verify(foreign, UsageReceipt))
    with pytest.raises(ReceiptLogError, match="not a receipt"):
        log.append(verify(mandelbrot().ack))  # type: ignore[arg-type]
    assert log.size == 0
    mine = mandelbrot().receipt
    assert log.append(verify(mine, UsageReceipt)) == 0 and log.append(mine) == 0  # one receipt, either way


def test_signed_tree_head_is_signed_once_per_size(store: Store) -> None:
    log = ReceiptLog(store, key("executor"), NET)
    empty = verify(log.signed_tree_head(T0), TreeHead).message
    assert empty.size == 0 and empty.root.raw == MerkleLog().root()
    for r in receipts(2):
        log.append(r)
    first = log.signed_tree_head(T0 + 10)
    assert log.signed_tree_head(T0 + 20) == first
    head = verify(first, TreeHead)
    assert head.signer == head.message.executor
    assert (head.message.size, head.message.root.raw, head.message.timestamp) == (2, log.root(), T0 + 10)
    log.append(receipts(3)[2])
    later = verify(log.signed_tree_head(T0), TreeHead).message
    assert later.size == 3 and later.timestamp == T0 + 10, "a head never goes back in time"
    assert [verify(h, TreeHead).message.size for h in log.heads()] == [0, 2, 3]


def test_inclusion_proofs_verify_against_the_latest_head(store: Store) -> None:
    log = ReceiptLog(store, key("executor"), NET)
    entries = receipts(7)
    for r in entries:
        log.append(r)
    for i, r in enumerate(entries):
        raw = log.inclusion(verify(r).message_id.raw, T0 + 100)
        proof = verify(raw, InclusionProof)
        assert proof.message.entries[0].leaf_index == i and proof.message.tree_size == 7
        head = check_inclusion(proof, verify(r, UsageReceipt))
        assert head.size == 7 and head.root.raw == log.root()


def test_an_old_proof_stays_valid_and_a_proof_for_another_receipt_fails(store: Store) -> None:
    log = ReceiptLog(store, key("executor"), NET)
    entries = receipts(4)
    for r in entries[:2]:
        log.append(r)
    old = verify(log.inclusion(verify(entries[0]).message_id.raw, T0), InclusionProof)
    for r in entries[2:]:
        log.append(r)
    assert check_inclusion(old, verify(entries[0], UsageReceipt)).size == 2
    with pytest.raises(Mismatch, match="does not place that receipt"):
        check_inclusion(old, verify(entries[1], UsageReceipt))
    with pytest.raises(ReceiptLogError, match="not in this node's log"):
        log.inclusion(verify(montecarlo().receipt).message_id.raw, T0)


def test_a_proof_with_a_wrong_path_does_not_match_the_head(store: Store) -> None:
    log = ReceiptLog(store, key("executor"), NET)
    entries = receipts(4)
    for r in entries:
        log.append(r)
    proof = verify(log.inclusion(verify(entries[1]).message_id.raw, T0), InclusionProof).message
    forged = dataclasses.replace(proof, entries=(dataclasses.replace(proof.entries[0], leaf_index=2),))
    with pytest.raises(BadProof, match="does not match the signed tree head"):
        check_inclusion(
            verify(sign_message(forged, key("executor")), InclusionProof), verify(entries[1], UsageReceipt)
        )


def test_consistency_proofs_link_heads(store: Store) -> None:
    log = ReceiptLog(store, key("executor"), NET)
    entries = receipts(9)
    roots = {0: log.root()}
    for i, r in enumerate(entries, 1):
        log.append(r)
        roots[i] = log.root()
    for old in range(0, 10):
        for new in range(old, 10):
            verify_consistency(old, new, roots[old], roots[new], log.consistency(old, new))
    with pytest.raises(ReceiptLogError):
        log.consistency(5, 20)


def test_append_marks_the_receipt_row_with_its_log_index(store: Store) -> None:
    job = mandelbrot_file()
    env = verify(job.receipt)
    store.put_envelope(env.message_id.raw, "receipt", job.receipt, 1.0, job.job_id.raw)
    store.put_receipt(
        digest=env.message_id.raw,
        job_id=job.job_id.raw,
        attempt=1,
        executor=job.executor,
        message_id=env.message_id.raw,
        now=1.0,
    )
    log = ReceiptLog(store, key("executor"), NET)
    log.append(receipts(1)[0])
    assert log.append(job.receipt) == 1
    row = store.receipt(env.message_id.raw)
    assert row is not None and row.log_index == 1


def test_a_tampered_stored_log_is_refused_at_start(tmp_path: Path) -> None:
    with Store(tmp_path / "node.sqlite") as store:
        log = ReceiptLog(store, key("executor"), NET)
        for r in receipts(3):
            log.append(r)
        log.signed_tree_head(T0)
        with store.transaction() as c:
            c.execute("UPDATE receipt_log SET leaf_hash = ? WHERE idx = 1", (b"\x00" * 32,))
    with Store(tmp_path / "node.sqlite") as store, pytest.raises(ReceiptLogError, match="does not match"):
        ReceiptLog(store, key("executor"), NET)


def test_another_key_cannot_take_over_the_log(tmp_path: Path) -> None:
    with Store(tmp_path / "node.sqlite") as store:
        log = ReceiptLog(store, key("executor"), NET)
        log.append(receipts(1)[0])
        log.signed_tree_head(T0)
    with Store(tmp_path / "node.sqlite") as store, pytest.raises(ReceiptLogError, match="key file"):
        ReceiptLog(store, key("executor2"), NET)


def test_an_append_is_durable_when_it_returns(tmp_path: Path) -> None:
    """A process killed right after append (no close, no clean exit) leaves the receipt in the log."""
    entry = receipts(1)[0]
    (tmp_path / "receipt.bin").write_bytes(entry)
    here = Path(__file__).resolve().parent
    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(here)!r})
        from pathlib import Path
        from e31.node.store.receiptlog import ReceiptLog
        from e31.node.store.db import Store
        from receipt_fixtures import NET, key
        log = ReceiptLog(Store({str(tmp_path / "node.sqlite")!r}), key("executor"), NET)
        print(log.append(Path({str(tmp_path / "receipt.bin")!r}).read_bytes()), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == -9, proc.stderr
    assert proc.stdout.strip() == "0"
    with Store(tmp_path / "node.sqlite") as store:
        log = ReceiptLog(store, key("executor"), NET)
        assert log.size == 1 and log.index_of(verify(entry).message_id.raw) == 0


def test_a_store_without_subtree_rows_gets_them_rebuilt_at_start(tmp_path: Path) -> None:
    """A log written before the subtree rows existed (or whose rows do not add up) is repaired from its
    leaves, and its proofs verify."""
    entries = receipts(6)
    with Store(tmp_path / "node.sqlite") as store:
        log = ReceiptLog(store, key("executor"), NET)
        for r in entries:
            log.append(r)
        root = log.root()
        with store.transaction() as c:  # a store of schema v7, before migration _V8 made the log's tables
            c.execute("DROP TABLE receipt_log_nodes")
            c.execute("PRAGMA user_version = 7")
    with Store(tmp_path / "node.sqlite") as store:
        again = ReceiptLog(store, key("executor"), NET)
        assert again.size == 6 and again.root() == root
        proof = verify(again.inclusion(verify(entries[4]).message_id.raw, T0), InclusionProof)
        assert check_inclusion(proof, verify(entries[4], UsageReceipt)).root.raw == root
        with store.transaction() as c:
            c.execute("UPDATE receipt_log_nodes SET hash = ? WHERE level = 2 AND idx = 0", (b"\x01" * 32,))
    reference = MerkleLog()
    for r in entries:
        reference.append(r)
    with Store(tmp_path / "node.sqlite") as store:
        repaired = ReceiptLog(store, key("executor"), NET)
        assert [repaired.root(n) for n in range(7)] == [reference.root(n) for n in range(7)]


def test_the_log_keeps_no_per_receipt_state_in_memory(store: Store) -> None:
    """Memory allocated by the log's own code stays the same whether it holds 50 receipts or 550:
    lookups and proofs come from the store (issue 8: memory flat over a long run of jobs)."""
    log = ReceiptLog(store, key("executor"), NET)
    entries = receipts(550)
    mine = [tracemalloc.Filter(True, "*/receiptlog.py"), tracemalloc.Filter(True, "*/receipt_tree.py")]

    def held() -> int:
        # sqlite3 keeps a weak reference to every cursor and drops the dead ones every 200 new cursors:
        # 200 made here (and counted under this file) clear those of the log's own queries
        for _ in range(200):
            store._conn.cursor().close()
        gc.collect()
        return sum(s.size for s in tracemalloc.take_snapshot().filter_traces(mine).statistics("filename"))

    tracemalloc.start()
    try:
        for r in entries[:50]:
            log.append(r)
        log.signed_tree_head(T0)
        before = held()
        for r in entries[50:]:
            log.append(r)
        log.signed_tree_head(T0 + 1)
        after = held()
    finally:
        tracemalloc.stop()
    assert after - before < 2_000, f"the log's memory grew by {after - before} bytes over 500 receipts"
    assert log.index_of(verify(entries[300]).message_id.raw) == 300
