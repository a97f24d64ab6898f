"""`e31 jobs [JOB|BATCH...]`: the jobs this node submitted (or, with --executed, ran for others),
filtered by state or batch, sorted, limited, and with --watch redrawn until every listed job has ended.

HANDOFF says whether a job still needs this node online: `yes` once its executor holds its data (or
its result is in), `no` while it is being offered or fetched, `-` when it ended without a result.
OUTCOME is the guest's ending or the reason the job ended, never cut: it is the last column, so a long
reason wraps instead of hiding its end. The selection is the Python client's `jobs` (e31.client).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import TYPE_CHECKING

from ..config import add_data_dir_argument
from . import options

if TYPE_CHECKING:
    from ..client.records import Job

WATCH_EVERY = 2.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..client.ops import SORT_KEYS
    from ..lifecycle import JobState

    add_data_dir_argument(parser)
    parser.add_argument(
        "jobs", nargs="*", metavar="JOB|BATCH", help="only these jobs (ids, unique prefixes or batch ids)"
    )
    parser.add_argument(
        "--state",
        action="append",
        choices=sorted(s.value for s in JobState),
        metavar="STATE",
        help="only jobs in this state (repeatable): " + ", ".join(sorted(s.value for s in JobState)),
    )
    parser.add_argument("--batch", metavar="BATCH", help="only the jobs of this batch (batch-...)")
    parser.add_argument(
        "--limit", type=options.count, metavar="N", help="show at most N jobs (after sorting)"
    )
    parser.add_argument(
        "--sort",
        default="created",
        choices=SORT_KEYS,
        metavar="KEY",
        help=f"order by {', '.join(SORT_KEYS)} (default created: oldest first)",
    )
    parser.add_argument(
        "--reverse", "-r", action="store_true", help="reverse the order (--sort created -r: newest first)"
    )
    parser.add_argument(
        "--watch",
        nargs="?",
        const=WATCH_EVERY,
        type=options.positive_duration,
        metavar="SECONDS",
        help=f"redraw every SECONDS (default {WATCH_EVERY:g}) until every listed job has ended, or Ctrl-C",
    )
    parser.add_argument("--json", action="store_true", help="print a JSON list")
    parser.add_argument("--executed", action="store_true", help="list the jobs this node ran for submitters")


def handoff(job: dict[str, object]) -> str:
    if "handed_off" not in job:
        return "-"
    if job["handed_off"]:
        return "yes"
    return "-" if job["state"] in ("failed", "expired", "cancelled") else "no"


def render(jobs: list[Job], executed: bool) -> str:
    from .common import ago, fuel, short, table

    if not jobs:
        return "no jobs run here" if executed else "no jobs"
    rows = []
    for j in jobs:
        d = j.raw
        rows.append(
            [
                short(j.job_id),
                j.state,
                *([] if executed else [handoff(d)]),
                short(d.get("submitter") if executed else d.get("executor"), 16),
                str(j.attempt),
                fuel(j.fuel_used),
                ago(j.created),
                ago(j.finished),
                j.why or "-",
            ]
        )
    headers = ["JOB", "STATE", *([] if executed else ["HANDOFF"])]
    headers += ["SUBMITTER" if executed else "NODE", "TRY", "FUEL", "SUBMITTED", "FINISHED", "OUTCOME"]
    text = table(headers, rows)
    if len(jobs) > 1:
        counts: dict[str, int] = {}
        for j in jobs:
            counts[j.state] = counts.get(j.state, 0) + 1
        text += f"\n{len(jobs)} jobs: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    return text


def run(args: argparse.Namespace) -> int:
    from ..client import ops
    from .common import client, run_op

    api = client(args)

    def select() -> list[Job]:
        return run_op(
            api,
            ops.jobs(
                args.jobs or None,
                state=args.state,
                batch=args.batch,
                executed=args.executed,
                sort=f"-{args.sort}" if args.reverse else args.sort,
                limit=args.limit,
            ),
        )

    jobs = select()
    if args.watch is None:
        print(json.dumps([j.raw for j in jobs], indent=2) if args.json else render(jobs, args.executed))
        return 0
    clear = sys.stdout.isatty()
    while True:
        text = json.dumps([j.raw for j in jobs]) if args.json else render(jobs, args.executed)
        if clear:
            sys.stdout.write("\x1b[H\x1b[2J")
        print(text, flush=True)
        if all(j.ended for j in jobs):
            return 0
        time.sleep(args.watch)
        jobs = select()
        if not clear and not args.json:
            print()
