from __future__ import annotations

import hashlib
import struct

import pytest
from e31.protocol.blobs import (
    BLOB_DOMAIN,
    CHUNK_SIZE,
    MAX_BLOB_SIZE,
    BlobHasher,
    BlobRef,
    ChunkList,
    blob_ref,
    chunk_count,
    chunk_length,
    chunk_list,
    split,
)
from e31.protocol.errors import BadBlob, InvalidMessage, LocalProtocolError
from hypothesis import given, settings
from hypothesis import strategies as st

DATA = bytes(range(256)) * (CHUNK_SIZE // 256) * 2 + b"tail"


def test_root_definition() -> None:
    chunks = list(split(DATA))
    assert [len(c) for c in chunks] == [CHUNK_SIZE, CHUNK_SIZE, 4]
    listing = b"".join(hashlib.sha256(c).digest() for c in chunks)
    expected = hashlib.sha256(BLOB_DOMAIN + struct.pack(">Q", len(DATA)) + listing).digest()
    cl = chunk_list(DATA)
    assert cl.root.raw == expected
    assert cl.to_bytes() == listing
    assert blob_ref(DATA) == BlobRef(cl.root, len(DATA))


def test_empty_blob_has_no_chunks() -> None:
    cl = chunk_list(b"")
    assert cl.hashes == () and cl.to_bytes() == b""
    assert ChunkList.from_bytes(cl.ref, b"") == cl
    with pytest.raises(BadBlob):
        chunk_length(0, 0)


def test_receiver_checks_the_list_then_every_chunk() -> None:
    ref = blob_ref(DATA)
    cl = ChunkList.from_bytes(ref, chunk_list(DATA).to_bytes())
    for i, chunk in enumerate(split(DATA)):
        cl.verify_chunk(i, chunk)
    with pytest.raises(BadBlob, match="does not match"):
        cl.verify_chunk(0, b"\x01" + DATA[1:CHUNK_SIZE])
    with pytest.raises(BadBlob, match="bytes"):
        cl.verify_chunk(2, b"tail!")
    with pytest.raises(BadBlob, match="does not exist"):
        cl.verify_chunk(3, b"")


def test_a_chunk_list_that_does_not_hash_to_the_root_is_refused() -> None:
    ref = blob_ref(DATA)
    listing = bytearray(chunk_list(DATA).to_bytes())
    listing[5] ^= 1
    with pytest.raises(BadBlob, match="root"):
        ChunkList.from_bytes(ref, bytes(listing))
    with pytest.raises(BadBlob, match="bytes"):
        ChunkList.from_bytes(ref, bytes(listing[:-1]))
    with pytest.raises(BadBlob, match="root"):
        ChunkList.from_bytes(BlobRef(ref.root, ref.size - 1), chunk_list(DATA[:-1]).to_bytes())


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, CHUNK_SIZE + 7), max_size=6))
def test_hasher_gives_the_same_list_for_any_split(cuts: list[int]) -> None:
    hasher = BlobHasher()
    rest = DATA
    for n in cuts:
        hasher.update(rest[:n])
        rest = rest[n:]
    hasher.update(rest)
    assert hasher.finish() == chunk_list(DATA)


def test_sizes_are_bounded() -> None:
    assert chunk_count(MAX_BLOB_SIZE) * 32 <= 512 * 1024
    with pytest.raises(InvalidMessage):
        BlobRef(chunk_list(b"").root, MAX_BLOB_SIZE + 1)
    with pytest.raises(BadBlob):
        ChunkList(10, ())
    hasher = BlobHasher()
    hasher._size = MAX_BLOB_SIZE
    with pytest.raises(LocalProtocolError):
        hasher.update(b"x")
