"""`e31 receipts export [--job JOB|BATCH]... --out FILE [--with-blobs]`: have the running node write a
bundle. A job is named by its id, a unique prefix or a batch id (all of its jobs).

The node (found through --data-dir / E31_DATA_DIR) writes the file itself (POST /v1/receipts/export),
atomically, at the absolute path this command resolves --out to.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from e31.node.cli.main import CliError
from e31.node.config import add_data_dir_argument

from .progress import add_progress_argument

EXPORT_TIMEOUT = 600.0


def _job_ref(text: str) -> str:
    """A job id, a prefix of one or a batch id, by its shape (the node resolves it: api/resolve.py)."""
    t = text.strip().lower()
    if t.startswith("batch-") or (6 <= len(t) <= 64 and not t.strip("0123456789abcdef")):
        return text
    raise argparse.ArgumentTypeError(
        f"not a job id, a prefix of at least 6 hex digits or a batch id: {text!r}"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = sub.add_parser(
        "export",
        help="write the receipts of some or all jobs into one bundle file",
        description="Write the signed offers, assignments, receipts, acknowledgements, tree "
        "heads and inclusion proofs of jobs into one bundle (docs/auditing.md).",
    )
    add_data_dir_argument(p)
    p.add_argument(
        "--job",
        dest="jobs",
        action="append",
        type=_job_ref,
        metavar="JOB|BATCH",
        help="a job to export: its id, a unique prefix, or a batch id for all its jobs (repeat for more; "
        "default: every job the node knows)",
    )
    p.add_argument("--out", required=True, metavar="FILE", help="the bundle file to write")
    p.add_argument(
        "--with-blobs",
        action="store_true",
        help="include the module, input and stdin blobs, so `e31 audit --reexecute` can re-run",
    )
    p.add_argument("--overwrite", action="store_true", help="replace FILE if it exists (refused otherwise)")
    p.add_argument("--json", action="store_true", help="print the node's answer as JSON")
    add_progress_argument(p)


def run(args: argparse.Namespace) -> int:
    from e31.node.api.client import ApiClient, ApiClientError

    out = Path(os.path.abspath(os.path.expanduser(args.out)))
    if out.is_dir():
        raise CliError(f"--out {out} is a directory; give a file name")
    if not out.parent.is_dir():
        raise CliError(f"--out {out}: the directory {out.parent} does not exist")
    from .common import expand_ids
    from .progress import Ticker, wanted

    try:
        with ApiClient(args.data_dir, timeout=EXPORT_TIMEOUT) as api:
            jobs = None if args.jobs is None else expand_ids(api, args.jobs)
            body = {"jobs": jobs, "with_blobs": args.with_blobs, "out": str(out), "overwrite": args.overwrite}
            with Ticker(f"exporting the receipts of {len(jobs) if jobs else 'all'} jobs", wanted(args)):
                answer = api.post("/v1/receipts/export", body)
    except ApiClientError as e:
        raise CliError(str(e)) from None
    if not isinstance(answer, dict):
        raise CliError("the node's answer to POST /v1/receipts/export is not an object")
    if args.json:
        json.dump(answer, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    missing = answer.get("missing_blobs") or []
    counts = ", ".join(_count(answer.get(k), k) for k in ("jobs", "envelopes", "blobs", "bytes"))
    print(f"wrote {answer.get('path', out)}: {counts}")
    corrupt = answer.get("corrupt_blobs") or []
    if corrupt:
        print(
            f"warning: {len(corrupt)} blob(s) needed to re-run failed their hash check on this node and "
            f"were quarantined (left out of the bundle): {', '.join(m[:16] for m in corrupt[:5])}",
            file=sys.stderr,
        )
    if missing:
        print(
            f"warning: the node lacks {len(missing)} blob(s) needed to re-run; `e31 audit --reexecute` "
            f"will report them: {', '.join(m[:16] for m in missing[:5])}",
            file=sys.stderr,
        )
    return 0


def _count(n: object, noun: str) -> str:
    return f"{n} {noun[:-1] if n == 1 else noun}"
