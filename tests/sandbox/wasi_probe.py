"""Probe guests for WASI conformance, run under our WASI and under wasmtime's own, side by side.

`probe(body)` wraps a `_start` body in a module that imports every preview-1 function (each as
`$name`, from sandbox.wasi.SIGNATURES) and one helper, `$rec`, that records an i32 (an errno, a flag
word, a count) in a list the guest prints to stdout at its end. `ours()` runs the module in our
sandbox (/input read-only at fd 3, /output writable at fd 4); `theirs()` runs it under wasmtime's
WASI with two host directories preopened at the same fds and with the same mutability. Comparing
the two lists is the differential test: same calls, same errnos.

`Probe` builds such a body step by step, each step with the value it must record (and, where
wasmtime answers otherwise on purpose, the value wasmtime records), and `verify()` runs both.

Memory layout: 0..8 an iovec, 8..16 a result slot (u32 or u64), 16..24 a second one, 24..128 scratch
structs (fdstat, filestat: the helpers below read their fields), strings at 256 and up, buffers at
1024 and up, the record list at 32768 and up.
"""

from __future__ import annotations

import struct
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import wasmtime
from e31.sandbox.job import JobSpec
from e31.sandbox.limits import Limits, Status
from e31.sandbox.runner import run
from e31.sandbox.wasi import SIGNATURES

RECORDS = 32768


def _imports() -> str:
    lines = []
    for name, (params, has_result) in sorted(SIGNATURES.items()):
        kinds = " ".join("i64" if k == "I" else "i32" for k in params)
        param = f"(param {kinds})" if kinds else ""
        result = "(result i32)" if has_result else ""
        lines.append(f'(import "wasi_snapshot_preview1" "{name}" (func ${name} {param} {result}))')
    return "\n".join(lines)


HELPERS = f"""
  (global $n (mut i32) (i32.const 0))
  (func $rec (param $v i32)
    (i32.store (i32.add (i32.const {RECORDS}) (i32.mul (global.get $n) (i32.const 4))) (local.get $v))
    (global.set $n (i32.add (global.get $n) (i32.const 1))))
  (func $flush
    (i32.store (i32.const 0) (i32.const {RECORDS}))
    (i32.store (i32.const 4) (i32.mul (global.get $n) (i32.const 4)))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8))))
  ;; path_open(dir, path at ptr/len, oflags, base rights, fdflags): the fd lands at 8; returns the errno
  (func $open (param $dir i32) (param $ptr i32) (param $len i32) (param $oflags i32) (param $rights i64)
    (param $fdflags i32) (result i32)
    (call $path_open (local.get $dir) (i32.const 0) (local.get $ptr) (local.get $len) (local.get $oflags)
      (local.get $rights) (local.get $rights) (local.get $fdflags) (i32.const 8)))
  (func $fd (result i32) (i32.load (i32.const 8)))
  ;; write len bytes at ptr to fd (count at 16); returns the errno
  (func $write (param $fd i32) (param $ptr i32) (param $len i32) (result i32)
    (i32.store (i32.const 0) (local.get $ptr))
    (i32.store (i32.const 4) (local.get $len))
    (call $fd_write (local.get $fd) (i32.const 0) (i32.const 1) (i32.const 16)))
  ;; read up to len bytes from fd into ptr (count at 16); returns the errno
  (func $read (param $fd i32) (param $ptr i32) (param $len i32) (result i32)
    (i32.store (i32.const 0) (local.get $ptr))
    (i32.store (i32.const 4) (local.get $len))
    (call $fd_read (local.get $fd) (i32.const 0) (i32.const 1) (i32.const 16)))
  (func $count (result i32) (i32.load (i32.const 16)))
  ;; fdstat of fd at 24: returns the errno; the fields through the getters below
  (func $fdstat (param $fd i32) (result i32) (call $fd_fdstat_get (local.get $fd) (i32.const 24)))
  (func $fdstat_type (result i32) (i32.load8_u (i32.const 24)))
  (func $fdstat_flags (result i32) (i32.load16_u (i32.const 26)))
  (func $fdstat_base_lo (result i32) (i32.load (i32.const 32)))
  (func $fdstat_base_hi (result i32) (i32.load (i32.const 36)))
  (func $fdstat_inh_lo (result i32) (i32.load (i32.const 40)))
  (func $fdstat_inh_hi (result i32) (i32.load (i32.const 44)))
  ;; filestat at 64: type at 80, size at 96, atim 104, mtim 112 (u64 each)
  (func $filestat (param $fd i32) (result i32) (call $fd_filestat_get (local.get $fd) (i32.const 64)))
  (func $stat_size (result i32) (i32.wrap_i64 (i64.load (i32.const 96))))
  (func $stat_type (result i32) (i32.load8_u (i32.const 80)))
  (func $seconds (param $ptr i32) (result i32)
    (i32.wrap_i64 (i64.div_u (i64.load (local.get $ptr)) (i64.const 1000000000))))
  (func $stat_atim_s (result i32) (call $seconds (i32.const 104)))
  (func $stat_mtim_s (result i32) (call $seconds (i32.const 112)))
"""


