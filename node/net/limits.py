"""The transport's knobs (timeouts, caps, buffer sizes) and the counter that enforces connection caps.

Caps count connections from the moment they are accepted (so a peer cannot hold many half-open
handshakes) until they are closed. A remote address is the IPv4 address, or the IPv6 /64 prefix
(one subscriber usually holds a whole /64). Loopback addresses have their own, usually higher, cap so
that many nodes on one machine can link to each other; by default only the total cap applies to them.
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from dataclasses import dataclass, field

DEFAULT_INBOX = 32
DEFAULT_INBOX_BYTES = 4 << 20


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Seconds. `idle`: no complete frame received for that long closes the connection."""

    connect: float = 10.0
    handshake: float = 10.0
    idle: float = 120.0
    send: float = 30.0

    def __post_init__(self) -> None:
        for name in ("connect", "handshake", "idle", "send"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ValueError(f"timeout {name} must be a positive number of seconds, not {value!r}")


@dataclass(frozen=True, slots=True)
class Limits:
    """What an inbound listener admits, and how much one connection may buffer.

    `max_per_loopback` is the per-address cap for 127.0.0.0/8 and ::1; None means "as many as
    `max_connections`". A connection holds at most `inbox` received messages and `inbox_bytes` bytes of
    them (one message is always let through) for a slow consumer before it stops reading the socket.
    """

    max_connections: int = 64
    max_per_address: int = 8
    max_per_loopback: int | None = None
    inbox: int = DEFAULT_INBOX
    inbox_bytes: int = DEFAULT_INBOX_BYTES
    timeouts: Timeouts = field(default_factory=Timeouts)

    def __post_init__(self) -> None:
        for name in ("max_connections", "max_per_address", "inbox", "inbox_bytes"):
            check_positive(name, getattr(self, name))
        if self.max_per_loopback is not None:
            check_positive("max_per_loopback", self.max_per_loopback)
        if not isinstance(self.timeouts, Timeouts):
            raise ValueError("timeouts must be a Timeouts")


def check_positive(name: str, value: object) -> None:
    if type(value) is not int or value < 1:
        raise ValueError(f"{name} must be a positive integer, not {value!r}")


def address_key(host: str) -> tuple[str, bool]:
    """The key a remote host is counted under, and whether it is a loopback address."""
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host, False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if isinstance(ip, ipaddress.IPv6Address) and not ip.is_loopback:
        return str(ipaddress.IPv6Network((ip, 64), strict=False)), False
    return str(ip), ip.is_loopback


class ConnectionCaps:
    """Counts open connections in total and per remote address; `admit` reserves a slot or refuses."""

    def __init__(self, limits: Limits) -> None:
        self._limits = limits
        self._per_key: Counter[str] = Counter()
        self._total = 0

    @property
    def total(self) -> int:
        return self._total

    def count(self, host: str) -> int:
        return self._per_key[address_key(host)[0]]

    def admit(self, host: str) -> str | None:
        """Reserve a slot for a connection from `host`: None if admitted, else why not.

        Every admitted connection must be given back with `release(host)`.
        """
        key, loopback = address_key(host)
        limits = self._limits
        if self._total >= limits.max_connections:
            return f"{self._total} connections open, the cap is {limits.max_connections}"
        cap = limits.max_per_address
        if loopback:
            cap = limits.max_connections if limits.max_per_loopback is None else limits.max_per_loopback
        if self._per_key[key] >= cap:
            return f"{self._per_key[key]} connections open from {key}, the cap is {cap}"
        self._per_key[key] += 1
        self._total += 1
        return None

    def release(self, host: str) -> None:
        key = address_key(host)[0]
        if self._per_key[key] <= 0:
            raise RuntimeError(f"release({host!r}) without a matching admit")
        self._per_key[key] -= 1
        if not self._per_key[key]:
            del self._per_key[key]
        self._total -= 1
