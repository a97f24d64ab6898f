"""The peers table: every node this one has heard of, with its addresses and how contacts went.

The peer table's policy (which to dial, when to give up) is node/net's; this is its storage. Not durable:
a peer lost to a power cut is found again. The rows of one network are capped (`max_rows`): a new row
beyond the cap evicts the least useful ones first (found only inbound before the others, then the
least recently seen), never a bootstrap or manual peer, so strangers cannot grow the table.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence

from .rows import PeerRow
from .tables import Tables

PEER_SOURCES = frozenset({"bootstrap", "mdns", "exchange", "inbound", "manual"})


def _peer(row: sqlite3.Row) -> PeerRow:
    return PeerRow(
        row["node_id"],
        row["network"],
        tuple(json.loads(row["addresses"])),
        row["source"],
        row["first_seen"],
        row["last_seen"],
        row["failures"],
        row["last_failure"],
        row["contact"],
    )


class Peers(Tables):
    """Known peers by node id."""

    def upsert_peer(
        self,
        node_id: str,
        network: str,
        addresses: Sequence[str],
        source: str,
        now: float,
        contact: bytes | None = None,
        max_rows: int | None = None,
    ) -> None:
        """Record that a peer was seen now at `addresses` (merged in front of those already known).

        A sighting resets its failure count; its source stays the one it was first found by. A new
        row beyond `max_rows` rows of its network evicts others (`trim_peers`).
        """
        if source not in PEER_SOURCES:
            raise ValueError(f"unknown peer source {source!r}")
        with self.transaction(durable=False) as c:
            row = c.execute("SELECT addresses FROM peers WHERE node_id = ?", (node_id,)).fetchone()
            known = json.loads(row[0]) if row else []
            merged = list(dict.fromkeys([*addresses, *known]))[:16]
            c.execute(
                "INSERT INTO peers (node_id, network, addresses, source, first_seen, last_seen, contact) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (node_id) DO UPDATE SET "
                "network = excluded.network, addresses = excluded.addresses, last_seen = excluded.last_seen, "
                "failures = 0, contact = coalesce(excluded.contact, peers.contact)",
                (node_id, network, json.dumps(merged), source, now, now, contact),
            )
            if row is None and max_rows is not None:
                _trim(c, network, max_rows, keep=node_id)

    def peer_failed(self, node_id: str, now: float) -> int:
        """Count a failed contact; returns the consecutive failures so far (0 if the peer is unknown)."""
        with self.transaction(durable=False) as c:
            row = c.execute(
                "UPDATE peers SET failures = failures + 1, last_failure = ? WHERE node_id = ? "
                "RETURNING failures",
                (now, node_id),
            ).fetchone()
        return 0 if row is None else int(row[0])

    def peer(self, node_id: str) -> PeerRow | None:
        with self.reading() as c:
            row = c.execute("SELECT * FROM peers WHERE node_id = ?", (node_id,)).fetchone()
        return None if row is None else _peer(row)

    def peers(self, network: str | None = None, limit: int | None = None) -> list[PeerRow]:
        """Known peers, most recently seen first (at most `limit` of them)."""
        with self.reading() as c:
            rows = c.execute(
                "SELECT * FROM peers WHERE ?1 IS NULL OR network = ?1 ORDER BY last_seen DESC, node_id "
                "LIMIT ?2",
                (network, -1 if limit is None else limit),
            ).fetchall()
        return [_peer(r) for r in rows]

    def count_peers(self, network: str | None = None) -> int:
        with self.reading() as c:
            row = c.execute(
                "SELECT count(*) FROM peers WHERE ?1 IS NULL OR network = ?1", (network,)
            ).fetchone()
        return int(row[0])

    def trim_peers(self, network: str, max_rows: int) -> int:
        """Evict rows of `network` beyond `max_rows`, least useful first; returns how many went."""
        with self.transaction(durable=False) as c:
            return _trim(c, network, max_rows)

    def remove_peer(self, node_id: str) -> bool:
        with self.transaction(durable=False) as c:
            return c.execute("DELETE FROM peers WHERE node_id = ?", (node_id,)).rowcount > 0

    def prune_peers(self, *, seen_before: float, min_failures: int) -> int:
        """Forget peers not seen since `seen_before` that failed at least `min_failures` times in a row."""
        with self.transaction(durable=False) as c:
            return c.execute(
                "DELETE FROM peers WHERE last_seen < ? AND failures >= ?", (seen_before, min_failures)
            ).rowcount


def _trim(c: sqlite3.Connection, network: str, max_rows: int, keep: str | None = None) -> int:
    """Delete the rows of `network` beyond `max_rows` (never bootstrap or manual ones, nor `keep`):
    peers met only inbound first, then those that kept failing, then the least recently seen."""
    if max_rows < 0:
        raise ValueError("max_rows must not be negative")
    (count,) = c.execute("SELECT count(*) FROM peers WHERE network = ?", (network,)).fetchone()
    excess = int(count) - max_rows
    if excess <= 0:
        return 0
    return c.execute(
        "DELETE FROM peers WHERE node_id IN (SELECT node_id FROM peers WHERE network = ? "
        "AND source NOT IN ('bootstrap', 'manual') AND node_id IS NOT ? "
        "ORDER BY source = 'inbound' DESC, failures > 0 DESC, last_seen, node_id LIMIT ?)",
        (network, keep, excess),
    ).rowcount
