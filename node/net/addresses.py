"""How the net wing writes a peer's address: `host:port` text, IPv6 hosts in brackets.

Addresses travel as text (contact records, the peer table, the store, the config), so one spelling
is used everywhere, and the hosts that stand for no reachable address (a wildcard, loopback) are told
apart here.
"""

from __future__ import annotations

import ipaddress


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def join_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def is_wildcard(host: str) -> bool:
    return host in ("", "0.0.0.0", "::")


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
