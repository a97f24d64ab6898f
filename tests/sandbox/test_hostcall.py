"""The raw host-call binding (sandbox/hostcall.py): parameters, results, memory growth and exceptions."""

from __future__ import annotations

import struct

import pytest
from e31.sandbox import hostcall, wasi
from e31.sandbox.job import JobSpec
from e31.sandbox.limits import Status
from e31.sandbox.profile import new_engine
from e31.sandbox.runner import run
from e31.sandbox.vfs import E
from guests import O_CREAT, RIGHTS_WRITE, command


def test_a_view_taken_before_memory_grew_is_refreshed() -> None:
    """A pointer past the end is EFAULT; after memory.grow the same call reads the new page."""
    module = command(
        """
      (i32.store8 (i32.const 100) (i32.const 0x41))
      (call $print (i32.const 100) (i32.const 1))
      (i32.store (i32.const 16) (call $write (i32.const 1) (i32.const 65536) (i32.const 2)))
      (drop (memory.grow (i32.const 1)))
      (i32.store16 (i32.const 65536) (i32.const 0x4342))
      (call $check (call $write (i32.const 1) (i32.const 65536) (i32.const 2)))
      (call $proc_exit (i32.load (i32.const 16)))""",
        memory='(memory (export "memory") 1 2)',
    )
    r = run(JobSpec(module))
    assert (r.status, r.exit_code, r.stdout) == (Status.EXITED, E.FAULT, b"ABC")
    assert r.peak_memory_bytes == 2 * 65536


def test_i64_parameters_are_read_signed_from_their_slots() -> None:
    """fd_seek(fd, i64 delta, i32 whence, i32 out): a negative delta from the end, then the i32s after it."""
    module = command(
        """
      (call $check (call $open (i32.const 4) (i32.const 256) (i32.const 5) (i32.const 1)
                              (i64.const 64)))
      (call $check (call $write (i32.load (i32.const 12)) (i32.const 300) (i32.const 10)))
      (call $check (call $fd_seek (i32.load (i32.const 12)) (i64.const -3) (i32.const 2) (i32.const 32)))
      (call $print (i32.const 32) (i32.const 8))
      (call $proc_exit
        (call $fd_seek (i32.load (i32.const 12)) (i64.const -100) (i32.const 2) (i32.const 32)))""",
        data='(data (i32.const 256) "x.txt") (data (i32.const 300) "0123456789")',
    )
    assert O_CREAT == 1 and RIGHTS_WRITE == 64  # the literals above
    r = run(JobSpec(module))
    assert (r.status, r.exit_code) == (Status.EXITED, E.INVAL), r.message
    assert struct.unpack("<Q", r.stdout) == (7,)


def test_an_exception_in_a_host_function_is_a_host_error_and_the_next_run_is_clean(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(ctx: wasi.Context, m: wasi.Memory, fd: int) -> int:
        raise ValueError("a bug of ours")

    params, has_result, _ = wasi.FUNCTIONS["fd_close"]
    monkeypatch.setitem(wasi.FUNCTIONS, "fd_close", (params, has_result, broken))
    engine = new_engine()  # a new engine links the functions as they are now
    r = run(JobSpec(command("(drop (call $fd_close (i32.const 1)))")), engine=engine)
    assert (r.status, r.trap, r.reverifiable) == (Status.TRAP, "host_error", False)
    assert "ValueError: a bug of ours" in r.message
    ok = run(
        JobSpec(command("(call $print (i32.const 256) (i32.const 2))", data='(data (i32.const 256) "ok")')),
        engine=engine,
    )
    assert (ok.status, ok.exit_code, ok.stdout) == (Status.EXITED, 0, b"ok")


def test_the_raw_slot_layout_is_what_the_binding_assumes() -> None:
    """wasmtime_val_raw_t: 16 bytes, an i32 or i64 little-endian at its start (wasmtime 50's C API)."""
    assert hostcall.RAW_SIZE == 16
    assert struct.calcsize("<" + "".join(hostcall._RAW_FIELD[k] for k in "iI")) == 32
