"""How `e31 node status` and `e31 peers` show the API's JSON as readable tables.

Only the standard library here: the CLI imports this module without starting trio.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..units import format_duration


def format_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def format_ago(timestamp: float | None, now: float | None = None) -> str:
    if timestamp is None:
        return "never"
    delta = (time.time() if now is None else now) - timestamp
    return "just now" if delta < 1 else f"{format_duration(delta)} ago"


def format_status(doc: Mapping[str, Any]) -> str:
    counts = doc.get("peers") or {}
    capacity = doc.get("capacity") or {}
    rows = [
        ("node id", str(doc.get("node_id", "?"))),
        ("network", str(doc.get("network", "?"))),
        ("listening on", str(doc.get("listen", "?"))),
        ("addresses", ", ".join(doc.get("addresses") or []) or "(none yet)"),
        ("uptime", format_duration(float(doc.get("uptime_seconds", 0)))),
        ("version", str(doc.get("version", "?"))),
        (
            "peers",
            f"{doc.get('peer_count', 0)} connected"
            + "".join(
                f", {counts[k]} {k}" for k in ("suspect", "dialing", "known", "backoff") if counts.get(k)
            ),
        ),
    ]
    offered = doc.get("offered") or {}
    if "cores" in capacity:
        now = f" (now {offered['cores']})" if "cores" in offered else ""
        rows.append(("cores offered", f"{capacity['cores']}{now}"))
    if "memory_bytes" in capacity:
        now = f" (now {format_bytes(int(offered['memory_bytes']))})" if "memory_bytes" in offered else ""
        rows.append(("memory offered", f"{format_bytes(int(capacity['memory_bytes']))}{now}"))
    if "state" in offered:
        state = str(offered["state"])
        if offered.get("only_when_idle"):
            state += ", only when idle"
        if offered.get("suspended"):
            state += ", jobs suspended"
        rows.append(("capacity", state))
        owner = offered.get("owner_cpu_cores")
        rows.append(("owner cpu", "not measured yet" if owner is None else f"{float(owner):.2f} cores"))
    peer_capacity = doc.get("peer_capacity")
    if isinstance(peer_capacity, Mapping):
        offering = [p for p in peer_capacity.values() if isinstance(p, Mapping) and p.get("cores")]
        cores = sum(int(p.get("cores", 0)) for p in offering)
        rows.append(("peers offer", f"{cores} cores on {len(offering)} of {len(peer_capacity)} advertising"))
    reach = doc.get("reachability")
    if isinstance(reach, Mapping) and reach:
        rows.append(("reachable", _reachable(reach)))
    rows.append(("data dir", str(doc.get("data_dir", "?"))))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k + ':':<{width + 1}} {v}" for k, v in rows)


def _reachable(reach: Mapping[str, Any]) -> str:
    """The `reachable` line: whether peers can dial this node, its relays, and what it relays."""
    status = reach.get("status")
    relays = list(reach.get("reservations") or {})
    text = {
        "public": "yes (a peer dialled it back)",
        "private": "no (behind NAT or a firewall): "
        + (f"reached through relay {', '.join(relays)}" if relays else "no relay yet"),
    }.get(str(status), "not known yet")
    linked = reach.get("relayed_links") or []
    if linked:
        text += f"; {len(linked)} peer(s) linked through a relay"
    if reach.get("relay"):
        circuits, reserved = reach.get("circuits", 0), reach.get("reserved_here", 0)
        text += f"; relays for others: {circuits} circuit(s), {reserved} reserved"
    return text


PEER_COLUMNS = ("NODE ID", "STATE", "ADDRESS", "SOURCE", "LAST SEEN", "RTT")


def format_peers(peers: Sequence[Mapping[str, Any]], now: float | None = None) -> str:
    if not peers:
        return "no known peers"
    rows = [PEER_COLUMNS]
    for p in peers:
        rtt = p.get("rtt_ms")
        rows.append(
            (
                str(p.get("node_id", "?")),
                str(p.get("state", "?")),
                str(p.get("address") or (f"via relay {str(p['via'])[:12]}..." if p.get("via") else "-")),
                str(p.get("source", "?")),
                format_ago(p.get("last_seen"), now),
                "-" if rtt is None else f"{float(rtt):.1f} ms",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(PEER_COLUMNS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    return "\n".join(lines)
