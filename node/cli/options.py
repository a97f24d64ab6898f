"""argparse `type=` functions for sizes, counts and durations, so every command reads them alike, and
the flags `e31 sandbox run` and `e31 submit` share (a job's inputs, arguments, environment, stdin and
limits: `add_job_arguments`, `add_limit_arguments`), defined once so they mean the same in both.

Each is a node/units.py parser whose UnitError becomes argparse.ArgumentTypeError with the same
message: a bad value gets argparse's usual one-line error and exit status 2. Ranges belong to whoever
owns the limit (the sandbox's Limits, the node's API), so `--fuel 0` is read here and refused there,
with that owner's reason; only options that are meaningless at zero (a poll interval, a hand-off
timeout) refuse it here.

`read_regular_file` (client/files.py, which the Python client shares; named here too) reads a file a
command is given (a batch file) only if it is a regular file, with a size cap, never blocking on a FIFO
or reading a device without end.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from ..client.files import file_kind as file_kind
from ..client.files import read_regular_file as read_regular_file
from ..errors import UsageError
from ..units import UnitError, parse_count, parse_duration, parse_size

T = TypeVar("T", int, float)

SIZE = "SIZE"
COUNT = "N"
DURATION = "DURATION"


def _argument(parse: Callable[[str], T], name: str, *, positive: bool = False) -> Callable[[str], T]:
    def convert(text: str) -> T:
        try:
            value = parse(text)
        except UnitError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        if positive and not value > 0:
            raise argparse.ArgumentTypeError(f"must be more than 0, got {text!r}")
        return value

    convert.__name__ = name
    return convert


size = _argument(parse_size, "size")
count = _argument(parse_count, "count")
positive_count = _argument(parse_count, "count", positive=True)
duration = _argument(parse_duration, "duration")
positive_duration = _argument(parse_duration, "duration", positive=True)


def add_limit_arguments(parser: argparse.ArgumentParser) -> None:
    """A job's limits, one definition for `e31 sandbox run` and `e31 submit`: the same flags mean the
    same there and here (unset ones take the sandbox's defaults)."""
    parser.add_argument("--fuel", type=count, metavar=COUNT, help="fuel budget (default 10G)")
    parser.add_argument("--memory", type=size, metavar=SIZE, help="linear memory limit (default 256MiB)")
    parser.add_argument(
        "--timeout",
        type=duration,
        metavar=DURATION,
        help="wall-clock limit while the job holds a core, e.g. 90s or 10m (default 60s)",
    )
    parser.add_argument(
        "--max-output",
        type=size,
        metavar=SIZE,
        help="cap on stdout + stderr + /output bytes (default 64MiB)",
    )


def env_pair(text: str) -> tuple[str, str]:
    """`--env NAME=VALUE` as a pair (the value may hold more `=`)."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """What a job is given, one definition for `e31 sandbox run` and `e31 submit` (and the keys of a
    spec file): --input, --arg, --env, --stdin mean the same in both."""
    parser.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="[NAME=]PATH",
        help="a file the job reads as /input/NAME (default NAME: the file's name), or a directory whose "
        "files it reads under /input (NAME/ first when NAME= is given); repeatable",
    )
    parser.add_argument(
        "--arg",
        action="append",
        default=[],
        metavar="A",
        help="one argument for the module; repeatable (or put them after --)",
    )
    parser.add_argument(
        "--env", action="append", type=env_pair, default=[], metavar="K=V", help="an environment variable"
    )
    parser.add_argument("--stdin", type=Path, metavar="FILE", help="a file to feed as standard input")


def input_entries(items: list[str]) -> list[tuple[str, Path]]:
    """The (guest name, host path) of each `--input [NAME=]PATH`: a file as NAME (default its file
    name), a directory as every regular file under it (NAME/ before their paths); UsageError for a
    path that is neither, a symbolic link inside a directory, or a name given twice."""
    from e31.sandbox.errors import JobSpecError
    from e31.sandbox.job import input_files_from_dir

    found: dict[str, Path] = {}

    def add(name: str, path: Path) -> None:
        if name in found:
            raise UsageError(f"--input: two inputs are named {name!r}")
        found[name] = path

    for item in items:
        name, sep, text = item.partition("=")
        if not sep or Path(item).exists():  # a plain path (which may itself contain "=")
            name, text = "", item
        path = Path(text).expanduser()
        if path.is_dir():
            try:
                files = input_files_from_dir(path)
            except JobSpecError as e:
                raise UsageError(f"--input {item}: {e}") from None
            for rel, host in sorted(files.items()):
                add(f"{name.rstrip('/')}/{rel}" if name else rel, host.absolute())
        else:
            add(name or path.name, path.absolute())
    return list(found.items())
