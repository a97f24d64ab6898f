"""Our virtual WASI: what a guest can read and write, and the errno it gets otherwise."""

from __future__ import annotations

import hashlib
import os
import random
from pathlib import Path

import pytest
from e31.sandbox.job import JobSpec
from e31.sandbox.limits import Limits, Status
from e31.sandbox.runner import run
from e31.sandbox.vfs import E, Errno, OutputBudget, OutputFile, OutputLimit, Tree
from e31.sandbox.wasi import SIGNATURES
from guests import RIGHTS_READ, command, wat

# Copy fd (at 12, or stdin) to stdout in 64 KiB reads until end of file.
CAT = """
  (i32.store (i32.const 0) (i32.const 65536))
  (i32.store (i32.const 4) (i32.const 65536))
  (loop $l
    (call $check (call $fd_read {fd} (i32.const 0) (i32.const 1) (i32.const 8)))
    (if (i32.load (i32.const 8)) (then
      (call $print (i32.const 65536) (i32.load (i32.const 8)))
      (i32.store (i32.const 0) (i32.const 65536))
      (i32.store (i32.const 4) (i32.const 65536))
      (br $l))))"""
MEM2 = '(memory (export "memory") 2)'


def test_a_large_input_is_served_whole_and_exact(tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(3 * 1024 * 1024 + 17))
    module = command(
        f"""(call $check (call $open (i32.const 3) (i32.const 256) (i32.const 7) (i32.const 0)
                                                  (i64.const {RIGHTS_READ})))"""
        + CAT.format(fd="(i32.load (i32.const 12))"),
        data='(data (i32.const 256) "big.bin")',
        memory=MEM2,
    )
    r = run(JobSpec(module, inputs={"big.bin": big}))
    assert (r.status, r.exit_code) == (Status.EXITED, 0), r.message
    assert r.stdout_sha256 == hashlib.sha256(big.read_bytes()).hexdigest()
    assert r.output_bytes == big.stat().st_size


def test_stdin_is_the_given_file_or_empty(tmp_path: Path) -> None:
    src = tmp_path / "stdin.txt"
    src.write_bytes(b"line one\nline two\n")
    module = command(CAT.format(fd="(i32.const 0)"), memory=MEM2)
    assert run(JobSpec(module, stdin=src)).stdout == b"line one\nline two\n"
    empty = run(JobSpec(module))
    assert (empty.status, empty.stdout) == (Status.EXITED, b"")


def test_args_and_environment_are_exactly_the_jobs() -> None:
    module = command("""
      (call $check (call $args_sizes_get (i32.const 16) (i32.const 20)))
      (call $check (call $args_get (i32.const 1024) (i32.const 2048)))
      (call $print (i32.const 2048) (i32.load (i32.const 20)))
      (call $check (call $environ_sizes_get (i32.const 16) (i32.const 20)))
      (call $check (call $environ_get (i32.const 1024) (i32.const 4096)))
      (call $print (i32.const 4096) (i32.load (i32.const 20)))""")
    r = run(JobSpec(module, args=("one", "two words"), env=(("A", "1"), ("B", "x=y"))))
    assert r.stdout == b"job.wasm\x00one\x00two words\x00A=1\x00B=x=y\x00"


def test_preopens_are_input_then_output() -> None:
    module = command("""
      (call $check (call $fd_prestat_dir_name (i32.const 3) (i32.const 1024) (i32.const 6)))
      (call $check (call $fd_prestat_dir_name (i32.const 4) (i32.const 1030) (i32.const 7)))
      (call $print (i32.const 1024) (i32.const 13))
      (call $proc_exit (call $fd_prestat_dir_name (i32.const 5) (i32.const 1024) (i32.const 10)))""")
    r = run(JobSpec(module))
    assert (r.stdout, r.exit_code) == (b"/input/output", E.BADF)


def test_pointers_outside_memory_get_efault_not_a_crash() -> None:
    module = command("""
      (i32.store (i32.const 0) (i32.const 0xfffffff0))
      (i32.store (i32.const 4) (i32.const 64))
      (call $proc_exit (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))""")
    r = run(JobSpec(module))
    assert (r.status, r.exit_code, r.output_bytes) == (Status.EXITED, E.FAULT, 0)


def test_a_module_without_memory_gets_efault() -> None:
    module = wat("""(module
      (import "wasi_snapshot_preview1" "fd_write" (func $w (param i32 i32 i32 i32) (result i32)))
      (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))
      (func (export "_start")
        (call $exit (call $w (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))))""")
    r = run(JobSpec(module))
    assert (r.status, r.exit_code) == (Status.EXITED, E.FAULT)


def test_output_limit_of_zero_allows_a_silent_job() -> None:
    assert run(JobSpec(command(""), limits=Limits(max_output_bytes=0))).status is Status.EXITED


# -- the tree itself --------------------------------------------------------------------------


def _tree(limit: int = 1000) -> Tree:
    return Tree(OutputBudget(limit))


def _errno(fn: object, *args: object) -> E:
    with pytest.raises(Errno) as info:
        fn(*args)  # type: ignore[operator]
    return info.value.code


