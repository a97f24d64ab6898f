"""`e31 results JOB --out DIR`: write a finished job's stdout, stderr, output files and receipt."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..config import add_data_dir_argument


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_data_dir_argument(parser)
    parser.add_argument("job", metavar="JOB", help="the job id (or a unique prefix of it)")
    parser.add_argument(
        "--out",
        required=True,
        type=Path,
        metavar="DIR",
        help="directory to write into (created if missing): stdout, stderr, output/..., "
        "receipt (the signed receipt envelope, exact bytes)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace files already in DIR (by default one that differs is refused)",
    )
    parser.add_argument("--json", action="store_true", help="print what was written as JSON")


def run(args: argparse.Namespace) -> int:
    from .common import call, client, resolve_ids

    api = client(args)
    (job_id,) = resolve_ids(api, [args.job])
    out = args.out.expanduser().resolve()
    answer = call(api, "POST", f"/v1/jobs/{job_id}/results", {"out": str(out), "overwrite": args.overwrite})
    if args.json:
        print(json.dumps(answer, indent=2))
    else:
        for name in answer["files"]:
            print(out / name)
    return 0
