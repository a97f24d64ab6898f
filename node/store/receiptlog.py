"""The executor's receipt log: an append-only RFC 9162 Merkle log of its acknowledged receipts.

An entry is the complete receipt envelope, byte for byte (docs/protocol.md section 9); the log keeps
only leaf hashes. Durable state lives in the node's SQLite store, in these tables (made by migration
_V8, store/schema.py):

    receipt_log        idx (0, 1, 2, ...), receipt_id (message id, unique), leaf_hash
    receipt_log_nodes  every complete subtree hash above the leaves (store/receipt_tree.py)
    receipt_log_heads  size (primary key), the signed `treehead` envelope of that size

Memory holds no per-receipt state, so a node's memory stays flat however long its log grows: the size,
the O(log n) right-edge subtree hashes and the latest signed head. Lookups by receipt id and proofs read
the store. `append` commits the leaf and the subtree hashes it completes (synchronous=FULL: on disk
when the call returns) before the in-memory tree moves on, so an ack answered after `append` never
names a receipt a crash can lose, and a failed write leaves memory and disk as they were. At start
the tree is recomputed from the stored leaves (O(n) time, O(log n) memory) and checked against the
newest stored head; the stored subtree rows are checked by count and along the right edge, and
rewritten from the leaves when they are missing (a store from before they existed) or do not add up.
Every head is recorded in the store's watermark (store/watermark.py) before it is handed out, and none
is signed at or below the watermark's floor: after an accepted loss of the database (`e31 node recover`)
the log is filled with placeholder leaves up to the largest size signed before it, so it never signs a
second root at a size it signed once. Appending the same receipt again returns its existing index. One
lock serialises appends and head signing; the methods are synchronous (the node calls them through
trio.to_thread).
"""

from __future__ import annotations

import hashlib
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import nacl.signing
from e31.protocol.envelope import VerifiedEnvelope, node_id_of, sign_message, verify
from e31.protocol.errors import ProtocolError
from e31.protocol.ids import Digest
from e31.protocol.merkle import leaf_hash
from e31.protocol.messages import MAX_PROOF_ENTRIES, InclusionProof, ProofEntry, TreeHead, UsageReceipt

from ..errors import StoreError
from . import receipt_tree as tree
from .db import Store


