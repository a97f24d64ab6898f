"""`e31 submit MODULE ...`: hand a job to the local node, which offers it to the network.

The node reads the module and input files itself (the paths are sent made absolute), checks the
job, stores it and answers with the job id, printed as the last word of the last line. With
`--batch FILE.jsonl` each line is one job (args, env, inputs, stdin; relative paths are taken from
the file's directory) and the last word is the batch id. The batch file is read here, as the user, only
if it is a regular file of at most 1 MiB (batch_file.MAX_BATCH_BYTES); the node itself refuses a module,
input or stdin path that is not a regular file or whose last component is a symbolic link. A submission
is safe to leave (this node may stop) once it is handed off: its executor holds its data.
`--wait-handoff` waits for that. `--python SCRIPT.py` runs a Python script instead of a MODULE
(python_job.py). `--spec JOB.toml` reads every flag from a TOML file; flags given override it
(spec_file.py).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from ..config import add_data_dir_argument
from . import options, python_job, spec_file
from .main import CliError
from .progress import add_progress_argument

if TYPE_CHECKING:
    from ..api.client import ApiClient

_NOT_A_DEADLINE = "not a duration (90s, 10m, 2h, 1d, 1h30m) nor an ISO-8601 time (2026-12-01T08:00:00Z)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_data_dir_argument(parser)
    parser.add_argument(
        "module", type=Path, nargs="?", metavar="MODULE", help="the WebAssembly (WASI preview 1) module"
    )
    python_job.add_arguments(parser)
    options.add_job_arguments(parser)  # --input, --arg, --env, --stdin: as `e31 sandbox run` has them
    options.add_limit_arguments(parser)
    parser.add_argument(
        "--deadline",
        type=_deadline,
        metavar="DURATION|ISO-8601",
        help="when the result is needed: a duration from now (90s, 10m, 2h, 1d) or a time "
        "(2026-12-01T08:00:00Z); default 1h",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        metavar="K",
        help="run each job on K distinct nodes and compare: agreeing receipts make it done, "
        "any difference disputed (default 1)",
    )
    parser.add_argument(
        "--batch",
        type=Path,
        metavar="FILE.jsonl",
        help='many jobs of MODULE, one JSON object per line: {"args": [...], "env": {...}, '
        '"inputs": {"NAME": "PATH"}, "stdin": "PATH"} (each optional)',
    )
    parser.add_argument(
        "--wait-handoff",
        action="store_true",
        help="return only once every job is handed off (its executor holds its data: safe to stop this node)",
    )
    parser.add_argument(
        "--handoff-timeout",
        type=options.positive_duration,
        default=300.0,
        metavar=options.DURATION,
        help="give up waiting for the hand-off after this long (exit 1; the jobs stay submitted)",
    )
    parser.add_argument("--json", action="store_true", help="print the node's answer as JSON")
    spec_file.add_spec_argument(parser)
    add_progress_argument(parser)
    parser.set_defaults(accepts_passthrough=True)


def _deadline(text: str) -> str:
    """The text itself, once it is known to be a deadline: it is read against the clock when sent."""
    try:
        parse_deadline(text, 0.0)
    except CliError:
        raise argparse.ArgumentTypeError(f"{_NOT_A_DEADLINE}, got {text!r}") from None
    return text


def parse_deadline(text: str, now: float) -> int:
    """Milliseconds since the Unix epoch, from a duration or an ISO-8601 time (naive: local time): the
    Python client's reading (e31.client), so a deadline means the same to a script."""
    from ..client.errors import OptionError
    from ..client.ops import parse_deadline as read

    try:
        return read(text, now)
    except OptionError:
        raise CliError(f"--deadline {text!r}: {_NOT_A_DEADLINE}") from None


def _absolute(path: Path) -> str:
    return str(path.expanduser().absolute())


def request_body(args: argparse.Namespace, now: float) -> dict[str, object]:
    inputs = [{"name": name, "path": str(path)} for name, path in options.input_entries(args.input)]
    env = [[name, value] for name, value in args.env]
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
        **({} if getattr(args, "replicas", None) is None else {"replicas": args.replicas}),
    }


