"""The executor's receipt log: an append-only RFC 9162 Merkle log of its acknowledged receipts.

An entry is the complete receipt envelope, byte for byte (docs/protocol.md section 9); the log keeps
only leaf hashes. Durable state lives in the node's SQLite store, in two tables this module creates
on first use (CREATE TABLE IF NOT EXISTS, inside one `Store.transaction()`):

    receipt_log        idx (0, 1, 2, ...), receipt_id (message id, unique), leaf_hash
    receipt_log_heads  size (primary key), the signed `treehead` envelope of that size

`append` commits the new row (synchronous=FULL: it is on disk when the call returns) before the
in-memory tree grows, so an ack answered after `append` never names a receipt a crash can lose, and
a failed write leaves memory and disk as they were. At start the tree is rebuilt from the stored
leaf hashes (O(n)) and checked against the newest stored head. Appending the same receipt again
returns its existing index. One lock serialises appends and head signing; the methods are
synchronous (the node calls them through trio.to_thread).
"""

from __future__ import annotations

import sqlite3
import threading
from dataclasses import dataclass

import nacl.signing
from e31.protocol.envelope import node_id_of, sign_message, verify
from e31.protocol.errors import ProtocolError
from e31.protocol.ids import Digest
from e31.protocol.merkle import MerkleLog, leaf_hash
from e31.protocol.messages import InclusionProof, TreeHead, UsageReceipt

from .store import Store

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS receipt_log ("
    " idx INTEGER PRIMARY KEY, receipt_id BLOB NOT NULL UNIQUE, leaf_hash BLOB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS receipt_log_heads (size INTEGER PRIMARY KEY, raw BLOB NOT NULL)",
)


class ReceiptLogError(Exception):
    """A receipt the log refuses, a receipt it does not hold, or stored log state that does not add up."""


@dataclass(frozen=True, slots=True)
class SignedHead:
    """A signed tree head: its exact envelope bytes and the decoded message."""

    raw: bytes
    head: TreeHead


