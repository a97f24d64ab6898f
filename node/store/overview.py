"""Summaries of the jobs table for the dashboard and the metrics endpoint: counts by role and state,
what this node served per submitter, the latest jobs of a role, and the latest batches with progress.

Each is one indexed or grouped query, run when a page or a scraper asks, never per event.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..lifecycle import TERMINAL, Role, sql_in
from .db import Store
from .rows import JobRow, columns


@dataclass(frozen=True, slots=True)
class Served:
    """What this node ran for one submitter (as an executor)."""

    submitter: str
    jobs: int
    done: int
    fuel: int
    run_seconds: float
    """Sum of started-to-finished times of its ended runs (owner pauses included)."""


@dataclass(frozen=True, slots=True)
class BatchProgress:
    batch_id: str
    created: float
    total: int
    ended: int
    states: dict[str, int]
    last_ended: float | None
    """When the latest of its ended jobs ended (for a rate), or None."""


def job_counts(store: Store) -> dict[tuple[str, str], int]:
    """The number of jobs by (role, state)."""
    with store.reading() as c:
        rows = c.execute("SELECT role, state, count(*) FROM jobs GROUP BY role, state").fetchall()
    return {(r[0], r[1]): int(r[2]) for r in rows}


def served_by_submitter(store: Store, limit: int = 100) -> list[Served]:
    """Per submitter, the jobs this node holds or held as an executor, most fuel first."""
    with store.reading() as c:
        rows = c.execute(
            "SELECT submitter, count(*), sum(state = 'done'), "
            "coalesce(sum(CASE WHEN state = 'done' THEN fuel_used END), 0), "
            "coalesce(sum(CASE WHEN finished IS NOT NULL AND started IS NOT NULL "
            "THEN max(finished - started, 0) END), 0.0) "
            "FROM jobs WHERE role = ? GROUP BY submitter ORDER BY 4 DESC, 1 LIMIT ?",
            (Role.EXECUTOR, limit),
        ).fetchall()
    return [Served(r[0], int(r[1]), int(r[2] or 0), int(r[3]), float(r[4])) for r in rows]


def latest_jobs(store: Store, role: str, limit: int, *, unfinished: bool = False) -> list[JobRow]:
    """The `limit` jobs of `role` updated last (only those not ended, with `unfinished`)."""
    where = f" AND NOT {sql_in(TERMINAL, 'state')}" if unfinished else ""
    with store.reading() as c:
        rows = c.execute(
            f"SELECT {columns(JobRow)} FROM jobs WHERE role = ?{where} ORDER BY updated DESC LIMIT ?",
            (role, limit),
        ).fetchall()
    return [JobRow(*r) for r in rows]


def latest_batches(store: Store, limit: int) -> list[BatchProgress]:
    """The `limit` batches created last, each with its jobs counted by state."""
    with store.reading() as c:
        heads = c.execute(
            "SELECT batch_id, min(created), count(*) FROM batch_jobs GROUP BY batch_id "
            "ORDER BY 2 DESC LIMIT ?",
            (limit,),
        ).fetchall()
        out = []
        for bid, created, total in heads:
            states: dict[str, int] = {}
            last: float | None = None
            for state, n, updated in c.execute(
                "SELECT j.state, count(*), max(j.updated) FROM batch_jobs b JOIN jobs j "
                "ON j.job_id = b.job_id AND j.role = ? WHERE b.batch_id = ? GROUP BY j.state",
                (Role.SUBMITTER, bid),
            ):
                states[state] = int(n)
                if state in TERMINAL:
                    last = updated if last is None else max(last, updated)
            ended = sum(n for s, n in states.items() if s in TERMINAL)
            out.append(BatchProgress(bid, float(created), int(total), ended, states, last))
    return out
