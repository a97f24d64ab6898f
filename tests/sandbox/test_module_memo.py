"""Modules by reference between the pool and a worker: both memos agree over any sequence of requests
(evictions included), a module the worker holds travels as its digest, and a reference it does not hold
is a protocol violation that ends the worker."""

from __future__ import annotations

import random
from pathlib import Path

import msgpack
import pytest
from e31.sandbox.job import JobSpec, module_digest
from e31.sandbox.worker import (
    EXIT_PROTOCOL,
    MEMO_BYTES,
    MEMO_MODULES,
    ModuleMemo,
    ProtocolViolation,
    decode_spec,
    encode_spec,
    read_frame,
    write_frame,
)
from test_worker import spawn_worker

WORKLOADS = Path(__file__).resolve().parents[2] / "sandbox" / "workloads"
ECHO = (WORKLOADS / "echo.wasm").read_bytes()


def module(i: int, size: int) -> bytes:
    """Distinct module bytes of about `size` (the memos never compile them)."""
    return b"\x00asm\x01\x00\x00\x00" + b"%d;" % i + bytes(size)


def wire(obj: object) -> object:
    return msgpack.unpackb(msgpack.packb(obj, use_bin_type=True), raw=False, use_list=True)


def test_pool_and_worker_memos_agree_through_evictions() -> None:
    rng = random.Random(5)
    big = MEMO_BYTES // 3
    specs = [JobSpec(module(i, rng.choice([10, 1000, 1000, big]))) for i in range(MEMO_MODULES + 4)]
    pool, worker = ModuleMemo(keep=False), ModuleMemo(keep=True)
    by_reference = 0
    for _ in range(200):
        spec = rng.choice(specs)
        sent = wire(encode_spec(spec, pool))
        assert isinstance(sent, list)
        by_reference += isinstance(sent[0], list)
        assert decode_spec(sent, worker).module == spec.module
    assert 0 < by_reference < 200
    too_big = module(99, MEMO_BYTES + 1)  # never remembered: always sent whole
    for _ in range(2):
        sent = wire(encode_spec(JobSpec(too_big), pool))
        assert isinstance(sent, list) and sent[0] == too_big
        assert decode_spec(sent, worker).module == too_big


def test_a_module_sent_before_travels_as_its_digest() -> None:
    pool, worker = ModuleMemo(keep=False), ModuleMemo(keep=True)
    first = encode_spec(JobSpec(ECHO, args=("a",)), pool)
    second = encode_spec(JobSpec(ECHO, args=("b",)), pool)
    assert first[0] == ECHO and second[0] == [bytes.fromhex(module_digest(ECHO))]
    assert decode_spec(wire(first), worker).args == ("a",)
    again = decode_spec(wire(second), worker)
    assert again.module == ECHO and again.module_sha256 == module_digest(ECHO) and again.args == ("b",)
    with pytest.raises(ProtocolViolation, match="does not hold"):
        decode_spec(wire(second), ModuleMemo(keep=True))  # a worker that was never sent it


def test_a_worker_sent_a_reference_it_does_not_hold_exits(tmp_path: Path) -> None:
    proc, requests, replies = spawn_worker(tmp_path / "cache")
    try:
        with requests, replies:
            assert read_frame(replies) == ["ready", proc.pid]
            spec = encode_spec(JobSpec(ECHO))
            spec[0] = [bytes(32)]
            write_frame(requests, ["run", 1, spec, None, None])
            assert proc.wait(timeout=30) == EXIT_PROTOCOL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
