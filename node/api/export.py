"""POST /v1/receipts/export: the local API's endpoint that writes a receipts bundle (audit/bundle.py)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import trio
from e31.protocol.errors import ProtocolError
from e31.protocol.ids import Digest

from ..audit.bundle import BundleError, Export, export_bundle, write_bundle
from ..store.blobs import BlobStore
from ..store.db import AsyncStore
from ..store.receiptlog import ReceiptLog
from .server import Handler, HttpError, Request


def export_handler(
    store: AsyncStore,
    blobs: BlobStore | None,
    receipt_log: ReceiptLog | Callable[[], ReceiptLog | None] | None = None,
) -> Handler:
    """The handler of POST /v1/receipts/export.

    Body: {"jobs": [hex job id, ...] or null (all), "with_blobs": bool, "out": absolute path}. The node
    writes the bundle to `out` atomically and answers {"path", "bytes", "jobs", "envelopes", "blobs",
    "missing_blobs"}.
    """

    async def handle(request: Request) -> Any:
        body = request.body if request.body is not None else {}
        if not isinstance(body, dict):
            raise HttpError(400, "the body is a JSON object")
        unknown = set(body) - {"jobs", "with_blobs", "out"}
        if unknown:
            raise HttpError(400, f"unknown field(s): {', '.join(sorted(unknown))}")
        jobs = body.get("jobs")
        with_blobs = body.get("with_blobs", False)
        out = body.get("out")
        if not isinstance(with_blobs, bool):
            raise HttpError(400, "with_blobs is true or false")
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
            write_bundle(out, export.data)
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
        }

    return handle
