"""The content-addressed blob store, on a real filesystem."""

from __future__ import annotations

import hashlib
import os
import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from e31.node.store.blobs import (
    CHUNK_SIZE,
    BlobCorrupt,
    BlobError,
    BlobNotFound,
    BlobStore,
    BlobStoreFull,
    HashMismatch,
    chunk_count,
    chunk_length,
    hash_hex,
)
from e31.protocol.blobs import blob_ref


def h(data: bytes) -> str:
    return blob_ref(data).root.hex()


def chunks_of(data: bytes) -> list[bytes]:
    return [data[i : i + CHUNK_SIZE] for i in range(0, len(data), CHUNK_SIZE)]


@pytest.fixture
def store(tmp_path: Path) -> BlobStore:
    return BlobStore(tmp_path / "blobs")


def test_put_names_the_file_by_its_hash(store: BlobStore) -> None:
    digest = store.put(b"hello")
    assert digest == h(b"hello")
    assert store.path(digest) == store.root / digest[:2] / digest[2:]
    assert store.path(digest).read_bytes() == b"hello"
    assert store.has(digest) and store.size(digest) == 5
    assert store.read(digest) == b"hello"
    assert store.path(bytes.fromhex(digest)) == store.path(digest)
    assert list(store.hashes()) == [digest]


def test_put_is_idempotent_and_leaves_no_temp_files(store: BlobStore) -> None:
    a = store.put(b"x" * 1000)
    b = store.put(b"x" * 1000)
    assert a == b
    assert store.total_size() == 1000
    assert [p.name for p in store.root.rglob(".tmp-*")] == []


def test_put_stream_with_and_without_expected_hash(store: BlobStore) -> None:
    data = os.urandom(3 * CHUNK_SIZE + 17)
    digest, size = store.put_stream(iter(chunks_of(data)))
    assert (digest, size) == (h(data), len(data))
    again = store.put_stream(iter(chunks_of(data)), expected=digest)
    assert again == (digest, size)


def test_put_stream_mismatch_keeps_nothing(store: BlobStore) -> None:
    with pytest.raises(HashMismatch):
        store.put_stream([b"abc"], expected=h(b"abd"))
    assert not store.has(h(b"abc")) and not store.has(h(b"abd"))
    assert list(store.root.rglob(".tmp-*")) == []
    assert store.total_size() == 0


def test_missing_blob(store: BlobStore) -> None:
    missing = h(b"never stored")
    assert not store.has(missing)
    for call in (store.size, store.open, store.read, store.verify):
        with pytest.raises(BlobNotFound):
            call(missing)
    assert store.delete(missing) is False


@pytest.mark.parametrize("bad", ["ab", "G" * 64, "A" * 64, b"short", "../../etc/passwd" + "0" * 48])
def test_bad_hashes_are_refused_before_touching_the_disk(store: BlobStore, bad: str | bytes) -> None:
    with pytest.raises(ValueError):
        store.path(bad)


def test_delete_and_total_size(store: BlobStore) -> None:
    a = store.put(b"a" * 10)
    store.put(b"b" * 20)
    assert store.total_size() == 30
    assert store.delete(a) is True
    assert store.total_size() == 20
    assert BlobStore(store.root).total_size() == 20


def test_corrupt_blob_is_quarantined_and_never_served(store: BlobStore) -> None:
    digest = store.put(b"precious bytes")
    store.path(digest).write_bytes(b"precious bytez")
    with pytest.raises(BlobCorrupt):
        store.open(digest)
    assert not store.has(digest)
    quarantined = list((store.root / "quarantine").iterdir())
    assert len(quarantined) == 1 and quarantined[0].name.startswith(digest)
    assert quarantined[0].read_bytes() == b"precious bytez"
    with pytest.raises(BlobNotFound):
        store.read(digest)
    assert store.total_size() == 0


