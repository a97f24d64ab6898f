"""`e31 wait JOB|BATCH...`: wait until the jobs have ended; exit 0 only if every one succeeded.

A job succeeded when it is `done` with a verified receipt whose outcome is `exited 0`. A batch id
stands for all its jobs; a batch is followed through its own long-poll (one request, not one per job)
and reported as counts by state plus the jobs that did not succeed. On a terminal, a progress bar on
stderr shows done/total, the rate and the time left; otherwise nothing is drawn.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from ..config import add_data_dir_argument
from ..lifecycle import TERMINAL
from . import options

POLL = 5.0
SHOWN = 20
"""Jobs of a batch listed by name when they did not succeed (the rest are counted)."""


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
    parser.add_argument("--json", action="store_true", help="print the jobs as a JSON list at the end")


def progress_line(done: int, total: int, elapsed: float, width: int = 30) -> str:
    filled = round(width * done / total) if total else width
    rate = done / elapsed if elapsed > 0 else 0.0
    eta = "?" if rate == 0 else f"{(total - done) / rate:.0f}s"
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total}  {rate:.2f} jobs/s  ETA {eta}"


def run(args: argparse.Namespace) -> int:
    from ..store.batches import PREFIX
    from .common import call, client, clip, resolve_ids, short, table

    api = client(args, timeout=POLL + 30.0)
    batches = list(
        dict.fromkeys(a.strip().lower() for a in args.jobs if a.strip().lower().startswith(PREFIX))
    )
    singles = [a for a in args.jobs if not a.strip().lower().startswith(PREFIX)]
    ids = list(dict.fromkeys(resolve_ids(api, singles)))
    start = time.monotonic()
    end = None if args.timeout is None else start + max(args.timeout, 0.0)
    tty = sys.stderr.isatty()
    batch_docs: list[dict[str, Any]] = []
    for batch in batches:
        while True:
            left = POLL if end is None else min(POLL, end - time.monotonic())
            doc = call(api, "GET", f"/v1/batches/{batch}/wait?timeout={max(left, 0):.3f}&brief=1")
            if tty:
                line = progress_line(doc["ended"], doc["total"], time.monotonic() - start)
                print("\r" + line, end="", file=sys.stderr, flush=True)
            if doc["ended"] == doc["total"] or left <= 0:
                break
        batch_docs.append(call(api, "GET", f"/v1/batches/{batch}"))
    if tty and batches:
        print(file=sys.stderr)
    docs: dict[str, dict[str, Any]] = {}
    while ids:
        for job_id in ids:
            if docs.get(job_id, {}).get("state") not in TERMINAL:
                docs[job_id] = call(api, "GET", f"/v1/jobs/{job_id}")
        pending = [j for j in ids if docs[j]["state"] not in TERMINAL]
        if tty:
            print(
                "\r" + progress_line(len(ids) - len(pending), len(ids), time.monotonic() - start),
                end="",
                file=sys.stderr,
                flush=True,
            )
        if not pending:
            break
        left = POLL if end is None else min(POLL, end - time.monotonic())
        if left <= 0:
            break
        docs[pending[0]] = call(api, "GET", f"/v1/jobs/{pending[0]}/wait?timeout={left:.3f}")
    if tty and ids:
        print(file=sys.stderr)
    ok = all(docs[j].get("succeeded") for j in ids)
    ok = ok and all(
        b["ended"] == b["total"] and all(j.get("succeeded") for j in b["jobs"]) for b in batch_docs
    )
    if args.json:
        print(json.dumps([docs[j] for j in ids] + [j for b in batch_docs for j in b["jobs"]], indent=2))
        return 0 if ok else 1
    for b in batch_docs:
        counts = ", ".join(f"{n} {s}" for s, n in sorted(b["states"].items()))
        good = sum(1 for j in b["jobs"] if j.get("succeeded"))
        print(f"batch {b['batch_id']}: {b['total']} jobs, {good} succeeded ({counts})")
        bad = [j for j in b["jobs"] if not j.get("succeeded")]
        for j in bad[:SHOWN]:
            why = (j.get("outcome") or {}).get("text") or j.get("reason") or "-"
            print(f"  {short(j['job_id'])}  {j['state']}  {clip(why)}")
        if len(bad) > SHOWN:
            print(f"  ... and {len(bad) - SHOWN} more (`e31 jobs {b['batch_id']}`)")
    if ids:
        rows = [
            [
                short(j),
                docs[j]["state"],
                clip((docs[j].get("outcome") or {}).get("text") or docs[j].get("reason") or "-"),
                "yes" if docs[j].get("succeeded") else "no",
            ]
            for j in ids
        ]
        print(table(["JOB", "STATE", "OUTCOME", "OK"], rows))
    return 0 if ok else 1
