"""A stored blob is never used, served or exported unchecked: real files, damaged in place the way a
failing disk or a careless operator would (a byte flipped at the head, middle or tail, bytes changed,
the file cut short or emptied), found at the next use, quarantined, and replaced by the same bytes again."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from e31.node.store.blobs import CHUNK_SIZE, BlobCorrupt, BlobNotFound, BlobStore

SIZE = 1 << 20


def _data() -> bytes:
    return bytes((i * 7 + i // 251) % 256 for i in range(SIZE))


def _flip(at: int) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        with open(path, "r+b") as f:
            f.seek(at)
            byte = f.read(1)
            f.seek(at)
            f.write(bytes([byte[0] ^ 0x01]))

    return damage


def _overwrite(at: int, n: int) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        with open(path, "r+b") as f:
            f.seek(at)
            f.write(b"\xaa" * n)

    return damage


def _truncate(to: int) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        os.truncate(path, to)

    return damage


DAMAGE = {
    "flip-head": _flip(0),
    "flip-middle": _flip(SIZE // 2 + 3),
    "flip-tail": _flip(SIZE - 1),
    "five-bytes": _overwrite(300_000, 5),
    "truncated-half": _truncate(SIZE // 2),
    "truncated-to-0": _truncate(0),
}
USES: dict[str, Callable[[BlobStore, str], object]] = {
    "read": lambda b, h: b.read(h),
    "checked_path": lambda b, h: b.checked_path(h),
    "open": lambda b, h: b.open(h).close(),
    "read_chunk": lambda b, h: b.read_chunk(h, 0),
    "chunk_hashes": lambda b, h: b.chunk_hashes(h),
}


@pytest.mark.parametrize("use", sorted(USES))
@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("restart", [False, True], ids=["same-store", "after-restart"])
def test_damage_anywhere_is_caught_at_the_next_use_and_quarantined(
    tmp_path: Path, damage: str, use: str, restart: bool
) -> None:
    blobs = BlobStore(tmp_path / "blobs")
    data = _data()
    h = blobs.put(data)
    assert blobs.read(h) == data  # checked, and stamped as checked
    DAMAGE[damage](blobs.path(h))
    if restart:
        blobs = BlobStore(tmp_path / "blobs")
    with pytest.raises(BlobCorrupt, match="corrupt"):
        USES[use](blobs, h)
    assert not blobs.has(h)
    assert len(list((tmp_path / "blobs" / "quarantine").iterdir())) == 1
    with pytest.raises(BlobNotFound):
        blobs.read(h)
    assert blobs.put(data) == h  # the same bytes again (the user's file, a peer's chunks) replace it
    assert blobs.read(h) == data


def test_a_damaged_blob_is_replaced_by_putting_its_bytes_again(tmp_path: Path) -> None:
    blobs = BlobStore(tmp_path / "blobs")
    data = _data()
    h = blobs.put(data)
    _overwrite(300_000, 5)(blobs.path(h))  # same size: the old put() kept this copy
    assert blobs.put(data) == h
    assert blobs.read(h) == data


def test_damage_that_keeps_size_and_mtime_is_caught_after_a_restart(tmp_path: Path) -> None:
    blobs = BlobStore(tmp_path / "blobs")
    h = blobs.put(_data())
    path = blobs.path(h)
    before = path.stat()
    _flip(12345)(path)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    with pytest.raises(BlobCorrupt):
        BlobStore(tmp_path / "blobs").read(h)  # a new store trusts nothing it has not hashed


def test_a_checked_blob_is_hashed_once_while_its_file_is_unchanged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blobs = BlobStore(tmp_path / "blobs")
    data = _data()
    h = blobs.put(data)
    fresh = BlobStore(tmp_path / "blobs")
    hashed: list[str] = []
    real = BlobStore._check_file

    def counting(self: BlobStore, f: object, want: str) -> None:
        hashed.append(want)
        real(self, f, want)  # type: ignore[arg-type]

    monkeypatch.setattr(BlobStore, "_check_file", counting)
    for _ in range(5):
        assert fresh.read(h) == data
        fresh.checked_path(h)
        fresh.read_chunk(h, 1)
    assert hashed == [h]
    os.utime(fresh.path(h))  # touched: its identity changed, so it is hashed again
    fresh.read(h)
    assert hashed == [h, h]


def test_putting_a_held_blob_again_opens_it_only_when_its_file_changed_since_its_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every run puts its (often empty) stderr: a blob checked since its file last changed is taken as
    it is, with one stat; a file changed since (here only touched) is opened and checked again."""
    blobs = BlobStore(tmp_path / "blobs")
    data = _data()
    h = blobs.put(data)
    empty = blobs.put(b"")
    opened: list[str] = []
    real = BlobStore.open

    def counting(self: BlobStore, digest: str | bytes, *, verify: bool = True) -> Any:
        opened.append(str(digest))
        return real(self, digest, verify=verify)

    monkeypatch.setattr(BlobStore, "open", counting)
    for _ in range(3):
        assert blobs.put(data) == h
        assert blobs.put(b"") == empty
    assert opened == []
    before = blobs.path(h).stat()
    os.utime(blobs.path(h), ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000))  # touched only
    assert blobs.put(data) == h
    assert opened == [h]
    assert blobs.put(data) == h  # checked again just now: no second open
    assert opened == [h]


def test_unchanged_tells_a_reader_whether_the_file_it_used_was_touched(tmp_path: Path) -> None:
    blobs = BlobStore(tmp_path / "blobs")
    h = blobs.put(_data())
    assert blobs.unchanged(h)  # written (and so checked) by this store
    path = blobs.checked_path(h)
    assert blobs.unchanged(h)
    _flip(CHUNK_SIZE + 1)(path)
    assert not blobs.unchanged(h)
    blobs.delete(h)
    assert not blobs.unchanged(h)
