"""`e31 sandbox run`: each outcome its exit code, usage errors exit 2, and never a traceback."""

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


@pytest.fixture(autouse=True)
def _data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The module cache goes under a data dir of the test's own, never the user's."""
    data_dir = tmp_path / "data"
    monkeypatch.setenv("E31_DATA_DIR", str(data_dir))
    return data_dir


@pytest.fixture
def echo(tmp_path: Path) -> Path:
    path = tmp_path / "echo.wat"
    path.write_text(ECHO_WAT)
    return path


def _json(capsys: pytest.CaptureFixture[str], argv: list[str], code: int = 0) -> dict[str, object]:
    assert main(argv) == code
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
        code=3,
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
    doc = _json(capsys, ["sandbox", "run", str(echo), "--json", "--", "-dashed"], code=3)
    assert str(doc["stdout"]).startswith("-dashed")


def test_double_dash_is_refused_where_nothing_takes_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["inspect", "-", "--", "x"])
    assert exc.value.code == 2
    assert "after '--'" in capsys.readouterr().err


def test_summary_mode_prints_the_guest_stdout_and_a_summary(
    echo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sandbox", "run", str(echo), "--arg", "x"]) == 3
    captured = capsys.readouterr()
    assert "exited (exit code 3)" in captured.err
    assert "fuel" in captured.err


def test_limits_apply(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    loop = tmp_path / "loop.wat"
    loop.write_text(LOOP_WAT)
    doc = _json(capsys, ["sandbox", "run", str(loop), "--fuel", "12345", "--json"], code=122)
    assert (doc["status"], doc["fuel_used"]) == ("out_of_fuel", 12345)
    doc = _json(
        capsys,
        ["sandbox", "run", str(loop), "--fuel", "1000000000000", "--timeout", "0.3", "--json"],
        code=124,
    )
    assert doc["status"] == "timeout"


@pytest.mark.parametrize("content", [b"\x00asm\x01\x00", b"garbage", b""])
def test_invalid_binaries_are_an_outcome(
    tmp_path: Path, content: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.wasm"
    path.write_bytes(content)
    doc = _json(capsys, ["sandbox", "run", str(path), "--json"], code=120)
    assert doc["status"] == "invalid_module"
    assert doc["message"]


def test_unparsable_text_is_an_outcome(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.wat"
    path.write_text("(module (func")
    assert _json(capsys, ["sandbox", "run", str(path), "--json"], 120)["status"] == "invalid_module"
    path.write_text('(module (import "env" "f" (func)) (func (export "_start")))')
    assert _json(capsys, ["sandbox", "run", str(path), "--json"], 120)["status"] == "invalid_module"


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
    doc = _json(capsys, ["sandbox", "run", str(echo), "--memory", "2M", "--max-output", "1K", "--json"], 3)
    assert doc["status"] == "exited"


def test_fuel_takes_a_count_and_the_timeout_a_duration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    loop = tmp_path / "loop.wat"
    loop.write_text(LOOP_WAT)
    doc = _json(capsys, ["sandbox", "run", str(loop), "--fuel", "20k", "--json"], 122)
    assert (doc["status"], doc["fuel_used"], doc["fuel_limit"]) == ("out_of_fuel", 20_000, 20_000)
    doc = _json(capsys, ["sandbox", "run", str(loop), "--fuel", "2G", "--timeout", "300ms", "--json"], 124)
    assert (doc["status"], doc["fuel_limit"]) == ("timeout", 2_000_000_000)


def test_a_real_process_never_prints_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.wasm"
    bad.write_bytes(b"\x00asm\x01\x00\x00\x00\x01")
    proc = subprocess.run(
        [sys.executable, "-m", "e31.node", "sandbox", "run", "--no-cache", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 120
    assert "invalid_module" in proc.stderr
    assert "Traceback" not in proc.stderr


def _module(tmp_path: Path, body: str, memory: int = 1) -> Path:
    path = tmp_path / "guest.wat"
    path.write_text(f"""(module
      (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
      (import "wasi_snapshot_preview1" "proc_exit" (func $proc_exit (param i32)))
      (memory (export "memory") {memory})
      (data (i32.const 256) "oops: it went wrong\\n")
      (func (export "_start") {body}))""")
    return path


WRITE_STDERR = """(i32.store (i32.const 0) (i32.const 256)) (i32.store (i32.const 4) (i32.const 20))
    (drop (call $fd_write (i32.const 2) (i32.const 0) (i32.const 1) (i32.const 8)))"""


@pytest.mark.parametrize(
    ("body", "memory", "flags", "code"),
    [
        ("", 1, [], 0),
        ("(call $proc_exit (i32.const 7))", 1, [], 7),
        ("(call $proc_exit (i32.const 119))", 1, [], 119),
        ("(call $proc_exit (i32.const 120))", 1, [], 119),
        ("(call $proc_exit (i32.const 256))", 1, [], 119),
        ("(call $proc_exit (i32.const -1))", 1, [], 119),
        ("unreachable", 1, [], 121),
        ("(loop $l (br $l))", 1, ["--fuel", "10k"], 122),
        ("", 64, ["--memory", "1M"], 123),
        ("(loop $l (br $l))", 1, ["--fuel", "1T", "--timeout", "200ms"], 124),
        (WRITE_STDERR, 1, ["--max-output", "10"], 125),
    ],
)
def test_the_exit_code_tells_each_outcome(
    tmp_path: Path, body: str, memory: int, flags: list[str], code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sandbox", "run", *flags, str(_module(tmp_path, body, memory))]) == code
    assert "e31 sandbox:" in capsys.readouterr().err


def test_the_guests_stderr_is_shown_on_stderr_before_the_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    module = _module(tmp_path, WRITE_STDERR + "(call $proc_exit (i32.const 1))")
    assert main(["sandbox", "run", str(module)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("oops: it went wrong\ne31 sandbox: exited (exit code 1)")


def test_streams_longer_than_the_result_holds_are_shown_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from e31.sandbox.wasi import DISPLAY_CAP

    n = DISPLAY_CAP + 4096
    body = f"""(i32.store (i32.const 0) (i32.const 65536)) (i32.store (i32.const 4) (i32.const {n}))
      (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))"""
    assert main(["sandbox", "run", str(_module(tmp_path, body, memory=20))]) == 0
    captured = capsys.readouterr()
    assert captured.out == "\0" * n


def test_a_module_compiles_once_then_loads_from_the_cache(
    tmp_path: Path, _data_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import e31.sandbox.runner as runner

    module = _module(tmp_path, "(call $proc_exit (i32.const 5))")
    assert main(["sandbox", "run", "--no-cache", str(module)]) == 5
    assert not (_data_dir / "module-cache").exists()
    assert main(["sandbox", "run", str(module)]) == 5
    entries = list((_data_dir / "module-cache").glob("*.cwasm"))
    assert len(entries) == 1
    assert (_data_dir / "module-cache").stat().st_mode & 0o077 == 0

    def no_compiling(*args: object) -> None:
        raise AssertionError("compiled again")

    monkeypatch.setattr(runner, "compile_module", no_compiling)
    assert main(["sandbox", "run", str(module)]) == 5  # loaded, not compiled
    capsys.readouterr()
    # With another data dir the same run must compile (and here cannot).
    assert main(["sandbox", "run", "--data-dir", str(tmp_path / "other"), str(module)]) == 70
    assert "compiled again" in capsys.readouterr().err


def test_the_cache_directory_is_the_nodes() -> None:
    from e31.node.cli.sandbox import CACHE_SUBDIR
    from e31.node.market.service import MODULE_CACHE_DIR

    assert CACHE_SUBDIR == MODULE_CACHE_DIR
