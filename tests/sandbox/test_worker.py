"""The worker side: the pipe protocol's framing and field checks, the paused clock, and a worker
process driven by hand over its pipes."""

from __future__ import annotations

import dataclasses
import io
import mmap
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import BinaryIO

import msgpack
import pytest
from e31.sandbox.job import JobSpec
from e31.sandbox.limits import Limits, RunResult, Status
from e31.sandbox.orphans import orphaned_workers
from e31.sandbox.pool import WorkerPool
from e31.sandbox.worker import (
    EXIT_PROTOCOL,
    MAX_FRAME,
    PARENT_CHECK_SECONDS,
    SHM_BYTES,
    ProtocolViolation,
    decode_result,
    decode_spec,
    encode_result,
    encode_spec,
    paused_clock,
    read_frame,
    write_frame,
)

ECHO = (Path(__file__).resolve().parents[2] / "sandbox" / "workloads" / "echo.wasm").read_bytes()

RESULT = RunResult(
    status=Status.EXITED,
    exit_code=0,
    trap=None,
    message="",
    fuel_used=123,
    fuel_limit=1000,
    wall_seconds=0.5,
    peak_memory_bytes=65536,
    stdout=b"hi\n",
    stdout_sha256="ab" * 32,
    stderr_sha256="cd" * 32,
    output_files={"a/b.txt": "ef" * 32},
    output_bytes=10,
    profile_digest="00" * 32,
    reverifiable=True,
)


def test_frames_round_trip_and_end_cleanly() -> None:
    buf = io.BytesIO()
    write_frame(buf, ["run", 1, b"\x00bytes", None])
    write_frame(buf, ["quit"])
    buf.seek(0)
    assert read_frame(buf) == ["run", 1, b"\x00bytes", None]
    assert read_frame(buf) == ["quit"]
    assert read_frame(buf) is None


@pytest.mark.parametrize(
    "data",
    [
        (MAX_FRAME + 1).to_bytes(4, "big"),
        b"\x00\x00\x00\x05ab",
        b"\x00\x00",
        b"\x00\x00\x00\x01\xc1",
        b"\x00\x00\x00\x01\x05",
        b"\x00\x00\x00\x01\x90",
    ],
)
def test_bad_frames_raise_protocol_violation(data: bytes) -> None:
    with pytest.raises(ProtocolViolation):
        read_frame(io.BytesIO(data))


def test_job_spec_round_trips(tmp_path: Path) -> None:
    (tmp_path / "in.txt").write_text("x")
    (tmp_path / "stdin").write_text("y")
    spec = JobSpec(
        ECHO,
        args=("a", "ü"),
        env=(("K", "v"),),
        stdin=tmp_path / "stdin",
        inputs={"d/in.txt": tmp_path / "in.txt"},
        limits=Limits(fuel=99, memory_bytes=2**20, wall_seconds=1.5, max_output_bytes=7),
        seed=bytes(range(32)),
    )
    wire = msgpack.unpackb(msgpack.packb(encode_spec(spec)), raw=False, use_list=True)
    again = decode_spec(wire)
    assert again == spec
    assert again.inputs == spec.inputs and again.limits == spec.limits


def test_a_malformed_job_spec_is_a_protocol_violation() -> None:
    with pytest.raises(ProtocolViolation):
        decode_spec([b"x", [], []])
    with pytest.raises(ProtocolViolation):
        decode_spec([ECHO, 5, [], None, [], [1, 2**20, 1.0, 0], bytes(32)])


def test_results_round_trip() -> None:
    wire = msgpack.unpackb(msgpack.packb(encode_result(RESULT)), raw=False, use_list=True)
    assert decode_result(wire) == RESULT


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("status", "exploded"),
        ("status", 1),
        ("exit_code", "0"),
        ("fuel_used", True),
        ("stdout", "text"),
        ("output_files", {"a": 1}),
        ("output_files", [1]),
        ("reverifiable", 1),
    ],
)
def test_a_result_with_a_wrong_field_is_refused(field: str, value: object) -> None:
    wire = encode_result(RESULT)
    wire[[f.name for f in dataclasses.fields(RunResult)].index(field)] = value
    with pytest.raises(ProtocolViolation):
        decode_result(wire)


