"""`e31 wait JOB...`: wait until the jobs have ended; exit 0 only if every one succeeded.

A job succeeded when it is `done` with a verified receipt whose outcome is `exited 0`. On a terminal,
a progress bar on stderr shows done/total, the rate and the time left; otherwise nothing is drawn.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from .config import add_data_dir_argument

TERMINAL = frozenset({"done", "failed", "expired", "cancelled"})
POLL = 5.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_data_dir_argument(parser)
    parser.add_argument("jobs", nargs="+", metavar="JOB", help="job ids (or unique prefixes)")
    parser.add_argument("--timeout", type=float, metavar="SECONDS", help="give up after this long (exit 1)")
    parser.add_argument("--json", action="store_true", help="print the jobs as a JSON list at the end")


def progress_line(done: int, total: int, elapsed: float, width: int = 30) -> str:
    filled = round(width * done / total) if total else width
    rate = done / elapsed if elapsed > 0 else 0.0
    eta = "?" if rate == 0 else f"{(total - done) / rate:.0f}s"
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total}  {rate:.2f} jobs/s  ETA {eta}"


def run(args: argparse.Namespace) -> int:
    from .jobs_cli import call, client, clip, resolve_ids, short, table

    api = client(args, timeout=POLL + 30.0)
    ids = list(dict.fromkeys(resolve_ids(api, args.jobs)))
    start = time.monotonic()
    end = None if args.timeout is None else start + max(args.timeout, 0.0)
    tty = sys.stderr.isatty()
    docs: dict[str, dict[str, Any]] = {}
    while True:
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
    if tty:
        print(file=sys.stderr)
    ok = all(docs[j].get("succeeded") for j in ids)
    if args.json:
        print(json.dumps([docs[j] for j in ids], indent=2))
    else:
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