def probe(body: str, *, data: Mapping[int, bytes | str] | None = None) -> bytes:
    """A command module running `body`, then printing its record list."""
    segments = []
    for offset, value in (data or {}).items():
        raw = value.encode() if isinstance(value, str) else value
        text = "".join(f"\\{b:02x}" for b in raw)
        segments.append(f'(data (i32.const {offset}) "{text}")')
    text = f"""(module {_imports()} (memory (export "memory") 2) {" ".join(segments)} {HELPERS}
      (func (export "_start") {body} (call $flush)))"""
    return bytes(wasmtime.wat2wasm(text))


@dataclass(frozen=True)
class Str:
    """A string argument: placed in the guest's memory, passed as (pointer, length)."""

    text: str


@dataclass(frozen=True)
class Wat:
    """An argument or value given as raw WAT (an expression of the right type)."""

    text: str


FD = Wat("(call $fd)")
"""The fd the last $open returned."""

Arg = int | Str | Wat


@dataclass
class Step:
    text: str
    expected: int
    wasmtime: int | None
    record: bool = True


class Probe:
    """A guest built step by step: each step is one expression whose i32 value is recorded, with the
    value expected from our WASI and from wasmtime's (the same unless `wasmtime=` says otherwise;
    `wasmtime=SKIP` where wasmtime's answer is not comparable: a host clock, a host inode)."""

    def __init__(self) -> None:
        self.strings: dict[str, int] = {}
        self.next_string = 256
        self.steps: list[Step] = []

    def addr(self, text: str) -> int:
        """Where `text` sits in the guest's memory."""
        if text not in self.strings:
            self.strings[text] = self.next_string
            self.next_string += len(text.encode()) + 1
            assert self.next_string < 1024, "strings overflow their area"
        return self.strings[text]

    def _str(self, text: str) -> str:
        return f"(i32.const {self.addr(text)}) (i32.const {len(text.encode())})"

    def call(self, name: str, *args: Arg) -> str:
        kinds = list(SIGNATURES[name][0]) if name in SIGNATURES else None
        parts = []
        for a in args:
            if isinstance(a, Str):
                parts.append(self._str(a.text))
                if kinds is not None:
                    del kinds[:2]
            elif isinstance(a, Wat):
                parts.append(a.text)
                if kinds is not None:
                    del kinds[:1]
            else:
                wide = kinds is not None and kinds.pop(0) == "I"
                parts.append(f"(i64.const {a})" if wide else f"(i32.const {a})")
        return f"(call ${name} {' '.join(parts)})"

    def check(self, expr: str, expected: int, *, wasmtime: int | None = None) -> None:
        self.steps.append(Step(expr, int(expected), None if wasmtime is None else int(wasmtime)))

    def do(self, statement: str) -> None:
        """A statement that records nothing (setting up memory for the next call)."""
        self.steps.append(Step(statement, 0, None, record=False))

    def errno(self, name: str, *args: Arg, expected: int, wasmtime: int | None = None) -> None:
        self.check(self.call(name, *args), expected, wasmtime=wasmtime)

    def open(
        self, dirfd: Arg, path: str, *, oflags: int = 0, rights: int = 2, fdflags: int = 0, expected: int = 0
    ) -> None:
        """path_open with `rights` as base and inheriting rights; the fd lands where FD reads it."""
        dirarg = dirfd.text if isinstance(dirfd, Wat) else f"(i32.const {dirfd})"
        text = f"(call $open {dirarg} {self._str(path)} (i32.const {oflags}) (i64.const {rights}) " + (
            f"(i32.const {fdflags}))"
        )
        self.check(text, expected)

    def module(self) -> bytes:
        body = " ".join(f"(call $rec {s.text})" if s.record else s.text for s in self.steps)
        return probe(body, data={v: k for k, v in self.strings.items()})

    def verify(
        self,
        inputs: Mapping[str, bytes] | None = None,
        *,
        args: tuple[str, ...] = (),
        env: tuple[tuple[str, str], ...] = (),
        against_wasmtime: bool = True,
        exit_code: int = 0,
        root: Mapping[str, bytes] | None = None,
    ) -> None:
        """Run under our WASI (and wasmtime's), and assert every step gave what was expected and the
        guest exited with `exit_code` (a guest that exits early calls $flush itself first)."""
        module = self.module()
        got, code = ours(module, inputs, args=args, env=env, root=root)
        assert code == exit_code
        recorded = [s for s in self.steps if s.record]
        problems = _compare(recorded, got, lambda s: s.expected, "ours")
        if against_wasmtime:
            theirs_got, theirs_code = theirs(module, inputs, args=args, env=env, root=root)
            assert theirs_code == exit_code
            problems += _compare(
                recorded,
                theirs_got,
                lambda s: s.expected if s.wasmtime is None else s.wasmtime,
                "wasmtime",
            )
        assert not problems, "\n".join(problems)


