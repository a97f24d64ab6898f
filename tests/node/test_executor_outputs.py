"""How an executor stores a run's streams: from the result when it holds them whole, else from the files
the run spilled them to; checked against the hash and size the run reported either way. A small one
(1..PUSH_MAX bytes) is handed back to be kept in the database and carried in the result, not written
as a file; an empty one already held is not written again."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from e31.node.market.outputs import JobFailed, put_checked
from e31.node.store.blobs import BlobStore
from e31.protocol.blobs import PUSH_MAX, BlobRef, blob_ref
from e31.sandbox.limits import RunResult, Status

TEXT = b"pi is about 3.14\n"


def _result(
    stdout: bytes, *, held: bytes | None = None, size: int | None = None, sha: str | None = None
) -> RunResult:
    """A run that wrote `stdout`, holding `held` of it (all of it by default)."""
    return RunResult(
        status=Status.EXITED,
        exit_code=0,
        trap=None,
        message="",
        fuel_used=1,
        fuel_limit=10,
        wall_seconds=0.0,
        peak_memory_bytes=0,
        stdout=stdout if held is None else held,
        stdout_sha256=sha or hashlib.sha256(stdout).hexdigest(),
        stderr_sha256=hashlib.sha256(b"").hexdigest(),
        stdout_bytes=len(stdout) if size is None else size,
    )


def test_a_small_stream_held_whole_is_handed_back_and_written_nowhere(tmp_path: Path) -> None:
    blobs = BlobStore(tmp_path / "blobs")
    small: list[tuple[BlobRef, bytes]] = []
    ref = put_checked(blobs, tmp_path / "no-such-dir", "stdout", _result(TEXT), small)
    assert ref == blob_ref(TEXT) and small == [(ref, TEXT)]
    assert not blobs.has(ref.root.raw) and list(blobs.hashes()) == []


def test_a_larger_stream_held_whole_is_stored_as_a_blob(tmp_path: Path) -> None:
    blobs = BlobStore(tmp_path / "blobs")
    big = b"x" * (PUSH_MAX + 1)
    small: list[tuple[BlobRef, bytes]] = []
    ref = put_checked(blobs, tmp_path / "no-such-dir", "stdout", _result(big), small)
    assert blobs.read(ref.root.raw) == big and ref == blob_ref(big) and small == []


def test_a_spilled_stream_is_stored_from_its_file(tmp_path: Path) -> None:
    blobs = BlobStore(tmp_path / "blobs")
    (tmp_path / "stdout").write_bytes(TEXT)
    pushed: list[tuple[BlobRef, bytes]] = []
    ref = put_checked(blobs, tmp_path, "stdout", _result(TEXT, held=TEXT[:4]), pushed)
    assert blobs.read(ref.root.raw) == TEXT and ref.size == len(TEXT)
    assert pushed == []


def test_a_stream_that_differs_from_what_the_run_reported_fails_the_job(tmp_path: Path) -> None:
    blobs = BlobStore(tmp_path / "blobs")
    other = hashlib.sha256(b"other").hexdigest()
    with pytest.raises(JobFailed, match="does not match"):
        put_checked(blobs, tmp_path, "stdout", _result(TEXT, sha=other), [])
    (tmp_path / "stdout").write_bytes(b"changed after the run")
    with pytest.raises(JobFailed, match="do not match"):  # the file is longer than reported
        put_checked(blobs, tmp_path, "stdout", _result(TEXT, held=TEXT[:4]), [])
    with pytest.raises(JobFailed, match="do not match"):
        put_checked(blobs, tmp_path, "stdout", _result(b"changed after the run", held=b"c", sha=other), [])
    with pytest.raises(JobFailed, match="left no"):
        put_checked(blobs, tmp_path / "gone", "stdout", _result(TEXT, held=TEXT[:4]), [])


def test_a_small_stream_already_held_is_not_written_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blobs = BlobStore(tmp_path / "blobs")
    first = put_checked(blobs, tmp_path, "stderr", _result(TEXT), [])

    def no_write(*args: object, **kwargs: object) -> None:
        raise AssertionError("an empty stream already held was written again")

    monkeypatch.setattr(blobs, "put_stream", no_write)
    assert put_checked(blobs, tmp_path, "stderr", _result(TEXT), []) == first