def test_a_result_of_the_wrong_shape_is_refused() -> None:
    with pytest.raises(ProtocolViolation):
        decode_result(encode_result(RESULT)[:-1])
    with pytest.raises(ProtocolViolation):
        decode_result({"status": "exited"})


def test_paused_clock_subtracts_the_stopped_time() -> None:
    shm = mmap.mmap(-1, SHM_BYTES)
    clock = paused_clock(shm)
    before = clock()
    shm[:8] = (5 * 10**9).to_bytes(8, "little")
    after = clock()
    assert before - 5.0 <= after < before - 4.0


def spawn_worker(cache_dir: Path) -> tuple[subprocess.Popen[bytes], BinaryIO, BinaryIO]:
    """A worker started by hand: (process, request pipe, reply pipe)."""
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    with tempfile.TemporaryFile() as shm:
        shm.truncate(SHM_BYTES)
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "e31.sandbox.worker",
                "--request-fd",
                str(req_r),
                "--reply-fd",
                str(rep_w),
                "--paused-fd",
                str(shm.fileno()),
                "--cache-dir",
                str(cache_dir),
            ],
            pass_fds=(req_r, rep_w, shm.fileno()),
        )
    os.close(req_r)
    os.close(rep_w)
    return proc, os.fdopen(req_w, "wb"), os.fdopen(rep_r, "rb")


def test_a_worker_process_driven_by_hand(tmp_path: Path) -> None:
    proc, requests, replies = spawn_worker(tmp_path / "cache")
    try:
        with requests, replies:
            assert read_frame(replies) == ["ready", proc.pid]
            write_frame(requests, ["run", 7, encode_spec(JobSpec(ECHO, args=("by", "hand"))), None, None])
            reply = read_frame(replies)  # `started` comes late, and not at all before a quick result
            if reply == ["started", 7]:
                reply = read_frame(replies)
            kind, job_id, raw = reply or [None, None, None]
            assert (kind, job_id) == ("result", 7)
            assert decode_result(raw).stdout == b"by hand\n"
            missing = encode_spec(JobSpec(ECHO))
            missing[4] = [["x", os.fsencode(tmp_path / "nope")]]
            write_frame(requests, ["run", 8, missing, None, None])
            reply = read_frame(replies)
            assert reply is not None and reply[:3] == ["error", 8, "JobSpecError"]
            write_frame(requests, ["quit"])
            assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_running_job_is_announced_started_by_the_ticker_and_a_quick_one_is_not(tmp_path: Path) -> None:
    from e31.sandbox.runner import wat_to_wasm

    spin = wat_to_wasm(
        '(module (memory 1) (export "memory" (memory 0)) (func (export "_start") (loop (br 0))))'
    )
    proc, requests, replies = spawn_worker(tmp_path / "cache")
    try:
        with requests, replies:
            assert read_frame(replies) == ["ready", proc.pid]
            long = JobSpec(spin, limits=Limits(fuel=Limits.MAX_FUEL, wall_seconds=1.5))
            write_frame(requests, ["run", 1, encode_spec(long), None, None])
            assert read_frame(replies) == ["started", 1]  # while it runs: within a tick of the start
            reply = read_frame(replies)
            assert reply is not None and reply[:2] == ["result", 1]
            assert decode_result(reply[2]).status is Status.TIMEOUT
            for job_id in range(2, 12):  # quick jobs: each reply is its result alone, as a rule
                write_frame(requests, ["run", job_id, encode_spec(JobSpec(ECHO, args=("x",))), None, None])
            kinds = []
            while len([k for k in kinds if k == "result"]) < 10:
                reply = read_frame(replies)
                assert reply is not None and 2 <= reply[1] < 12
                kinds.append(reply[0])
            assert kinds.count("started") < 10
            write_frame(requests, ["quit"])
            assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_worker_exits_when_its_request_pipe_closes(tmp_path: Path) -> None:
    proc, requests, replies = spawn_worker(tmp_path / "cache")
    with replies:
        assert read_frame(replies) == ["ready", proc.pid]
        requests.close()
        assert proc.wait(timeout=30) == 0


