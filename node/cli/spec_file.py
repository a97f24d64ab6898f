"""`e31 submit --spec job.toml`: a job described in a TOML file, one key for every flag of submit.

A key is the flag's long name without the dashes (`fuel`, `max-output`, `wait-handoff`, ...; `_` may
stand for `-`) and `module` for the positional MODULE. Values are what the flag takes: a string or a
number for a one-value flag (`fuel = "10G"` or `fuel = 10000000000`, `timeout = "90s"`), true or false
for a switch, a list for a repeatable flag (`arg = ["42", "1e6"]`; `args` is accepted too); `env` may
be a table (`env = { SEED = "7" }`) and `input` a table of names to paths (`input = { "data.csv" =
"in/data.csv" }`). Relative paths are taken from the spec file's directory. Every value goes through
the flag's own parser, so it is checked exactly as on the command line.

A flag given on the command line overrides the file's key (a repeatable flag replaces the file's list
whole). Unknown keys, values of the wrong kind, and a file that is not TOML are UsageErrors (one line,
exit 2) naming the file and the key.
"""

from __future__ import annotations

import argparse
import difflib
import tomllib
from pathlib import Path
from typing import Any

from ..errors import UsageError
from .options import read_regular_file

MAX_SPEC_BYTES = 1 << 20
PATH_KEYS = frozenset({"module", "stdin", "batch", "python", "python_path"})
"""Keys whose values are paths (relative ones are taken from the spec file's directory)."""
ALIASES = {"args": "arg", "inputs": "input"}
NOT_IN_A_SPEC = frozenset({"help", "spec", "accepts_passthrough"})


def add_spec_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--spec",
        type=Path,
        metavar="JOB.toml",
        help="read the job from a TOML file with a key per flag (module, input, arg, env, fuel, deadline, "
        "...); flags given here override it (docs/submitting.md)",
    )


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """The parser's actions by spec key (a flag's long name with `_` for `-`; `module`)."""
    found: dict[str, argparse.Action] = {}
    for action in parser._actions:
        if action.dest in NOT_IN_A_SPEC or action.dest == argparse.SUPPRESS:
            continue
        longs = [s for s in action.option_strings if s.startswith("--")]
        key = longs[0][2:].replace("-", "_") if longs else action.dest
        found[key] = action
    return found


def submit_parser() -> argparse.ArgumentParser:
    """`e31 submit`'s own parser (its actions say what each key takes, and its defaults)."""
    from .main import build_parser

    parser = build_parser(["submit"])
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sub: argparse.ArgumentParser = commands.choices["submit"]
    return sub


def apply_spec(args: argparse.Namespace, parser: argparse.ArgumentParser | None = None) -> None:
    """Fill `args` from the spec file `args.spec` wherever the command line left the default."""
    parser = parser or submit_parser()
    path: Path = args.spec
    label = f"--spec {path}"
    raw = read_regular_file(path, label, MAX_SPEC_BYTES)
    try:
        table = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise UsageError(f"{label}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{label}: not valid TOML: {e}") from None
    base = path.expanduser().absolute().parent
    actions = _actions(parser)
    for given_key, value in table.items():
        key = given_key.replace("-", "_")
        key = ALIASES.get(key, key)
        action = actions.get(key)
        if action is None:
            close = difflib.get_close_matches(key, list(actions), n=1)
            hint = f" (did you mean {close[0].replace('_', '-')!r}?)" if close else ""
            known = ", ".join(sorted(k.replace("_", "-") for k in actions))
            raise UsageError(f"{label}: unknown key {given_key!r}{hint}; the keys are: {known}")
        where = f"{label}: key {given_key!r}"
        current = getattr(args, action.dest)
        default = parser.get_default(action.dest)
        if current != default and not (isinstance(current, list) and not current):
            continue  # the command line said it: the command line wins
        if key == "arg" and getattr(args, "passthrough", []):
            continue  # arguments after `--` replace the file's
        setattr(args, action.dest, _value(action, key, value, base, where))


def _value(action: argparse.Action, key: str, value: Any, base: Path, where: str) -> Any:
    if isinstance(action, argparse._StoreTrueAction):
        if not isinstance(value, bool):
            raise UsageError(f"{where}: true or false, got {_kind(value)}")
        return value
    repeatable = isinstance(action, argparse._AppendAction)
    if repeatable:
        if isinstance(value, dict) and key in ("env", "input"):
            items = [f"{k}={v}" for k, v in value.items() if _scalar(v, where)]
            if key == "input":
                items = [f"{k}={_path(str(v), base)}" for k, v in value.items()]
        elif isinstance(value, list):
            items = [_text(v, where) for v in value]
            if key == "input":
                items = [_input(v, base) for v in items]
            elif key in PATH_KEYS:
                items = [str(_path(v, base)) for v in items]
        else:
            raise UsageError(
                f"{where}: a list{' or a table' if key in ('env', 'input') else ''}, got {_kind(value)}"
            )
        return [_convert(action, item, where) for item in items]
    text = _text(value, where)
    if key in PATH_KEYS:
        text = str(_path(text, base))
    return _convert(action, text, where)


def _convert(action: argparse.Action, text: str, where: str) -> Any:
    convert = action.type
    if convert is None:
        return text
    try:
        return convert(text)  # type: ignore[operator]
    except (argparse.ArgumentTypeError, ValueError) as e:
        raise UsageError(f"{where}: {e}") from None


def _scalar(value: Any, where: str) -> bool:
    _text(value, where)
    return True


def _text(value: Any, where: str) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise UsageError(f"{where}: a string or a number, got {_kind(value)}")
    return str(value)


def _path(text: str, base: Path) -> Path:
    path = Path(text).expanduser()
    return path if path.is_absolute() else base / path


def _input(item: str, base: Path) -> str:
    """A list entry of `input`: PATH or NAME=PATH, the path taken from the spec file's directory."""
    name, sep, text = item.partition("=")
    if not sep or (base / item).exists():
        return str(_path(item, base))
    return f"{name}={_path(text, base)}"


def _kind(value: Any) -> str:
    return {bool: "a boolean", list: "a list", dict: "a table"}.get(type(value), type(value).__name__)
