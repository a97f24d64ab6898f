"""Hostile modules: every one is contained, with the right outcome, and the host stays unharmed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from e31.sandbox.errors import InvalidModule, JobSpecError
from e31.sandbox.job import MAX_MODULE_BYTES, JobSpec, input_files_from_dir
from e31.sandbox.limits import Limits, RunResult, Status
from e31.sandbox.profile import PROFILE, new_engine
from e31.sandbox.runner import compile_module, run
from guests import O_CREAT, RIGHTS_READ, RIGHTS_WRITE, command, wat

MIB = 1 << 20
LOOP = "(loop $l (br $l))"


def go(module: bytes, output_dir: Path | None = None, **limits: float) -> RunResult:
    return run(JobSpec(module, limits=Limits(**limits)), output_dir)  # type: ignore[arg-type]


# -- cpu ---------------------------------------------------------------------------------------


def test_infinite_loop_runs_out_of_fuel_exactly_at_the_budget() -> None:
    r = go(command(LOOP), fuel=1_000_000)
    assert r.status is Status.OUT_OF_FUEL
    assert r.fuel_used == r.fuel_limit == 1_000_000
    assert r.reverifiable


def test_infinite_loop_in_the_start_function_is_stopped() -> None:
    module = command("", funcs=f"(func $spin {LOOP})", start="(start $spin)")
    r = go(module, fuel=500_000)
    assert r.status is Status.OUT_OF_FUEL
    assert r.fuel_used == 500_000


def test_fuel_is_exact_to_the_budget() -> None:
    counted = command("""
      (local $i i32)
      (loop $l (local.set $i (i32.add (local.get $i) (i32.const 1)))
               (br_if $l (i32.lt_u (local.get $i) (i32.const 10000))))""")
    needed = go(counted).fuel_used
    assert needed > 10000
    exact = go(counted, fuel=needed)
    assert (exact.status, exact.exit_code, exact.fuel_used) == (Status.EXITED, 0, needed)
    # Fuel is checked at loop heads and calls: a budget a few units short can still finish
    # (reported as using all of it); one short by a loop iteration stops exactly at the budget.
    outcomes = [go(counted, fuel=needed - k) for k in range(1, 20)]
    assert all(r.fuel_used == needed - k for k, r in enumerate(outcomes, 1))
    stopped = [r.status for r in outcomes].index(Status.OUT_OF_FUEL)
    assert all(r.status is Status.OUT_OF_FUEL for r in outcomes[stopped:])
    assert all(r.status is Status.EXITED for r in outcomes[:stopped])


def test_wall_clock_stops_a_loop_with_a_huge_fuel_budget() -> None:
    r = go(command(LOOP), fuel=10**18, wall_seconds=0.5)
    assert r.status is Status.TIMEOUT
    assert r.fuel_used == r.fuel_limit  # the documented rule: charged the whole budget
    assert not r.reverifiable
    assert r.wall_seconds >= 0.5


def test_wall_clock_also_stops_the_start_function() -> None:
    module = command("", funcs=f"(func $spin {LOOP})", start="(start $spin)")
    r = go(module, fuel=10**18, wall_seconds=0.3)
    assert r.status is Status.TIMEOUT


def test_a_paused_process_does_not_spend_the_wall_clock_budget() -> None:
    """A clock that jumps 1000 s (a SIGSTOP/SIGCONT pair) counts at most MAX_STEP of the jump."""
    readings = iter([0.0, 1000.0])

    def clock() -> float:
        return next(readings, 1000.0)

    counted = command("""(local $i i32)
      (loop $l (local.set $i (i32.add (local.get $i) (i32.const 1)))
               (br_if $l (i32.lt_u (local.get $i) (i32.const 1000))))""")
    r = run(JobSpec(counted, limits=Limits(wall_seconds=1.0)), clock=clock)
    assert r.status is Status.EXITED
    assert r.wall_seconds < 1.0


def test_stack_overflow_is_a_trap_of_its_own_kind() -> None:
    r = go(command("(call $down)", funcs="(func $down (call $down))"))
    assert (r.status, r.trap) == (Status.TRAP, "stack_overflow")
    assert r.reverifiable


def test_other_traps_name_their_kind() -> None:
    assert go(command("unreachable")).trap == "unreachable"
    r = go(command("(drop (i32.div_u (i32.const 1) (i32.const 0)))"))
    assert (r.status, r.trap) == (Status.TRAP, "integer_division_by_zero")
    r = go(command("(drop (i32.load (i32.const 70000)))"))
    assert r.trap == "memory_out_of_bounds"


# -- memory and tables --------------------------------------------------------------------------


def test_memory_grow_bomb_meets_the_limit() -> None:
    bomb = command("(loop $l (br_if $l (i32.ne (memory.grow (i32.const 1)) (i32.const -1)))) unreachable")
    r = go(bomb, memory_bytes=8 * MIB)
    assert r.status is Status.MEMORY_LIMIT
    assert r.peak_memory_bytes == 8 * MIB
    assert r.reverifiable


def test_a_guest_that_handles_a_refused_grow_keeps_its_exit_code() -> None:
    careful = command(
        "(if (i32.eq (memory.grow (i32.const 1000)) (i32.const -1)) (then (call $proc_exit (i32.const 12))))"
    )
    r = go(careful, memory_bytes=4 * MIB)
    assert (r.status, r.exit_code) == (Status.EXITED, 12)
    assert r.peak_memory_bytes == 65536


def test_huge_declared_initial_memory_is_a_memory_limit_not_a_crash() -> None:
    r = go(command("", memory='(memory (export "memory") 60000)'), memory_bytes=16 * MIB)
    assert r.status is Status.MEMORY_LIMIT
    assert r.fuel_used == 0
    assert "exceeds memory limits" in r.message


def test_table_grow_bomb_is_refused_at_the_table_cap() -> None:
    bomb = command(
        """
      (loop $l (br_if $l (i32.ne (table.grow $t (ref.null func) (i32.const 1024)) (i32.const -1))))
      (call $proc_exit (i32.shr_u (table.size $t) (i32.const 10)))""",
        funcs="(table $t 0 funcref)",
    )
    r = go(bomb)
    assert (r.status, r.exit_code) == (Status.EXITED, PROFILE.max_table_elements >> 10)


def test_huge_declared_table_is_a_memory_limit() -> None:
    r = go(command("", funcs="(table 10000000 funcref)"))
    assert r.status is Status.MEMORY_LIMIT


# -- output -------------------------------------------------------------------------------------


def test_stdout_flood_stops_at_the_output_cap() -> None:
    flood = command("(loop $l (drop (call $write (i32.const 1) (i32.const 1024) (i32.const 4096))) (br $l))")
    r = go(flood, max_output_bytes=100_000)
    assert r.status is Status.OUTPUT_LIMIT
    assert r.output_bytes <= 100_000
    assert len(r.stdout) == r.output_bytes == 24 * 4096
    assert r.reverifiable


def test_stderr_counts_against_the_same_cap() -> None:
    flood = command("(loop $l (drop (call $write (i32.const 2) (i32.const 1024) (i32.const 4096))) (br $l))")
    r = go(flood, max_output_bytes=50_000)
    assert r.status is Status.OUTPUT_LIMIT
    assert r.stdout == b""
    assert r.output_bytes <= 50_000


OUT_FILE = '(data (i32.const 256) "flood.bin")'


def test_output_file_flood_stops_at_the_cap_and_writes_only_what_fits(tmp_path: Path) -> None:
    flood = command(
        f"""
      (call $check (call $open (i32.const 4) (i32.const 256) (i32.const 9) (i32.const {O_CREAT})
                               (i64.const {RIGHTS_WRITE})))
      (loop $l (drop (call $write (i32.load (i32.const 12)) (i32.const 1024) (i32.const 4096))) (br $l))""",
        data=OUT_FILE,
    )
    out = tmp_path / "out"
    r = go(flood, out, max_output_bytes=200_000)
    assert r.status is Status.OUTPUT_LIMIT
    assert (out / "flood.bin").stat().st_size == r.output_bytes <= 200_000
    assert set(r.output_files) == {"flood.bin"}


def test_a_sparse_write_far_out_is_charged_for_the_bytes_it_would_store() -> None:
    sparse = command(
        f"""
      (call $check (call $open (i32.const 4) (i32.const 256) (i32.const 9) (i32.const {O_CREAT})
                               (i64.const {RIGHTS_WRITE})))
      (call $check (call $fd_seek (i32.load (i32.const 12)) (i64.const 0x10000000000) (i32.const 0)
                                  (i32.const 16)))
      (drop (call $write (i32.load (i32.const 12)) (i32.const 1024) (i32.const 1)))""",
        data=OUT_FILE,
    )
    r = go(sparse, max_output_bytes=MIB)
    assert r.status is Status.OUTPUT_LIMIT
    assert r.output_bytes == 0


def test_creating_files_without_end_meets_the_entry_cap() -> None:
    # Names are a counter in base 64 over the ASCII digits '0'..'o': create until it fails, then
    # exit with the errno.
    many = command(f"""
      (local $i i32) (local $e i32)
      (loop $l
        (i32.store (i32.const 256) (i32.add (i32.const 0x30303030) (i32.or (i32.or
          (i32.and (local.get $i) (i32.const 63))
          (i32.shl (i32.and (i32.shr_u (local.get $i) (i32.const 6)) (i32.const 63)) (i32.const 8)))
          (i32.shl (i32.and (i32.shr_u (local.get $i) (i32.const 12)) (i32.const 63)) (i32.const 16)))))
        (local.set $e (call $open (i32.const 4) (i32.const 256) (i32.const 4) (i32.const {O_CREAT})
                                  (i64.const {RIGHTS_WRITE})))
        (if (i32.eqz (local.get $e)) (then (drop (call $fd_close (i32.load (i32.const 12))))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br_if $l (i32.eqz (local.get $e))))
      (call $proc_exit (local.get $e))""")
    r = go(many)
    assert (r.status, r.exit_code) == (Status.EXITED, 51)  # ENOSPC
    assert len(r.output_files) == 10_000


# -- paths --------------------------------------------------------------------------------------


def _open_errno(path: str, dirfd: int = 3, oflags: int = 0, rights: int = RIGHTS_READ) -> int:
    raw = path.encode()
    data = '(data (i32.const 256) "' + "".join(f"\\{b:02x}" for b in raw) + '")'
    module = command(
        f"""(call $proc_exit (call $open (i32.const {dirfd}) (i32.const 256)
                         (i32.const {len(raw)}) (i32.const {oflags}) (i64.const {rights})))""",
        data=data,
    )
    r = run(JobSpec(module, inputs=_INPUTS))
    assert r.status is Status.EXITED
    assert r.exit_code is not None
    return r.exit_code


_INPUTS: dict[str, Path] = {}


@pytest.fixture(autouse=True)
def _inputs(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("hello\n")
    _INPUTS.clear()
    _INPUTS["a.txt"] = tmp_path / "in" / "a.txt"


@pytest.mark.parametrize(
    "path", ["../a.txt", "../../etc/passwd", "/etc/passwd", "/input/a.txt", "x/../../a.txt", "./../in/a.txt"]
)
def test_paths_out_of_a_preopen_are_refused(path: str) -> None:
    errno = _open_errno(path)
    assert errno in (44, 63)  # ENOENT for a missing middle component, else EPERM (as wasmtime)
    if path.startswith(("/", "..", "./..")):
        assert errno == 63


def test_paths_inside_the_preopen_resolve() -> None:
    assert _open_errno("a.txt") == 0
    assert _open_errno("./a.txt") == 0
    assert _open_errno("missing") == 44


def test_input_is_read_only() -> None:
    assert _open_errno("a.txt", rights=RIGHTS_WRITE) == 63  # EPERM, as wasmtime answers
    assert _open_errno("new.txt", oflags=O_CREAT, rights=RIGHTS_WRITE) == 63


def test_symlinks_among_inputs_are_refused(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("host data")
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    (inputs / "link").symlink_to(secret)
    with pytest.raises(JobSpecError, match="symbolic link"):
        input_files_from_dir(inputs)
    with pytest.raises(JobSpecError, match="symbolic link"):
        JobSpec(command(""), inputs={"link": inputs / "link"})
    (inputs / "link").unlink()
    (inputs / "dirlink").symlink_to(tmp_path, target_is_directory=True)
    with pytest.raises(JobSpecError, match="symbolic link"):
        input_files_from_dir(inputs)


@pytest.mark.parametrize("name", ["../x", "/abs", "a//b", "a/./b", "", "a\x00b", "a\\b"])
def test_bad_input_names_are_refused(name: str, tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(JobSpecError):
        JobSpec(command(""), inputs={name: f})


def test_nothing_is_written_outside_the_output_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    before = sorted(p for p in tmp_path.rglob("*"))
    attempts = ["../escape.txt", "/escape.txt", "../../escape.txt", "sub/../../escape.txt"]
    body = ""
    data = ""
    for i, path in enumerate(attempts):
        raw = path.encode()
        data += f'(data (i32.const {256 + 64 * i}) "{path}")'
        body += f"""(drop (call $open (i32.const 4) (i32.const {256 + 64 * i}) (i32.const {len(raw)})
                     (i32.const {O_CREAT}) (i64.const {RIGHTS_WRITE})))"""
    data += '(data (i32.const 1000) "ok.txt")'
    body += f"""(call $check (call $open (i32.const 4) (i32.const 1000) (i32.const 6) (i32.const {O_CREAT})
                (i64.const {RIGHTS_WRITE})))
              (drop (call $write (i32.load (i32.const 12)) (i32.const 1000) (i32.const 6)))"""
    out = tmp_path / "out"
    r = run(JobSpec(command(body, data=data)), out)
    assert (r.status, r.exit_code) == (Status.EXITED, 0)
    assert sorted(p for p in tmp_path.rglob("*") if out not in (p, *p.parents)) == before
    assert [p.name for p in out.iterdir()] == ["ok.txt"]


# -- refused modules ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "imports",
    [
        '(import "env" "f" (func))',
        '(import "wasi_snapshot_preview1" "sock_open" (func (param i32) (result i32)))',
        '(import "wasi_snapshot_preview1" "fd_write" (func (param i32) (result i32)))',
        '(import "wasi_snapshot_preview1" "fd_write" (memory 1))',
        '(import "env" "memory" (memory 1))',
        '(import "wasi_unstable" "fd_write" (func (param i32 i32 i32 i32) (result i32)))',
    ],
)
def test_imports_outside_the_granted_set_are_invalid(imports: str) -> None:
    module = wat(f'(module {imports} (func (export "_start")))')
    r = go(module)
    assert r.status is Status.INVALID_MODULE
    assert r.fuel_used == 0
    assert "import" in r.message
    with pytest.raises(InvalidModule):
        compile_module(new_engine(), module)


@pytest.mark.parametrize(
    "blob",
    [
        b"",
        b"\x00asm",
        b"\x00asm\x01\x00\x00\x00\xff\xff\xff",
        os.urandom(300),
        b'(module (func (export "_start")))',  # text is not a binary module
    ],
)
def test_malformed_modules_are_invalid(blob: bytes) -> None:
    r = go(blob)
    assert r.status is Status.INVALID_MODULE
    assert r.message


def test_truncated_module_is_invalid() -> None:
    whole = command("(call $print (i32.const 256) (i32.const 2))", data='(data (i32.const 256) "hi")')
    for cut in (len(whole) // 2, len(whole) - 1):
        assert go(whole[:cut]).status is Status.INVALID_MODULE


def test_oversized_module_is_invalid_without_compiling() -> None:
    r = go(b"\x00asm\x01\x00\x00\x00" + bytes(MAX_MODULE_BYTES))
    assert r.status is Status.INVALID_MODULE
    assert "more than" in r.message


def test_a_module_without_start_is_invalid() -> None:
    assert go(wat('(module (func (export "main")))')).status is Status.INVALID_MODULE


# -- exits --------------------------------------------------------------------------------------


@pytest.mark.parametrize("code", [0, 1, 3, 42, 255])
def test_proc_exit_codes(code: int) -> None:
    r = go(command(f"(call $proc_exit (i32.const {code})) unreachable"))
    assert (r.status, r.exit_code, r.trap) == (Status.EXITED, code, None)


def test_returning_from_start_is_exit_zero() -> None:
    r = go(command(""))
    assert (r.status, r.exit_code) == (Status.EXITED, 0)
