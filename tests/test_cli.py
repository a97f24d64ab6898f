"""The CLI shell: help, version, unknown commands, start-up that imports only what it needs, and the units
its options share (node/units.py)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from e31.node.cli import main as cli


def _e31(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "e31.node", *args], capture_output=True, text=True)


def test_help_lists_every_command() -> None:
    proc = _e31("--help")
    assert proc.returncode == 0
    for name in cli.COMMANDS:
        assert name in proc.stdout


def test_version() -> None:
    proc = _e31("--version")
    assert proc.returncode == 0
    assert proc.stdout.startswith("e31 ")


def test_no_command_prints_usage_and_exits_2() -> None:
    proc = _e31()
    assert proc.returncode == 2
    assert "usage: e31" in proc.stderr


def test_unknown_command_is_a_usage_error() -> None:
    proc = _e31("frobnicate")
    assert proc.returncode == 2
    assert "invalid choice" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_help_imports_no_heavy_module() -> None:
    code = (
        "import sys, json\n"
        "from e31.node.cli import main as cli\n"
        "try:\n    cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(json.dumps(sorted(m for m in ('trio', 'wasmtime', 'zeroconf', 'nacl', 'msgpack', 'sqlite3')"
        " if m in sys.modules)))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []


def test_command_modules_have_the_interface() -> None:
    import importlib

    for name, (module_name, help_text) in cli.COMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError:  # pragma: no cover - a registered command must exist
            raise AssertionError(f"command {name} names missing module {module_name}") from None
        assert callable(module.add_arguments) and callable(module.run), name
        assert help_text


# --- sizes, counts and durations mean the same in every command ------------------------------------------


def _parse(*argv: str) -> argparse.Namespace:
    return cli.build_parser(list(argv)).parse_args(list(argv))


@pytest.mark.parametrize(
    ("flags", "limits"),
    [
        (["--memory", "64M"], {"memory": 64 << 20}),
        (["--memory", "64MiB"], {"memory": 64 << 20}),
        (["--memory", "64MB"], {"memory": 64_000_000}),
        (["--fuel", "2G"], {"fuel": 2_000_000_000}),
        (["--fuel", "2e9"], {"fuel": 2_000_000_000}),
        (["--fuel", "1_000_000"], {"fuel": 1_000_000}),
        (["--timeout", "90"], {"timeout": 90.0}),
        (["--timeout", "1m30s"], {"timeout": 90.0}),
        (["--timeout", "500ms"], {"timeout": 0.5}),
        (["--max-output", "1K"], {"max_output": 1024}),
        (
            ["--memory", "1.5G", "--fuel", "5M", "--timeout", "2h", "--max-output", "16MiB"],
            {"memory": 3 << 29, "fuel": 5_000_000, "timeout": 7200.0, "max_output": 16 << 20},
        ),
    ],
)
def test_limits_mean_the_same_in_sandbox_run_and_submit(flags: list[str], limits: dict[str, object]) -> None:
    from e31.node.cli.sandbox import limits_from
    from e31.node.cli.submit import request_body

    assert request_body(_parse("submit", "job.wasm", *flags), 0.0)["limits"] == limits
    local = limits_from(_parse("sandbox", "run", "job.wasm", *flags))
    fields = {
        "memory": "memory_bytes",
        "fuel": "fuel",
        "timeout": "wall_seconds",
        "max_output": "max_output_bytes",
    }
    assert {key: getattr(local, fields[key]) for key in limits} == limits


def test_deadlines_and_waits_take_durations() -> None:
    from e31.node.cli.submit import request_body

    body = request_body(
        _parse("submit", "job.wasm", "--deadline", "1h30m", "--handoff-timeout", "10m"), 1000.0
    )
    assert body["deadline"] == (1000 + 5400) * 1000
    assert _parse("submit", "job.wasm", "--handoff-timeout", "10m").handoff_timeout == 600.0
    assert _parse("wait", "abcdef", "--timeout", "2m").timeout == 120.0


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--memory", "64 parsecs"], "argument --memory: expected a size, got '64 parsecs'"),
        (
            ["--memory", "0.1K"],
            "argument --memory: expected a size, got '0.1K' (not a whole number of bytes)",
        ),
        (["--max-output", "lots"], "argument --max-output: expected a size, got 'lots'"),
        (["--fuel", "2GiB"], "argument --fuel: expected a count, got '2GiB'"),
        (["--fuel", "1.5"], "argument --fuel: expected a count, got '1.5' (not a whole number)"),
        (["--fuel=-5"], "argument --fuel: expected a count, got '-5' (negative)"),
        (["--timeout", "soon"], "argument --timeout: expected a number of seconds or a duration, got 'soon'"),
        (
            ["--timeout=-1"],
            "argument --timeout: expected a number of seconds or a duration, got '-1' (negative)",
        ),
    ],
)
def test_bad_units_are_one_argparse_line_and_exit_2_in_both_commands(
    argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for command in (["sandbox", "run", "job.wasm"], ["submit", "job.wasm"]):
        with pytest.raises(SystemExit) as done:
            cli.main([*command, *argv])
        assert done.value.code == 2
        last = capsys.readouterr().err.strip().splitlines()[-1]
        assert last.startswith(f"e31 {command[0]}") and fragment in last, last


@pytest.mark.parametrize(
    "argv",
    [
        ["submit", "job.wasm", "--deadline", "tomorrow"],
        ["submit", "job.wasm", "--handoff-timeout", "0"],
        ["wait", "abcdef", "--timeout", "forever"],
    ],
)
def test_other_bad_durations_are_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    assert done.value.code == 2
    assert "error: argument --" in capsys.readouterr().err


@pytest.mark.parametrize(("batch", "kind"), [("/dev/zero", "a character device"), ("/", "a directory")])
def test_a_batch_file_that_is_not_a_regular_file_is_one_usage_line(
    batch: str, kind: str, tmp_path: Path
) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "e31.node", "submit", "m.wasm", "--batch", batch],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "E31_DATA_DIR": str(tmp_path)},
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"e31: error: --batch {batch}: {kind}, not a regular file"]


@pytest.mark.parametrize("command", [["results"], ["receipts", "export"]])
def test_the_commands_that_write_files_take_overwrite(command: list[str]) -> None:
    proc = _e31(*command, "--help")
    assert proc.returncode == 0 and "--overwrite" in proc.stdout
