"""What the job commands (submit, jobs, wait, results) share: the API client, job ids, formatting."""

from __future__ import annotations

import time
from typing import Any

from ..api.client import ApiClient, ApiClientError
from .main import CliError

HEX = frozenset("0123456789abcdef")


def client(args: Any, timeout: float = 60.0) -> ApiClient:
    return ApiClient(args.data_dir, timeout=timeout)


def call(api: ApiClient, method: str, path: str, body: Any = None) -> Any:
    try:
        return api.request(method, path, body)
    except ApiClientError as e:
        raise CliError(str(e)) from None


def resolve_ids(api: ApiClient, given: list[str]) -> list[str]:
    """Full job ids for the given ids or unique prefixes (at least 6 hex digits)."""
    known: list[str] | None = None
    out = []
    for text in given:
        t = text.strip().lower()
        if len(t) < 6 or not set(t) <= HEX:
            raise CliError(f"not a job id: {text!r} (64 hex digits, or a unique prefix of at least 6)")
        if len(t) == 64:
            out.append(t)
            continue
        if known is None:
            known = [j["job_id"] for j in call(api, "GET", "/v1/jobs")]
            known += [j["job_id"] for j in call(api, "GET", "/v1/jobs?role=executor")]
        matches = sorted({k for k in known if k.startswith(t)})
        if len(matches) != 1:
            raise CliError(f"job id prefix {text!r} matches {len(matches)} jobs on this node")
        out.append(matches[0])
    return out


def expand_ids(api: ApiClient, given: list[str]) -> list[str]:
    """Full job ids for job ids, unique prefixes and batch ids (`batch-...`, every job of the batch),
    in the order given, each once."""
    from ..store.batches import PREFIX

    out: list[str] = []
    for text in given:
        if text.strip().lower().startswith(PREFIX):
            doc = call(api, "GET", f"/v1/batches/{text.strip().lower()}?brief=1")
            out += [j["job_id"] for j in doc["jobs"]]
        else:
            out += resolve_ids(api, [text])
    return list(dict.fromkeys(out))


def short(text: str | None, n: int = 12) -> str:
    return "-" if not text else text[:n]


def clip(text: str, n: int = 80) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def ago(ts: float | None, now: float | None = None) -> str:
    if ts is None:
        return "-"
    seconds = max(0.0, (now if now is not None else time.time()) - ts)
    if seconds < 60:
        return f"{seconds:.0f}s ago"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m ago"
    if seconds < 86400:
        return f"{seconds / 3600:.1f}h ago"
    return f"{seconds / 86400:.1f}d ago"


def fuel(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, size in (("G", 10**9), ("M", 10**6), ("k", 10**3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return "\n".join(lines)