def test_verify_rehashes(store: BlobStore) -> None:
    digest = store.put(b"fine")
    store.verify(digest)
    with store.path(digest).open("r+b") as f:
        f.write(b"F")
    with pytest.raises(BlobCorrupt):
        store.verify(digest)


def test_chunk_rules() -> None:
    assert CHUNK_SIZE == 256 * 1024
    assert [chunk_count(n) for n in (0, 1, CHUNK_SIZE, CHUNK_SIZE + 1)] == [0, 1, 1, 2]
    assert chunk_length(CHUNK_SIZE + 5, 0) == CHUNK_SIZE
    assert chunk_length(CHUNK_SIZE + 5, 1) == 5
    with pytest.raises(ValueError):
        chunk_length(10, 1)


def test_serving_chunks(store: BlobStore) -> None:
    data = os.urandom(2 * CHUNK_SIZE + 3)
    digest = store.put(data)
    assert store.chunk_hashes(digest) == [hashlib.sha256(c).digest() for c in chunks_of(data)]
    assert b"".join(store.read_chunk(digest, i) for i in range(3)) == data
    with pytest.raises(ValueError):
        store.read_chunk(digest, 3)


def test_chunked_download_out_of_order(store: BlobStore) -> None:
    data = os.urandom(5 * CHUNK_SIZE + 99)
    pieces = chunks_of(data)
    partial = store.partial(h(data), len(data))
    order = list(range(len(pieces)))
    random.Random(4).shuffle(order)
    for i in order[:-1]:
        partial.write_chunk(i, pieces[i], hashlib.sha256(pieces[i]).digest())
    assert partial.missing() == [order[-1]]
    with pytest.raises(BlobError, match="missing 1 of 6"):
        partial.finalise()
    last = order[-1]
    partial.write_chunk(last, pieces[last], hashlib.sha256(pieces[last]).digest())
    assert partial.complete
    assert partial.finalise() == h(data)
    assert store.read(h(data)) == data
    assert store.partials() == []


def test_chunked_download_resumes_after_restart(tmp_path: Path) -> None:
    data = os.urandom(3 * CHUNK_SIZE)
    pieces = chunks_of(data)
    first = BlobStore(tmp_path / "blobs").partial(h(data), len(data))
    first.write_chunk(1, pieces[1], hashlib.sha256(pieces[1]).digest())
    reopened = BlobStore(tmp_path / "blobs")
    assert reopened.partials() == [h(data)]
    resumed = reopened.partial(h(data), len(data))
    assert resumed.missing() == [0, 2]
    for i in (0, 2):
        resumed.write_chunk(i, pieces[i], hashlib.sha256(pieces[i]).digest())
    assert resumed.finalise() == h(data)
    other = reopened.partial(h(b"other"), 10)
    with pytest.raises(ValueError, match="started with size 10, not 11"):
        reopened.partial(other.hash, 11)


def test_bad_chunks_are_refused(store: BlobStore) -> None:
    data = os.urandom(CHUNK_SIZE + 10)
    pieces = chunks_of(data)
    partial = store.partial(h(data), len(data))
    with pytest.raises(HashMismatch, match="does not match"):
        partial.write_chunk(0, pieces[0], hashlib.sha256(b"other").digest())
    with pytest.raises(HashMismatch, match="should be 10 bytes"):
        partial.write_chunk(1, pieces[1] + b"!", hashlib.sha256(pieces[1] + b"!").digest())
    with pytest.raises(ValueError):
        partial.write_chunk(2, b"", hashlib.sha256(b"").digest())
    assert partial.missing() == [0, 1]


def test_chunks_that_do_not_add_up_to_the_hash_are_discarded(store: BlobStore) -> None:
    # Each chunk matches the hash it was offered with, but the offered hashes were for other bytes.
    claimed = h(b"the real blob" * 30000)
    fake = os.urandom(len(b"the real blob" * 30000))
    partial = store.partial(claimed, len(fake))
    for i, piece in enumerate(chunks_of(fake)):
        partial.write_chunk(i, piece, hashlib.sha256(piece).digest())
    with pytest.raises(HashMismatch):
        partial.finalise()
    assert not store.has(claimed)
    assert store.partials() == []


