"""The dashboard: its static files, and the endpoints it reads besides those the CLI uses.

    GET /                             the dashboard page (public: the shell holds no data)
    GET /ui/{name}                    its script and style sheet (public)
    GET /v1/overview?after=V&timeout=S  everything the page shows, in one document with a `version`;
                                      with `after`, answered once the version differs (long-poll) or
                                      after `timeout` seconds (at most 25), whichever comes first
    GET /v1/served                    what this node ran, per submitter (jobs, done, fuel, run seconds)
    GET /v1/jobs/{id}/receipt         the job's usage receipt, every field, its signature checked
    GET /v1/jobs/{id}/files/{name}    stdout, stderr or receipt of a done job, as bytes (a download)
    GET /v1/jobs/{id}/outputs/{name}  one output file of a done job, as bytes

The page is plain HTML, CSS and a JavaScript module shipped in the package (node/api/static/), with
no CDN and no build step. It signs in with the API token, keeps it in sessionStorage and sends it as
the bearer header like the CLI does (docs/security.md, "The dashboard", says why); every data request
needs it. The long-poll wakes at once when a submitted job changes state and re-reads at most every
POLL_TICK seconds otherwise (executor runs, peers, capacity): one open page costs a few small queries a
second while it waits (figures in docs/benchmarks.md).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from importlib import resources
from typing import Any

import trio
from e31.protocol.blobs import BlobRef, blob_ref
from e31.protocol.codec import unpack_canonical
from e31.protocol.envelope import VerifiedEnvelope, reopen_stored, verify
from e31.protocol.errors import ProtocolError
from e31.protocol.ids import Digest, NodeId
from e31.protocol.jobs import JobManifest
from e31.protocol.receipts import UsageReceipt

from ..lifecycle import Role
from ..market.outcomes import outcome_text
from ..market.submitter import Submitter
from ..store import overview
from ..store.async_store import AsyncStore
from ..store.blobs import BlobError, BlobStore
from ..store.db import Store
from ..store.receiptlog import ReceiptLog
from ..store.rows import JobRow
from .server import HttpError, RawResponse, Request, Router

STATIC_FILES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
PAGE_HEADERS = (
    (
        "content-security-policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    ),
    ("x-frame-options", "DENY"),
    ("referrer-policy", "no-referrer"),
    ("cross-origin-opener-policy", "same-origin"),
    ("cross-origin-resource-policy", "same-origin"),
)
MAX_WAIT = 25.0
"""The longest a long-poll is held (well inside a browser's and the client's patience)."""
POLL_TICK = 1.0
"""Seconds between two re-reads of a held long-poll when no submitted job changed."""
LIST_LIMIT = 50
BATCH_LIMIT = 20
DOWNLOAD_MAX = 64 << 20
"""The largest file served as one download (larger ones: `e31 results JOB --out DIR`)."""


def load_static() -> dict[str, bytes]:
    """The dashboard's files, read once from the installed package."""
    root = resources.files("e31.node.api") / "static"
    return {name: (root / name).read_bytes() for name in STATIC_FILES}


