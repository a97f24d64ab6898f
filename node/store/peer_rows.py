"""The peers table: every node this one has heard of, with its addresses and how contacts went.

The peer table's policy (which to dial, when to give up) is node/net's; this is its storage. Not durable:
a peer lost to a power cut is found again.
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
    ) -> None:
        """Record that a peer was seen now at `addresses` (merged in front of those already known).

        A sighting resets its failure count; its source stays the one it was first found by.
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

    def peers(self, network: str | None = None) -> list[PeerRow]:
        """Known peers, most recently seen first."""
        with self.reading() as c:
            rows = c.execute(
                "SELECT * FROM peers WHERE ?1 IS NULL OR network = ?1 ORDER BY last_seen DESC, node_id",
                (network,),
            ).fetchall()
        return [_peer(r) for r in rows]

    def remove_peer(self, node_id: str) -> bool:
        with self.transaction(durable=False) as c:
            return c.execute("DELETE FROM peers WHERE node_id = ?", (node_id,)).rowcount > 0

    def prune_peers(self, *, seen_before: float, min_failures: int) -> int:
        """Forget peers not seen since `seen_before` that failed at least `min_failures` times in a row."""
        with self.transaction(durable=False) as c:
            return c.execute(
                "DELETE FROM peers WHERE last_seen < ? AND failures >= ?", (seen_before, min_failures)
            ).rowcount
