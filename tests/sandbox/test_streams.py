"""Whole streams: with `streams_dir`, a stream longer than DISPLAY_CAP lands whole in a file, a shorter one
is whole in the RunResult and touches no disk; either way it matches the result's hashes and sizes, in
process and through a worker pool, and the output cap still holds."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest
from e31.sandbox.errors import SandboxError
from e31.sandbox.job import JobSpec
from e31.sandbox.limits import Limits, RunResult, Status, whole_stream
from e31.sandbox.pool import WorkerPool
from e31.sandbox.runner import run
from e31.sandbox.wasi import DISPLAY_CAP
from guests import command

MIB = 1 << 20
# Fills 1024..5120 with bytes 0..255 repeated, writes it 768 times to stdout (3 MiB), then the first
# 100 bytes of it to stderr, and exits 0.
CHATTY_WAT = """
  (local $i i32)
  (loop $fill
    (i32.store8 (i32.add (i32.const 1024) (local.get $i)) (local.get $i))
    (local.set $i (i32.add (local.get $i) (i32.const 1)))
    (br_if $fill (i32.lt_u (local.get $i) (i32.const 4096))))
  (local.set $i (i32.const 0))
  (loop $out
    (call $check (call $write (i32.const 1) (i32.const 1024) (i32.const 4096)))
    (local.set $i (i32.add (local.get $i) (i32.const 1)))
    (br_if $out (i32.lt_u (local.get $i) (i32.const 768))))
  (call $check (call $write (i32.const 2) (i32.const 1024) (i32.const 100)))
"""
CHATTY = command(CHATTY_WAT)
BLOCK = bytes(i % 256 for i in range(4096))


def whole(r: RunResult, streams: Path, name: str) -> bytes:
    where = whole_stream(r, streams, name)
    return where.read_bytes() if isinstance(where, Path) else where


def check_streams(r: RunResult, streams: Path) -> None:
    out, err = whole(r, streams, "stdout"), whole(r, streams, "stderr")
    assert (len(out), r.stdout_bytes, hashlib.sha256(out).hexdigest()) == (
        r.stdout_bytes,
        len(out),
        r.stdout_sha256,
    )
    assert (len(err), hashlib.sha256(err).hexdigest()) == (r.stderr_bytes, r.stderr_sha256)


def test_whole_streams_are_written_and_the_display_copy_stays_capped(tmp_path: Path) -> None:
    r = run(JobSpec(CHATTY), streams_dir=tmp_path / "streams")
    assert (r.status, r.exit_code) == (Status.EXITED, 0)
    assert r.stdout_bytes == 3 * MIB and r.stderr_bytes == 100
    assert r.stdout == (BLOCK * 256)[:DISPLAY_CAP]
    check_streams(r, tmp_path / "streams")
    assert (tmp_path / "streams" / "stdout").read_bytes() == BLOCK * 768  # what was held, then the rest
    assert r.stderr == BLOCK[:100] and whole_stream(r, tmp_path / "streams", "stderr") == BLOCK[:100]
    assert not (tmp_path / "streams" / "stderr").exists()


def test_a_long_stderr_goes_to_its_file_whole(tmp_path: Path) -> None:
    chatty_err = command(CHATTY_WAT.replace("(call $write (i32.const 1)", "(call $write (i32.const 2)"))
    r = run(JobSpec(chatty_err), streams_dir=tmp_path)
    assert (r.status, r.stderr_bytes, r.stdout_bytes) == (Status.EXITED, 3 * MIB + 100, 0)
    assert r.stderr == (BLOCK * 256)[:DISPLAY_CAP]
    assert (tmp_path / "stderr").read_bytes() == BLOCK * 768 + BLOCK[:100]
    assert not (tmp_path / "stdout").exists()
    check_streams(r, tmp_path)


def test_a_run_with_short_streams_and_no_outputs_creates_nothing(tmp_path: Path) -> None:
    r = run(
        JobSpec(command("(call $print (i32.const 1024) (i32.const 5))")),
        tmp_path / "work" / "output",
        streams_dir=tmp_path / "work" / "streams",
    )
    assert (r.status, r.stdout_bytes) == (Status.EXITED, 5)
    assert not (tmp_path / "work").exists()
    check_streams(r, tmp_path / "work" / "streams")


def test_streams_stop_at_the_output_cap(tmp_path: Path) -> None:
    r = run(JobSpec(CHATTY, limits=Limits(max_output_bytes=MIB + 10)), streams_dir=tmp_path)
    assert r.status is Status.OUTPUT_LIMIT
    assert r.stdout_bytes == len(r.stdout) == MIB  # exactly what memory holds: no file
    assert not (tmp_path / "stdout").exists()
    check_streams(r, tmp_path)
    r = run(JobSpec(CHATTY, limits=Limits(max_output_bytes=2 * MIB + 10)), streams_dir=tmp_path)
    assert r.status is Status.OUTPUT_LIMIT
    assert r.stdout_bytes == (tmp_path / "stdout").stat().st_size == 2 * MIB
    check_streams(r, tmp_path)


def test_a_rerun_ignores_the_files_an_earlier_run_left(tmp_path: Path) -> None:
    run(JobSpec(CHATTY), streams_dir=tmp_path)
    r = run(JobSpec(command("(call $print (i32.const 1024) (i32.const 0))")), streams_dir=tmp_path)
    assert r.stdout_bytes == 0 and whole_stream(r, tmp_path, "stdout") == b""
    check_streams(r, tmp_path)
    r = run(JobSpec(CHATTY), streams_dir=tmp_path)  # a long stream truncates what was there
    check_streams(r, tmp_path)


def test_without_streams_dir_a_long_stream_is_not_whole(tmp_path: Path) -> None:
    r = run(JobSpec(CHATTY))
    with pytest.raises(SandboxError, match="not kept whole"):
        whole_stream(r, None, "stdout")
    assert whole_stream(r, None, "stderr") == BLOCK[:100]


def test_an_unwritable_streams_dir_is_a_host_error(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(SandboxError, match="cannot write streams"):
        run(JobSpec(CHATTY), streams_dir=tmp_path / "file")


@pytest.mark.skipif(sys.platform != "linux", reason="the worker pool is tested on Linux")
def test_a_pool_worker_writes_the_streams(tmp_path: Path) -> None:
    with WorkerPool(1, tmp_path / "cache", grace_seconds=1.0) as pool:
        assert pool.pids() == pool.worker_pids() and len(pool.pids()) == 1
        r = pool.run(JobSpec(CHATTY), tmp_path / "out", streams_dir=tmp_path / "streams", timeout=60)
    assert r.status is Status.EXITED
    check_streams(r, tmp_path / "streams")
    assert r.stdout_bytes == 3 * MIB


def test_a_run_that_leaves_files_creates_its_output_dir_and_parents_private(tmp_path: Path) -> None:
    tile = Path(__file__).resolve().parents[2] / "sandbox" / "workloads" / "mandelbrot.wasm"
    spec = JobSpec(tile.read_bytes(), args=("16", "8", "0", "0", "16", "8", "10", "/output/t.pgm"))
    r = run(spec, tmp_path / "work" / "output", streams_dir=tmp_path / "work" / "streams")
    assert r.status is Status.EXITED and set(r.output_files) == {"t.pgm"}
    for d in (tmp_path / "work", tmp_path / "work" / "output"):
        assert d.stat().st_mode & 0o777 == 0o700
    assert not (tmp_path / "work" / "streams").exists()
