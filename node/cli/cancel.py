"""`e31 cancel JOB...`: withdraw jobs (or whole batches) this node submitted.

The node signs a `cancel` for each job, sends it to the job's executor and out on gossip, and the job
ends `cancelled`. A job that has already ended keeps its state; the line says so.
"""

from __future__ import annotations

import argparse
import json

from ..config import add_data_dir_argument


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_data_dir_argument(parser)
    parser.add_argument("jobs", nargs="+", metavar="JOB", help="job ids (or unique prefixes) or batch ids")
    parser.add_argument("--reason", default="", metavar="TEXT", help="why (sent with the signed cancel)")
    parser.add_argument("--json", action="store_true", help="print the answers as a JSON list")


def run(args: argparse.Namespace) -> int:
    from .common import call, client, expand_ids

    api = client(args)
    answers = []
    for job_id in expand_ids(api, args.jobs):
        answers.append(call(api, "POST", f"/v1/jobs/{job_id}/cancel", {"text": args.reason}))
    if args.json:
        print(json.dumps(answers, indent=2))
        return 0
    for a in answers:
        if a["cancelled"]:
            print(f"cancelled job {a['job_id']}")
        else:
            print(f"job {a['job_id']} had already ended: {a['state']}")
    return 0
