"""Reads about many submitted jobs at once, so a batch of thousands is listed without store round trips
per job: which are handed off (done, or `assigned` with an `accepted` from their executor naming the
current assignment), and the acknowledged receipt of each finished one."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from e31.protocol.assignments import assignment_of
from e31.protocol.envelope import VerifiedEnvelope, reopen_stored
from e31.protocol.messages import Accepted

from ..lifecycle import JobState
from .db import Store
from .rows import JobRow

CHUNK = 500
"""Job ids per query (SQLite limits the parameters of one statement)."""


def handed_off(store: Store, rows: Sequence[JobRow]) -> set[bytes]:
    """The job ids among `rows` (submitter rows) that no longer need their submitter online."""
    out = {r.job_id for r in rows if r.state == JobState.DONE}
    current = {r.job_id: r for r in rows if r.state == JobState.ASSIGNED}
    if not current:
        return out
    ids = list(current)
    found = []
    with store.transaction() as c:
        for i in range(0, len(ids), CHUNK):
            part = ids[i : i + CHUNK]
            marks = ",".join("?" * len(part))
            found += c.execute(
                "SELECT kind, raw, job_id FROM envelopes WHERE kind IN ('assign', 'accepted') "
                f"AND job_id IN ({marks}) UNION ALL "
                "SELECT e.kind, e.raw, l.job_id FROM envelope_jobs l JOIN envelopes e "
                f"ON e.message_id = l.message_id WHERE e.kind = 'assigns' AND l.job_id IN ({marks})",
                (*part, *part),
            ).fetchall()
    assigns: set[tuple[bytes, bytes]] = set()
    accepted: set[tuple[bytes, bytes]] = set()
    opened: dict[bytes, VerifiedEnvelope[Any]] = {}
    for kind, raw, job_id in found:
        if kind == "accepted":
            acc = reopen_stored(bytes(raw), Accepted).message
            accepted.add((acc.assignment_id.raw, acc.job_id.raw))
            continue
        env = opened.get(bytes(raw))
        if env is None:  # a set comes once per job it names: opened once
            env = opened[bytes(raw)] = reopen_stored(bytes(raw))
        a = assignment_of(env, bytes(job_id))
        if a is None:
            continue
        row = current[a.job_id.raw]
        if a.attempt == row.attempt and str(a.executor) == row.executor:
            assigns.add(a.key)
    out.update(job for _, job in accepted & assigns)
    return out


def acked_receipts(store: Store, job_ids: Sequence[bytes]) -> dict[bytes, bytes]:
    """The signed receipt (envelope bytes) this node acknowledged for each of `job_ids` that has one;
    with several (replicas), the last by attempt and executor, as for one job."""
    ids = list(job_ids)
    found: list[tuple[bytes, bytes]] = []
    with store.transaction() as c:
        for i in range(0, len(ids), CHUNK):
            part = ids[i : i + CHUNK]
            found += c.execute(
                "SELECT r.job_id, e.raw FROM receipts r JOIN envelopes e ON e.message_id = r.message_id "
                f"WHERE r.delivered IS NOT NULL AND r.job_id IN ({','.join('?' * len(part))}) "
                "ORDER BY r.attempt, r.executor",
                part,
            ).fetchall()
    return {bytes(job): bytes(raw) for job, raw in found}
