"""`e31 submit --python SCRIPT.py [--python-path DEPS.zip] ...`: a Python 3 script as a job.

The job's module is the CPython WASI interpreter (python_runtime.py: installed by the `python` extra,
checked against its pinned SHA-256 before use). The script travels as an input, /input/NAME (NAME the
script's file name), and the guest's argv is `[job.wasm, /input/NAME, *ARGS]`, so the script sees
`sys.argv == ["/input/NAME", *ARGS]` and `sys.path[0] == "/input"`: other inputs are importable by
name. Each `--python-path ZIP` is an input as well, put on `sys.path` through PYTHONPATH (zipimport:
pure-Python packages only, for example a `pip install --target DIR` zipped). Everything else is a
plain `e31 submit`: --input, --arg, --env, the limits, --batch (each line's args follow the script).
"""

from __future__ import annotations

import argparse
from pathlib import Path, PurePosixPath
from typing import Any

from ..errors import UsageError

INPUT_ROOT = PurePosixPath("/input")
API_TIMEOUT = 600.0
"""How long a Python job's submission may take: the node compiles a module it has not seen (the
26 MB interpreter: about 12 s on a quiet machine here, a minute on a loaded one) before it answers."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--python",
        type=Path,
        metavar="SCRIPT.py",
        help="run a Python 3 script in the CPython 3.12 WASI interpreter (instead of MODULE; needs "
        "e31-node[python]); --arg and arguments after -- go to the script",
    )
    parser.add_argument(
        "--python-path",
        action="append",
        default=[],
        type=Path,
        metavar="ZIP",
        help="with --python: a zip of pure-Python packages, given to the job as an input and put on "
        "sys.path; repeatable",
    )


def prepare(args: argparse.Namespace) -> None:
    """Checks MODULE against --python; for a Python job, sets args.module to the checked interpreter."""
    if args.python is None:
        if args.python_path:
            raise UsageError("--python-path: only with --python SCRIPT.py")
        if args.module is None:
            raise UsageError("give the MODULE to run, or --python SCRIPT.py")
        return
    if args.module is not None:
        raise UsageError(f"give MODULE ({args.module}) or --python SCRIPT.py, not both")
    from .python_runtime import interpreter

    for flag, path in [("--python", args.python), *(("--python-path", p) for p in args.python_path)]:
        if not path.expanduser().is_file():
            raise UsageError(f"{flag} {path}: no such file")
    names = [p.name for p in (args.python, *args.python_path)]
    for name in names:
        if not name or names.count(name) > 1:
            raise UsageError(f"--python and --python-path files need distinct names, got {name!r} twice")
    args.module = interpreter()


def _absolute(path: Path) -> str:
    return str(path.expanduser().absolute())


def _additions(args: argparse.Namespace) -> tuple[list[dict[str, str]], str, list[str] | None]:
    """The inputs a Python job adds (the script, the zips), the script's guest path, and the
    PYTHONPATH pair (None without zips)."""
    files = [args.python, *args.python_path]
    inputs = [{"name": p.name, "path": _absolute(p)} for p in files]
    zips = [str(INPUT_ROOT / p.name) for p in args.python_path]
    return inputs, str(INPUT_ROOT / args.python.name), (["PYTHONPATH", ":".join(zips)] if zips else None)


def _apply(job: dict[str, Any], inputs: list[dict[str, str]], script: str, path: list[str] | None) -> None:
    given = job.get("inputs") or []
    job["inputs"] = [*inputs, *given] if isinstance(given, list) else given  # a bad value: the node says why
    job_args = job.get("args") or []
    job["args"] = [script, *job_args] if isinstance(job_args, list) else job_args
    env = job.get("env") or []
    if path is not None and isinstance(env, list):

        def theirs(pair: object) -> bool:
            return isinstance(pair, list) and len(pair) == 2 and pair[0] == "PYTHONPATH"

        extra = [str(pair[1]) for pair in env if theirs(pair)]
        job["env"] = [["PYTHONPATH", ":".join([path[1], *extra])], *(p for p in env if not theirs(p))]


def apply(args: argparse.Namespace, body: dict[str, Any]) -> dict[str, Any]:
    """The POST /v1/jobs or /v1/batches body of a Python job, from the one MODULE would have given."""
    if args.python is None:
        return body
    inputs, script, path = _additions(args)
    for job in body.get("jobs", [body]):
        if isinstance(job, dict):
            _apply(job, inputs, script, path)
    return body
