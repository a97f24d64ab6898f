"""Sandbox speed: per-job overhead, host-call rate, input streaming, fuel metering cost.

Run: .venv/bin/python tests/bench/bench_sandbox_core.py
Prints medians of 3 rounds; exits 1 if a floor is missed. The floors sit well below what this
2-core machine does; they catch regressions such as a Linker rebuilt per job, a whole input
loaded into memory, or a per-byte Python loop in the WASI layer.
"""

from __future__ import annotations

import hashlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

import wasmtime
from e31.sandbox.job import JobSpec
from e31.sandbox.limits import Limits, Status
from e31.sandbox.profile import new_engine
from e31.sandbox.runner import compile_module, run

FLOORS = {
    "small_jobs_per_s": 300.0,
    # Bound by wasmtime-py's Python trampoline (about half of each call converts the result).
    "host_calls_per_s": 10_000.0,
    "input_read_mb_per_s": 300.0,
    "stdout_write_mb_per_s": 200.0,
}

WASI = """
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_read" (func $fd_read (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_open"
    (func $path_open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "clock_time_get" (func $clock (param i32 i64 i32) (result i32)))
  (memory (export "memory") 20)
"""

HELLO = f"""(module {WASI} (data (i32.const 64) "hello\\n")
  (func (export "_start")
    (i32.store (i32.const 0) (i32.const 64)) (i32.store (i32.const 4) (i32.const 6))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))))"""

CLOCKS = f"""(module {WASI}
  (func (export "_start") (local $i i32)
    (loop $l (drop (call $clock (i32.const 1) (i64.const 0) (i32.const 16)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (i32.const 100000))))))"""

# Read /input/big.bin in 1 MiB reads (buffer at 64 KiB), discarding it.
READ = f"""(module {WASI} (data (i32.const 64) "big.bin")
  (func (export "_start")
    (drop (call $path_open (i32.const 3) (i32.const 0) (i32.const 64) (i32.const 7) (i32.const 0)
                           (i64.const 2) (i64.const 0) (i32.const 0) (i32.const 12)))
    (loop $l
      (i32.store (i32.const 0) (i32.const 65536)) (i32.store (i32.const 4) (i32.const 1048576))
      (drop (call $fd_read (i32.load (i32.const 12)) (i32.const 0) (i32.const 1) (i32.const 8)))
      (br_if $l (i32.load (i32.const 8))))))"""

# 64 MiB to stdout in 1 MiB writes.
WRITE = f"""(module {WASI}
  (func (export "_start") (local $i i32)
    (loop $l
      (i32.store (i32.const 0) (i32.const 65536)) (i32.store (i32.const 4) (i32.const 1048576))
      (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (i32.const 64))))))"""


def _median(fn: object, rounds: int = 3) -> float:
    return statistics.median(fn() for _ in range(rounds))  # type: ignore[operator]


def main() -> int:
    engine = new_engine()
    hello = bytes(wasmtime.wat2wasm(HELLO))
    compiled = compile_module(engine, hello)

    def small_jobs() -> float:
        n = 500
        t = time.perf_counter()
        for _ in range(n):
            r = run(JobSpec(hello), engine=engine, module=compiled)
        assert r.status is Status.EXITED
        return n / (time.perf_counter() - t)

    clocks = bytes(wasmtime.wat2wasm(CLOCKS))

    def host_calls() -> float:
        t = time.perf_counter()
        r = run(JobSpec(clocks), engine=engine)
        assert r.status is Status.EXITED
        return 100_000 / (time.perf_counter() - t)

    with tempfile.TemporaryDirectory() as tmp:
        big = Path(tmp) / "big.bin"
        size = 256 << 20
        with big.open("wb") as f:
            block = hashlib.sha256(b"x").digest() * (1 << 15)
            for _ in range(size // len(block)):
                f.write(block)
        reader = bytes(wasmtime.wat2wasm(READ))

        def input_read() -> float:
            t = time.perf_counter()
            r = run(JobSpec(reader, inputs={"big.bin": big}), engine=engine)
            assert r.status is Status.EXITED, r.message
            return size / (1 << 20) / (time.perf_counter() - t)

        figures = {
            "small_jobs_per_s": _median(small_jobs),
            "host_calls_per_s": _median(host_calls),
            "input_read_mb_per_s": _median(input_read),
        }

    writer = bytes(wasmtime.wat2wasm(WRITE))

    def stdout_write() -> float:
        t = time.perf_counter()
        r = run(JobSpec(writer, limits=Limits(max_output_bytes=128 << 20)), engine=engine)
        assert r.status is Status.EXITED, r.message
        return 64 / (time.perf_counter() - t)

    figures["stdout_write_mb_per_s"] = _median(stdout_write)
    t = time.perf_counter()
    compile_module(new_engine(), hello)
    figures["compile_small_module_ms"] = (time.perf_counter() - t) * 1000

    failed = False
    for name, value in figures.items():
        floor = FLOORS.get(name)
        ok = floor is None or value >= floor
        failed |= not ok
        note = (f"   (floor {floor:,.0f})" if floor else "") + ("" if ok else "  MISSED")
        print(f"{name:28s} {value:12,.1f}{note}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
