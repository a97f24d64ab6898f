"""`e31 wait JOB|BATCH...`: wait until the jobs have ended; exit 0 only if every one succeeded.

A job succeeded when it is `done` with a verified receipt whose outcome is `exited 0`. Ids may be
unique prefixes; a batch id stands for all its jobs, is followed through its own long-poll (one request,
not one per job) and reported as counts by state plus the jobs that did not succeed. The waiting is the
Python client's (e31.client's `wait`), so the two behave alike. On a terminal (or with --progress) a bar
on stderr shows done/total, the rate over the time this command has watched (jobs that had ended before
it started do not count) and the time left.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..config import add_data_dir_argument
from . import options
from .progress import add_progress_argument, progress_line

POLL = 5.0
SHOWN = 20
"""Jobs of a batch listed by name when they did not succeed (the rest are counted)."""

__all__ = ["progress_line"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_data_dir_argument(parser)
    parser.add_argument(
        "jobs", nargs="+", metavar="JOB|BATCH", help="job ids (or unique prefixes) or batch ids"
    )
    parser.add_argument(
        "--timeout",
        type=options.duration,
        metavar=options.DURATION,
        help="give up after this long, e.g. 90s or 1h (exit 1)",
    )
    add_progress_argument(parser)
    parser.add_argument("--json", action="store_true", help="print the jobs as a JSON list at the end")


def run(args: argparse.Namespace) -> int:
    from ..client import ops
    from ..store.batches import PREFIX
    from .common import client, clip, run_op, short, table
    from .progress import Bar, wanted

    api = client(args, timeout=POLL + 30.0)
    bar = Bar(wanted(args))
    try:
        jobs = run_op(api, ops.wait(args.jobs, timeout=args.timeout, progress=bar.update, poll=POLL))
    finally:
        bar.close()
    by_id = {j.job_id: j for j in jobs}
    ok = all(j.succeeded for j in jobs)
    if args.json:
        print(json.dumps([j.raw for j in jobs], indent=2))
        return 0 if ok else 1
    batches = list(
        dict.fromkeys(a.strip().lower() for a in args.jobs if a.strip().lower().startswith(PREFIX))
    )
    in_batch: set[str] = set()
    for b in batches:
        members: list[dict[str, Any]] = run_op(api, _batch_jobs(b))
        mine = [by_id[d["job_id"]] for d in members if d["job_id"] in by_id]
        in_batch.update(j.job_id for j in mine)
        counts: dict[str, int] = {}
        for j in mine:
            counts[j.state] = counts.get(j.state, 0) + 1
        good = sum(1 for j in mine if j.succeeded)
        summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
        print(f"batch {b}: {len(members)} jobs, {good} succeeded ({summary})")
        bad = [j for j in mine if not j.succeeded]
        for j in bad[:SHOWN]:
            print(f"  {short(j.job_id)}  {j.state}  {clip(j.why or '-')}")
        if len(bad) > SHOWN:
            print(f"  ... and {len(bad) - SHOWN} more (`e31 jobs --batch {b}`)")
    singles = [j for j in jobs if j.job_id not in in_batch]
    if singles:
        rows = [
            [short(j.job_id), j.state, clip(j.why or "-"), "yes" if j.succeeded else "no"] for j in singles
        ]
        print(table(["JOB", "STATE", "OUTCOME", "OK"], rows))
    return 0 if ok else 1


def _batch_jobs(batch: str) -> Any:
    from ..client.ops import Call

    doc = yield Call("GET", f"/v1/batches/{batch}?brief=1")
    return doc["jobs"]
