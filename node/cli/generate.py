"""`e31 generate PROMPTS.jsonl`: batch language-model inference, submitted as one batch of jobs.

The work is the Python client's `generate` (client/generate.py, one implementation): it checks the
prompts file and the model as the user, cuts the prompts into spans of --prompts-per-job lines, one job
of sandbox/workloads/generate.wasm each sharing the model and tokenizer blobs, sizes the limits, and
sends the batch to the local node. This command reads the flags, runs it, and prints the batch id:
the submitter may walk away, and collect the completions later with
`e31 results BATCH --merge completions.jsonl` (client/merge.py).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..client.generate import DEFAULT_MAX_TOKENS, DEFAULT_PER_JOB
from ..config import add_data_dir_argument
from . import options
from .main import CliError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_data_dir_argument(parser)
    parser.add_argument("prompts", type=Path, metavar="PROMPTS.jsonl", help="one JSON prompt per line")
    parser.add_argument(
        "--model",
        type=Path,
        metavar="MODEL.bin",
        help="a llama2.c checkpoint (default: the shipped KJV model)",
    )
    parser.add_argument(
        "--tokenizer",
        type=Path,
        metavar="TOK.bin",
        help="its llama2.c tokenizer (required with --model; default: the shipped model's)",
    )
    parser.add_argument(
        "--prompts-per-job",
        type=options.positive_count,
        default=DEFAULT_PER_JOB,
        metavar="N",
        help=f"prompts in one job (default {DEFAULT_PER_JOB})",
    )
    parser.add_argument(
        "--max-tokens",
        type=options.positive_count,
        default=DEFAULT_MAX_TOKENS,
        metavar="N",
        help=f"tokens generated per prompt unless its line says max_tokens (default {DEFAULT_MAX_TOKENS})",
    )
    parser.add_argument(
        "--pass-bad-lines",
        action="store_true",
        help="send malformed lines on (each is answered with an error line) instead of refusing the file",
    )
    parser.add_argument(
        "--deadline",
        type=_deadline,
        metavar="DURATION|ISO-8601",
        help="when the completions are needed: a duration from now (90s, 10m, 2h) or a time; default 1h",
    )
    options.add_limit_arguments(parser)
    parser.add_argument(
        "--module",
        type=Path,
        metavar="WASM",
        help=argparse.SUPPRESS,  # another build of the guest (tests, benchmarks)
    )
    parser.add_argument("--json", action="store_true", help="print the node's answer as JSON")


def _deadline(text: str) -> str:
    from .submit import _deadline as submit_deadline

    return submit_deadline(text)


def run(args: argparse.Namespace) -> int:
    from ..client.generate import generate
    from .common import client, run_op

    if (args.model is None) != (args.tokenizer is None):
        given = "--model" if args.model is not None else "--tokenizer"
        raise CliError(f"{given} needs its pair: give both --model and --tokenizer", code=2)
    op = generate(
        args.prompts,
        model=args.model,
        tokenizer=args.tokenizer,
        prompts_per_job=args.prompts_per_job,
        max_tokens=args.max_tokens,
        pass_bad_lines=args.pass_bad_lines,
        deadline=args.deadline,
        fuel=args.fuel,
        memory=args.memory,
        timeout=args.timeout,
        max_output=args.max_output,
        module=args.module,
    )
    batch = run_op(client(args), op)
    if args.json:
        answer: dict[str, Any] = {"batch_id": batch.batch_id, "job_ids": list(batch.job_ids)}
        answer |= {"prompts": batch.prompts, "malformed": batch.malformed, "limits": batch.limits}
        print(json.dumps(answer))
        return 0
    if batch.malformed:
        print(f"{batch.malformed} malformed line(s) sent on: each gets an error line", file=sys.stderr)
    print(
        f"collect the completions later: e31 results {batch.batch_id} --merge completions.jsonl "
        "(keep this node running until the jobs are handed off: `e31 jobs` HANDOFF column)",
        file=sys.stderr,
    )
    print(f"submitted {batch.prompts} prompts in {len(batch.job_ids)} jobs as batch {batch.batch_id}")
    return 0
