"""`e31 sandbox run`: outcomes exit 0, usage errors exit 2, and never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from e31.node.cli.main import main

# Prints argv[1] and $GREETING's value, copies stdin to /output/echo.txt, exits 3.
ECHO_WAT = r"""(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_read" (func $fd_read (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_open"
    (func $path_open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "args_get" (func $args_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "environ_get" (func $environ_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $proc_exit (param i32)))
  (memory (export "memory") 1)
  (data (i32.const 256) "echo.txt")
  (func $strlen (param $p i32) (result i32) (local $n i32)
    (block $done (loop $l
      (br_if $done (i32.eqz (i32.load8_u (i32.add (local.get $p) (local.get $n)))))
      (local.set $n (i32.add (local.get $n) (i32.const 1))) (br $l)))
    (local.get $n))
  (func $print (param $p i32)
    (i32.store (i32.const 0) (local.get $p))
    (i32.store (i32.const 4) (call $strlen (local.get $p)))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8))))
  (func (export "_start")
    (drop (call $args_get (i32.const 1024) (i32.const 2048)))
    (call $print (i32.load (i32.const 1028)))
    (drop (call $environ_get (i32.const 1024) (i32.const 3072)))
    (call $print (i32.load (i32.const 1024)))
    (drop (call $path_open (i32.const 4) (i32.const 0) (i32.const 256) (i32.const 8) (i32.const 1)
                           (i64.const 64) (i64.const 0) (i32.const 0) (i32.const 12)))
    (i32.store (i32.const 0) (i32.const 4096)) (i32.store (i32.const 4) (i32.const 1024))
    (drop (call $fd_read (i32.const 0) (i32.const 0) (i32.const 1) (i32.const 8)))
    (i32.store (i32.const 4) (i32.load (i32.const 8)))
    (drop (call $fd_write (i32.load (i32.const 12)) (i32.const 0) (i32.const 1) (i32.const 8)))
    (call $proc_exit (i32.const 3))))