class ReceiptLog:
    """One executor's receipt log, persisted in its store and signed with its key."""

    def __init__(self, store: Store, signing_key: nacl.signing.SigningKey, network: str) -> None:
        self._store = store
        self._key = signing_key
        self._node = node_id_of(signing_key)
        self._network = network
        self._lock = threading.Lock()
        with store.transaction() as c:
            for statement in _SCHEMA:
                c.execute(statement)
            rows = c.execute("SELECT idx, receipt_id, leaf_hash FROM receipt_log ORDER BY idx").fetchall()
        self._index: dict[bytes, int] = {}
        leaves: list[bytes] = []
        for expected, (idx, receipt_id, leaf) in enumerate(rows):
            if idx != expected or len(leaf) != 32:
                raise ReceiptLogError(f"{store.path}: the receipt log has a gap or a bad leaf at {expected}")
            self._index[bytes(receipt_id)] = idx
            leaves.append(bytes(leaf))
        self._tree = MerkleLog(leaves)
        self._latest = self._load_latest_head()

    @property
    def size(self) -> int:
        return self._tree.size

    @property
    def node(self) -> str:
        return str(self._node)

    def index_of(self, receipt_id: bytes) -> int | None:
        return self._index.get(bytes(receipt_id))

    def root(self, size: int | None = None) -> bytes:
        return self._tree.root(size)

    def append(self, receipt_envelope: bytes) -> int:
        """Append one of this node's receipts (its exact envelope bytes); return its leaf index.

        Idempotent: the same receipt returns the index it already has. Durable when it returns.
        """
        try:
            env = verify(receipt_envelope, UsageReceipt)
        except ProtocolError as e:
            raise ReceiptLogError(f"not a valid receipt envelope: {type(e).__name__}: {e}") from None
        if env.signer != self._node:
            raise ReceiptLogError(f"the receipt was signed by {env.signer}, not by this node ({self._node})")
        if env.message.network != self._network:
            raise ReceiptLogError(f"the receipt is for network {env.message.network!r}, "
                                  f"not {self._network!r}")
        receipt_id = env.message_id.raw
        leaf = leaf_hash(env.raw)
        with self._lock:
            known = self._index.get(receipt_id)
            if known is not None:
                return known
            idx = self._tree.size
            with self._store.transaction() as c:
                c.execute("INSERT INTO receipt_log (idx, receipt_id, leaf_hash) VALUES (?, ?, ?)",
                          (idx, receipt_id, leaf))
                _mark_receipt(c, receipt_id, idx)
            self._tree.append_leaf_hash(leaf)
            self._index[receipt_id] = idx
            return idx

    def signed_tree_head(self, now: int) -> bytes:
        """The signed head of the log as it is now (`now` in ms since the epoch, signed into a new head).

        A head of the current size is signed once and reused, so repeated calls do not mint new heads.
        """
        with self._lock:
            return self._head_locked(now).raw

    def heads(self) -> list[bytes]:
        """Every signed head, oldest first."""
        with self._store.transaction() as c:
            rows = c.execute("SELECT raw FROM receipt_log_heads ORDER BY size").fetchall()
        return [bytes(r[0]) for r in rows]

    def inclusion(self, receipt_id: bytes, now: int) -> bytes:
        """A signed `proof` message placing the receipt in the log, against the latest signed head
        (signing a new head first if the log grew since)."""
        with self._lock:
            idx = self._index.get(bytes(receipt_id))
            if idx is None:
                raise ReceiptLogError(f"receipt {bytes(receipt_id).hex()} is not in this node's log")
            head = self._head_locked(now)
            size = head.head.size
            path = tuple(Digest(h) for h in self._tree.inclusion_proof(idx, size))
            proof = InclusionProof(self._network, self._node, Digest(bytes(receipt_id)), idx, size, path,
                                   head.raw)
            return sign_message(proof, self._key)

    def consistency(self, old_size: int, new_size: int | None = None) -> tuple[bytes, ...]:
        """The RFC 9162 consistency proof from `old_size` to `new_size` (default: the current size)."""
        with self._lock:
            if new_size is not None and not 0 <= new_size <= self._tree.size:
                raise ReceiptLogError(f"size {new_size} is not in 0..{self._tree.size}")
            if not 0 <= old_size <= (self._tree.size if new_size is None else new_size):
                raise ReceiptLogError(f"old size {old_size} is larger than the new size")
            return self._tree.consistency_proof(old_size, new_size)

    def _head_locked(self, now: int) -> SignedHead:
        size = self._tree.size
        if self._latest is not None and self._latest.head.size == size:
            return self._latest
        if self._latest is not None and now < self._latest.head.timestamp:
            now = self._latest.head.timestamp  # heads never go back in time, even if the clock does
        head = TreeHead(self._network, self._node, size, Digest(self._tree.root()), now)
        raw = sign_message(head, self._key)
        with self._store.transaction() as c:
            c.execute("INSERT INTO receipt_log_heads (size, raw) VALUES (?, ?) "
                      "ON CONFLICT (size) DO NOTHING", (size, raw))
            stored = c.execute("SELECT raw FROM receipt_log_heads WHERE size = ?", (size,)).fetchone()
        self._latest = SignedHead(bytes(stored[0]), verify(bytes(stored[0]), TreeHead).message)
        return self._latest

    def _load_latest_head(self) -> SignedHead | None:
        with self._store.transaction() as c:
            row = c.execute("SELECT size, raw FROM receipt_log_heads ORDER BY size DESC LIMIT 1").fetchone()
        if row is None:
            return None
        try:
            head = verify(bytes(row[1]), TreeHead).message
        except ProtocolError as e:
            raise ReceiptLogError(f"{self._store.path}: a stored tree head is invalid: {e}") from None
        if head.executor != self._node:
            raise ReceiptLogError(f"{self._store.path}: the stored tree heads belong to {head.executor}, "
                                  f"not to this node ({self._node}); was the key file replaced?")
        if head.size > self._tree.size or head.root.raw != self._tree.root(head.size):
            raise ReceiptLogError(f"{self._store.path}: the stored log does not match its signed head of "
                                  f"size {head.size}")
        return SignedHead(bytes(row[1]), head)


def _mark_receipt(c: sqlite3.Connection, receipt_id: bytes, idx: int) -> None:
    """Record the log position on the store's receipt row, when the node indexed the receipt there."""
    c.execute("UPDATE receipts SET log_index = ? WHERE message_id = ? OR digest = ?",
              (idx, receipt_id, receipt_id))

