"""`e31 submit MODULE ...`: hand a job to the local node, which offers it to the network.

The node reads the module and input files itself (the paths are sent made absolute), checks the
job, stores it and answers with the job id, printed as the last word of the last line.
"""

from __future__ import annotations

import argparse
import json
import re
from datetime import UTC, datetime
from pathlib import Path

from .cli import CliError
from .config import add_data_dir_argument, parse_size

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_data_dir_argument(parser)
    parser.add_argument("module", type=Path, metavar="MODULE", help="the WebAssembly (WASI preview 1) module")
    parser.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="[NAME=]PATH",
        help="a file the job reads as /input/NAME (default NAME: the file's name); repeatable",
    )
    parser.add_argument(
        "--arg",
        action="append",
        default=[],
        metavar="A",
        help="one argument for the module; repeatable (or put them after --)",
    )
    parser.add_argument("--env", action="append", default=[], metavar="K=V", help="an environment variable")
    parser.add_argument("--stdin", type=Path, metavar="FILE", help="a file to feed as standard input")
    parser.add_argument("--fuel", type=_count, metavar="N", help="fuel limit (default 10G)")
    parser.add_argument("--memory", type=_size, metavar="BYTES", help="memory limit, e.g. 256MiB (default)")
    parser.add_argument("--timeout", type=_seconds, metavar="SECONDS", help="wall-clock limit (default 60)")
    parser.add_argument(
        "--max-output",
        type=_size,
        metavar="BYTES",
        help="cap on stdout + stderr + output files (default 64MiB)",
    )
    parser.add_argument(
        "--deadline",
        metavar="DURATION|ISO-8601",
        help="when the result is needed: a duration from now (90s, 10m, 2h, 1d) or a time "
        "(2026-12-01T08:00:00Z); default 1h",
    )
    parser.add_argument("--json", action="store_true", help="print the node's answer as JSON")
    parser.set_defaults(accepts_passthrough=True)


def _count(text: str) -> int:
    try:
        value = parse_size(text.replace("G", "g").replace("M", "m").replace("K", "k"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a count: {text!r} (e.g. 1000000, 5G)") from None
    return value


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds: {text!r}")
    return value


def parse_deadline(text: str, now: float) -> int:
    """Milliseconds since the Unix epoch, from a duration or an ISO-8601 time (naive: local time)."""
    m = _DURATION.match(text)
    if m is not None:
        return round((now + float(m.group(1)) * _UNITS[m.group(2)]) * 1000)
    try:
        when = datetime.fromisoformat(text.strip().replace("z", "Z").replace("Z", "+00:00"))
    except ValueError:
        raise CliError(
            f"--deadline {text!r}: not a duration (90s, 10m, 2h, 1d) nor an ISO-8601 time"
        ) from None
    if when.tzinfo is None:
        when = when.astimezone()
    return round(when.astimezone(UTC).timestamp() * 1000)


def _absolute(path: Path) -> str:
    return str(path.expanduser().absolute())


def request_body(args: argparse.Namespace, now: float) -> dict[str, object]:
    inputs = []
    for item in args.input:
        name, sep, path = item.partition("=")
        if not sep or Path(item).exists():  # a plain path (which may itself contain "=")
            name, path = Path(item).name, item
        inputs.append({"name": name, "path": _absolute(Path(path))})
    env = []
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise CliError(f"--env {item!r}: expected NAME=VALUE")
        env.append([name, value])
    limits = {
        "fuel": args.fuel,
        "memory": args.memory,
        "timeout": args.timeout,
        "max_output": args.max_output,
    }
    return {
        "module": _absolute(args.module),
        "inputs": inputs,
        "args": [*args.arg, *getattr(args, "passthrough", [])],
        "env": env,
        "stdin": None if args.stdin is None else _absolute(args.stdin),
        "limits": {k: v for k, v in limits.items() if v is not None},
        "deadline": None if args.deadline is None else parse_deadline(args.deadline, now),
    }


def run(args: argparse.Namespace) -> int:
    import time

    from .jobs_cli import call, client

    body = request_body(args, time.time())
    answer = call(client(args), "POST", "/v1/jobs", body)
    if args.json:
        print(json.dumps(answer))
    else:
        print(f"submitted job {answer['job_id']}")
    return 0