def batch_body(args: argparse.Namespace, now: float) -> dict[str, object]:
    """The POST /v1/batches body: the batch file's jobs (paths made absolute from its directory)."""
    from .batch_file import BatchError, parse_lines, read_batch_file

    per_job = [n for n in ("input", "arg", "env") if getattr(args, n)]
    if args.stdin is not None:
        per_job.append("stdin")
    if per_job or getattr(args, "passthrough", []):
        names = ", ".join(f"--{n}" for n in per_job) or "arguments after --"
        raise CliError(f"{names}: with --batch, each line of the batch file says these")
    try:
        text = read_batch_file(args.batch, f"--batch {args.batch}")
        jobs = parse_lines(text, str(args.batch))
    except BatchError as e:
        raise CliError(str(e), code=2) from None
    base = args.batch.expanduser().absolute().parent

    def absolute(value: object) -> object:
        return str(base / value) if isinstance(value, str) else value

    for job in jobs:
        inputs = job.get("inputs")
        if isinstance(inputs, dict):
            job["inputs"] = [{"name": k, "path": absolute(v)} for k, v in inputs.items()]
        elif isinstance(inputs, list):
            job["inputs"] = [
                {**i, "path": absolute(i.get("path"))} if isinstance(i, dict) else i for i in inputs
            ]
        if "stdin" in job:
            job["stdin"] = absolute(job["stdin"])
    single = request_body(args, now)
    shared: dict[str, object] = {
        k: single[k] for k in ("module", "limits", "deadline", "replicas") if k in single
    }
    return {**shared, "jobs": jobs}


def wait_handoff(api: ApiClient, ids: list[str], batch: str | None, timeout: float) -> list[str]:
    """Poll until every job is handed off or has ended; returns the ids still waiting at `timeout`."""
    import time

    from .common import call

    terminal = {"done", "failed", "expired", "cancelled", "disputed"}
    end = time.monotonic() + timeout
    pending = list(ids)
    while pending:
        if batch is not None:
            docs = call(api, "GET", f"/v1/batches/{batch}?brief=1")["jobs"]
        else:
            docs = [call(api, "GET", f"/v1/jobs/{j}") for j in pending]
        pending = [d["job_id"] for d in docs if not d.get("handed_off") and d["state"] not in terminal]
        if not pending or time.monotonic() >= end:
            break
        time.sleep(0.2 if batch is None else 1.0)
    return pending


def run(args: argparse.Namespace) -> int:
    import sys
    import time

    from .common import call, client

    if args.spec is not None:
        spec_file.apply_spec(args)
    python_job.prepare(args)
    body = batch_body(args, time.time()) if args.batch is not None else request_body(args, time.time())
    body = python_job.apply(args, body)
    api = client(args) if args.python is None else client(args, timeout=python_job.API_TIMEOUT)
    from .progress import Ticker, wanted

    what = "the node is reading and storing the module and inputs"  # an upload: the node reads the files
    if args.batch is not None:
        count = len(body["jobs"]) if isinstance(body["jobs"], list) else 0
        with Ticker(f"submitting {count} jobs: {what}", wanted(args)):
            answer = call(api, "POST", "/v1/batches", body)
        ids, name, batch = answer["job_ids"], answer["batch_id"], answer["batch_id"]
        line = f"submitted {len(ids)} jobs as batch {name}"
    else:
        with Ticker(f"submitting: {what}", wanted(args)):
            answer = call(api, "POST", "/v1/jobs", body)
        ids, name, batch = [answer["job_id"]], answer["job_id"], None
        line = f"submitted job {name}"
    waiting: list[str] = []
    if args.wait_handoff:
        waiting = wait_handoff(api, ids, batch, args.handoff_timeout)
    if args.json:
        print(json.dumps({**answer, "handed_off": args.wait_handoff and not waiting}))
    else:
        if not args.wait_handoff:
            print(
                "keep this node running until the submission is handed off "
                "(`e31 jobs` HANDOFF column, or `e31 submit --wait-handoff`); then it is safe to leave",
                file=sys.stderr,
            )
        elif waiting:
            print(f"{len(waiting)} of {len(ids)} jobs not handed off yet: keep this node running")
        else:
            print("handed off: safe to stop this node; results wait at the executors until it is back")
        print(line)
    return 1 if waiting else 0
