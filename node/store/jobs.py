"""The jobs table: one row per (job, role) this node plays in it, its state and its bookkeeping.

States and roles are node/lifecycle.py's: every row written is checked against them, and which state
changes are durable commits is lifecycle.DURABLE (assigned and the ends, which others rely on; the
intermediate states are not: losing one to a power cut only repeats work). A submitted job is durable
(`add_job`); an executor's is not until it promises it (AsyncStore.flush before `accepted`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..lifecycle import DURABLE, JobState, Role
from .rows import JobRow, columns
from .tables import Tables

_JOB_COLUMNS = columns(JobRow)
_JOB_UPDATABLE = frozenset(
    {"state", "executor", "attempt", "deadline", "started", "finished", "fuel_limit", "fuel_used", "reason"}
)


def _check_job(role: str, state: str) -> None:
    if role not in Role.__members__.values():
        raise ValueError(f"unknown job role {role!r}")
    if state not in JobState.__members__.values():
        raise ValueError(f"unknown job state {state!r}")


class Jobs(Tables):
    """Jobs by (job id, role)."""

    def add_job(
        self,
        *,
        job_id: bytes,
        role: str,
        manifest: bytes,
        state: str,
        submitter: str,
        created: float,
        deadline: float,
        fuel_limit: int | None = None,
        executor: str | None = None,
        attempt: int = 0,
        blobs: Sequence[str] = (),
        durable: bool = True,
    ) -> bool:
        """Insert a job; returns False (and changes nothing) if this node already holds it in `role`.

        `blobs` (hashes) are referenced by owner "job:<hex id>" in the same transaction. Not `durable`:
        a power cut may take the job back (an executor's, until it promises it: see AsyncStore.flush)."""
        _check_job(role, state)
        with self.transaction(durable=durable) as c:
            cur = c.execute(
                "INSERT INTO jobs (job_id, role, manifest, state, submitter, executor, attempt, created, "
                "deadline, updated, fuel_limit) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (job_id, role) DO NOTHING",
                (
                    job_id,
                    role,
                    manifest,
                    state,
                    submitter,
                    executor,
                    attempt,
                    created,
                    deadline,
                    created,
                    fuel_limit,
                ),
            )
            if cur.rowcount > 0:
                c.executemany(
                    "INSERT INTO blob_refs (blob_hash, owner, retain_until) VALUES (?, ?, NULL) "
                    "ON CONFLICT DO NOTHING",
                    [(h, f"job:{job_id.hex()}") for h in blobs],
                )
            return cur.rowcount > 0

    def job(self, job_id: bytes, role: str) -> JobRow | None:
        with self.reading() as c:
            row = c.execute(
                f"SELECT {_JOB_COLUMNS} FROM jobs WHERE job_id = ? AND role = ?", (job_id, role)
            ).fetchone()
        return None if row is None else JobRow(*row)

    def jobs_by_id(self, job_ids: Sequence[bytes], role: str) -> dict[bytes, JobRow]:
        """The rows in `role` of those of `job_ids` this store holds, by job id (one query for the
        entries of a results carrier: at most a few dozen ids)."""
        if not job_ids:
            return {}
        with self.reading() as c:
            marks = ", ".join("?" * len(job_ids))
            rows = c.execute(
                f"SELECT {_JOB_COLUMNS} FROM jobs WHERE role = ? AND job_id IN ({marks})", (role, *job_ids)
            ).fetchall()
        found = (JobRow(*r) for r in rows)
        return {bytes(row.job_id): row for row in found}

    def jobs_held(self, job_ids: Sequence[bytes], role: str) -> set[bytes]:
        """Which of `job_ids` this store holds a job row of in `role` (one query for an offer's jobs)."""
        with self.reading() as c:
            marks = ", ".join("?" * len(job_ids))
            rows = c.execute(
                f"SELECT job_id FROM jobs WHERE role = ? AND job_id IN ({marks})", (role, *job_ids)
            ).fetchall()
        return {bytes(r[0]) for r in rows}

    def jobs(self, *, role: str | None = None, states: Sequence[str] | None = None) -> list[JobRow]:
        """Jobs, oldest first, optionally only in `role` and in one of `states`."""
        sql = f"SELECT {_JOB_COLUMNS} FROM jobs WHERE (?1 IS NULL OR role = ?1)"
        args: list[Any] = [role]
        if states is not None:
            sql += f" AND state IN ({', '.join('?' * len(states))})"
            args += list(states)
        with self.reading() as c:
            rows = c.execute(sql + " ORDER BY created, job_id", args).fetchall()
        return [JobRow(*r) for r in rows]

    def update_job(
        self, /, job_id: bytes, role: str, now: float, *, expect_state: str | None = None, **changes: Any
    ) -> bool:
        """Change a job's fields; with `expect_state`, only if it is still in that state (compare-and-set).

        Returns whether a row changed. Only state, executor, attempt, deadline, started, finished,
        fuel_limit, fuel_used and reason may change.
        """
        bad = set(changes) - _JOB_UPDATABLE
        if bad:
            raise ValueError(f"cannot update job field(s): {', '.join(sorted(bad))}")
        if "state" in changes:
            _check_job(role, changes["state"])
        sets = ", ".join(f"{k} = ?" for k in changes)
        sql = f"UPDATE jobs SET {sets + ', ' if sets else ''}updated = ? WHERE job_id = ? AND role = ?"
        args: list[Any] = [*changes.values(), now, job_id, role]
        if expect_state is not None:
            sql += " AND state = ?"
            args.append(expect_state)
        with self.transaction(durable=changes.get("state") in DURABLE) as c:
            return c.execute(sql, args).rowcount > 0
