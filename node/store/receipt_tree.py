"""The receipt log's RFC 9162 Merkle tree with its hashes in SQLite and O(log n) of them in memory.

Every complete, aligned subtree hash is a row: level 0 is the leaf hash in `receipt_log` (idx, leaf_hash),
levels 1 and up live in `receipt_log_nodes` (level, idx, hash), the subtree over leaves
[idx * 2^level, (idx + 1) * 2^level). A tree of n leaves has n - popcount(n) such rows above the
leaves. Memory holds only the size and the right-edge frontier: one complete subtree per set bit of n,
which is all an append needs (it completes at most one subtree per level) and all the current root
needs. Roots of past sizes and proofs read the few rows the RFC recursion visits: every range it visits
is a run of complete subtrees plus one ragged right edge (protocol/merkle.py explains why), so each
costs O(log n) point reads.

`StoredTree` is an immutable value: `extended(leaf)` returns the next tree and the rows to insert, so a
caller writes the rows in its transaction and adopts the new value only once the commit succeeded.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, partial

from e31.protocol import merkle
from e31.protocol.merkle import EMPTY_ROOT, HASH_SIZE, node_hash

from ..errors import StoreError

NodeRow = tuple[int, int, bytes]
"""(level >= 1, index within the level, hash): one row of receipt_log_nodes."""


class TreeStateError(StoreError):
    """The stored tree is missing a hash or has a malformed one."""


def _frontier_positions(size: int) -> list[tuple[int, int]]:
    """(level, index) of the complete subtrees that make up [0, size), largest first."""
    return [(h, (size >> h) - 1) for h in range(size.bit_length() - 1, -1, -1) if size >> h & 1]


@dataclass(frozen=True, slots=True)
class StoredTree:
    size: int
    frontier: tuple[bytes, ...]
    """The hashes at `_frontier_positions(size)`, largest subtree first."""

    @classmethod
    def empty(cls) -> StoredTree:
        return cls(0, ())

    @classmethod
    def load(cls, c: sqlite3.Connection, size: int) -> StoredTree:
        """The tree of `size` leaves from its stored frontier rows (TreeStateError if one is missing)."""
        return cls(size, tuple(_node(c, h, i) for h, i in _frontier_positions(size)))

    def extended(self, leaf: bytes) -> tuple[StoredTree, list[NodeRow]]:
        """The tree with `leaf` appended, and the subtree rows the append completes (to insert)."""
        levels = [h for h, _ in _frontier_positions(self.size)]
        carry, height, rows = leaf, 0, []
        stack = list(zip(levels, self.frontier, strict=True))
        while stack and stack[-1][0] == height:
            _, left = stack.pop()
            carry = node_hash(left, carry)
            height += 1
            rows.append((height, ((self.size + 1) >> height) - 1, carry))
        return StoredTree(self.size + 1, (*(h for _, h in stack), carry)), rows

    def root(self) -> bytes:
        if not self.frontier:
            return EMPTY_ROOT
        acc = self.frontier[-1]
        for left in reversed(self.frontier[:-1]):
            acc = node_hash(left, acc)
        return acc


def expected_node_rows(size: int) -> int:
    return size - size.bit_count()


def scan(c: sqlite3.Connection, check_size: int, rewrite: bool) -> tuple[StoredTree, bytes]:
    """Recompute the tree from the stored leaves, in order and in O(log n) memory; returns it and its
    root at `check_size` (<= its size). With `rewrite`, the node rows are replaced by the recomputed
    ones. TreeStateError if the leaves have a gap or a malformed hash."""
    if rewrite:
        c.execute("DELETE FROM receipt_log_nodes")
    tree, batch = StoredTree.empty(), []
    checked = EMPTY_ROOT
    for expected, (idx, leaf) in enumerate(c.execute("SELECT idx, leaf_hash FROM receipt_log ORDER BY idx")):
        if idx != expected or len(leaf) != HASH_SIZE:
            raise TreeStateError(f"the receipt log has a gap or a bad leaf at {expected}")
        tree, rows = tree.extended(bytes(leaf))
        if tree.size == check_size:
            checked = tree.root()
        if rewrite:
            batch += rows
            if len(batch) >= _BATCH:
                insert_rows(c, batch)
                batch = []
    if rewrite:
        insert_rows(c, batch)
    return tree, checked


def insert_rows(c: sqlite3.Connection, rows: list[NodeRow]) -> None:
    c.executemany("INSERT INTO receipt_log_nodes (level, idx, hash) VALUES (?, ?, ?)", rows)


_BATCH = 4096


# --- reading past sizes and proofs ---------------------------------------------------------------


def _node(c: sqlite3.Connection, level: int, index: int) -> bytes:
    if level == 0:
        row = c.execute("SELECT leaf_hash FROM receipt_log WHERE idx = ?", (index,)).fetchone()
    else:
        row = c.execute(
            "SELECT hash FROM receipt_log_nodes WHERE level = ? AND idx = ?", (level, index)
        ).fetchone()
    if row is None or len(row[0]) != HASH_SIZE:
        raise TreeStateError(f"the stored receipt log lacks a valid hash at level {level}, index {index}")
    return bytes(row[0])


def _stored(c: sqlite3.Connection) -> merkle.Subtree:
    return partial(_node, c)


def range_hash(c: sqlite3.Connection, lo: int, hi: int) -> bytes:
    """MTH(D[lo:hi]) for a range the RFC recursion visits, from the stored subtrees."""
    return merkle.range_hash(_stored(c), lo, hi)


def root_at(c: sqlite3.Connection, size: int) -> bytes:
    """The tree hash of the first `size` stored leaves."""
    return merkle.range_hash(_stored(c), 0, size) if size else EMPTY_ROOT


def inclusion_proof(c: sqlite3.Connection, index: int, size: int) -> tuple[bytes, ...]:
    """PATH(index, D[0:size]) of RFC 9162 §2.1.3.1, leaf side first (0 <= index < size)."""
    return inclusion_proofs(c, [index], size)[0]


def inclusion_proofs(c: sqlite3.Connection, indexes: Sequence[int], size: int) -> list[tuple[bytes, ...]]:
    """`inclusion_proof` of each of `indexes` against one size, each stored hash read once: the paths
    of receipts acknowledged together (neighbours in the log) share most of their hashes, and the
    ragged right edge of the tree is the same in every one of them."""
    subtree = cache(partial(_node, c))
    return [merkle.inclusion_path(subtree, index, size) for index in indexes]


def consistency_proof(c: sqlite3.Connection, old_size: int, new_size: int) -> tuple[bytes, ...]:
    """PROOF(old_size, D[0:new_size]) of RFC 9162 §2.1.4.1 (0 <= old_size <= new_size)."""
    return merkle.consistency_path(_stored(c), old_size, new_size)
