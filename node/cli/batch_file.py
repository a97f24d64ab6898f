"""The batch file of `e31 submit MODULE --batch FILE.jsonl`: each line describes one job with the
fields of POST /v1/jobs that vary between jobs."""

from __future__ import annotations

import json

from ..errors import UsageError
from ..store.batches import LINE_FIELDS, MAX_JOBS


class BatchError(UsageError, ValueError):
    """A batch file or batch id that cannot be used; the message says where and why."""


def parse_lines(text: str, source: str) -> list[dict[str, object]]:
    """The jobs of a JSON Lines batch file: one object per non-blank line with `args`, `env`,
    `inputs` and `stdin` (each optional; `env` an object or a list of pairs)."""
    jobs: list[dict[str, object]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except json.JSONDecodeError as e:
            raise BatchError(f"{source}:{number}: not JSON: {e.msg}") from None
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
