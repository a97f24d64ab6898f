"""The batch file of `e31 submit MODULE --batch FILE.jsonl`: each line describes one job with the
fields of POST /v1/jobs that vary between jobs.

The file is read only if it is a regular file (a FIFO, device, directory or socket is refused without
blocking), and only up to MAX_BATCH_BYTES: the whole batch travels as one request body, which the local
API caps at the same 1 MiB (ControlLimits.max_body in node/api/server.py). Each line is parsed with a
depth limit, MAX_LINE_DEPTH: a line nested deeper is an error for that line, not a RecursionError.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..store.batches import LINE_FIELDS, MAX_JOBS
from .options import read_regular_file

MAX_BATCH_BYTES = 1 << 20
"""The largest batch file read; the same as the local API's cap on a request body."""
MAX_LINE_DEPTH = 16
"""How deeply a line may nest lists and objects (a valid line needs 3: {"env": [["K", "V"]]})."""


class BatchError(UsageError, ValueError):
    """A batch file or batch id that cannot be used; the message says where and why."""


def read_batch_file(path: Path, label: str | None = None) -> str:
    """The text of the batch file at `path`: a regular file of at most MAX_BATCH_BYTES, in UTF-8."""
    label = label or str(path)
    try:
        data = read_regular_file(path, label, MAX_BATCH_BYTES)
    except UsageError as e:
        raise BatchError(str(e)) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BatchError(f"{label}: not UTF-8 text (byte {e.start})") from None


def _depth(value: Any) -> int:
    """How deeply `value` nests lists and objects (walked without recursion)."""
    deepest = 0
    level: list[tuple[Any, int]] = [(value, 1)]
    while level:
        item, depth = level.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, depth)
            level += [(v, depth + 1) for v in item if isinstance(v, dict | list)]
    return deepest


def _too_deep(source: str, number: int) -> BatchError:
    return BatchError(f"{source}:{number}: nested deeper than {MAX_LINE_DEPTH} levels")


def parse_lines(text: str, source: str) -> list[dict[str, object]]:
    """The jobs of a JSON Lines batch file: one object per non-blank line with `args`, `env`,
    `inputs` and `stdin` (each optional; `env` an object or a list of pairs)."""
    jobs: list[dict[str, object]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except RecursionError:
            raise _too_deep(source, number) from None
        except json.JSONDecodeError as e:
            raise BatchError(f"{source}:{number}: not JSON: {e.msg}") from None
        # only a line with more brackets than the limit can be too deep, so most lines are not walked
        if line.count("[") + line.count("{") > MAX_LINE_DEPTH and _depth(doc) > MAX_LINE_DEPTH:
            raise _too_deep(source, number)
        if not isinstance(doc, dict):
            raise BatchError(f"{source}:{number}: each line is a JSON object")
        unknown = set(doc) - LINE_FIELDS
        if unknown:
            raise BatchError(
                f"{source}:{number}: unknown field(s) {', '.join(sorted(unknown))} "
                f"(a line has {', '.join(sorted(LINE_FIELDS))})"
            )
        env = doc.get("env")
        if isinstance(env, dict):
            doc["env"] = [[str(k), v] for k, v in env.items()]
        jobs.append(doc)
        if len(jobs) > MAX_JOBS:
            raise BatchError(f"{source}: more than {MAX_JOBS} jobs")
    if not jobs:
        raise BatchError(f"{source}: no jobs (one JSON object per line)")
    return jobs
