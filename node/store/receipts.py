"""Results, usage receipts and their acknowledgements: the index of a job's signed outcome.

The signed envelopes themselves are in envelopes (store/envelopes.py); these tables index them by job,
attempt and executor. Results, receipts and receipt log indexes are durable commits (the writes behind
"safe to walk away"); acknowledgements are not (an ack lost to a power cut is sent or signed again when
its receipt is delivered again), nor are delivery retry times.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

from ..lifecycle import Role
from .blob_refs import BlobRefs
from .envelopes import Envelopes
from .rows import EnvelopeRow, ReceiptRow, ResultRow, columns

_RECEIPT_COLUMNS = columns(ReceiptRow)
_SUBMITTED = "EXISTS (SELECT 1 FROM jobs j WHERE j.job_id = r.job_id AND j.role = ?)"
"""Receipt r is of a job this node still holds in the role given (a parameter: Role.SUBMITTER)."""


def _result(row: sqlite3.Row) -> ResultRow:
    return ResultRow(
        row["job_id"],
        row["attempt"],
        row["executor"],
        row["message_id"],
        row["status"],
        row["fuel_used"],
        json.loads(row["outputs"]),
        row["created"],
    )


class Receipts(Envelopes, BlobRefs):
    """Results, receipts and acks by job, attempt and executor."""

    def put_result(
        self,
        *,
        job_id: bytes,
        attempt: int,
        executor: str,
        message_id: bytes,
        status: str,
        outputs: dict[str, str],
        now: float,
        fuel_used: int | None = None,
    ) -> bool:
        """Index an executor's result of an attempt (`message_id`: its receipt's envelope, already stored);
        False if this attempt's result is known."""
        with self.transaction() as c:
            cur = c.execute(
                "INSERT INTO results (job_id, attempt, executor, message_id, status, fuel_used, outputs, "
                "created) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (
                    job_id,
                    attempt,
                    executor,
                    message_id,
                    status,
                    fuel_used,
                    json.dumps(outputs, sort_keys=True),
                    now,
                ),
            )
            return cur.rowcount > 0

    def results_for_job(self, job_id: bytes) -> list[ResultRow]:
        with self.reading() as c:
            rows = c.execute(
                "SELECT * FROM results WHERE job_id = ? ORDER BY attempt, executor", (job_id,)
            ).fetchall()
        return [_result(r) for r in rows]

    def put_receipt(
        self,
        *,
        digest: bytes,
        job_id: bytes,
        attempt: int,
        executor: str,
        message_id: bytes,
        now: float,
        next_delivery: float | None = None,
    ) -> bool:
        """Index a receipt whose envelope is already stored; False if it was known."""
        with self.transaction() as c:
            cur = c.execute(
                "INSERT INTO receipts (digest, job_id, attempt, executor, message_id, created, "
                "next_delivery) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (digest) DO NOTHING",
                (digest, job_id, attempt, executor, message_id, now, next_delivery),
            )
            return cur.rowcount > 0

    def receipt(self, digest: bytes) -> ReceiptRow | None:
        with self.reading() as c:
            row = c.execute(f"SELECT {_RECEIPT_COLUMNS} FROM receipts WHERE digest = ?", (digest,)).fetchone()
        return None if row is None else ReceiptRow(*row)

    def receipts_with_envelopes(self, digests: Sequence[bytes]) -> list[tuple[ReceiptRow, bytes]]:
        """The receipts of `digests` this store indexes, each with its stored envelope's bytes (one
        query for a proof's batch of receipts; digests it does not index are left out)."""
        out: list[tuple[ReceiptRow, bytes]] = []
        select = columns(ReceiptRow, "r")
        with self.reading() as c:
            for i in range(0, len(digests), 500):  # within SQLite's bound on parameters
                part = digests[i : i + 500]
                marks = ", ".join("?" * len(part))
                sql = (
                    f"SELECT {select}, e.raw FROM receipts r JOIN envelopes e "
                    f"ON e.message_id = r.message_id WHERE r.digest IN ({marks})"
                )
                rows = c.execute(sql, part).fetchall()
                out += [(ReceiptRow(*row[:-1]), bytes(row[-1])) for row in rows]
        return out

    def receipts_for_job(self, job_id: bytes) -> list[ReceiptRow]:
        with self.reading() as c:
            rows = c.execute(
                f"SELECT {_RECEIPT_COLUMNS} FROM receipts WHERE job_id = ? ORDER BY attempt, executor",
                (job_id,),
            ).fetchall()
        return [ReceiptRow(*r) for r in rows]

    def receipts_due(self, now: float, limit: int = 100) -> list[ReceiptRow]:
        """Unacknowledged receipts whose next delivery attempt is due."""
        with self.reading() as c:
            rows = c.execute(
                f"SELECT {_RECEIPT_COLUMNS} FROM receipts WHERE delivered IS NULL "
                "AND next_delivery IS NOT NULL AND next_delivery <= ? ORDER BY next_delivery LIMIT ?",
                (now, limit),
            ).fetchall()
        return [ReceiptRow(*r) for r in rows]

    def acked_without_proof(
        self, executor: str, limit: int = 100, before: tuple[float, bytes] | None = None
    ) -> list[ReceiptRow]:
        """Receipts by `executor` this node acknowledged (as their submitter) for jobs it still holds
        and holds no inclusion proof of (its `log_index` is set when one is kept), newest first, from
        just below `before` (a row's (delivered, digest): where the last page ended); an index of
        exactly those rows makes it cheap however many receipts the store holds."""
        after = "" if before is None else "AND (r.delivered, r.digest) < (?, ?) "
        with self.reading() as c:
            rows = c.execute(
                f"SELECT {_RECEIPT_COLUMNS} FROM receipts r WHERE r.executor = ? AND r.delivered IS NOT NULL "
                f"AND r.log_index IS NULL {after}"
                f"AND {_SUBMITTED} ORDER BY r.delivered DESC, r.digest DESC LIMIT ?",
                (executor, *(before or ()), Role.SUBMITTER, limit),
            ).fetchall()
        return [ReceiptRow(*r) for r in rows]

    def verified_unacked(self, limit: int = 10_000) -> list[ReceiptRow]:
        """Up to `limit` receipts of jobs this node submitted that it verified (marked delivered) and
        holds no ack of: the node stopped before their batch's ack was stored. Newest first. Receipts
        delivered before schema v6 are not among them (their acks of the old form were dropped: _V6)."""
        with self.reading() as c:
            rows = c.execute(
                f"SELECT {_RECEIPT_COLUMNS} FROM receipts r WHERE r.delivered IS NOT NULL "
                "AND r.delivered > coalesce((SELECT CAST(value AS REAL) FROM kv "
                "WHERE key = 'acks_v6_at'), 0) "
                "AND NOT EXISTS (SELECT 1 FROM acks a WHERE a.receipt_digest = r.digest) "
                f"AND {_SUBMITTED} ORDER BY r.delivered DESC LIMIT ?",
                (Role.SUBMITTER, limit),
            ).fetchall()
        return [ReceiptRow(*r) for r in rows]

    def acked_unlogged(self, executor: str) -> list[ReceiptRow]:
        """`executor`'s acknowledged receipts not yet in its receipt log (the node stopped between the
        ack and the append), oldest first."""
        with self.reading() as c:
            rows = c.execute(
                f"SELECT {_RECEIPT_COLUMNS} FROM receipts WHERE executor = ? AND delivered IS NOT NULL "
                "AND log_index IS NULL ORDER BY delivered",
                (executor,),
            ).fetchall()
        return [ReceiptRow(*r) for r in rows]

    def receipt_delivery_failed(self, digest: bytes, next_delivery: float) -> None:
        with self.transaction(durable=False) as c:
            c.execute(
                "UPDATE receipts SET delivery_tries = delivery_tries + 1, next_delivery = ? WHERE digest = ?",
                (next_delivery, digest),
            )

    def set_receipt_log_index(self, digest: bytes, log_index: int, *, durable: bool = True) -> None:
        """Record where a receipt sits in its executor's log: durable for the executor's own log; a
        submitter's record of a proof it can ask for again need not be."""
        with self.transaction(durable=durable) as c:
            c.execute("UPDATE receipts SET log_index = ? WHERE digest = ?", (log_index, digest))

    def put_acks(
        self,
        ack_id: bytes,
        ack_raw: bytes,
        now: float,
        receipts: Sequence[tuple[bytes, bytes]],
        *,
        durable: bool = True,
        delivered: bool = False,
    ) -> None:
        """Keep a verified `ack` once, linked to the jobs it answers, as the acknowledgement of each of
        `receipts` ((receipt digest, job id) pairs, receipts already indexed) that has none yet, and mark
        those receipts delivered (unless the caller knows they are: `delivered`, a submitter's receipts,
        marked by `record_verified_receipt`). Not `durable` (an executor's copy, or a submitter's, which
        signs another when the receipt is delivered again): a power cut may take it back."""
        with self.transaction(durable=durable) as c:
            self.put_shared_envelope(ack_id, "ack", ack_raw, now, sorted({job for _, job in receipts}))
            c.executemany(
                "INSERT INTO acks (receipt_digest, message_id, created) VALUES (?, ?, ?) "
                "ON CONFLICT (receipt_digest) DO NOTHING",
                [(digest, ack_id, now) for digest, _ in receipts],
            )
            if not delivered:
                c.executemany(
                    "UPDATE receipts SET delivered = ?, next_delivery = NULL "
                    "WHERE digest = ? AND delivered IS NULL",
                    [(now, digest) for digest, _ in receipts],
                )

    def record_verified_receipt(
        self,
        *,
        receipt_digest: bytes,
        job_id: bytes,
        attempt: int,
        executor: str,
        now: float,
        blobs: Sequence[str] = (),
    ) -> None:
        """A submitter's side of a verified outcome: the receipt (envelope already stored) indexed and
        marked delivered (it is acknowledged with the next `ack` to its executor: put_acks), and the
        output blobs the job's result names (`blobs`) referenced by the job."""
        with self.transaction() as c:
            for blob in blobs:
                self.ref_blob(blob, f"job:{job_id.hex()}")
            c.execute(  # indexed, or (seen before, not verified) marked delivered now
                "INSERT INTO receipts (digest, job_id, attempt, executor, message_id, created, delivered) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (digest) DO UPDATE SET "
                "delivered = excluded.delivered, next_delivery = NULL WHERE receipts.delivered IS NULL",
                (receipt_digest, job_id, attempt, executor, receipt_digest, now, now),
            )

    def ack_for(self, receipt_digest: bytes) -> EnvelopeRow | None:
        with self.reading() as c:
            row = c.execute(
                "SELECT e.message_id, e.kind, e.raw, e.job_id, e.received FROM acks a "
                "JOIN envelopes e ON e.message_id = a.message_id WHERE a.receipt_digest = ?",
                (receipt_digest,),
            ).fetchone()
        return None if row is None else EnvelopeRow(*row)
