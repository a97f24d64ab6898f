"""How the net wing writes a peer's address: `host:port` text, IPv6 hosts in brackets.

Addresses travel as text (contact records, the peer table, the store, the config), so one spelling
is used everywhere, and the hosts that stand for no reachable address (a wildcard, loopback) are told
apart here, as are the addresses a node may dial when a peer names them (`dial_refusal`).
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


def dial_refusal(address: str, *, allow_private: bool) -> str | None:
    """Why this node must not dial `address` learned from a peer (None: it may).

    Only IP literals with a port in 1..65535 are dialled: a name could resolve anywhere, so names are
    dialled only when the operator typed them (bootstrap). Multicast, broadcast and unspecified
    addresses never are. Loopback, private (RFC 1918, ULA), link-local, shared (RFC 6598),
    documentation and the other special-purpose ranges (everything `ipaddress` does not call global)
    are dialled only with `allow_private` (`dial_private = true`).
    """
    try:
        host, port = split_address(address)
    except ValueError:
        return "not host:port"
    if not 1 <= port <= 65535:
        return "port outside 1..65535"
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return "a host name (only the operator's bootstrap names are dialled)"
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.scope_id:
            return "a scoped IPv6 address"
        if ip.sixtofour is not None and not ip.sixtofour.is_global and not allow_private:
            return "a 6to4 address wrapping a special-purpose IPv4 address"
        if ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
    if ip.is_multicast or ip.is_unspecified or ip == ipaddress.IPv4Address("255.255.255.255"):
        return "a multicast, broadcast or unspecified address"
    if ip.is_global and not ip.is_reserved:
        return None
    if allow_private:
        return None
    return "a loopback, private or special-purpose address (allowed only with dial_private)"
