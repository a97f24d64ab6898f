"""Batch language-model inference: a prompts file in, one batch of jobs of generate.wasm out. The
client's `generate`, and `e31 generate`, which runs it.

The prompts file is read and checked here, as the user (prompts.py), and cut into spans of
`prompts_per_job` prompt lines. Each span becomes one job of sandbox/workloads/generate.wasm whose
inputs are the model, the tokenizer and that span's lines: the model and tokenizer are the same files
for every job, so they are one blob each (content-addressed: stored once on this node, fetched once by
each executor that runs any of the jobs). The span's first and last line numbers name its input
(`/input/prompts-FIRST-LAST.jsonl`, passed with --prompts), which is how the merge (merge.py) puts the
completions back in the file's order and error lines back on the file's line numbers.

The jobs go to the local node as one POST /v1/batches; the span files are written to a temporary
directory that is removed once the node has stored them. Limits are sized per job from the model's
shape and the span's prompts (llama_files.limits_for), and the batch gets the largest, unless given.
The batch's id comes back at once: the submitter may walk away and merge the completions later.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from importlib import resources
from pathlib import Path
from typing import Any

from .errors import LocalFileError, ModelFileError, OptionError
from .ops import Call, Deadline, Op, PathLike, _absolute, limits_body, parse_deadline
from .records import Generation

MODULE = "generate.wasm"
SHIPPED_MODEL = "kjv.bin"
SHIPPED_TOKENIZER = "kjv-tok.bin"
DEFAULT_PER_JOB = 32
DEFAULT_MAX_TOKENS = 256
MAX_PER_JOB = 10_000
MAX_REQUEST_BYTES = 1 << 20
"""The largest request body the local API takes (api/server.py): the whole batch travels as one."""
SPAN_INPUT = re.compile(r"^/input/prompts-([1-9][0-9]*)-([1-9][0-9]*)\.jsonl$")
"""The --prompts argument of a generate job: the span of the prompts file it carries."""


@contextmanager
def shipped(name: str, what: str) -> Iterator[Path]:
    """A file shipped in the wheel (the module, the model) as a path, or ModelFileError when missing."""
    base = resources.files("e31.sandbox") / "workloads"
    ref = base / MODULE if name == MODULE else base / "models" / name
    with resources.as_file(ref) as path:
        if not path.is_file():
            raise ModelFileError(f"the shipped {what} is missing from this install: {path}")
        yield path


def span_name(first: int, last: int) -> str:
    return f"prompts-{first}-{last}.jsonl"


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


def _count(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise OptionError(f"{what} is a whole number of at least 1, got {value!r}")
    return value


def plan(
    prompts: Path,
    model: Path,
    tokenizer: Path,
    module: Path,
    work: Path,
    *,
    prompts_per_job: int,
    max_tokens: int,
    pass_bad_lines: bool,
) -> tuple[list[dict[str, Any]], dict[str, Any], int, int]:
    """The batch's jobs (each span's file written under `work`), the limits the largest of them needs,
    and how many prompts, and malformed ones, the file holds."""
    from .llama_files import check_tokenizer, limits_for, read_model_shape
    from .prompts import read_prompts, split

    shape = read_model_shape(model)
    tokenizer_bytes = check_tokenizer(tokenizer, shape.vocab_size)
    spans = split(read_prompts(prompts, pass_bad_lines), min(prompts_per_job, MAX_PER_JOB))
    jobs: list[dict[str, Any]] = []
    fuel = memory = 0
    timeout = 0.0
    for span in spans:
        name = span_name(span.first, span.last)
        try:
            (work / name).write_text(span.text, encoding="utf-8")
        except OSError as e:
            raise LocalFileError(f"cannot write {work / name}: {e.strerror or e}") from None
        limits = limits_for(
            shape,
            shape.file_size,
            tokenizer_bytes,
            [(p.prompt_bytes, max_tokens if p.max_tokens is None else p.max_tokens) for p in span.prompts],
            len(span.text.encode("utf-8")),
        )
        fuel, memory, timeout = (
            max(fuel, limits.fuel),
            max(memory, limits.memory),
            max(timeout, limits.timeout),
        )
        jobs.append(
            {
                "args": ["--prompts", f"/input/{name}", "--max-tokens", str(max_tokens)],
                "inputs": [
                    {"name": "model.bin", "path": str(model)},
                    {"name": "tokenizer.bin", "path": str(tokenizer)},
                    {"name": name, "path": str(work / name)},
                ],
            }
        )
    count = sum(len(s.prompts) for s in spans)
    bad = sum(1 for s in spans for p in s.prompts if p.problem is not None)
    return jobs, {"fuel": fuel, "memory": memory, "timeout": timeout}, count, bad


def generate(
    prompts: PathLike,
    *,
    model: PathLike | None = None,
    tokenizer: PathLike | None = None,
    prompts_per_job: int = DEFAULT_PER_JOB,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    pass_bad_lines: bool = False,
    deadline: Deadline | None = None,
    fuel: int | str | None = None,
    memory: int | str | None = None,
    timeout: float | str | None = None,
    max_output: int | str | None = None,
    module: PathLike | None = None,
) -> Op[Generation]:
    """Submit a prompts file (JSON Lines, docs/inference.md) as one batch of inference jobs of
    `prompts_per_job` prompts each, and return it (its batch id stands for all of them; merge() it
    once they are done). `model` and `tokenizer` are a llama2.c checkpoint and its tokenizer (both, or
    neither for the shipped KJV model); `max_tokens` is the tokens per prompt where its line does not
    say; a malformed line refuses the file (PromptsError) unless `pass_bad_lines` (then the guest
    answers it with an error line). Limits are sized from the model and the prompts unless given;
    `module` is another build of generate.wasm."""
    per_job = _count(prompts_per_job, "prompts_per_job")
    tokens = _count(max_tokens, "max_tokens")
    if (model is None) != (tokenizer is None):
        given = "model" if model is not None else "tokenizer"
        raise OptionError(f"{given} needs its pair: give both model and tokenizer (--model, --tokenizer)")
    prompts_path = Path(_absolute(prompts, "prompts"))
    given_limits = limits_body(fuel, memory, timeout, max_output)
    when = None if deadline is None else parse_deadline(deadline, time.time())
    try:
        scratch = tempfile.TemporaryDirectory(prefix="e31-generate-", ignore_cleanup_errors=True)
    except OSError as e:
        where = "" if e.filename is None else f" {e.filename}"
        raise LocalFileError(f"cannot make a temporary directory{where}: {e.strerror or e}") from None
    with scratch as tmp, ExitStack() as files:
        if module is None:
            wasm = files.enter_context(shipped(MODULE, "inference module"))
        else:
            wasm = Path(_absolute(module, "module"))
        if model is None or tokenizer is None:
            model_path = files.enter_context(shipped(SHIPPED_MODEL, "model"))
            tokenizer_path = files.enter_context(shipped(SHIPPED_TOKENIZER, "tokenizer"))
        else:
            model_path = Path(_absolute(model, "model"))
            tokenizer_path = Path(_absolute(tokenizer, "tokenizer"))
        jobs, limits, count, bad = plan(
            prompts_path,
            model_path,
            tokenizer_path,
            wasm,
            Path(tmp),
            prompts_per_job=per_job,
            max_tokens=tokens,
            pass_bad_lines=pass_bad_lines,
        )
        limits.update(given_limits)  # one set for the batch (POST /v1/batches shares it)
        body = {"module": str(wasm), "limits": limits, "deadline": when, "jobs": jobs}
        size = len(json.dumps(body).encode())
        if size > MAX_REQUEST_BYTES:
            raise OptionError(
                f"{len(jobs)} jobs do not fit one batch request ({size} bytes; the node takes "
                f"{MAX_REQUEST_BYTES}): give more prompts per job (--prompts-per-job)"
            )
        answer = yield Call("POST", "/v1/batches", body)
    return Generation(str(answer["batch_id"]), tuple(answer["job_ids"]), count, bad, limits)