def test_a_worker_refuses_a_malformed_request(tmp_path: Path) -> None:
    proc, requests, replies = spawn_worker(tmp_path / "cache")
    with requests, replies:
        assert read_frame(replies) == ["ready", proc.pid]
        write_frame(requests, ["launch", 1])
        assert proc.wait(timeout=30) == EXIT_PROTOCOL


def _gone(pid: int) -> bool:
    """True once `pid` has exited (reaped, or a zombie waiting for a reaper that never comes)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


@pytest.mark.skipif(sys.platform != "linux", reason="process states are read from /proc")
def test_a_worker_stops_its_job_when_its_pool_process_is_killed(tmp_path: Path) -> None:
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from e31.sandbox.job import JobSpec\n"
        "from e31.sandbox.limits import Limits\n"
        "from e31.sandbox.pool import WorkerPool\n"
        "from e31.sandbox.runner import wat_to_wasm\n"
        "spin = wat_to_wasm('(module (func (export \"_start\") (loop (br 0))))')\n"
        "pool = WorkerPool(1, Path(sys.argv[1]))\n"
        "job = pool.start_job(JobSpec(spin, limits=Limits(fuel=10**15, wall_seconds=600)))\n"
        "while job.pid is None: time.sleep(0.01)\n"
        "print(job.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script, str(tmp_path / "cache")], stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None
        worker = int(parent.stdout.readline())
        assert not _gone(worker)
        parent.kill()
        parent.wait(timeout=30)
        deadline = time.monotonic() + 30
        while not _gone(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone(worker), "the orphaned worker is still running its job"
    finally:
        if parent.poll() is None:
            parent.kill()


@pytest.mark.skipif(sys.platform != "linux", reason="processes are found in /proc")
def test_a_stopped_worker_of_a_killed_pool_is_killed_by_the_next_pool_of_its_cache(tmp_path: Path) -> None:
    # A worker suspended for the machine's owner (SIGSTOP) cannot notice that its node died: it would
    # stay, holding its memory, unless the node's next pool finds it.
    cache = tmp_path / "cache"
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from e31.sandbox.pool import WorkerPool\n"
        "pool = WorkerPool(1, Path(sys.argv[1]))\n"
        "print(pool.worker_pids()[0], flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script, str(cache)], stdout=subprocess.PIPE, text=True)
    worker = None
    try:
        assert parent.stdout is not None
        worker = int(parent.stdout.readline())
        os.kill(worker, signal.SIGSTOP)
        parent.kill()
        parent.wait(timeout=30)
        time.sleep(PARENT_CHECK_SECONDS * 3)
        assert not _gone(worker), "a stopped worker cannot notice its pool died"
        assert orphaned_workers(cache) == [worker]
        with WorkerPool(1, cache) as live:
            assert live.orphans_killed == [worker]
            deadline = time.monotonic() + 30
            while not _gone(worker) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _gone(worker)
            # a live pool's own workers are not orphans, for another pool of the same cache either
            assert orphaned_workers(cache) == []
            with WorkerPool(1, cache) as second:
                assert second.orphans_killed == []
                assert all(not _gone(pid) for pid in live.worker_pids())
    finally:
        if parent.poll() is None:
            parent.kill()
        if worker is not None and not _gone(worker):
            os.kill(worker, signal.SIGKILL)