SKIP = -(2**31)
"""A `wasmtime=` value: do not compare this step with wasmtime's answer."""


def _compare(steps: list[Step], got: list[int], want: Callable[[Step], int], who: str) -> list[str]:
    if len(got) != len(steps):
        return [f"{who}: {len(got)} records for {len(steps)} steps: {got}"]
    return [
        f"{who}: step {i} {s.text}: got {g}, expected {want(s)}"
        for i, (s, g) in enumerate(zip(steps, got, strict=True))
        if want(s) != SKIP and g != want(s)
    ]


def records(raw: bytes) -> list[int]:
    return [v for (v,) in struct.iter_unpack("<i", raw[: len(raw) // 4 * 4])]


def _write_tree(root: Path, files: Mapping[str, bytes]) -> None:
    for name, content in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)


def ours(
    module: bytes,
    inputs: Mapping[str, bytes] | None = None,
    *,
    args: tuple[str, ...] = (),
    env: tuple[tuple[str, str], ...] = (),
    root: Mapping[str, bytes] | None = None,
) -> tuple[list[int], int | None]:
    """(records, exit code) of a run in our sandbox (run_ours)."""
    out, code = run_ours(module, inputs, args=args, env=env, root=root)
    return records(out), code


def theirs(
    module: bytes,
    inputs: Mapping[str, bytes] | None = None,
    *,
    args: tuple[str, ...] = (),
    env: tuple[tuple[str, str], ...] = (),
    root: Mapping[str, bytes] | None = None,
) -> tuple[list[int], int | None]:
    """(records, exit code) of a run under wasmtime's WASI (run_theirs)."""
    out, code = run_theirs(module, inputs, args=args, env=env, root=root)
    return records(out), code


def run_ours(
    module: bytes,
    inputs: Mapping[str, bytes] | None = None,
    *,
    args: tuple[str, ...] = (),
    env: tuple[tuple[str, str], ...] = (),
    root: Mapping[str, bytes] | None = None,
) -> tuple[bytes, int | None]:
    """(stdout, exit code) of a run in our sandbox with `inputs` under /input, or with a writable
    root holding `root` (the only preopen, "/", at fd 3)."""
    with tempfile.TemporaryDirectory() as tmp:
        files = {}
        for name, content in (inputs or {}).items():
            path = Path(tmp) / name.replace("/", "_")
            path.write_bytes(content)
            files[name] = path
        writable_root = None
        if root is not None:
            writable_root = Path(tmp) / "root"
            writable_root.mkdir()
            _write_tree(writable_root, root)
        spec = JobSpec(module, args=args, env=env, inputs=files, limits=Limits(fuel=10**8))
        r = run(spec, writable_root=writable_root)
    assert r.status is Status.EXITED, (r.status, r.trap, r.message)
    return r.stdout, r.exit_code


def run_theirs(
    module: bytes,
    inputs: Mapping[str, bytes] | None = None,
    *,
    args: tuple[str, ...] = (),
    env: tuple[tuple[str, str], ...] = (),
    root: Mapping[str, bytes] | None = None,
) -> tuple[bytes, int | None]:
    """(stdout, exit code) of a run under wasmtime's own WASI: a read-only host directory holding
    `inputs` preopened as /input (fd 3), an empty writable one as /output (fd 4); or, with `root`,
    one writable directory holding `root` preopened as "/" (as `wasmtime --dir DIR::/`)."""
    engine = wasmtime.Engine()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        config = wasmtime.WasiConfig()
        config.argv = ["job.wasm", *args]
        config.env = list(env)
        if root is not None:
            (base / "root").mkdir()
            _write_tree(base / "root", root)
            config.preopen_dir(str(base / "root"), "/")
        else:
            (base / "in").mkdir()
            (base / "out").mkdir()
            _write_tree(base / "in", inputs or {})
            config.preopen_dir(str(base / "in"), "/input", fs_mutable=False)
            config.preopen_dir(str(base / "out"), "/output")
        config.stdout_file = str(base / "stdout")
        linker = wasmtime.Linker(engine)
        linker.define_wasi()
        store = wasmtime.Store(engine)
        store.set_wasi(config)
        code: int | None = 0
        try:
            instance = linker.instantiate(store, wasmtime.Module(engine, module))
            start = instance.exports(store)["_start"]
            assert isinstance(start, wasmtime.Func)
            start(store)
        except wasmtime.ExitTrap as e:
            code = e.code
        finally:
            store.close()
        return (base / "stdout").read_bytes(), code
