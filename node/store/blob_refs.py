"""What keeps a blob from garbage collection (blob_refs), and the small blobs kept in the database.

A reference names a blob hash and its owner ("job:<hex id>", "pin:<name>", ...), with an optional end of
retention; store/gc.py collects what no live reference (nor a job's manifest) names. Small blobs (a job's
outputs of PUSH_MAX bytes at most, those its `result` carries) live in small_blobs instead of as files.
Not durable: both are written before, or with, the durable write that needs them.
"""

from __future__ import annotations

from collections.abc import Sequence

from e31.protocol.blobs import PUSH_MAX

from .tables import Tables


class BlobRefs(Tables):
    """Blob references by (hash, owner), and small blobs by hash."""

    def ref_blob(self, blob_hash: str, owner: str, retain_until: float | None = None) -> None:
        with self.transaction(durable=False) as c:
            c.execute(
                "INSERT INTO blob_refs (blob_hash, owner, retain_until) VALUES (?, ?, ?) "
                "ON CONFLICT DO UPDATE SET retain_until = excluded.retain_until",
                (blob_hash, owner, retain_until),
            )

    def unref_owner(self, owner: str) -> int:
        with self.transaction(durable=False) as c:
            return c.execute("DELETE FROM blob_refs WHERE owner = ?", (owner,)).rowcount

    def put_small_blob(self, blob_hash: str, data: bytes) -> None:
        """Keep a small blob (at most PUSH_MAX bytes, already checked against its hash) in the database;
        a no-op when it is there. Reference it (ref_blob) in the same transaction, or it is dropped."""
        if len(data) > PUSH_MAX:
            raise ValueError(f"a small blob is at most {PUSH_MAX} bytes, not {len(data)}")
        with self.transaction(durable=False) as c:
            c.execute(
                "INSERT INTO small_blobs (blob_hash, data) VALUES (?, ?) ON CONFLICT DO NOTHING",
                (blob_hash, data),
            )

    def small_blobs(self, blob_hashes: Sequence[str]) -> dict[str, bytes]:
        """The small blobs of `blob_hashes` the database holds, by hash."""
        out: dict[str, bytes] = {}
        with self.reading() as c:
            for h in dict.fromkeys(blob_hashes):
                row = c.execute("SELECT data FROM small_blobs WHERE blob_hash = ?", (h,)).fetchone()
                if row is not None:
                    out[h] = bytes(row[0])
        return out

    def drop_small_blobs(self, now: float) -> int:
        """Forget the small blobs no live reference names (as `live_blobs` judges it at `now`)."""
        with self.transaction(durable=False) as c:
            return c.execute(
                "DELETE FROM small_blobs WHERE NOT EXISTS (SELECT 1 FROM blob_refs r WHERE r.blob_hash = "
                "small_blobs.blob_hash AND (r.retain_until IS NULL OR r.retain_until > ?))",
                (now,),
            ).rowcount

    def live_blobs(self, now: float) -> set[str]:
        """Hashes still referenced (no end of retention, or one in the future): not to be collected."""
        with self.reading() as c:
            rows = c.execute(
                "SELECT DISTINCT blob_hash FROM blob_refs WHERE retain_until IS NULL OR retain_until > ?",
                (now,),
            ).fetchall()
        return {r[0] for r in rows}

    def expire_blob_refs(self, now: float) -> int:
        with self.transaction(durable=False) as c:
            return c.execute("DELETE FROM blob_refs WHERE retain_until <= ?", (now,)).rowcount
