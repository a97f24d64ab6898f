"""Blobs (modules, inputs, outputs) as lists of hashed chunks.

A blob of `size` bytes is cut into chunks of CHUNK_SIZE bytes (the last one shorter; an empty
blob has no chunks). Its chunk list is the concatenation of the chunks' SHA-256 digests, and its
id, the root, is SHA-256(b"e31/blob\\x00" || size as 8 bytes big-endian || chunk list). A peer
that knows a blob's root and size fetches the chunk list first, checks it against the root, then
checks every chunk against its listed digest as it arrives. Sizes are bounded by MAX_BLOB_SIZE,
so a chunk list (at most 512 KiB) always fits in one frame.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field

from .errors import BadBlob, LocalProtocolError
from .ids import DIGEST_SIZE, Digest
from .schema import Hash, Record, UInt, record, w

CHUNK_SIZE = 256 * 1024
MAX_BLOB_SIZE = 4 << 30
PUSH_MAX = 64 * 1024
"""A blob of one chunk of at most this many bytes may travel inside a message instead of being asked
for: a job's small outputs in its `result` (protocol/results.py)."""
MAX_CHUNKS = MAX_BLOB_SIZE // CHUNK_SIZE
BLOB_DOMAIN = b"e31/blob\x00"

_SIZE = struct.Struct(">Q")


def chunk_count(size: int) -> int:
    return -(-size // CHUNK_SIZE)


def chunk_length(size: int, index: int) -> int:
    """The exact length of chunk `index` of a blob of `size` bytes."""
    if not 0 <= index < chunk_count(size):
        raise BadBlob(f"chunk {index} does not exist in a blob of {size} bytes")
    return min(CHUNK_SIZE, size - index * CHUNK_SIZE)


@record
@dataclass(frozen=True, slots=True)
class BlobRef(Record):
    """A blob named by its root and size."""

    root: Digest = field(metadata=w(Hash()))
    size: int = field(metadata=w(UInt(MAX_BLOB_SIZE)))


@dataclass(frozen=True, slots=True)
class ChunkList:
    """The digests of a blob's chunks, in order."""

    size: int
    hashes: tuple[Digest, ...]

    def __post_init__(self) -> None:
        if not 0 <= self.size <= MAX_BLOB_SIZE:
            raise BadBlob(f"blob size {self.size} is outside 0..{MAX_BLOB_SIZE}")
        if len(self.hashes) != chunk_count(self.size):
            raise BadBlob(
                f"a blob of {self.size} bytes has {chunk_count(self.size)} chunks, not {len(self.hashes)}"
            )

    def to_bytes(self) -> bytes:
        return b"".join(h.raw for h in self.hashes)

    @property
    def root(self) -> Digest:
        return Digest(hashlib.sha256(BLOB_DOMAIN + _SIZE.pack(self.size) + self.to_bytes()).digest())

    @property
    def ref(self) -> BlobRef:
        return BlobRef(self.root, self.size)

    @classmethod
    def from_bytes(cls, ref: BlobRef, data: bytes) -> ChunkList:
        """Parse a received chunk list and check it against the blob it claims to describe."""
        if len(data) != DIGEST_SIZE * chunk_count(ref.size):
            raise BadBlob(
                f"the chunk list of a {ref.size}-byte blob is "
                f"{DIGEST_SIZE * chunk_count(ref.size)} bytes, got {len(data)}"
            )
        hashes = tuple(Digest(bytes(data[i : i + DIGEST_SIZE])) for i in range(0, len(data), DIGEST_SIZE))
        chunks = cls(ref.size, hashes)
        if chunks.root != ref.root:
            raise BadBlob(f"chunk list does not hash to the blob root {ref.root}")
        return chunks

    def verify_chunk(self, index: int, data: bytes) -> None:
        """Raise BadBlob unless `data` is exactly chunk `index` of this blob."""
        expected = chunk_length(self.size, index)
        if len(data) != expected:
            raise BadBlob(f"chunk {index} is {expected} bytes, got {len(data)}")
        if hashlib.sha256(data).digest() != self.hashes[index].raw:
            raise BadBlob(f"chunk {index} does not match its digest")


class BlobHasher:
    """Builds a ChunkList from a blob fed in pieces of any size."""

    def __init__(self) -> None:
        self._hashes: list[Digest] = []
        self._pending = bytearray()
        self._size = 0

    def update(self, data: bytes | bytearray | memoryview) -> None:
        self._size += len(data)
        if self._size > MAX_BLOB_SIZE:
            raise LocalProtocolError(f"blob larger than {MAX_BLOB_SIZE} bytes")
        self._pending += data
        while len(self._pending) >= CHUNK_SIZE:
            self._hashes.append(Digest(hashlib.sha256(self._pending[:CHUNK_SIZE]).digest()))
            del self._pending[:CHUNK_SIZE]

    def finish(self) -> ChunkList:
        hashes = list(self._hashes)
        if self._pending:
            hashes.append(Digest(hashlib.sha256(self._pending).digest()))
        return ChunkList(self._size, tuple(hashes))


def chunk_list(data: bytes) -> ChunkList:
    hasher = BlobHasher()
    hasher.update(data)
    return hasher.finish()


def blob_ref(data: bytes) -> BlobRef:
    return chunk_list(data).ref


def split(data: bytes) -> Iterator[bytes]:
    """The chunks of `data`, in order."""
    view = memoryview(data)
    for i in range(0, len(data), CHUNK_SIZE):
        yield bytes(view[i : i + CHUNK_SIZE])
