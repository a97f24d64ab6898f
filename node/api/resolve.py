"""POST /v1/resolve: the one place where what a user types for a job becomes full job ids.

Body: {"ids": [TEXT, ...]}. Each TEXT is a job id (64 hex digits, passed on as it is: the endpoint it is
then sent to says whether this node knows it, and an export takes a job known only by its envelopes), a
unique prefix of one (at least MIN_PREFIX hex digits, either role's jobs), or a batch id (`batch-` and
16 hex digits: every job of the batch, in batch order). The answer is {"job_ids": [...]}: the full ids
in the order given, each once, and "batches": the batch ids among the given. Every CLI command and the
Python client resolve through here, so a prefix means the same everywhere and the errors read alike:

- 400 `bad_id`: TEXT is neither (too short, not hex, a malformed batch id);
- 404 `unknown_id`: no job of this node begins with the prefix, or no such batch;
- 409 `ambiguous_id`: more than one job begins with it; the error object lists up to MAX_CANDIDATES of
  them under "candidates" (full ids), and the message names the first few.
"""

from __future__ import annotations

from typing import Any

from ..store import batches as batch
from ..store.async_store import AsyncStore
from ..store.lookup import jobs_with_prefix
from .server import Handler, HttpError, JsonResponse, Request

MIN_PREFIX = 6
MAX_IDS = 10_000
MAX_CANDIDATES = 10
HEX = frozenset("0123456789abcdef")


class Ambiguous(Exception):
    def __init__(self, given: str, candidates: list[str]) -> None:
        self.given = given
        self.candidates = candidates


def resolve_handler(store: AsyncStore) -> Handler:
    async def handle(request: Request) -> Any:
        body = request.body
        ids = body.get("ids") if isinstance(body, dict) else None
        if not isinstance(ids, list) or not all(isinstance(t, str) for t in ids) or len(ids) > MAX_IDS:
            raise HttpError(400, f"the body is {{'ids': [ids, prefixes or batch ids]}}, at most {MAX_IDS}")
        if set(body) - {"ids"}:
            raise HttpError(400, f"unknown field(s): {', '.join(sorted(set(body) - {'ids'}))}")
        out: list[str] = []
        batches: list[str] = []
        for text in ids:
            try:
                found, is_batch = await resolve_one(store, text)
            except Ambiguous as e:
                return _ambiguous(e)
            out += found
            if is_batch:
                batches.append(text.strip().lower())
        return {"job_ids": list(dict.fromkeys(out)), "batches": list(dict.fromkeys(batches))}

    return handle


async def resolve_one(store: AsyncStore, given: str) -> tuple[list[str], bool]:
    """The full ids `given` stands for, and whether it is a batch id; HttpError or Ambiguous if none."""
    text = given.strip().lower()
    shown = given[:80]
    if text.startswith(batch.PREFIX):
        if not batch.is_batch_id(text):
            raise HttpError(
                400, f"not a batch id ({batch.PREFIX} and {batch.ID_HEX} hex digits): {shown!r}", "bad_id"
            )
        row = await store.run(batch.get_batch, text)
        if row is None:
            raise HttpError(404, f"no batch {text} on this node", "unknown_id")
        return [j.hex() for j in row.job_ids], True
    if len(text) == 64 and set(text) <= HEX:
        return [text], False  # a whole id: the endpoint it goes to says whether the node knows it
    if len(text) < MIN_PREFIX or len(text) > 64 or not set(text) <= HEX:
        raise HttpError(
            400,
            f"not a job id: {shown!r} (64 hex digits, a unique prefix of at least {MIN_PREFIX}, "
            f"or a batch id {batch.PREFIX}...)",
            "bad_id",
        )
    found = await store.run(jobs_with_prefix, text, MAX_CANDIDATES + 1)
    if not found:
        raise HttpError(404, f"no job on this node has an id beginning with {text}", "unknown_id")
    if len(found) > 1:
        raise Ambiguous(text, [j.hex() for j in found])
    return [found[0].hex()], False


def _ambiguous(e: Ambiguous) -> JsonResponse:
    more = len(e.candidates) > MAX_CANDIDATES
    shown = e.candidates[:MAX_CANDIDATES]
    message = (
        f"job id prefix {e.given!r} is ambiguous: it matches {len(shown)}{'+' if more else ''} jobs: "
        + ", ".join(c[:16] for c in shown[:4])
        + (", ..." if len(shown) > 4 else "")
        + "; give more digits"
    )
    error = {"code": "ambiguous_id", "message": message, "status": 409, "candidates": shown}
    return JsonResponse({"error": error}, 409)
