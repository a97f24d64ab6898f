"""`e31 results JOB|BATCH... --out DIR`: write finished jobs' stdout, stderr, output files and receipts.

One job (named by its id or a unique prefix) is written into DIR itself; a batch, or several jobs, into
one subfolder per job (NNNN-JOBID, in order) with DIR/index.json listing each job's folder, state,
outcome and arguments: the Python client's `results` (e31.client), so scripts and the CLI agree.

`e31 results BATCH --merge FILE` merges the completions of an `e31 generate` batch into FILE, in the
prompts' order, with every job's results and receipt beside it in FILE.jobs/ (or --out DIR): the
client's `merge` (client/merge.py).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..config import add_data_dir_argument
from .main import CliError

if TYPE_CHECKING:
    from ..api.client import ApiClient
    from ..client.records import Result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_data_dir_argument(parser)
    parser.add_argument(
        "job",
        metavar="JOB|BATCH",
        help="a job id (or a unique prefix of it) or a batch id; with --merge, the batch id",
    )
    parser.add_argument(
        "more", nargs="*", metavar="JOB|BATCH", help="more jobs or batches, written beside the first"
    )
    parser.add_argument(
        "--out",
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
    parser.add_argument(
        "--merge",
        type=Path,
        metavar="FILE",
        help="for an `e31 generate` batch: write its completions, in the prompts' order, to FILE, and "
        "each job's results and receipt to FILE.jobs/NNNN-JOB/ (or under --out DIR)",
    )
    parser.add_argument(
        "--partial",
        action="store_true",
        help="with --merge: merge the finished jobs even if others are not, listing what is missing",
    )
    parser.add_argument("--json", action="store_true", help="print what was written as JSON")


def run(args: argparse.Namespace) -> int:
    from .common import client, run_op

    api = client(args)
    if args.merge is not None:
        if args.more:
            raise CliError("--merge takes one batch id", code=2)
        return _merge(api, args)
    if args.out is None:
        raise CliError("--out DIR is required (or --merge FILE for a batch of `e31 generate`)", code=2)
    if args.partial:
        raise CliError("--partial goes with --merge", code=2)
    import sys

    from ..client import ops

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


def _merge(api: ApiClient, args: argparse.Namespace) -> int:
    import sys

    from ..client.merge import merge
    from ..store.batches import is_batch_id
    from .common import run_op

    batch_id = args.job.strip().lower()
    if not is_batch_id(batch_id):
        raise CliError(f"--merge takes a batch id (batch-...), got {args.job!r}", code=2)
    op = merge(batch_id, args.merge, partial=args.partial, overwrite=args.overwrite, jobs_dir=args.out)
    report = run_op(api, op)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
        return 0
    for m in report.missing:
        print(f"missing: lines {m.first}-{m.last} (job {m.job_id}: {m.state}: {m.why})", file=sys.stderr)
    print(f"receipts and results of each job: {report.jobs_dir}/", file=sys.stderr)
    print(
        f"wrote {report.completions} completions ({report.error_lines} error lines) from "
        f"{report.merged_jobs} of {report.jobs} jobs to {report.out}"
    )
    return 0