def test_empty_blob(store: BlobStore) -> None:
    partial = store.partial(h(b""), 0)
    assert partial.missing() == []
    assert partial.finalise() == h(b"")
    assert store.read(h(b"")) == b""


def test_disk_ceiling(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs", ceiling=1000)
    store.put(b"a" * 600)
    with pytest.raises(BlobStoreFull):
        store.put(b"b" * 600)
    with pytest.raises(BlobStoreFull):
        store.partial(h(b"c" * 500), 500)
    assert store.total_size() == 600
    assert list(store.root.rglob(".tmp-*")) == []
    store.put(b"d" * 400)
    assert store.total_size() == 1000


def test_sweep_removes_crash_leftovers(store: BlobStore) -> None:
    digest = store.put(b"kept")
    (store.root / digest[:2] / ".tmp-deadbeef").write_bytes(b"half a write")
    partial = store.partial(h(b"p"), 1)
    (partial.dir / ".tmp-0.abcd").write_bytes(b"x")
    assert store.sweep() == 2
    assert store.read(digest) == b"kept"
    assert list(store.root.rglob(".tmp-*")) == []


def test_hash_hex_forms() -> None:
    raw = hashlib.sha256(b"x").digest()
    assert hash_hex(raw) == raw.hex() == hash_hex(raw.hex())


_BLOB_WRITER = textwrap.dedent("""
    import os, sys
    from e31.node.store.blobs import BlobStore
    store = BlobStore(sys.argv[1])
    n = 0
    while True:
        data = os.urandom(1024 * (1 + n % 300))
        pieces = [data[i:i + 4096] for i in range(0, len(data), 4096)]
        store.put_stream(pieces)
        print(n, flush=True)
        n += 1
""")


def test_sigkill_mid_write_leaves_only_whole_blobs(tmp_path: Path) -> None:
    root = tmp_path / "blobs"
    argv = [sys.executable, "-c", _BLOB_WRITER, str(root)]
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    written = -1
    try:
        while written < 40:
            line = child.stdout.readline()
            assert line, "the writer stopped early"
            written = int(line)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    store = BlobStore(root)
    hashes = list(store.hashes())
    assert len(hashes) >= written + 1
    for digest in hashes:
        store.verify(digest)
    store.sweep()
    assert list(root.rglob(".tmp-*")) == []
    assert store.total_size() == sum(store.size(d) for d in hashes)


def test_unreadable_download_bookkeeping_restarts_the_download(store: BlobStore) -> None:
    data = os.urandom(CHUNK_SIZE + 1)
    partial = store.partial(h(data), len(data))
    partial.write_chunk(1, data[CHUNK_SIZE:], hashlib.sha256(data[CHUNK_SIZE:]).digest())
    (partial.dir / "size").write_text("not a number")
    again = store.partial(h(data), len(data))
    assert again.missing() == [0, 1]


def test_chunk_rules_match_the_protocol() -> None:
    from e31.protocol import blobs as wire

    assert wire.CHUNK_SIZE == CHUNK_SIZE
    for size in (0, 1, CHUNK_SIZE - 1, CHUNK_SIZE, 3 * CHUNK_SIZE + 7):
        assert wire.chunk_count(size) == chunk_count(size)


def test_served_chunk_hashes_build_the_protocols_chunk_list(store: BlobStore) -> None:
    from e31.protocol import blobs as wire

    data = os.urandom(2 * CHUNK_SIZE + 5)
    digest = store.put(data)
    assert tuple(d.raw for d in wire.chunk_list(data).hashes) == tuple(store.chunk_hashes(digest))


def test_a_file_in_place_of_the_store_is_a_blob_error(tmp_path: Path) -> None:
    (tmp_path / "blobs").write_text("in the way")
    with pytest.raises(BlobError, match="cannot create the blob store"):
        BlobStore(tmp_path / "blobs")