def test_directories_rename_and_remove_like_posix() -> None:
    t = _tree()
    out = t.output
    t.mkdir(out, b"a")
    t.mkdir(out, b"a/b")
    assert _errno(t.mkdir, out, b"a") is E.EXIST
    assert _errno(t.rmdir, out, b"a") is E.NOTEMPTY
    assert _errno(t.rename, out, b"a", out, b"a/b/c") is E.INVAL
    f = t.create_file(t.lookup(out, b"a/b"), "f")  # type: ignore[arg-type]
    assert _errno(t.unlink, out, b"a/b") is E.ISDIR
    assert _errno(t.rename, out, b"a/b/f", out, b"a") is E.ISDIR
    t.rename(out, b"a/b/f", out, b"g")
    assert t.lookup(out, b"g") is f
    assert _errno(t.lookup, out, b"g/") is E.NOTDIR
    t.unlink(out, b"g")
    t.rmdir(out, b"a/b")
    assert [name for name, _ in t.output_entries()] == ["a"]
    assert _errno(t.rmdir, out, b"..") is E.PERM


def test_the_input_tree_cannot_change() -> None:
    t = _tree()
    t.add_input(("d", "x"), Path("unused"), 1)
    assert _errno(t.mkdir, t.input, b"new") is E.PERM
    assert _errno(t.unlink, t.input, b"d/x") is E.PERM
    assert _errno(t.rename, t.input, b"d/x", t.output, b"x") is E.PERM
    assert _errno(t.create_file, t.input, "y") is E.PERM


def test_names_are_checked() -> None:
    t = _tree()
    assert _errno(t.lookup, t.output, b"/x") is E.PERM
    assert _errno(t.lookup, t.output, b"\xff") is E.ILSEQ
    assert _errno(t.lookup, t.output, b"a\x00") is E.INVAL
    assert _errno(t.lookup, t.output, b"x" * 256) is E.NAMETOOLONG
    assert _errno(t.lookup, t.output, b"") is E.NOENT


def test_only_growth_is_charged_and_charged_before_it_is_stored() -> None:
    t = _tree(limit=10)
    f = t.create_file(t.output, "f")
    assert isinstance(f, OutputFile)
    t.write_at(f, 0, b"12345678")
    t.write_at(f, 0, b"abcdefgh")  # overwriting is free
    assert t.budget.used == 8
    with pytest.raises(OutputLimit):
        t.write_at(f, 8, b"xyz")
    assert bytes(f.data) == b"abcdefgh"
    t.resize(f, 2)
    t.write_at(f, 2, b"cd")  # growth after a truncation is charged again
    assert t.budget.used == 10
    with pytest.raises(OutputLimit):
        t.resize(f, 5)


# -- every function, called with hostile arguments --------------------------------------------------

_EDGE_I32 = [
    0,
    1,
    2,
    3,
    4,
    5,
    7,
    8,
    12,
    16,
    0xFFFF,
    0x10000 - 1,
    0x10000 - 8,
    0x10000,
    0x7FFFFFFF,
    -1,
    -8,
    0x80000000,
]
_EDGE_I64 = [0, 1, -1, 2**62, -(2**63), 2**63 - 1, 5_000_000_000]


def _garbage_calls(name: str, seed: int, calls: int) -> bytes:

    params, has_result = SIGNATURES[name]
    rng = random.Random(seed)
    sig = " ".join("i64" if k == "I" else "i32" for k in params)
    body = []
    for _ in range(calls):
        args = []
        for k in params:
            if k == "I":
                v = rng.choice(_EDGE_I64) if rng.random() < 0.7 else rng.getrandbits(64) - 2**63
                args.append(f"(i64.const {v})")
            else:
                v = rng.choice(_EDGE_I32) if rng.random() < 0.7 else rng.randrange(0, 0x10000)
                args.append(f"(i32.const {v if v < 2**31 else v - 2**32})")
        call = f"(call $f {' '.join(args)})"
        body.append(f"(drop {call})" if has_result else call)
    result = "(result i32)" if has_result else ""
    return wat(f"""(module
      (import "wasi_snapshot_preview1" "{name}" (func $f (param {sig}) {result}))
      (memory (export "memory") 1)
      (data (i32.const 0) "a.txt\\00\\00\\00d/b.txt\\00d\\00..\\00")
      (func (export "_start") {" ".join(body)}))""")


def test_every_function_survives_garbage_arguments(tmp_path: Path) -> None:
    f = tmp_path / "a.txt"
    f.write_bytes(b"0123456789" * 100)
    for name in sorted(SIGNATURES):
        if name == "proc_exit":
            continue
        for seed in range(3):
            r = run(
                JobSpec(
                    _garbage_calls(name, seed, 60),
                    inputs={"a.txt": f, "d/b.txt": f},
                    limits=Limits(max_output_bytes=1 << 20),
                )
            )
            assert r.status in (Status.EXITED, Status.OUTPUT_LIMIT), (name, seed, r.trap, r.message)
            assert r.trap != "host_error"
