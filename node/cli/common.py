"""What the job commands (submit, jobs, wait, results) share: the API client, job ids, formatting."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, TypeVar

from ..api.client import ApiClient, ApiClientError
from ..errors import UsageError
from .main import CliError

if TYPE_CHECKING:
    from ..client.ops import Op

T = TypeVar("T")


def client(args: Any, timeout: float = 60.0) -> ApiClient:
    return ApiClient(args.data_dir, timeout=timeout)


def call(api: ApiClient, method: str, path: str, body: Any = None) -> Any:
    try:
        return api.request(method, path, body)
    except ApiClientError as e:
        raise CliError(str(e)) from None


def run_op(api: ApiClient, op: Op[T]) -> T:
    """Run one of the Python client's operations (e31.client's ops) over `api`: the CLI and scripts
    share their logic. A usage error (a bad or ambiguous id, a bad option) keeps its type and exit
    code 2; any other client error is one CliError line, exit 1, as the commands always had."""
    from ..client.errors import ClientError
    from ..client.sync import drive

    try:
        return drive(op, lambda c: api.request(c.method, c.path, c.body), time.sleep)
    except UsageError:
        raise
    except ClientError as e:
        raise CliError(str(e)) from None


def expand_ids(api: ApiClient, given: list[str]) -> list[str]:
    """Full job ids for job ids, unique prefixes and batch ids (every job of the batch), in the order
    given, each once: resolved by the node (POST /v1/resolve, node/api/resolve.py), the one resolver."""
    from ..client import ops

    return run_op(api, ops.resolve(given))


resolve_ids = expand_ids


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
