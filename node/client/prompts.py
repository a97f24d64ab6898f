"""The prompts file of a generate batch (the client's `generate`, `e31 generate`): read, checked line
by line, and cut into the jobs' spans of lines.

The file is JSON Lines, one prompt a line (docs/inference.md, "The job"): `{"id": string or integer,
"prompt": string, "max_tokens"?: int, "temperature"?: number, "top_p"?: number, "seed"?: uint64}`.
It is read only if it is a regular file of at most MAX_PROMPTS_BYTES, in UTF-8. Blank lines (spaces,
tabs and carriage returns only) are no prompts and get no completion, as in the guest. Every other line
is checked here by the guest's own rules (fields it does not know are ignored, as it ignores them); the
file is refused if any line is malformed, naming the lines (up to a few, in one message), unless the
caller passes bad lines on (`pass_bad_lines`, `--pass-bad-lines`): then the guest answers each with an
error line and the rest go on.

A span is a run of consecutive lines of the file holding `per_job` prompt lines (blank lines between
them ride along), cut without changing a byte, so the guest's line numbers inside a job's file are the
file's own line numbers less the span's first one plus one: the merge turns them back (merge.py).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from e31.node.errors import UsageError

from .errors import PromptsError
from .files import read_regular_file

MAX_PROMPTS_BYTES = 64 << 20
MAX_PROMPTS = 1_000_000
SHOWN_PROBLEMS = 5
U64 = (1 << 64) - 1
I32 = (1 << 31) - 1


@dataclass(frozen=True, slots=True)
class PromptLine:
    number: int
    """1-based line number in the file."""
    text: str
    prompt_bytes: int
    """The prompt's length in UTF-8 (0 for a malformed line: the guest answers it without running)."""
    max_tokens: int | None
    problem: str | None


@dataclass(frozen=True, slots=True)
class PromptsFile:
    raw: list[str]
    """The file's lines as they are, without their newlines."""
    lines: list[PromptLine | None]
    """Each line parsed, or None for a blank one."""


@dataclass(frozen=True, slots=True)
class Span:
    first: int
    last: int
    """The span's first and last line numbers in the file (1-based, inclusive)."""
    text: str
    """Those lines, byte for byte, each ending in a newline."""
    prompts: tuple[PromptLine, ...]


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: object) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(float(v))  # type: ignore[arg-type]


def line_problem(doc: object) -> str | None:
    """Why a parsed line is not a prompt, or None."""
    if not isinstance(doc, dict):
        return "not a JSON object"
    if "id" not in doc or not (isinstance(doc["id"], str) or _is_int(doc["id"])):
        return "id is missing or not a string or integer"
    if not isinstance(doc.get("prompt"), str):
        return "prompt is missing or not a string"
    if "max_tokens" in doc and not (_is_int(doc["max_tokens"]) and 1 <= doc["max_tokens"] <= I32):
        return "max_tokens is not a whole number from 1 to 2147483647"
    if "temperature" in doc and not (_is_number(doc["temperature"]) and doc["temperature"] >= 0):
        return "temperature is not a number of at least 0"
    if "top_p" in doc and not (_is_number(doc["top_p"]) and 0 < doc["top_p"] <= 1):
        return "top_p is not a number above 0 and at most 1"
    if "seed" in doc and not (_is_int(doc["seed"]) and 0 <= doc["seed"] <= U64):
        return "seed is not a whole number from 0 to 2^64-1"
    return None


class _Duplicate(ValueError):
    pass


def _object(pairs: list[tuple[str, object]]) -> dict[str, object]:
    doc = dict(pairs)
    if len(doc) != len(pairs):
        raise _Duplicate(next(k for i, (k, _) in enumerate(pairs) if k in dict(pairs[:i])))
    return doc


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def parse_prompt(number: int, line: str) -> PromptLine:
    try:
        doc = json.loads(line, object_pairs_hook=_object, parse_constant=_no_constant)
    except _Duplicate as e:
        return PromptLine(number, line, 0, None, f"{e} given twice")
    except RecursionError:
        return PromptLine(number, line, 0, None, "nested too deeply")
    except json.JSONDecodeError as e:
        return PromptLine(number, line, 0, None, f"not JSON: {e.msg}")
    except ValueError as e:
        return PromptLine(number, line, 0, None, f"not JSON: {e}")
    problem = line_problem(doc)
    if problem is not None:
        return PromptLine(number, line, 0, None, problem)
    return PromptLine(number, line, len(doc["prompt"].encode("utf-8")), doc.get("max_tokens"), None)


def read_prompts(path: Path, pass_bad_lines: bool = False) -> PromptsFile:
    """Every line of the file: a PromptLine, or None for a blank line. Refuses the file (PromptsError)
    if it is not a regular UTF-8 file within the caps, has no prompt, or (unless `pass_bad_lines`) has a
    malformed line."""
    label = f"prompts file {path}"
    try:
        data = read_regular_file(path, label, MAX_PROMPTS_BYTES)
    except UsageError as e:
        raise PromptsError(str(e)) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PromptsError(f"{label}: not UTF-8 text (byte {e.start})") from None
    raw = text.split("\n")
    if len(raw) > MAX_PROMPTS + 1:
        raise PromptsError(f"{label}: more than {MAX_PROMPTS} lines")
    lines = [None if _blank(line) else parse_prompt(number, line) for number, line in enumerate(raw, 1)]
    while lines and lines[-1] is None:  # blank lines at the end (and the last newline) carry nothing
        lines.pop()
    raw = raw[: len(lines)]
    prompts = [p for p in lines if p is not None]
    if not prompts:
        raise PromptsError(f"{label}: no prompts (one JSON object per line)")
    bad = [p for p in prompts if p.problem is not None]
    if bad and not pass_bad_lines:
        shown = "; ".join(f"line {p.number}: {p.problem}" for p in bad[:SHOWN_PROBLEMS])
        more = f" (and {len(bad) - SHOWN_PROBLEMS} more)" if len(bad) > SHOWN_PROBLEMS else ""
        raise PromptsError(
            f"{label}: {len(bad)} malformed line(s): {shown}{more}; fix them, or pass --pass-bad-lines "
            "to have each answered with an error line"
        )
    return PromptsFile(raw, lines)


def _blank(line: str) -> bool:
    return not line.strip(" \t\r")


def split(file: PromptsFile, per_job: int) -> list[Span]:
    """Cut the file's lines into spans of `per_job` prompt lines (the last may hold fewer); blank lines
    go with the prompt before them (leading ones with the first)."""
    if per_job < 1:
        raise ValueError("per_job is at least 1")
    lines = file.lines
    spans: list[Span] = []
    start = 0
    held: list[PromptLine] = []
    for i, line in enumerate(lines):
        if line is None:
            continue
        if len(held) == per_job:
            spans.append(_span(file, start, i, held))
            start, held = i, []
        held.append(line)
    if held:
        spans.append(_span(file, start, len(lines), held))
    return spans


def _span(file: PromptsFile, start: int, end: int, held: list[PromptLine]) -> Span:
    text = "".join(line + "\n" for line in file.raw[start:end])
    return Span(start + 1, end, text, tuple(held))
