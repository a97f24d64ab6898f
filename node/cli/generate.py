"""`e31 generate PROMPTS.jsonl`: batch language-model inference, submitted as one batch of jobs.

The prompts file is read and checked here, as the user (prompts.py), and cut into spans of
--prompts-per-job prompt lines. Each span becomes one job of sandbox/workloads/generate.wasm whose
inputs are the model, the tokenizer and that span's lines: the model and tokenizer are the same files
for every job, so they are one blob each (content-addressed: stored once on this node, fetched once by
each executor that runs any of the jobs). The span's first and last line numbers name its input
(`/input/prompts-FIRST-LAST.jsonl`, passed with --prompts), which is how `e31 results BATCH --merge`
puts the completions back in the file's order and error lines back on the file's line numbers.

The jobs go to the local node as one POST /v1/batches, as `e31 submit --batch` sends them; the span
files are written to a temporary directory that is removed once the node has stored them. Limits are
sized per job from the model's shape and the span's prompts (llama_files.limits_for) unless given.
The command prints the batch id and returns: the submitter may walk away, and collect the completions
later with `e31 results BATCH --merge completions.jsonl`.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any

from ..config import add_data_dir_argument
from ..errors import UsageError
from . import options
from .main import CliError

MODULE = "generate.wasm"
SHIPPED_MODEL = "kjv.bin"
SHIPPED_TOKENIZER = "kjv-tok.bin"
DEFAULT_PER_JOB = 32
DEFAULT_MAX_TOKENS = 256
MAX_PER_JOB = 10_000
SPAN_INPUT = re.compile(r"^/input/prompts-([1-9][0-9]*)-([1-9][0-9]*)\.jsonl$")
"""The --prompts argument of a generate job: the span of the prompts file it carries."""


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


@contextmanager
def shipped(name: str, what: str) -> Iterator[Path]:
    """A file shipped in the wheel (the module, the model) as a path, or UsageError when it is missing."""
    base = resources.files("e31.sandbox") / "workloads"
    ref = base / MODULE if name == MODULE else base / "models" / name
    with resources.as_file(ref) as path:
        if not path.is_file():
            raise UsageError(f"the shipped {what} is missing from this install: {path}")
        yield path


def _model_files(args: argparse.Namespace) -> tuple[Path, Path] | None:
    """(model, tokenizer) as given, or None for the shipped pair; refuses one without the other."""
    if args.model is None and args.tokenizer is None:
        return None
    if args.model is None or args.tokenizer is None:
        given = "--model" if args.model is not None else "--tokenizer"
        raise CliError(f"{given} needs its pair: give both --model and --tokenizer", code=2)
    return args.model.expanduser().absolute(), args.tokenizer.expanduser().absolute()


def _span_name(first: int, last: int) -> str:
    return f"prompts-{first}-{last}.jsonl"


def plan(args: argparse.Namespace, model: Path, tokenizer: Path, module: Path, work: Path) -> dict[str, Any]:
    """The POST /v1/batches body: one job per span, its file written under `work`."""
    from .llama_files import check_tokenizer, limits_for, read_model_shape
    from .prompts import read_prompts, split
    from .submit import parse_deadline

    shape = read_model_shape(model)
    tokenizer_bytes = check_tokenizer(tokenizer, shape.vocab_size)
    spans = split(read_prompts(args.prompts, args.pass_bad_lines), min(args.prompts_per_job, MAX_PER_JOB))
    jobs: list[dict[str, Any]] = []
    fuel = memory = 0
    timeout = 0.0
    for span in spans:
        name = _span_name(span.first, span.last)
        (work / name).write_text(span.text, encoding="utf-8")
        limits = limits_for(
            shape,
            shape.file_size,
            tokenizer_bytes,
            [
                (p.prompt_bytes, args.max_tokens if p.max_tokens is None else p.max_tokens)
                for p in span.prompts
            ],
            len(span.text.encode("utf-8")),
        )
        fuel, memory, timeout = (
            max(fuel, limits.fuel),
            max(memory, limits.memory),
            max(timeout, limits.timeout),
        )
        jobs.append(
            {
                "args": ["--prompts", f"/input/{name}", "--max-tokens", str(args.max_tokens)],
                "inputs": [
                    {"name": "model.bin", "path": str(model)},
                    {"name": "tokenizer.bin", "path": str(tokenizer)},
                    {"name": name, "path": str(work / name)},
                ],
            }
        )
    # one set of limits for the batch (POST /v1/batches shares them): the largest any job needs
    given = {"fuel": args.fuel, "memory": args.memory, "timeout": args.timeout, "max_output": args.max_output}
    limits_doc = {"fuel": fuel, "memory": memory, "timeout": timeout}
    limits_doc.update({k: v for k, v in given.items() if v is not None})
    return {
        "module": str(module),
        "limits": limits_doc,
        "deadline": None if args.deadline is None else parse_deadline(args.deadline, time.time()),
        "jobs": jobs,
        "_prompts": sum(len(s.prompts) for s in spans),
        "_bad": sum(1 for s in spans for p in s.prompts if p.problem is not None),
    }


def run(args: argparse.Namespace) -> int:
    from .common import call, client

    given = _model_files(args)
    with tempfile.TemporaryDirectory(prefix="e31-generate-") as tmp:
        work = Path(tmp)
        with shipped(MODULE, "inference module") as shipped_module:
            module = shipped_module if args.module is None else args.module.expanduser().absolute()
            if given is None:
                with shipped(SHIPPED_MODEL, "model") as m, shipped(SHIPPED_TOKENIZER, "tokenizer") as t:
                    body = plan(args, m, t, module, work)
                    answer = _submit(call, client(args), body)
            else:
                body = plan(args, given[0], given[1], module, work)
                answer = _submit(call, client(args), body)
    prompts, bad = body["_prompts"], body["_bad"]
    if args.json:
        print(json.dumps({**answer, "prompts": prompts, "malformed": bad, "limits": body["limits"]}))
        return 0
    if bad:
        print(f"{bad} malformed line(s) sent on: each gets an error line", file=sys.stderr)
    print(
        f"collect the completions later: e31 results {answer['batch_id']} --merge completions.jsonl "
        "(keep this node running until the jobs are handed off: `e31 jobs` HANDOFF column)",
        file=sys.stderr,
    )
    print(f"submitted {prompts} prompts in {len(answer['job_ids'])} jobs as batch {answer['batch_id']}")
    return 0


def _submit(call: Any, api: Any, body: dict[str, Any]) -> Any:
    from .batch_file import MAX_BATCH_BYTES

    wire = {k: v for k, v in body.items() if not k.startswith("_")}
    size = len(json.dumps(wire).encode())
    if size > MAX_BATCH_BYTES:
        raise CliError(
            f"{len(wire['jobs'])} jobs do not fit one batch request ({size} bytes; the node takes "
            f"{MAX_BATCH_BYTES}): give more --prompts-per-job",
            code=2,
        )
    return call(api, "POST", "/v1/batches", wire)


def span_of(job_args: list[str]) -> tuple[int, int] | None:
    """The (first, last) line span a generate job carries, from its arguments; None for another job."""
    for i, arg in enumerate(job_args[:-1]):
        if arg == "--prompts":
            m = SPAN_INPUT.match(job_args[i + 1])
            if m is None:
                return None
            first, last = int(m.group(1)), int(m.group(2))
            return (first, last) if first <= last else None
    return None