class ReceiptLogError(StoreError):
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
            self._tree, self._latest = self._open(c)

    @property
    def size(self) -> int:
        return self._tree.size

    @property
    def node(self) -> str:
        return str(self._node)

    def index_of(self, receipt_id: bytes) -> int | None:
        with self._reading() as c:
            return _indexes_of(c, [bytes(receipt_id)]).get(bytes(receipt_id))

    def root(self, size: int | None = None) -> bytes:
        """The tree hash of the first `size` receipts (default: all of them)."""
        with self._lock:
            current = self._tree
            if size is None or size == current.size:
                return current.root()
            if not _is_size(size) or size > current.size:
                raise ReceiptLogError(f"size {size!r} is not in 0..{current.size}")
            with self._reading() as c:
                return tree.root_at(c, size)

    def append(self, receipt_envelope: bytes | VerifiedEnvelope[UsageReceipt]) -> int:
        """Append one of this node's receipts (its exact envelope bytes, or the envelope as verified or
        signed here); return its leaf index.

        Idempotent: the same receipt returns the index it already has. Durable when it returns.
        """
        return self.append_many([receipt_envelope])[0]

    def append_many(self, receipt_envelopes: Sequence[bytes | VerifiedEnvelope[UsageReceipt]]) -> list[int]:
        """Append several receipts in one transaction (one fsync), in order; their leaf indexes. Each
        is checked first, so one bad receipt appends none."""
        envs = [self._own_receipt(r) for r in receipt_envelopes]
        with self._lock:
            grown = self._tree
            out: list[int] = []
            with self._store.transaction() as c:
                fresh = _indexes_of(c, sorted({env.message_id.raw for env in envs}))
                for env in envs:
                    receipt_id = env.message_id.raw
                    known = fresh.get(receipt_id)
                    if known is not None:
                        _mark_receipt(c, receipt_id, known)  # heals a row whose index was not set
                        out.append(known)
                        continue
                    idx = grown.size
                    leaf = leaf_hash(env.raw)
                    grown, rows = grown.extended(leaf)
                    c.execute(
                        "INSERT INTO receipt_log (idx, receipt_id, leaf_hash) VALUES (?, ?, ?)",
                        (idx, receipt_id, leaf),
                    )
                    tree.insert_rows(c, rows)
                    _mark_receipt(c, receipt_id, idx)
                    fresh[receipt_id] = idx
                    out.append(idx)
            self._tree = grown
            return out

    def _own_receipt(
        self, receipt_envelope: bytes | VerifiedEnvelope[UsageReceipt]
    ) -> VerifiedEnvelope[UsageReceipt]:
        if isinstance(receipt_envelope, VerifiedEnvelope):
            env = receipt_envelope
            if not isinstance(env.message, UsageReceipt):
                raise ReceiptLogError(f"a {env.kind} is not a receipt")
        else:
            try:
                env = verify(receipt_envelope, UsageReceipt)
            except ProtocolError as e:
                raise ReceiptLogError(f"not a valid receipt envelope: {type(e).__name__}: {e}") from None
        if env.signer != self._node:
            raise ReceiptLogError(f"the receipt was signed by {env.signer}, not by this node ({self._node})")
        if env.message.network != self._network:
            raise ReceiptLogError(
                f"the receipt is for network {env.message.network!r}, not {self._network!r}"
            )
        return env

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
        proofs = self.inclusions([receipt_id], now)
        if not proofs:
            raise ReceiptLogError(f"receipt {bytes(receipt_id).hex()} is not in this node's log")
        return proofs[0]

    def inclusions(self, receipt_ids: Iterable[bytes], now: int) -> list[bytes]:
        """Signed `proof` messages placing the receipts of `receipt_ids` that are in the log, against one
        head (signed at most once): one proof per MAX_PROOF_ENTRIES receipts, none for those not in it."""
        wanted = sorted({bytes(r) for r in receipt_ids})
        with self._lock:
            with self._reading() as c:
                indexes = _indexes_of(c, wanted)
            found = [(r, indexes[r]) for r in wanted if r in indexes]
            if not found:
                return []
            head = self._head_locked(now)
            size = head.head.size
            with self._reading() as c:
                paths = tree.inclusion_proofs(c, [idx for _, idx in found], size)
            entries = [
                ProofEntry(Digest(r), idx, tuple(map(Digest, path)))
                for (r, idx), path in zip(found, paths, strict=True)
            ]
            return [
                sign_message(
                    InclusionProof(
                        self._network, self._node, size, head.raw, tuple(entries[i : i + MAX_PROOF_ENTRIES])
                    ),
                    self._key,
                )
                for i in range(0, len(entries), MAX_PROOF_ENTRIES)
            ]

    def consistency(self, old_size: int, new_size: int | None = None) -> tuple[bytes, ...]:
        """The RFC 9162 consistency proof from `old_size` to `new_size` (default: the current size)."""
        with self._lock:
            if new_size is not None and (not _is_size(new_size) or not 0 <= new_size <= self._tree.size):
                raise ReceiptLogError(f"size {new_size} is not in 0..{self._tree.size}")
            new = self._tree.size if new_size is None else new_size
            if not _is_size(old_size) or not 0 <= old_size <= new:
                raise ReceiptLogError(f"old size {old_size} is larger than the new size")
            with self._reading() as c:
                return tree.consistency_proof(c, old_size, new)

    def _head_locked(self, now: int) -> SignedHead:
        size = self._tree.size
        if self._latest is not None and self._latest.head.size == size:
            return self._latest
        if self._latest is not None and now < self._latest.head.timestamp:
            now = self._latest.head.timestamp  # heads never go back in time, even if the clock does
        floor = self._floor()
        if floor and size <= floor:
            raise ReceiptLogError(
                f"{self._store.path}: no tree head is signed at size {size}: this node signed heads up to "
                f"size {floor} before a loss it accepted (`e31 node recover`); the next receipt lifts this"
            )
        head = TreeHead(self._network, self._node, size, Digest(self._tree.root()), now)
        raw = sign_message(head, self._key)
        with self._store.transaction() as c:
            c.execute(
                "INSERT INTO receipt_log_heads (size, raw) VALUES (?, ?) ON CONFLICT (size) DO NOTHING",
                (size, raw),
            )
            stored = c.execute("SELECT raw FROM receipt_log_heads WHERE size = ?", (size,)).fetchone()
        signed = SignedHead(bytes(stored[0]), verify(bytes(stored[0]), TreeHead).message)
        # in the watermark before anyone sees it, so a database that later loses it is refused at start
        self._store.promise_head(size, signed.head.root.raw, signed.raw)
        self._latest = signed
        return signed

    def _floor(self) -> int:
        keeper = self._store.watermark
        return 0 if keeper is None else keeper.mark.floor

    @contextmanager
    def _reading(self) -> Iterator[sqlite3.Connection]:
        """The store's connection for reads (its lock held, no transaction: appends, the only writes to
        the log's tables, take this log's lock too, and a stored subtree never changes), in which a
        stored hash found missing is a ReceiptLogError."""
        try:
            with self._store.reading() as c:
                yield c
        except tree.TreeStateError as e:
            raise ReceiptLogError(f"{self._store.path}: {e}") from None

    def _open(self, c: sqlite3.Connection) -> tuple[tree.StoredTree, SignedHead | None]:
        """The stored tree, recomputed from its leaves and checked, and the newest signed head."""
        latest = self._load_latest_head(c)
        head_size = 0 if latest is None else latest.head.size
        size = c.execute("SELECT count(*) FROM receipt_log").fetchone()[0]
        nodes = c.execute("SELECT count(*) FROM receipt_log_nodes").fetchone()[0]
        try:
            rewrite = nodes != tree.expected_node_rows(size)
            current, head_root = tree.scan(c, head_size, rewrite)
            if not rewrite and _stored_frontier(c, current.size) != current:
                current, head_root = tree.scan(c, head_size, rewrite=True)
        except tree.TreeStateError as e:
            raise ReceiptLogError(f"{self._store.path}: {e}") from None
        if latest is not None and (head_size > current.size or latest.head.root.raw != head_root):
            raise ReceiptLogError(
                f"{self._store.path}: the stored log does not match its signed head of size {head_size}"
            )
        floor = self._floor()
        if current.size < floor:
            current = _fill_to(c, current, floor)
        return current, latest

    def _load_latest_head(self, c: sqlite3.Connection) -> SignedHead | None:
        row = c.execute("SELECT size, raw FROM receipt_log_heads ORDER BY size DESC LIMIT 1").fetchone()
        if row is None:
            return None
        try:
            head = verify(bytes(row[1]), TreeHead).message
        except ProtocolError as e:
            raise ReceiptLogError(f"{self._store.path}: a stored tree head is invalid: {e}") from None
        if head.executor != self._node:
            raise ReceiptLogError(
                f"{self._store.path}: the stored tree heads belong to {head.executor}, "
                f"not to this node ({self._node}); was the key file replaced?"
            )
        return SignedHead(bytes(row[1]), head)


