"""The envelopes table: signed messages kept byte for byte, each once, for the jobs they concern.

An envelope stored for one job names it (`job_id`); one that concerns several jobs (an offer of a set
of jobs, a bid for several, an `assigns` set, a proof, an ack of a batch of receipts) is stored once
with job_id NULL and linked to each job in envelope_jobs (put_shared_envelope). Not durable: an envelope
is kept before, or with, the durable write that names it.
"""

from __future__ import annotations

from collections.abc import Sequence

from e31.protocol.assignments import ASSIGN_KINDS

from .rows import EnvelopeRow
from .tables import Tables

SHARED_KINDS = ("offer", "bid", "proof", "ack", "assigns")
"""Kinds of envelope that may be shared by several jobs (`put_shared_envelope`); pruning deletes one
once no job links it any more."""

_ENVELOPES_FOR_JOB = (
    "SELECT 0, message_id, kind, raw, job_id, received FROM envelopes "
    "WHERE job_id = ?1 AND (?2 IS NULL OR kind = ?2 OR kind = ?3) "
    "UNION ALL "
    "SELECT 1, e.message_id, e.kind, e.raw, e.job_id, e.received FROM envelope_jobs l "
    "JOIN envelopes e ON e.message_id = l.message_id "
    "WHERE l.job_id = ?1 AND e.job_id IS NOT ?1 AND (?2 IS NULL OR e.kind = ?2 OR e.kind = ?3) "
    "ORDER BY 1, 6, 2"
)


class Envelopes(Tables):
    """Signed envelopes by message id, and their links to jobs."""

    def put_envelope(
        self, message_id: bytes, kind: str, raw: bytes, now: float, job_id: bytes | None = None
    ) -> bool:
        """Keep a signed envelope's exact bytes; returns False if it was already stored."""
        with self.transaction(durable=False) as c:
            cur = c.execute(
                "INSERT INTO envelopes (message_id, kind, raw, job_id, received) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (message_id) DO NOTHING",
                (message_id, kind, raw, job_id, now),
            )
            return cur.rowcount > 0

    def put_shared_envelope(
        self, message_id: bytes, kind: str, raw: bytes, now: float, job_ids: Sequence[bytes]
    ) -> bool:
        """Keep a signed envelope that concerns several jobs once, linked to each of `job_ids` (links
        are added even when the envelope was already stored); returns whether the envelope was new.
        Only SHARED_KINDS: pruning collects an envelope of those kinds once no job links it."""
        if kind not in SHARED_KINDS:
            raise ValueError(
                f"an envelope of kind {kind!r} is not shared by jobs (only {', '.join(SHARED_KINDS)} are)"
            )
        if not job_ids:
            raise ValueError("a shared envelope needs at least one job to link it to")
        with self.transaction(durable=False) as c:
            cur = c.execute(
                "INSERT INTO envelopes (message_id, kind, raw, job_id, received) VALUES (?, ?, ?, NULL, ?) "
                "ON CONFLICT (message_id) DO NOTHING",
                (message_id, kind, raw, now),
            )
            c.executemany(
                "INSERT OR IGNORE INTO envelope_jobs (job_id, message_id) VALUES (?, ?)",
                [(job_id, message_id) for job_id in job_ids],
            )
            return cur.rowcount > 0

    def envelope(self, message_id: bytes) -> EnvelopeRow | None:
        with self.reading() as c:
            row = c.execute(
                "SELECT message_id, kind, raw, job_id, received FROM envelopes WHERE message_id = ?",
                (message_id,),
            ).fetchone()
        return None if row is None else EnvelopeRow(*row)

    def envelopes_for_job(self, job_id: bytes, kind: str | None = None) -> list[EnvelopeRow]:
        """The job's envelopes (of `kind`, or all): those stored for it, then those it shares with
        other jobs, each group by arrival; each envelope once."""
        with self.reading() as c:
            rows = c.execute(_ENVELOPES_FOR_JOB, (job_id, kind, None)).fetchall()
        return [EnvelopeRow(*r[1:]) for r in rows]

    def assignments_for_job(self, job_id: bytes) -> list[EnvelopeRow]:
        """The envelopes that assigned the job: `assign`s stored for it, then the `assigns` sets that
        name it, each group by arrival."""
        with self.reading() as c:
            rows = c.execute(_ENVELOPES_FOR_JOB, (job_id, *ASSIGN_KINDS)).fetchall()
        return [EnvelopeRow(*r[1:]) for r in rows]

    def envelope_job_ids(self, kinds: Sequence[str]) -> set[bytes]:
        """Ids of the jobs that have an envelope of one of `kinds`, stored for them or shared."""
        marks = ", ".join("?" * len(kinds))
        with self.reading() as c:
            rows = c.execute(
                f"SELECT job_id FROM envelopes WHERE job_id IS NOT NULL AND kind IN ({marks}) UNION "
                f"SELECT l.job_id FROM envelope_jobs l JOIN envelopes e ON e.message_id = l.message_id "
                f"WHERE e.kind IN ({marks})",
                (*kinds, *kinds),
            ).fetchall()
        return {bytes(r[0]) for r in rows}
