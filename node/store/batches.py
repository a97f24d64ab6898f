"""Batches: many jobs submitted together (`e31 submit MODULE --batch FILE.jsonl`), named by one id.

A batch is only a name for a list of this node's submitted jobs, kept in the table batch_jobs beside
jobs. The id is `batch-` and 16 hex digits of the SHA-256 of its job ids, so it never looks like a job
id or a prefix of one. The batch file's format is the CLI's (cli/batch_file.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..lifecycle import TERMINAL, Role, sql_in
from .db import Store
from .rows import JobRow, columns

PREFIX = "batch-"
ID_HEX = 16
MAX_JOBS = 100_000
"""The most jobs one batch may hold."""
LINE_FIELDS = frozenset({"args", "env", "inputs", "stdin"})
"""The fields in which the jobs of one batch may differ (POST /v1/batches, a batch file's lines)."""


@dataclass(frozen=True, slots=True)
class BatchRow:
    batch_id: str
    created: float
    job_ids: tuple[bytes, ...]


def batch_id(job_ids: Sequence[bytes]) -> str:
    return PREFIX + hashlib.sha256(b"".join(job_ids)).hexdigest()[:ID_HEX]


def is_batch_id(text: str) -> bool:
    rest = text[len(PREFIX) :]
    return text.startswith(PREFIX) and len(rest) == ID_HEX and all(c in "0123456789abcdef" for c in rest)


def store_batch(store: Store, jobs: Sequence[Mapping[str, Any]], now: float) -> str:
    """Insert submitted jobs (each the arguments of Store.add_job) and their batch in one transaction: a
    sweep of thousands of jobs is one commit, and a crash leaves all of it or none. Returns the batch id."""
    job_ids = [j["job_id"] for j in jobs]
    bid = batch_id(job_ids)
    with store.transaction() as c:
        for j in jobs:
            store.add_job(**j)
        c.executemany(
            "INSERT OR IGNORE INTO batch_jobs (batch_id, seq, job_id, created) VALUES (?, ?, ?, ?)",
            [(bid, i, j, now) for i, j in enumerate(job_ids)],
        )
    return bid


def get_batch(store: Store, bid: str) -> BatchRow | None:
    with store.reading() as c:
        rows = c.execute(
            "SELECT job_id, created FROM batch_jobs WHERE batch_id = ? ORDER BY seq", (bid,)
        ).fetchall()
    if not rows:
        return None
    return BatchRow(bid, rows[0][1], tuple(bytes(r[0]) for r in rows))


def batch_jobs(store: Store, bid: str) -> list[JobRow]:
    """The rows of the batch's jobs this node submitted, in batch order (one indexed query: the cost
    follows the batch's size, not the store's)."""
    with store.reading() as c:
        rows = c.execute(
            f"SELECT {columns(JobRow, 'j')} FROM batch_jobs b JOIN jobs j ON j.job_id = b.job_id "
            "AND j.role = ? WHERE b.batch_id = ? ORDER BY b.seq",
            (Role.SUBMITTER, bid),
        ).fetchall()
    return [JobRow(*r) for r in rows]


def batch_unfinished(store: Store, bid: str) -> int:
    """How many of the batch's jobs have not ended (a count, for waiting on a batch of thousands)."""
    with store.reading() as c:
        row = c.execute(
            "SELECT count(*) FROM batch_jobs b JOIN jobs j ON j.job_id = b.job_id AND j.role = ? "
            f"WHERE b.batch_id = ? AND NOT {sql_in(TERMINAL, 'j.state')}",
            (Role.SUBMITTER, bid),
        ).fetchone()
    return int(row[0])


def forget_pruned_jobs(store: Store) -> int:
    """Drop the batch entries of jobs the store no longer holds (pruned after their retention): a
    batch whose jobs are all gone is gone. Returns how many entries went."""
    with store.transaction(durable=False) as c:
        return c.execute(
            "DELETE FROM batch_jobs WHERE NOT EXISTS "
            "(SELECT 1 FROM jobs WHERE jobs.job_id = batch_jobs.job_id)"
        ).rowcount