@dataclass
class DashboardApi:
    store: AsyncStore
    blobs: BlobStore
    submitter: Submitter
    receipt_log: ReceiptLog
    status: Callable[[], dict[str, Any]]
    """The node's GET /v1/status document (daemon.py)."""
    peers: Callable[[], list[Any]]
    """The node's GET /v1/peers list."""
    files: dict[str, bytes] = field(default_factory=load_static)

    def register(self, router: Router) -> None:
        router.add("GET", "/", self.page, public=True)
        router.add("GET", "/ui/{name}", self.static, public=True)
        router.add("GET", "/v1/overview", self.overview)
        router.add("GET", "/v1/served", self.served)
        router.add("GET", "/v1/jobs/{id}/receipt", self.receipt)
        router.add("GET", "/v1/jobs/{id}/files/{name}", self.file)
        router.add("GET", "/v1/jobs/{id}/outputs/{name}", self.output)

    # --- the static shell ---

    async def page(self, request: Request) -> RawResponse:
        return RawResponse(self.files["index.html"], STATIC_FILES["index.html"], PAGE_HEADERS)

    async def static(self, request: Request) -> RawResponse:
        name = request.params["name"]
        if name not in STATIC_FILES:
            raise HttpError(404, f"no such dashboard file: {name[:80]!r}")
        return RawResponse(self.files[name], STATIC_FILES[name], PAGE_HEADERS)

    # --- the overview ---

    async def overview(self, request: Request) -> dict[str, Any]:
        after = request.query.get("after")
        try:
            timeout = float(request.query.get("timeout", "20"))
        except ValueError:
            timeout = math.nan
        if timeout != timeout:
            raise HttpError(400, "timeout is a number of seconds")
        timeout = min(max(timeout, 0.0), MAX_WAIT)
        doc = await self._overview()
        if after is None:
            return doc
        with trio.move_on_after(timeout):
            while doc["version"] == after:
                changed = self.submitter.changed
                with trio.move_on_after(POLL_TICK):
                    await changed.wait()
                doc = await self._overview()
        return doc

    async def _overview(self) -> dict[str, Any]:
        counts = await self.store.run(overview.job_counts)
        running = await self.store.run(overview.latest_jobs, Role.EXECUTOR, LIST_LIMIT, unfinished=True)
        submitted = await self.store.run(overview.latest_jobs, Role.SUBMITTER, LIST_LIMIT)
        batches = await self.store.run(overview.latest_batches, BATCH_LIMIT)
        served = await self.store.run(overview.served_by_submitter)
        log_size, log_root = await trio.to_thread.run_sync(self._log_head)
        status = self.status()
        by_role: dict[str, dict[str, int]] = {"submitter": {}, "executor": {}}
        for (role, state), n in counts.items():
            by_role.setdefault(role, {})[state] = n
        body = {
            "jobs": by_role,
            "executing": [_brief(r) for r in running],
            "submitted": [_brief(r) for r in submitted],
            "batches": [_batch(b) for b in batches],
            "served": [asdict(s) for s in served],
            "receipt_log": {"size": log_size, "root": log_root},
            "peers": self.peers()[:LIST_LIMIT],
        }
        return {"version": _version(body, status), "now": time.time(), "status": status, **body}

    def _log_head(self) -> tuple[int, str]:
        return self.receipt_log.size, self.receipt_log.root().hex()

    async def served(self, request: Request) -> list[dict[str, Any]]:
        return [asdict(s) for s in await self.store.run(overview.served_by_submitter)]

    # --- one job's receipt and files ---

    async def _job(self, request: Request) -> JobRow:
        text = request.params["id"]
        try:
            job_id = Digest.parse(text).raw
        except ProtocolError:
            raise HttpError(400, f"not a job id (64 hex digits): {text[:80]!r}") from None
        for role in (Role.SUBMITTER, Role.EXECUTOR):
            row = await self.store.run(Store.job, job_id, role)
            if row is not None:
                return row
        raise HttpError(404, f"no job {text} on this node")

    async def _receipt(self, row: JobRow) -> VerifiedEnvelope[UsageReceipt]:
        rows = [] if row.state != "done" else await self.store.run(Store.receipts_for_job, row.job_id)
        wanted = [r for r in rows if row.role == Role.EXECUTOR or r.delivered is not None]
        env = None if not wanted else await self.store.run(Store.envelope, wanted[-1].message_id)
        if env is None:
            raise HttpError(409, f"job {row.job_id.hex()} has no verified result yet (it is {row.state})")
        return reopen_stored(env.raw, UsageReceipt)

    async def receipt(self, request: Request) -> dict[str, Any]:
        row = await self._job(request)
        stored = await self._receipt(row)
        try:
            checked = verify(bytes(stored.raw), UsageReceipt)  # shown to a person: the signature too
        except ProtocolError as e:
            raise HttpError(500, f"the stored receipt does not verify: {e}") from None
        r = checked.message
        log_index = await trio.to_thread.run_sync(self.receipt_log.index_of, checked.message_id.raw)
        return {
            "job_id": r.job_id.hex(),
            "receipt_id": checked.message_id.hex(),
            "signature": {"valid": True, "signer": str(checked.signer), "kind": checked.kind},
            "log_index": log_index,
            "outcome_text": outcome_text(r.outcome.status, r.outcome.exit_code, r.outcome.trap),
            "fields": _jsonable(r),
            "bytes": len(checked.raw),
        }

    async def file(self, request: Request) -> RawResponse:
        name = request.params["name"]
        row = await self._job(request)
        env = await self._receipt(row)
        r = env.message
        if name == "receipt":
            data = bytes(env.raw)
        elif name in ("stdout", "stderr"):
            data = await self._read(r.stdout if name == "stdout" else r.stderr)
        else:
            raise HttpError(404, "a job's files are stdout, stderr and receipt (outputs: /outputs/NAME)")
        return _download(data, f"{row.job_id.hex()[:12]}-{name}")

    async def output(self, request: Request) -> RawResponse:
        name = request.params["name"]
        row = await self._job(request)
        r = (await self._receipt(row)).message
        ref = next((f.blob for f in r.outputs if f.name == name), None)
        if ref is None:
            raise HttpError(404, f"job {row.job_id.hex()[:12]} has no output {name[:80]!r}")
        return _download(await self._read(ref), name.rsplit("/", 1)[-1])

    async def _read(self, ref: BlobRef) -> bytes:
        if ref.size > DOWNLOAD_MAX:
            raise HttpError(413, f"{ref.size} bytes: too large to download here; use e31 results --out")
        root = ref.root.hex()
        small = await self.store.run(Store.small_blobs, [root])
        data = small.get(root)
        if data is not None:
            if blob_ref(data) != ref:
                raise HttpError(500, f"the stored output {root} does not match its hash")
            return data
        try:
            return await trio.to_thread.run_sync(self.blobs.read, ref.root.raw)
        except BlobError as e:
            raise HttpError(500, f"a result blob is unavailable: {e}") from None


