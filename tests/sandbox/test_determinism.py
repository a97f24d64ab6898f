"""The same job gives the same bytes and the same fuel: across runs, engines and processes."""

from __future__ import annotations

import hashlib
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from e31.sandbox.job import JobSpec, input_files_from_dir
from e31.sandbox.limits import RunResult, Status
from e31.sandbox.profile import new_engine
from e31.sandbox.runner import run
from e31.sandbox.vfs import FIXED_TIME_NS
from e31.sandbox.wasi import REALTIME_EPOCH_NS
from guests import O_CREAT, RIGHTS_WRITE, command

# The guest reads both clocks, waits 5 s on the monotonic clock, reads it again, draws 32 random
# bytes, stats /input/a.txt, lists /input, and copies that listing to /output/listing.bin.
PROBE = command(
    f"""
  (call $check (call $clock_time_get (i32.const 0) (i64.const 0) (i32.const 1024)))
  (call $check (call $clock_time_get (i32.const 1) (i64.const 0) (i32.const 1032)))
  (i64.store (i32.const 1100) (i64.const 7))
  (i32.store8 (i32.const 1108) (i32.const 0))
  (i32.store (i32.const 1116) (i32.const 1))
  (i64.store (i32.const 1124) (i64.const 5000000000))
  (call $check (call $poll_oneoff (i32.const 1100) (i32.const 1152) (i32.const 1) (i32.const 16)))
  (call $check (call $clock_time_get (i32.const 1) (i64.const 0) (i32.const 1040)))
  (call $check (call $random_get (i32.const 1184) (i32.const 32)))
  (call $check (call $path_filestat_get (i32.const 3) (i32.const 0) (i32.const 256) (i32.const 5)
                                        (i32.const 1216)))
  (call $check (call $fd_readdir (i32.const 3) (i32.const 2048) (i32.const 512) (i64.const 0)
                                 (i32.const 1280)))
  (call $print (i32.const 1024) (i32.const 260))
  (call $print (i32.const 2048) (i32.load (i32.const 1280)))
  (call $check (call $open (i32.const 4) (i32.const 272) (i32.const 11) (i32.const {O_CREAT})
                           (i64.const {RIGHTS_WRITE})))
  (call $check (call $write (i32.load (i32.const 12)) (i32.const 2048) (i32.load (i32.const 1280))))
""",
    data='(data (i32.const 256) "a.txt") (data (i32.const 272) "listing.bin")',
)


@pytest.fixture
def inputs(tmp_path: Path) -> Path:
    root = tmp_path / "in"
    (root / "sub").mkdir(parents=True)
    # Created in an order unlike the sorted one, so host directory order cannot leak through.
    (root / "sub" / "c.txt").write_text("c")
    (root / "b.bin").write_bytes(bytes(range(256)))
    (root / "a.txt").write_text("hello\n")
    return root


def _comparable(r: RunResult) -> dict[str, object]:
    d = r.to_json_dict()
    del d["wall_seconds"]
    return d


def _dirents(blob: bytes) -> list[tuple[int, int, str, int]]:
    out, off = [], 0
    while off < len(blob):
        d_next, ino, namlen, kind = struct.unpack_from("<QQIB", blob, off)
        out.append((d_next, ino, blob[off + 24 : off + 24 + namlen].decode(), kind))
        off += 24 + namlen
    return out


def test_clock_random_listing_and_metadata_are_what_the_docs_say(inputs: Path) -> None:
    seed = bytes(range(32))
    r = run(JobSpec(PROBE, inputs=input_files_from_dir(inputs), seed=seed))
    assert (r.status, r.exit_code) == (Status.EXITED, 0), r.message
    head, listing = r.stdout[:260], r.stdout[260:]
    realtime, mono1, mono2 = struct.unpack_from("<QQQ", head, 0)
    assert realtime == REALTIME_EPOCH_NS
    assert mono1 == 1_000
    assert mono2 == 2_000 + 5_000_000_000
    userdata, error, kind = struct.unpack_from("<QHB", head, 128)
    assert (userdata, error, kind) == (7, 0, 0)
    assert head[160:192] == hashlib.sha256(b"e31/random/1" + seed + bytes(8)).digest()
    _dev, ino, ftype, nlink, size, atim, mtim, ctim = struct.unpack_from("<QQBxxxxxxxQQQQQ", head, 192)
    assert (ftype, nlink, size) == (4, 1, 6)
    assert atim == mtim == ctim == FIXED_TIME_NS
    names = [name for _, _, name, _ in _dirents(listing)]
    assert names == [".", "..", "a.txt", "b.bin", "sub"]
    inos = {name: i for _, i, name, _ in _dirents(listing)}
    assert inos["a.txt"] == ino
    assert max(inos.values()) < 16  # synthetic, handed out in sorted order; never the host's


def test_different_seeds_draw_different_bytes(inputs: Path) -> None:
    files = input_files_from_dir(inputs)
    a = run(JobSpec(PROBE, inputs=files, seed=bytes(32)))
    b = run(JobSpec(PROBE, inputs=files, seed=b"\x01" * 32))
    assert a.stdout[160:192] != b.stdout[160:192]
    assert a.fuel_used == b.fuel_used


def test_three_runs_and_two_engines_agree_bit_for_bit(inputs: Path, tmp_path: Path) -> None:
    files = input_files_from_dir(inputs)
    results = [run(JobSpec(PROBE, inputs=files), tmp_path / f"out{i}") for i in range(3)]
    results.append(run(JobSpec(PROBE, inputs=files), engine=new_engine()))
    first = _comparable(results[0])
    assert all(_comparable(r) == first for r in results[1:])
    assert set(results[0].output_files) == {"listing.bin"}
    copies = {(tmp_path / f"out{i}" / "listing.bin").read_bytes() for i in range(3)}
    assert len(copies) == 1


def test_a_fresh_process_agrees(inputs: Path, tmp_path: Path) -> None:
    local = run(JobSpec(PROBE, inputs=input_files_from_dir(inputs)))
    module = tmp_path / "probe.wasm"
    module.write_bytes(PROBE)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "e31.node",
            "sandbox",
            "run",
            str(module),
            "--input",
            str(inputs),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    remote = json.loads(proc.stdout)
    for key in (
        "status",
        "stdout_sha256",
        "stderr_sha256",
        "fuel_used",
        "output_files",
        "peak_memory_bytes",
        "profile_digest",
    ):
        assert remote[key] == _comparable(local)[key], key