LOST_ENTRY = b"e31 receipt log: entry lost before an accepted loss, index "
"""The prefix of the leaves `_fill_to` writes in place of entries a lost database took with it."""


def _fill_to(c: sqlite3.Connection, current: tree.StoredTree, size: int) -> tree.StoredTree:
    """Extend the log to `size` with placeholder leaves (LOST_ENTRY + the index as decimal ASCII), so
    the next receipt lands above every size signed before an accepted loss, and the log signs again
    with it. A placeholder names no receipt: no proof is ever asked for one."""
    rows: list[tree.NodeRow] = []
    while current.size < size:
        entry = LOST_ENTRY + str(current.size).encode()
        leaf = leaf_hash(entry)
        c.execute(
            "INSERT INTO receipt_log (idx, receipt_id, leaf_hash) VALUES (?, ?, ?)",
            (current.size, hashlib.sha256(entry).digest(), leaf),
        )
        current, new_rows = current.extended(leaf)
        rows += new_rows
    tree.insert_rows(c, rows)
    return current


def _stored_frontier(c: sqlite3.Connection, size: int) -> tree.StoredTree | None:
    try:
        return tree.StoredTree.load(c, size)
    except tree.TreeStateError:
        return None


def _indexes_of(c: sqlite3.Connection, receipt_ids: Sequence[bytes]) -> dict[bytes, int]:
    """The log index of each of `receipt_ids` the log holds (one query per _IDS_PER_QUERY of them)."""
    out: dict[bytes, int] = {}
    for i in range(0, len(receipt_ids), _IDS_PER_QUERY):
        part = receipt_ids[i : i + _IDS_PER_QUERY]
        marks = ", ".join("?" * len(part))
        rows = c.execute(f"SELECT receipt_id, idx FROM receipt_log WHERE receipt_id IN ({marks})", part)
        out.update((bytes(r), int(idx)) for r, idx in rows)
    return out


_IDS_PER_QUERY = 500
"""Receipt ids looked up in one query (under SQLite's oldest limit of 999 parameters)."""


def _is_size(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _mark_receipt(c: sqlite3.Connection, receipt_id: bytes, idx: int) -> None:
    """Record the log position on the store's receipt row, when the node indexed the receipt there."""
    c.execute(
        "UPDATE receipts SET log_index = ? WHERE message_id = ? OR digest = ?", (idx, receipt_id, receipt_id)
    )
