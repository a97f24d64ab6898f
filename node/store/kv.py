"""The key-value table: small named values the node keeps between runs (a cache, markers).

Its writes are not durable (no fsync of their own, store/db.py): a value lost to a power cut is computed
or fetched again.
"""

from __future__ import annotations

from .tables import Tables


class Kv(Tables):
    """The kv table: bytes by key."""

    def kv_get(self, key: str) -> bytes | None:
        with self.reading() as c:
            row = c.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
        return None if row is None else bytes(row[0])

    def kv_set(self, key: str, value: bytes) -> None:
        with self.transaction(durable=False) as c:
            c.execute(
                "INSERT INTO kv (key, value) VALUES (?, ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (key, value),
            )

    def kv_delete(self, key: str) -> bool:
        with self.transaction(durable=False) as c:
            return c.execute("DELETE FROM kv WHERE key = ?", (key,)).rowcount > 0
