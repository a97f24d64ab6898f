"""Garbage collection: blobs nobody needs any more, and the leftovers of finished jobs on disk.

A blob is kept while any of these holds; everything else is deleted, oldest first:
- a reference in the store names it and its retention has not ended (Store.live_blobs; references
  whose retention ended are dropped first, Store.expire_blob_refs): a result the executor still serves,
  a submitter's fetched outputs;
- a job of either role that is not over, or that ended less than `retention_s` ago, names it in its
  manifest (module, inputs, stdin): the executor still needs them, and so does an auditor re-running
  the job against its receipt;
- it was written less than `grace_s` ago: a blob just stored, whose job row or reference is about to
  be written, is never taken from under its writer.
Small blobs kept in the database (a job's outputs its result carried) go once no live reference names
them. Partial downloads live apart and are never touched. Run directories (DATA/runs/JOB) of jobs this node
is no longer running (a kill -9 leaves them) are removed. The seen-message cache is pruned.

Jobs that ended more than `retention_s` ago (done, failed, expired, cancelled; never `disputed`) are
forgotten first (Store.prune_finished_jobs): their rows, results, blob references, batch entries and
envelopes go, but for the signed evidence of a job that ran: its usage receipts and their
acknowledgements, with the offer and assignments they name (what an audit checks a receipt against).
So the store of a node that runs jobs for months holds the jobs of one retention window, plus about
2 KB of evidence per job ever run.

`collect` is blocking (run it in a thread); `run_gc` is the daemon's periodic service. Blob deletion
needs no store transaction: a blob a job names is in the keep set, computed just before deleting.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import trio
from e31.protocol.codec import unpack_canonical
from e31.protocol.errors import ProtocolError
from e31.protocol.jobs import JobManifest

from ..lifecycle import EXECUTOR_TRANSITIONS, TERMINAL, Role
from .async_store import AsyncStore
from .batches import forget_pruned_jobs
from .blobs import BlobStore
from .db import Store

log = logging.getLogger("e31.gc")

GRACE_SECONDS = 3600.0
PRUNE_CHUNK = 500
ACTIVE_RUN_STATES = tuple(sorted(set(EXECUTOR_TRANSITIONS) - TERMINAL))
"""An executor's states before an end (fetching, queued, running): its run directory is in use."""


@dataclass(frozen=True, slots=True)
class GcReport:
    blobs_deleted: int
    bytes_freed: int
    blobs_kept: int
    bytes_used: int
    refs_expired: int
    runs_removed: int
    seen_pruned: int
    jobs_pruned: int = 0
    small_blobs_dropped: int = 0
    """Small blobs kept in the database (Store.put_small_blob) that no live reference names any more."""

    @property
    def changed(self) -> bool:
        return bool(
            self.blobs_deleted
            or self.refs_expired
            or self.runs_removed
            or self.jobs_pruned
            or self.small_blobs_dropped
        )


def keep_set(store: Store, *, now: float, retention_s: float) -> set[str] | None:
    """Hashes that must not be collected at `now` (Unix seconds); None when that cannot be known (a
    job's manifest is unreadable, so the blobs it names cannot be told apart: nothing is collected)."""
    keep = set(store.live_blobs(now))
    for row in store.jobs():
        if row.state in TERMINAL and row.updated + retention_s <= now:
            continue
        try:
            manifest = JobManifest.from_wire(unpack_canonical(row.manifest))
        except ProtocolError:
            log.warning("job %s has an unreadable manifest: no blob is collected", row.job_id.hex()[:12])
            return None
        refs = [manifest.module, *(f.blob for f in manifest.inputs)]
        if manifest.stdin is not None:
            refs.append(manifest.stdin)
        keep.update(ref.root.hex() for ref in refs)
    return keep


def collect(
    store: Store,
    blobs: BlobStore,
    *,
    now: float,
    retention_s: float,
    grace_s: float = GRACE_SECONDS,
    runs_dir: Path | None = None,
) -> GcReport:
    """One collection at `now` (Unix seconds; file ages are judged against it too)."""
    pruned = 0
    while True:  # in chunks, so the writer is never held for long
        n = store.prune_finished_jobs(now - retention_s, limit=PRUNE_CHUNK)
        pruned += n
        if n < PRUNE_CHUNK:
            break
    if pruned:
        forget_pruned_jobs(store)
    expired = store.expire_blob_refs(now)
    small = store.drop_small_blobs(now)
    keep = keep_set(store, now=now, retention_s=retention_s)
    candidates: list[tuple[float, str, int]] = []
    kept = used = 0
    for digest in blobs.hashes():
        try:
            st = os.stat(blobs.path(digest))
        except FileNotFoundError:
            continue
        if keep is None or digest in keep or st.st_mtime > now - grace_s:
            kept += 1
            used += st.st_size
        else:
            candidates.append((st.st_mtime, digest, st.st_size))
    deleted = freed = 0
    for _, digest, size in sorted(candidates):
        if blobs.delete(digest):
            deleted += 1
            freed += size
    runs = _remove_stale_runs(store, runs_dir) if runs_dir is not None else 0
    seen = store.prune_seen(now)
    return GcReport(deleted, freed, kept, used, expired, runs, seen, pruned, small)


def _remove_stale_runs(store: Store, runs_dir: Path) -> int:
    active = {row.job_id.hex() for row in store.jobs(role=Role.EXECUTOR, states=ACTIVE_RUN_STATES)}
    removed = 0
    try:
        entries = list(runs_dir.iterdir())
    except FileNotFoundError:
        return 0
    for entry in entries:
        if entry.name not in active and entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
            removed += 1
    return removed


async def run_gc(
    store: AsyncStore,
    blobs: BlobStore,
    *,
    interval: float,
    retention_s: float,
    runs_dir: Path | None = None,
    grace_s: float = GRACE_SECONDS,
    clock: Callable[[], float] = time.time,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Collect every `interval` seconds (the first time one interval after start) until cancelled."""
    task_status.started()
    while True:
        await trio.sleep(interval)
        job = partial(
            collect,
            store.store,
            blobs,
            now=clock(),
            retention_s=retention_s,
            grace_s=grace_s,
            runs_dir=runs_dir,
        )
        try:
            report = await trio.to_thread.run_sync(job)
        except OSError as e:
            log.warning("garbage collection failed: %s", e)
            continue
        if report.changed:
            log.info(
                "garbage collection: %d finished job(s) forgotten, %d blob(s) deleted (%d bytes), %d "
                "kept (%d bytes), %d stale run dir(s) removed",
                report.jobs_pruned,
                report.blobs_deleted,
                report.bytes_freed,
                report.blobs_kept,
                report.bytes_used,
                report.runs_removed,
            )
        ceiling = blobs.ceiling
        if ceiling is not None and report.bytes_used > ceiling * 0.9:
            log.warning(
                "blobs still use %d of the %d-byte disk ceiling after collection: everything "
                "left is within its retention",
                report.bytes_used,
                ceiling,
            )
