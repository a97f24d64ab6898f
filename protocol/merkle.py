"""The receipt log: an RFC 9162 (Certificate Transparency v2) Merkle tree, and its pure verifiers.

Hashing (RFC 9162 §2.1.1): leaf = SHA-256(0x00 || entry), node = SHA-256(0x01 || left || right), the
empty tree hashes to SHA-256(b""), and a tree of n > 1 leaves splits at k, the largest power of two
smaller than n.

How MerkleLog stays cheap: it keeps every complete, aligned subtree hash, level by level
(`_levels[h][i]` is the hash of leaves [i*2^h, (i+1)*2^h)), about 2n hashes in all. Appending a leaf
completes at most one subtree per level (amortised O(1) hashing). Every range the RFC recursion visits
starts at a multiple of its own split point, so it is a run of complete subtrees down its left side plus
one ragged right edge: its hash costs O(log n) given the stored levels. A root of any past size, an
inclusion proof and a consistency proof each touch at most one ragged range, so each is O(log n).

The verifiers follow RFC 9162 §2.1.3.2 (inclusion) and §2.1.4.2 (consistency) step for step. They
return None or raise BadProof: there is no boolean to forget to check.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence

from .errors import BadProof, LocalProtocolError

HASH_SIZE = 32
MAX_TREE_SIZE = (1 << 64) - 1
"""Tree sizes and indexes are uint64, as in RFC 9162."""

EMPTY_ROOT = hashlib.sha256(b"").digest()

_LEAF = b"\x00"
_NODE = b"\x01"


def leaf_hash(entry: bytes) -> bytes:
    """SHA-256(0x00 || entry)."""
    return hashlib.sha256(_LEAF + entry).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """SHA-256(0x01 || left || right)."""
    return hashlib.sha256(_NODE + left + right).digest()


def _split(n: int) -> int:
    """The largest power of two strictly smaller than n (n >= 2)."""
    return 1 << ((n - 1).bit_length() - 1)


Subtree = Callable[[int, int], bytes]
"""`subtree(h, i)`: the stored hash of the complete subtree of leaves [i*2^h, (i+1)*2^h). A log keeps
these (in memory here, in SQLite in node/receipt_tree.py); the algorithms below only read them."""


def range_hash(subtree: Subtree, lo: int, hi: int) -> bytes:
    """MTH(D[lo:hi]) for a range the RFC recursion visits (lo is a multiple of its split): the complete
    subtrees down its left side, then its ragged right edge."""
    rights: list[bytes] = []
    while True:
        n = hi - lo
        if n & (n - 1) == 0:
            height = n.bit_length() - 1
            acc = subtree(height, lo >> height)
            break
        k = _split(n)
        height = k.bit_length() - 1
        rights.append(subtree(height, lo >> height))
        lo += k
    for left in reversed(rights):
        acc = node_hash(left, acc)
    return acc


def inclusion_path(subtree: Subtree, index: int, size: int) -> tuple[bytes, ...]:
    """PATH(index, D[0:size]) of RFC 9162 §2.1.3.1, leaf side first (0 <= index < size, unchecked)."""
    path: list[bytes] = []
    lo, hi = 0, size
    while hi - lo > 1:
        k = _split(hi - lo)
        if index < lo + k:
            path.append(range_hash(subtree, lo + k, hi))
            hi = lo + k
        else:
            path.append(range_hash(subtree, lo, lo + k))
            lo += k
    path.reverse()
    return tuple(path)


def consistency_path(subtree: Subtree, old_size: int, new_size: int) -> tuple[bytes, ...]:
    """PROOF(old_size, D[0:new_size]) of RFC 9162 §2.1.4.1 (0 <= old_size <= new_size, unchecked;
    empty when old_size is 0 or equal)."""
    if old_size in (0, new_size):
        return ()
    proof: list[bytes] = []
    lo, hi, m, whole = 0, new_size, old_size, True
    while True:
        n = hi - lo
        if m == n:
            if not whole:
                proof.append(range_hash(subtree, lo, hi))
            break
        k = _split(n)
        if m <= k:
            proof.append(range_hash(subtree, lo + k, hi))
            hi = lo + k
        else:
            proof.append(range_hash(subtree, lo, lo + k))
            lo, m, whole = lo + k, m - k, False
    proof.reverse()
    return tuple(proof)


class MerkleLog:
    """An append-only, in-memory Merkle log over leaf hashes.

    `MerkleLog(stored_leaf_hashes)` rebuilds a log from leaf hashes kept elsewhere (in O(n)).
    """

    def __init__(self, leaf_hashes: Iterable[bytes] = ()) -> None:
        self._levels: list[list[bytes]] = [[]]
        for leaf in leaf_hashes:
            self.append_leaf_hash(leaf)

    def __len__(self) -> int:
        return len(self._levels[0])

    @property
    def size(self) -> int:
        return len(self._levels[0])

    def append(self, entry: bytes) -> int:
        """Append an entry; return its leaf index."""
        return self.append_leaf_hash(leaf_hash(entry))

    def append_leaf_hash(self, leaf: bytes) -> int:
        """Append a leaf already hashed with `leaf_hash`; return its index."""
        if not isinstance(leaf, bytes) or len(leaf) != HASH_SIZE:
            raise LocalProtocolError("a leaf hash is 32 bytes")
        index = len(self._levels[0])
        if index >= MAX_TREE_SIZE:
            raise LocalProtocolError("the log is full")
        self._levels[0].append(leaf)
        height, i = 0, index
        while i & 1:
            row = self._levels[height]
            if height + 1 == len(self._levels):
                self._levels.append([])
            self._levels[height + 1].append(node_hash(row[i - 1], row[i]))
            height, i = height + 1, i >> 1
        return index

    def leaf_hash_at(self, index: int) -> bytes:
        self._check_index(index, self.size)
        return self._levels[0][index]

    def root(self, size: int | None = None) -> bytes:
        """The tree hash of the first `size` leaves (default: all of them)."""
        size = self._check_size(size)
        return range_hash(self._subtree, 0, size) if size else EMPTY_ROOT

    def inclusion_proof(self, index: int, size: int | None = None) -> tuple[bytes, ...]:
        """PATH(index, D[0:size]) of RFC 9162 §2.1.3.1, leaf side first."""
        size = self._check_size(size)
        self._check_index(index, size)
        return inclusion_path(self._subtree, index, size)

    def consistency_proof(self, old_size: int, new_size: int | None = None) -> tuple[bytes, ...]:
        """PROOF(old_size, D[0:new_size]) of RFC 9162 §2.1.4.1 (empty when old_size is 0 or equal)."""
        new_size = self._check_size(new_size)
        if not _is_size(old_size) or old_size > new_size:
            raise LocalProtocolError(f"old size {old_size!r} is not in 0..{new_size}")
        return consistency_path(self._subtree, old_size, new_size)

    def _subtree(self, height: int, index: int) -> bytes:
        return self._levels[height][index]

    def _check_size(self, size: int | None) -> int:
        if size is None:
            return self.size
        if not _is_size(size) or size > self.size:
            raise LocalProtocolError(f"tree size {size!r} is not in 0..{self.size}")
        return size

    @staticmethod
    def _check_index(index: int, size: int) -> None:
        if not _is_size(index) or index >= size:
            raise LocalProtocolError(f"leaf index {index!r} is not below the tree size {size}")


def _is_size(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= MAX_TREE_SIZE


def _check_hash(x: object, what: str) -> bytes:
    if not isinstance(x, bytes) or len(x) != HASH_SIZE:
        raise BadProof(f"{what} is not a 32-byte hash")
    return x


def _check_proof(proof: object) -> list[bytes]:
    if not isinstance(proof, (list, tuple)):
        raise BadProof("a proof is a sequence of 32-byte hashes")
    if len(proof) > 64:
        raise BadProof(f"a proof of {len(proof)} hashes is longer than any uint64 tree allows")
    return [_check_hash(p, "a proof element") for p in proof]


def verify_inclusion(leaf: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes) -> None:
    """Check that `leaf` (a leaf hash) is leaf `index` of the tree of `size` leaves with hash `root`.

    RFC 9162 §2.1.3.2. Returns None, or raises BadProof.
    """
    leaf = _check_hash(leaf, "the leaf hash")
    root = _check_hash(root, "the root")
    path = _check_proof(proof)
    if not _is_size(size) or not _is_size(index):
        raise BadProof("index and size must be integers in the uint64 range")
    if index >= size:
        raise BadProof(f"leaf index {index} is not below the tree size {size}")
    fn, sn = index, size - 1
    r = leaf
    for p in path:
        if sn == 0:
            raise BadProof("the inclusion proof is longer than the tree is deep")
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise BadProof("the inclusion proof is shorter than the tree is deep")
    if r != root:
        raise BadProof("the inclusion proof does not lead to the root")


def verify_entry_inclusion(entry: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes) -> None:
    """`verify_inclusion` for an entry rather than its leaf hash."""
    if not isinstance(entry, bytes):
        raise BadProof("an entry is bytes")
    verify_inclusion(leaf_hash(entry), index, size, proof, root)


def verify_consistency(
    old_size: int, new_size: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]
) -> None:
    """Check that the tree (`new_size`, `new_root`) extends the tree (`old_size`, `old_root`).

    RFC 9162 §2.1.4.2 for 0 < old_size < new_size. The edge cases the RFC leaves to the caller: equal
    sizes need an empty proof and equal roots; old size 0 needs an empty proof and the empty-tree root.
    Returns None, or raises BadProof.
    """
    old_root = _check_hash(old_root, "the old root")
    new_root = _check_hash(new_root, "the new root")
    path = _check_proof(proof)
    if not _is_size(old_size) or not _is_size(new_size):
        raise BadProof("tree sizes must be integers in the uint64 range")
    if old_size > new_size:
        raise BadProof(f"old size {old_size} is larger than new size {new_size}")
    if old_size == new_size or old_size == 0:
        if path:
            raise BadProof("this consistency proof must be empty")
        if old_size == 0 and old_root != EMPTY_ROOT:
            raise BadProof("the old root is not the empty-tree hash")
        if old_size == new_size and old_root != new_root:
            raise BadProof("trees of equal size have different roots")
        return
    if not path:
        raise BadProof("the consistency proof is empty")
    if old_size & (old_size - 1) == 0:
        path.insert(0, old_root)
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            raise BadProof("the consistency proof is too long")
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    if sn != 0:
        raise BadProof("the consistency proof is too short")
    if fr != old_root:
        raise BadProof("the consistency proof does not lead to the old root")
    if sr != new_root:
        raise BadProof("the consistency proof does not lead to the new root")
