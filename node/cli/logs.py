"""`e31 logs JOB [--follow]`: the guest's standard output and standard error of a finished job.

Output comes back with the job's result (signed: its hashes are in the receipt), so it is there once
the job is done; with --follow the command first waits for the job to end (a bar on stderr when it
is a terminal). The guest's stdout goes to stdout and its stderr to stderr, byte for byte, so
`e31 logs JOB > out.txt` keeps them apart; --stdout or --stderr prints only one of them.
"""

from __future__ import annotations

import argparse
import sys

from ..config import add_data_dir_argument
from .progress import add_progress_argument


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_data_dir_argument(parser)
    parser.add_argument("job", metavar="JOB", help="the job id (or a unique prefix of it)")
    parser.add_argument("--follow", "-f", action="store_true", help="wait for the job to end first")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--stdout", action="store_true", help="only the guest's standard output")
    which.add_argument("--stderr", action="store_true", help="only the guest's standard error")
    add_progress_argument(parser)


def run(args: argparse.Namespace) -> int:
    from ..client import ops
    from .common import client, run_op
    from .main import CliError
    from .progress import Bar, wanted

    api = client(args, timeout=60.0)
    job = run_op(api, ops.job(args.job))
    job_id = job.job_id
    if args.follow and not job.ended:
        bar = Bar(wanted(args))
        try:
            (job,) = run_op(api, ops.wait([job_id], progress=bar.update))
        finally:
            bar.close()
    if job.state != "done":
        going = "has not ended yet (--follow waits for it)" if not job.ended else f"ended {job.state}"
        raise CliError(f"job {job_id[:16]} {going}{f': {job.reason}' if job.reason else ''}: no output")
    (result,) = run_op(api, ops.results([job_id]))
    if not args.stderr:
        sys.stdout.buffer.write(result.stdout)
        sys.stdout.buffer.flush()
    if not args.stdout:
        sys.stderr.buffer.write(result.stderr)
        sys.stderr.buffer.flush()
    return 0
