"""`e31 jobs`: the jobs this node submitted (or, with --executed, ran for others), with their state."""

from __future__ import annotations

import argparse
import json

from .config import add_data_dir_argument


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_data_dir_argument(parser)
    parser.add_argument("--json", action="store_true", help="print a JSON list")
    parser.add_argument("--executed", action="store_true", help="list the jobs this node ran for submitters")


def run(args: argparse.Namespace) -> int:
    from .jobs_cli import ago, call, client, clip, fuel, short, table

    role = "executor" if args.executed else "submitter"
    jobs = call(client(args), "GET", f"/v1/jobs?role={role}")
    if args.json:
        print(json.dumps(jobs, indent=2))
        return 0
    if not jobs:
        print("no jobs" if role == "submitter" else "no jobs run here")
        return 0
    rows = []
    for j in jobs:
        outcome = (j.get("outcome") or {}).get("text") or (j.get("reason") or "")
        rows.append(
            [
                short(j["job_id"]),
                j["state"],
                short(j.get("submitter") if args.executed else j.get("executor"), 16),
                str(j["attempt"]),
                fuel(j.get("fuel_used")),
                ago(j.get("created")),
                ago(j.get("finished")),
                clip(outcome, 60),
            ]
        )
    print(
        table(
            [
                "JOB",
                "STATE",
                "SUBMITTER" if args.executed else "NODE",
                "TRY",
                "FUEL",
                "SUBMITTED",
                "FINISHED",
                "OUTCOME",
            ],
            rows,
        )
    )
    return 0
