"""How an executor stores a run's streams: checked against the hash and size the run reported, and a
stream already held (an empty stderr) not written again."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from e31.node import market_executor
from e31.node.blobs import BlobStore
from e31.node.market_executor import JobFailed, _put_checked
from e31.protocol.blobs import BlobRef


def _stream(tmp_path: Path, data: bytes) -> tuple[Path, int, str]:
    path = tmp_path / "stdout"
    path.write_bytes(data)
    return path, len(data), hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("small", [True, False])
def test_a_stream_that_matches_the_run_is_stored(tmp_path: Path, small: bool,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    if not small:
        monkeypatch.setattr(market_executor, "SMALL_STREAM", 4)  # the streaming path
    blobs = BlobStore(tmp_path / "blobs")
    path, total, sha = _stream(tmp_path, b"pi is about 3.14\n")
    pushed: list[tuple[BlobRef, bytes]] = []
    ref = _put_checked(blobs, path, total, sha, pushed)
    assert blobs.read(ref.root.raw) == b"pi is about 3.14\n" and ref.size == total
    # read whole, it is kept to push with the result; streamed (a large one), it is not
    assert pushed == ([(ref, b"pi is about 3.14\n")] if small else [])


@pytest.mark.parametrize("small", [True, False])
def test_a_stream_that_differs_from_what_the_run_reported_fails_the_job(
    tmp_path: Path, small: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not small:
        monkeypatch.setattr(market_executor, "SMALL_STREAM", 4)
    blobs = BlobStore(tmp_path / "blobs")
    path, total, sha = _stream(tmp_path, b"changed after the run")
    with pytest.raises(JobFailed, match="do not match"):
        _put_checked(blobs, path, total + 1, sha, [])
    with pytest.raises(JobFailed, match="do not match"):
        _put_checked(blobs, path, total, hashlib.sha256(b"other").hexdigest(), [])
    with pytest.raises(JobFailed, match="left no"):
        _put_checked(blobs, tmp_path / "stderr", 0, hashlib.sha256(b"").hexdigest(), [])


def test_a_small_stream_already_held_is_not_written_again(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    blobs = BlobStore(tmp_path / "blobs")
    path, total, sha = _stream(tmp_path, b"")
    first = _put_checked(blobs, path, total, sha, [])

    def no_write(*args: object, **kwargs: object) -> None:
        raise AssertionError("an empty stream already held was written again")

    monkeypatch.setattr(blobs, "put_stream", no_write)
    assert _put_checked(blobs, path, total, sha, []) == first
