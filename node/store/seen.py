"""The seen-cache: ids of the gossip messages already handled, each until its expiry.

Not durable: a message id lost to a power cut only lets that message be handled once more.
"""

from __future__ import annotations

from .tables import Tables


class Seen(Tables):
    """Message ids by expiry."""

    def mark_seen(self, message_id: bytes, expires: float) -> bool:
        """Remember a message id until `expires`; True if it was new, False if already known."""
        with self.transaction(durable=False) as c:
            cur = c.execute(
                "INSERT INTO seen (message_id, expires) VALUES (?, ?) ON CONFLICT (message_id) DO NOTHING",
                (message_id, expires),
            )
            return cur.rowcount > 0

    def is_seen(self, message_id: bytes, now: float) -> bool:
        with self.reading() as c:
            row = c.execute(
                "SELECT 1 FROM seen WHERE message_id = ? AND expires > ?", (message_id, now)
            ).fetchone()
        return row is not None

    def prune_seen(self, now: float) -> int:
        """Forget message ids whose expiry has passed; returns how many."""
        with self.transaction(durable=False) as c:
            return c.execute("DELETE FROM seen WHERE expires <= ?", (now,)).rowcount