"""
LOOP_WAT = '(module (memory (export "memory") 1) (func (export "_start") (loop $l (br $l))))'


@pytest.fixture
def echo(tmp_path: Path) -> Path:
    path = tmp_path / "echo.wat"
    path.write_text(ECHO_WAT)
    return path


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict[str, object]:
    assert main(argv) == 0
    doc: dict[str, object] = json.loads(capsys.readouterr().out)
    return doc


def test_json_reports_every_documented_field(
    echo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stdin = tmp_path / "in.txt"
    stdin.write_text("from stdin")
    out = tmp_path / "out"
    doc = _json(
        capsys,
        [
            "sandbox",
            "run",
            str(echo),
            "--arg",
            "hello",
            "--env",
            "GREETING=hi there",
            "--stdin",
            str(stdin),
            "--output",
            str(out),
            "--json",
        ],
    )
    assert doc["status"] == "exited"
    assert doc["exit_code"] == 3
    assert doc["stdout"] == "helloGREETING=hi there"
    for key in (
        "fuel_used",
        "fuel_limit",
        "wall_seconds",
        "peak_memory_bytes",
        "stdout_sha256",
        "stderr_sha256",
        "output_files",
        "profile",
    ):
        assert key in doc
    assert (out / "echo.txt").read_text() == "from stdin"
    assert set(doc["output_files"]) == {"echo.txt"}  # type: ignore[arg-type]
    assert doc["profile"]["digest"] == doc["profile_digest"]  # type: ignore[index]


def test_guest_arguments_after_double_dash_may_follow_options(
    echo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _json(capsys, ["sandbox", "run", str(echo), "--json", "--", "-dashed"])
    assert str(doc["stdout"]).startswith("-dashed")


def test_double_dash_is_refused_where_nothing_takes_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["inspect", "-", "--", "x"])
    assert exc.value.code == 2
    assert "after '--'" in capsys.readouterr().err


def test_summary_mode_prints_the_guest_stdout_and_a_summary(
    echo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sandbox", "run", str(echo), "--arg", "x"]) == 0
    captured = capsys.readouterr()
    assert "exited (exit code 3)" in captured.err
    assert "fuel" in captured.err


def test_limits_apply(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    loop = tmp_path / "loop.wat"
    loop.write_text(LOOP_WAT)
    doc = _json(capsys, ["sandbox", "run", str(loop), "--fuel", "12345", "--json"])
    assert (doc["status"], doc["fuel_used"]) == ("out_of_fuel", 12345)
    doc = _json(
        capsys, ["sandbox", "run", str(loop), "--fuel", "1000000000000", "--timeout", "0.3", "--json"]
    )
    assert doc["status"] == "timeout"


@pytest.mark.parametrize("content", [b"\x00asm\x01\x00", b"garbage", b""])
def test_invalid_binaries_are_an_outcome(
    tmp_path: Path, content: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.wasm"
    path.write_bytes(content)
    doc = _json(capsys, ["sandbox", "run", str(path), "--json"])
    assert doc["status"] == "invalid_module"
    assert doc["message"]


def test_unparsable_text_is_an_outcome(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.wat"
    path.write_text("(module (func")
    assert _json(capsys, ["sandbox", "run", str(path), "--json"])["status"] == "invalid_module"
    path.write_text('(module (import "env" "f" (func)) (func (export "_start")))')
    assert _json(capsys, ["sandbox", "run", str(path), "--json"])["status"] == "invalid_module"


def test_usage_errors_exit_2(echo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "escape").symlink_to(a_file)
    bad = [
        ["sandbox", "run", str(tmp_path / "missing.wasm")],
        ["sandbox", "run", str(echo), "--fuel", "lots"],
        ["sandbox", "run", str(echo), "--fuel", "0"],
        ["sandbox", "run", str(echo), "--memory", "12 parsecs"],
        ["sandbox", "run", str(echo), "--memory", "100"],
        ["sandbox", "run", str(echo), "--timeout", "-1"],
        ["sandbox", "run", str(echo), "--timeout", "0"],
        ["sandbox", "run", str(echo), "--timeout", "8d"],
        ["sandbox", "run", str(echo), "--fuel", "2GiB"],
        ["sandbox", "run", str(echo), "--memory", "0.1K"],
        ["sandbox", "run", str(echo), "--env", "NOEQUALS"],
        ["sandbox", "run", str(echo), "--stdin", str(tmp_path / "missing")],
        ["sandbox", "run", str(echo), "--input", str(a_file)],
        ["sandbox", "run", str(echo), "--input", str(linked)],
        ["sandbox", "run", str(echo), "--output", str(a_file)],
        ["sandbox", "run", str(echo), "--seed", "abc"],
        ["sandbox", "run"],
        ["sandbox"],
    ]
    for argv in bad:
        try:
            code = main(argv)  # our own checks return 2 ...
        except SystemExit as e:  # ... argparse's exit with 2
            code = e.code
        assert code == 2, argv
        err = capsys.readouterr().err
        assert "Traceback" not in err
        assert "error" in err, argv


def test_sizes_take_binary_suffixes(echo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _json(capsys, ["sandbox", "run", str(echo), "--memory", "2M", "--max-output", "1K", "--json"])
    assert doc["status"] == "exited"


def test_fuel_takes_a_count_and_the_timeout_a_duration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loop = tmp_path / "loop.wat"
    loop.write_text(LOOP_WAT)
    doc = _json(capsys, ["sandbox", "run", str(loop), "--fuel", "20k", "--json"])
    assert (doc["status"], doc["fuel_used"], doc["fuel_limit"]) == ("out_of_fuel", 20_000, 20_000)
    doc = _json(capsys, ["sandbox", "run", str(loop), "--fuel", "2G", "--timeout", "300ms", "--json"])
    assert (doc["status"], doc["fuel_limit"]) == ("timeout", 2_000_000_000)


def test_a_real_process_never_prints_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.wasm"
    bad.write_bytes(b"\x00asm\x01\x00\x00\x00\x01")
    proc = subprocess.run(
        [sys.executable, "-m", "e31.node", "sandbox", "run", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0
    assert "invalid_module" in proc.stderr
    assert "Traceback" not in proc.stderr
