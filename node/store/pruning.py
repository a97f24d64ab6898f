"""Forgetting finished jobs once their retention is over, but for the signed evidence of a job that ran.

A finished job has rows in most tables (jobs, results, blob_refs, envelopes, envelope_jobs, receipts,
acks); this is the one place that knows which of them go together and which stay. store/gc.py calls it
in chunks, oldest jobs first, found through the partial index jobs_ended (store/schema.py, _V4).
"""

from __future__ import annotations

from ..lifecycle import PRUNABLE, sql_in
from .envelopes import SHARED_KINDS
from .tables import Tables


class Pruning(Tables):
    """Finished jobs, forgotten after their retention."""

    def prune_finished_jobs(self, ended_before: float, limit: int = 500) -> int:
        """Forget up to `limit` jobs that ended (lifecycle.PRUNABLE) before `ended_before`, oldest first, in
        one transaction; returns how many rows went (call again until it returns less than `limit`).

        Goes: the job row, and once no role of the job is left, its results, its blob references and
        its envelopes (bids, result, accepted, proofs...; all of them when it has no receipt). Stays,
        for a job with a usage receipt: the receipts and their acknowledgements, with the offer and the
        assignments they name (the signed evidence an audit checks a receipt against, in the receipt
        log); undelivered receipts are not offered again. And every `disputed` job stays whole.

        An envelope shared by several jobs loses the job's link likewise (a job with a receipt keeps
        its links to offers and acks), and goes once no job links it any more. One stored for a job and shared
        with others later is kept, for those others, as a shared one."""
        with self.transaction() as c:
            rows = c.execute(  # the states as literals, as in the partial index jobs_ended
                f"SELECT job_id, role FROM jobs WHERE {_ENDED} AND updated < ? ORDER BY updated LIMIT ?",
                (ended_before, limit),
            ).fetchall()
            c.executemany("DELETE FROM jobs WHERE job_id = ? AND role = ?", [(r[0], r[1]) for r in rows])
            gone = [
                (job,)
                for job in {bytes(r[0]) for r in rows}
                if c.execute("SELECT 1 FROM jobs WHERE job_id = ?", (job,)).fetchone() is None
            ]
            c.executemany("DELETE FROM results WHERE job_id = ?", gone)
            c.executemany("DELETE FROM blob_refs WHERE owner = ?", [(f"job:{j.hex()}",) for (j,) in gone])
            c.executemany(
                "UPDATE receipts SET next_delivery = NULL WHERE job_id = ? AND delivered IS NULL", gone
            )  # its result goes: no more delivery attempts
            unlinked = {
                bytes(r[0])
                for (j,) in gone
                for r in c.execute(
                    "DELETE FROM envelope_jobs AS l WHERE job_id = ?1 AND NOT (EXISTS ("
                    "SELECT 1 FROM receipts WHERE job_id = ?1) AND EXISTS ("
                    "SELECT 1 FROM envelopes e WHERE e.message_id = l.message_id "
                    "AND e.kind IN ('offer', 'ack', 'assigns'))) "
                    "RETURNING message_id",
                    (j,),
                ).fetchall()
            }
            c.executemany(
                f"UPDATE envelopes SET job_id = NULL WHERE {_NOT_EVIDENCE} AND EXISTS ("
                "SELECT 1 FROM envelope_jobs l WHERE l.message_id = envelopes.message_id)",
                gone,
            )
            c.executemany(f"DELETE FROM envelopes WHERE {_NOT_EVIDENCE}", gone)
            marks = ", ".join("?" * len(SHARED_KINDS))
            c.executemany(
                f"DELETE FROM envelopes WHERE message_id = ? AND job_id IS NULL AND kind IN ({marks}) "
                "AND NOT EXISTS (SELECT 1 FROM envelope_jobs l WHERE l.message_id = envelopes.message_id)",
                [(m, *SHARED_KINDS) for m in sorted(unlinked)],
            )
            return len(rows)


_ENDED = sql_in(PRUNABLE)
"""PRUNABLE as SQL, spelled exactly as the index jobs_ended's condition (so the query uses it)."""
_NOT_EVIDENCE = (
    "job_id = ?1 AND NOT ("
    "message_id IN (SELECT message_id FROM receipts WHERE job_id = ?1 UNION SELECT a.message_id "
    "FROM acks a JOIN receipts r ON r.digest = a.receipt_digest WHERE r.job_id = ?1) "
    "OR (kind IN ('offer', 'assign') AND EXISTS (SELECT 1 FROM receipts WHERE job_id = ?1)))"
)
"""The envelopes stored for job ?1 that are not the signed evidence of a receipt (prune_finished_jobs)."""
