"""The SQLite-backed Merkle tree of the receipt log against the in-memory reference (protocol/merkle.py)."""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterator

import pytest
from e31.node.store import receipt_tree as tree
from e31.node.store.schema import SCHEMA_VERSION, migrate
from e31.protocol.merkle import MerkleLog, verify_consistency, verify_inclusion

N = 70


def leaf(i: int) -> bytes:
    return hashlib.sha256(b"leaf %d" % i).digest()


@pytest.fixture
def db() -> Iterator[sqlite3.Connection]:
    c = sqlite3.connect(":memory:", isolation_level=None)
    migrate(c, SCHEMA_VERSION)
    yield c
    c.close()


def grow(c: sqlite3.Connection, n: int) -> tuple[tree.StoredTree, MerkleLog]:
    current, reference = tree.StoredTree.empty(), MerkleLog()
    for i in range(n):
        current, rows = current.extended(leaf(i))
        c.execute("INSERT INTO receipt_log VALUES (?, ?, ?)", (i, b"id%d" % i, leaf(i)))
        tree.insert_rows(c, rows)
        reference.append_leaf_hash(leaf(i))
    return current, reference


def test_appends_store_every_complete_subtree_and_keep_only_the_frontier(db: sqlite3.Connection) -> None:
    current, reference = grow(db, N)
    assert current.size == N and current.root() == reference.root()
    assert len(current.frontier) == N.bit_count()
    assert db.execute("SELECT count(*) FROM receipt_log_nodes").fetchone()[0] == tree.expected_node_rows(N)
    assert tree.StoredTree.load(db, N) == current


def test_roots_and_proofs_of_every_size_match_the_reference(db: sqlite3.Connection) -> None:
    _, reference = grow(db, N)
    for size in range(N + 1):
        root = reference.root(size)
        assert tree.root_at(db, size) == root
        for index in range(size):
            path = tree.inclusion_proof(db, index, size)
            assert path == reference.inclusion_proof(index, size)
            verify_inclusion(leaf(index), index, size, path, root)
        for old in range(size + 1):
            proof = tree.consistency_proof(db, old, size)
            assert proof == reference.consistency_proof(old, size)
            verify_consistency(old, size, reference.root(old), root, proof)


def test_a_scan_recomputes_the_tree_and_can_rewrite_the_subtree_rows(db: sqlite3.Connection) -> None:
    current, reference = grow(db, N)
    db.execute("DELETE FROM receipt_log_nodes WHERE level = 1")
    again, root_at_40 = tree.scan(db, 40, rewrite=False)
    assert again == current and root_at_40 == reference.root(40)
    with pytest.raises(tree.TreeStateError):
        tree.inclusion_proof(db, 3, N)
    rebuilt, _ = tree.scan(db, N, rewrite=True)
    assert rebuilt == current
    assert tree.inclusion_proof(db, 3, N) == reference.inclusion_proof(3, N)
    assert db.execute("SELECT count(*) FROM receipt_log_nodes").fetchone()[0] == tree.expected_node_rows(N)


def test_a_scan_refuses_a_gap_or_a_malformed_leaf(db: sqlite3.Connection) -> None:
    grow(db, 5)
    db.execute("UPDATE receipt_log SET leaf_hash = x'00' WHERE idx = 2")
    with pytest.raises(tree.TreeStateError, match="bad leaf at 2"):
        tree.scan(db, 0, rewrite=False)
    db.execute("DELETE FROM receipt_log WHERE idx = 1")
    with pytest.raises(tree.TreeStateError, match="gap or a bad leaf at 1"):
        tree.scan(db, 0, rewrite=False)