def _version(body: dict[str, Any], status: dict[str, Any]) -> str:
    """A digest of what the page shows that is worth waking it for: jobs, batches, served totals, the
    log, which peers are linked and what capacity is offered; not the clock, heartbeats or counters."""
    offered = status.get("offered") or {}
    stable = [
        {k: v for k, v in body.items() if k != "peers"},
        sorted((p.get("node_id"), p.get("state")) for p in body["peers"] if isinstance(p, dict)),
        [offered.get(k) for k in ("cores", "memory_bytes", "state", "suspended")],
        sorted((k, v.get("cores")) for k, v in (status.get("peer_capacity") or {}).items()),
    ]
    return hashlib.sha256(json.dumps(stable, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _download(data: bytes, filename: str) -> RawResponse:
    safe = "".join(c if c.isalnum() or c in "-._" else "_" for c in filename)[:100] or "download"
    return RawResponse(
        data,
        "application/octet-stream",
        (("content-disposition", f'attachment; filename="{safe}"'),),
    )


def _brief(row: JobRow) -> dict[str, Any]:
    try:
        args = list(JobManifest.from_wire(unpack_canonical(row.manifest)).args)
    except ProtocolError:
        args = []
    return {
        "job_id": row.job_id.hex(),
        "role": row.role,
        "state": row.state,
        "submitter": row.submitter,
        "executor": row.executor,
        "created": row.created,
        "updated": row.updated,
        "started": row.started,
        "finished": row.finished,
        "deadline": row.deadline,
        "fuel_used": row.fuel_used,
        "reason": row.reason,
        "args": args[:8],
    }


def _batch(b: overview.BatchProgress) -> dict[str, Any]:
    """A batch's progress, with an ETA from its rate so far (ended jobs over the time since it began)."""
    eta = rate = None
    if b.ended and b.last_ended is not None and b.last_ended > b.created:
        rate = b.ended / (b.last_ended - b.created)
        eta = 0.0 if b.ended >= b.total else (b.total - b.ended) / rate
    return {
        "batch_id": b.batch_id,
        "created": b.created,
        "total": b.total,
        "ended": b.ended,
        "states": b.states,
        "jobs_per_second": rate,
        "eta_seconds": eta,
    }


def _jsonable(value: Any) -> Any:
    """A message's fields as JSON: digests, keys and bytes as text, nested records as objects."""
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    if isinstance(value, bytes | bytearray):
        return bytes(value).hex()
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    if isinstance(value, Digest):
        return value.hex()
    if isinstance(value, NodeId):
        return str(value)
    fields = getattr(value, "__dataclass_fields__", None)
    if fields is not None:
        return {name: _jsonable(getattr(value, name)) for name in fields}
    return str(value)
