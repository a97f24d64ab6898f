"""`e31 results JOB|BATCH... --out DIR`: write finished jobs' stdout, stderr, output files and receipts.

One job (named by its id or a unique prefix) is written into DIR itself; a batch, or several jobs, into
one subfolder per job (NNNN-JOBID, in order) with DIR/index.json listing each job's folder, state,
outcome and arguments: the Python client's `results` (e31.client), so scripts and the CLI agree.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import add_data_dir_argument

if TYPE_CHECKING:
    from ..client.records import Result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_data_dir_argument(parser)
    parser.add_argument(
        "job",
        metavar="JOB|BATCH",
        help="a job id (or a unique prefix of it) or a batch id",
    )
    parser.add_argument(
        "more", nargs="*", metavar="JOB|BATCH", help="more jobs or batches, written beside the first"
    )
    parser.add_argument(
        "--out",
        required=True,
        type=Path,
        metavar="DIR",
        help="directory to write into (created if missing): stdout, stderr, output/..., "
        "receipt (the signed receipt envelope, exact bytes); for a batch or several jobs, one "
        "subfolder NNNN-JOBID per job and index.json (each job's folder, state, outcome, arguments)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace files already in DIR (by default one that differs is refused)",
    )
    parser.add_argument("--json", action="store_true", help="print what was written as JSON")


def run(args: argparse.Namespace) -> int:
    from ..client import ops
    from .common import client, run_op

    api = client(args)
    out = args.out.expanduser().resolve()
    found = run_op(api, ops.results([args.job, *args.more], out=out, overwrite=args.overwrite))
    if args.json:
        print(json.dumps([_written(r) for r in found], indent=2))
        return 0 if all(r.ok for r in found) else 1
    missing = [r for r in found if not r.ok]
    if len(found) == 1 and found[0].directory == out:
        for name in found[0].files:
            print(out / name)
        return 0
    print(
        f"wrote the results of {len(found) - len(missing)} of {len(found)} jobs into {out} "
        f"(index: {out / ops.INDEX})"
    )
    for r in missing:
        print(f"  {r.job_id[:12]}  {r.state}: no result", file=sys.stderr)
    return 1 if missing else 0


def _written(r: Result) -> dict[str, Any]:
    return {
        "job_id": r.job_id,
        "state": r.state,
        "succeeded": r.succeeded,
        "dir": None if r.directory is None else str(r.directory),
        "files": list(r.files),
    }
