"""POST /v1/receipts/export: the local API's endpoint that writes a receipts bundle (audit/bundle.py)."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from collections.abc import Callable
from typing import Any

import trio
from e31.protocol.errors import ProtocolError
from e31.protocol.ids import Digest

from ..audit.bundle import BundleError, Export, export_bundle, write_bundle
from ..store.async_store import AsyncStore
from ..store.blobs import BlobStore
from ..store.receiptlog import ReceiptLog
from .server import Handler, HttpError, Request


def export_handler(
    store: AsyncStore,
    blobs: BlobStore | None,
    receipt_log: ReceiptLog | Callable[[], ReceiptLog | None] | None = None,
) -> Handler:
    """The handler of POST /v1/receipts/export.

    Body: {"jobs": [hex job id, ...] or null (all), "with_blobs": bool, "out": absolute path}. The node
    writes the bundle to `out` atomically (refusing with 409 if anything, a file or a link, is there
    already, unless "overwrite": true) and answers {"path", "bytes", "jobs", "envelopes", "blobs",
    "missing_blobs", "corrupt_blobs"} (a corrupt blob is one that failed its hash check: it is missing
    from the bundle and now in the blob store's quarantine).
    """

    async def handle(request: Request) -> Any:
        body = request.body if request.body is not None else {}
        if not isinstance(body, dict):
            raise HttpError(400, "the body is a JSON object")
        unknown = set(body) - {"jobs", "with_blobs", "out", "overwrite"}
        if unknown:
            raise HttpError(400, f"unknown field(s): {', '.join(sorted(unknown))}")
        jobs = body.get("jobs")
        with_blobs = body.get("with_blobs", False)
        out = body.get("out")
        overwrite = body.get("overwrite", False)
        if not isinstance(with_blobs, bool):
            raise HttpError(400, "with_blobs is true or false")
        if not isinstance(overwrite, bool):
            raise HttpError(400, "overwrite is true or false")
        if not isinstance(out, str) or not os.path.isabs(out):
            raise HttpError(400, "out is the absolute path of the bundle file to write")
        job_ids: list[bytes] | None = None
        if jobs is not None:
            if not isinstance(jobs, list) or not all(isinstance(j, str) for j in jobs):
                raise HttpError(400, "jobs is a list of job ids (64 hex digits each), or null for all")
            try:
                job_ids = [Digest.parse(j).raw for j in jobs]
            except ProtocolError as e:
                raise HttpError(400, f"bad job id: {e}") from None
        log = receipt_log() if callable(receipt_log) else receipt_log

        def work() -> Export:
            if job_ids is not None:
                for j in job_ids:
                    if not store.store.envelopes_for_job(j) and not any(
                        store.store.job(j, role) for role in ("submitter", "executor")
                    ):
                        raise HttpError(404, f"no such job: {j.hex()}", "unknown_job")
            export = export_bundle(store.store, blobs, job_ids, with_blobs, receipt_log=log)
            if overwrite:
                write_bundle(out, export.data)  # a rename: a link at `out` is replaced, not followed
            else:
                _write_new(out, export.data)
            return export

        try:
            export = await trio.to_thread.run_sync(work)
        except BundleError as e:
            raise HttpError(400, str(e), "export_failed") from None
        return {
            "path": out,
            "bytes": len(export.data),
            "jobs": export.jobs,
            "envelopes": export.envelopes,
            "blobs": export.blobs,
            "missing_blobs": list(export.missing_blobs),
            "corrupt_blobs": list(export.corrupt_blobs),
        }

    return handle


def _write_new(out: str, data: bytes) -> None:
    """Write the bundle to `out` only if nothing has that name: whole under a temporary name beside it
    (write_bundle: fsynced), then hard-linked to `out`, which fails if anything is there, even a
    dangling link, so nothing is overwritten or written through a link, with no window between a check
    and the write. A file system without hard links gets a check and a rename instead."""
    parent, name = os.path.split(out)
    tmp = os.path.join(parent, f".{name}.new-{secrets.token_hex(4)}")
    write_bundle(tmp, data)
    exists = HttpError(409, f"{out} exists: not overwritten (ask for overwrite to replace it)", "exists")
    try:
        try:
            os.link(tmp, out, follow_symlinks=False)
        except FileExistsError:
            raise exists from None
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
                raise BundleError(f"cannot write {out}: {e.strerror or e}") from None
            if os.path.lexists(out):
                raise exists from None
            os.replace(tmp, out)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
