"""`e31 jobs [JOB|BATCH...]`: the jobs this node submitted (or, with --executed, ran for others).

HANDOFF says whether a job still needs this node online: `yes` once its executor holds its data (or
its result is in), `no` while it is being offered or fetched, `-` when it ended without a result.
"""

from __future__ import annotations

import argparse
import json

from ..config import add_data_dir_argument


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_data_dir_argument(parser)
    parser.add_argument(
        "jobs", nargs="*", metavar="JOB|BATCH", help="only these jobs (ids, unique prefixes or batch ids)"
    )
    parser.add_argument("--json", action="store_true", help="print a JSON list")
    parser.add_argument("--executed", action="store_true", help="list the jobs this node ran for submitters")


def handoff(job: dict[str, object]) -> str:
    if "handed_off" not in job:
        return "-"
    if job["handed_off"]:
        return "yes"
    return "-" if job["state"] in ("failed", "expired", "cancelled") else "no"


def run(args: argparse.Namespace) -> int:
    from .common import ago, call, client, clip, expand_ids, fuel, short, table

    api = client(args)
    role = "executor" if args.executed else "submitter"
    jobs = call(api, "GET", f"/v1/jobs?role={role}")
    if args.jobs:
        wanted = expand_ids(api, args.jobs)
        by_id = {j["job_id"]: j for j in jobs}
        jobs = [by_id[j] for j in wanted if j in by_id]
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
                *([] if args.executed else [handoff(j)]),
                short(j.get("submitter") if args.executed else j.get("executor"), 16),
                str(j["attempt"]),
                fuel(j.get("fuel_used")),
                ago(j.get("created")),
                ago(j.get("finished")),
                clip(outcome, 60),
            ]
        )
    headers = ["JOB", "STATE", *([] if args.executed else ["HANDOFF"])]
    headers += ["SUBMITTER" if args.executed else "NODE", "TRY", "FUEL", "SUBMITTED", "FINISHED", "OUTCOME"]
    print(table(headers, rows))
    if len(jobs) > 1:
        counts: dict[str, int] = {}
        for j in jobs:
            counts[j["state"]] = counts.get(j["state"], 0) + 1
        print(f"{len(jobs)} jobs: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    return 0
