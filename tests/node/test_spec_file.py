"""`e31 submit --spec job.toml`: every flag of submit as a key, values through the flags' own parsers,
paths from the file's directory, the command line overriding the file, and typed one-line errors for
unknown keys, wrong kinds and files that are not TOML."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from e31.node.cli.spec_file import _actions, apply_spec, submit_parser
from e31.node.cli.submit import request_body
from e31.node.errors import UsageError


def _args(tmp_path: Path, spec: str, *argv: str) -> argparse.Namespace:
    (tmp_path / "job.toml").write_text(spec)
    parser = submit_parser()
    args = parser.parse_args([*argv, "--spec", str(tmp_path / "job.toml")])
    args.passthrough = []
    apply_spec(args, parser)
    return args


def test_a_spec_says_what_the_flags_say(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "data.csv").write_text("1,2\n")
    spec = """
module = "job.wasm"
input = { "table.csv" = "in/data.csv" }
args = ["42", "--flag"]
env = { SEED = "7", MODE = "a=b" }
stdin = "in/data.csv"
fuel = "5G"
memory = "64MiB"
timeout = 90
max-output = "1MiB"
replicas = 2
"""
    from_spec = request_body(_args(tmp_path, spec), 0.0)
    monkeypatch.chdir(tmp_path)
    flags = [
        "job.wasm",
        "--input",
        "table.csv=in/data.csv",
        "--arg",
        "42",
        "--arg=--flag",
        "--env",
        "SEED=7",
        "--env",
        "MODE=a=b",
        "--stdin",
        "in/data.csv",
        "--fuel",
        "5G",
        "--memory",
        "64MiB",
        "--timeout",
        "90",
        "--max-output",
        "1MiB",
        "--replicas",
        "2",
    ]
    args = submit_parser().parse_args(flags)
    args.passthrough = []
    assert from_spec == request_body(args, 0.0)
    assert from_spec["limits"] == {
        "fuel": 5_000_000_000,
        "memory": 64 << 20,
        "timeout": 90.0,
        "max_output": 1 << 20,
    }
    assert from_spec["module"] == str(tmp_path / "job.wasm")


def test_the_command_line_overrides_the_spec(tmp_path: Path) -> None:
    spec = 'module = "a.wasm"\nfuel = "5G"\narg = ["1", "2"]\nwait-handoff = true\ndeadline = "2h"\n'
    args = _args(tmp_path, spec, "b.wasm", "--fuel", "1G", "--arg", "3")
    assert (args.module, args.fuel, args.arg, args.wait_handoff) == (Path("b.wasm"), 10**9, ["3"], True)
    assert args.deadline == "2h"


def test_every_flag_of_submit_is_a_key(tmp_path: Path) -> None:
    keys = set(_actions(submit_parser()))
    flags = {
        s[2:].replace("-", "_")
        for a in submit_parser()._actions
        for s in a.option_strings
        if s.startswith("--") and s not in ("--help", "--spec")
    }
    assert flags <= keys and "module" in keys
    assert {"input", "arg", "env", "stdin", "fuel", "memory", "timeout", "max_output", "deadline"} <= keys


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ('fuell = "5G"', "unknown key 'fuell' (did you mean 'fuel'?)"),
        ("fuel = true", "key 'fuel': a string or a number, got a boolean"),
        ('fuel = "lots"', "key 'fuel': "),
        ('arg = "x"', "key 'arg': a list, got str"),
        ('env = ["NOEQUALS"]', "key 'env': expected NAME=VALUE"),
        ('wait-handoff = "yes"', "key 'wait-handoff': true or false"),
        ('deadline = "tomorrow"', "key 'deadline': not a duration"),
        ("module = ", "not valid TOML"),
    ],
)
def test_a_bad_spec_is_one_usage_error(tmp_path: Path, spec: str, message: str) -> None:
    with pytest.raises(UsageError) as e:
        _args(tmp_path, spec)
    assert message in str(e.value) and str(tmp_path / "job.toml") in str(e.value)
    assert e.value.exit_code == 2


def test_a_spec_that_is_not_a_file_is_refused(tmp_path: Path) -> None:
    parser = submit_parser()
    args = parser.parse_args(["--spec", str(tmp_path)])
    with pytest.raises(UsageError, match="a directory"):
        apply_spec(args, parser)
