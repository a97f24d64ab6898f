"""Reachability and relays: the messages that let a node behind NAT learn it cannot be dialled and be
reached through a relay, and the relay's bookkeeping of what it carries for others (docs/protocol.md
section 17). Pure: time comes in as a parameter.

- `observed` (identify): on a new link each side tells the other the address it sees the link come
  from, and whether it offers to relay.
- `dialback` / `dialed` (AutoNAT): a node asks a linked peer to dial it back at a port. The peer dials
  only the IP address the link comes from (never one the request names), under a fresh throwaway key,
  pinning the requester's key, and answers whether the handshake completed.
- `reserve` / `reserved`: a node that cannot be dialled keeps a reservation with a relay it is linked to.
- `circuit`, `relaydata`, `relaycredit`, `relayclose`: a circuit is a byte stream between two nodes
  through a relay, carried in relay data messages on each end's link to the relay, flow-controlled end
  to end by credit (CIRCUIT_WINDOW). The two ends run the ordinary
  handshake and session over it, so the relay carries only ciphertext and cannot pose as either end.
- `via`: a node's signed statement that it is reached through these relays (gossiped).

`RelayBook` is the relay's ledger: reservations, open circuits, and the limits on them, with a typed
refusal (`RELAY_REFUSALS`) for each thing it will not do.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from .errors import LocalProtocolError
from .ids import NodeId
from .schema import (
    BY_RAW,
    NETWORK,
    TIME,
    U16,
    Bin,
    Bool,
    Key,
    Message,
    OneOf,
    Seq,
    Text,
    UInt,
    message,
    w,
)

CIRCUIT_ID_SIZE = 16
DIALBACK_NONCE_SIZE = 16
RELAY_CHUNK = 256 * 1024
"""The most stream bytes one `relaydata` carries."""
CIRCUIT_WINDOW = 4 << 20
"""Stream bytes an end may send on a circuit before the other end grants more (`relaycredit`): each
end starts with this much credit in each direction."""
MAX_VIA = 4
"""Relays one `via` record names."""
VIA_GOSSIP_CAP = 1024
"""The largest `via` envelope gossip carries, in bytes."""
OBSERVED_MAX = 64
RELAY_TEXT_MAX = 256

RELAY_REFUSALS = ("not_relay", "no_reservation", "limit", "bytes", "duration", "in_use", "refused", "closed")
"""Why a relay refuses or ends a reservation or a circuit (also the reasons of `relayclose`)."""


def check_observed(text: str) -> str | None:
    """Why `text` is not an IP literal with a port ("127.0.0.1:7531", "[::1]:7531"), or None."""
    host, sep, port = text.rpartition(":")
    if (
        not sep
        or not port.isascii()
        or not port.isdigit()
        or port != str(int(port))
        or not 1 <= int(port) <= U16
    ):
        return f"observed address {text!r} is not ip:port"
    bracketed = host.startswith("[") and host.endswith("]")
    try:
        ip = ipaddress.ip_address(host[1:-1] if bracketed else host)
    except ValueError:
        return f"observed address {text!r} has no IP literal"
    if (ip.version == 6) != bracketed:
        return f"observed address {text!r}: an IPv6 host goes in brackets, an IPv4 host does not"
    return None


OBSERVED = Text(OBSERVED_MAX, min_len=3, rule=check_observed, label="ip:port")
CIRCUIT = Bin(CIRCUIT_ID_SIZE, CIRCUIT_ID_SIZE)
DIALBACK_NONCE = Bin(DIALBACK_NONCE_SIZE, DIALBACK_NONCE_SIZE)


@message("observed", issuer="sender", expiry="expires")
@dataclass(frozen=True, slots=True)
class Observed(Message):
    """Where the sender sees the link to the receiver come from, and whether the sender relays."""

    network: str = field(metadata=w(NETWORK))
    sender: NodeId = field(metadata=w(Key()))
    address: str = field(metadata=w(OBSERVED))
    relay: bool = field(metadata=w(Bool()))
    expires: int = field(metadata=w(TIME))


@message("dialback", issuer="requester", expiry="expires")
@dataclass(frozen=True, slots=True)
class Dialback(Message):
    """Dial me back at `port` of the IP address this link comes from, and say whether it worked."""

    network: str = field(metadata=w(NETWORK))
    requester: NodeId = field(metadata=w(Key()))
    port: int = field(metadata=w(UInt(U16, minimum=1)))
    nonce: bytes = field(metadata=w(DIALBACK_NONCE))
    expires: int = field(metadata=w(TIME))


@message("dialed", issuer="sender", expiry="expires")
@dataclass(frozen=True, slots=True)
class Dialed(Message):
    """The answer to a dialback (same nonce): whether a handshake with the requester completed at
    `address` (the address dialled); `refused`, the request was not carried out (too frequent)."""

    network: str = field(metadata=w(NETWORK))
    sender: NodeId = field(metadata=w(Key()))
    nonce: bytes = field(metadata=w(DIALBACK_NONCE))
    address: str = field(metadata=w(OBSERVED))
    reachable: bool = field(metadata=w(Bool()))
    refused: bool = field(metadata=w(Bool()))
    expires: int = field(metadata=w(TIME))


@message("reserve", issuer="node", expiry="expires")
@dataclass(frozen=True, slots=True)
class Reserve(Message):
    """Ask a relay to accept circuits to `node` over this link (sent again to renew)."""

    network: str = field(metadata=w(NETWORK))
    node: NodeId = field(metadata=w(Key()))
    expires: int = field(metadata=w(TIME))


@message("reserved", issuer="relay", expiry="expires")
@dataclass(frozen=True, slots=True)
class Reserved(Message):
    """A relay's answer to `reserve`: granted until `expires` (`refusal` empty), or refused."""

    network: str = field(metadata=w(NETWORK))
    relay: NodeId = field(metadata=w(Key()))
    node: NodeId = field(metadata=w(Key()))
    expires: int = field(metadata=w(TIME))
    refusal: str = field(metadata=w(OneOf("", *RELAY_REFUSALS)))


@message("circuit", issuer="sender", expiry="expires")
@dataclass(frozen=True, slots=True)
class Circuit(Message):
    """Open circuit `circuit` from `source` to `target`: sent by the source to the relay, then by the
    relay to the target. The stream's first bytes are the source's handshake."""

    network: str = field(metadata=w(NETWORK))
    sender: NodeId = field(metadata=w(Key()))
    circuit: bytes = field(metadata=w(CIRCUIT))
    source: NodeId = field(metadata=w(Key()))
    target: NodeId = field(metadata=w(Key()))
    expires: int = field(metadata=w(TIME))


@message("relaydata", issuer="sender")
@dataclass(frozen=True, slots=True)
class RelayData(Message):
    """Stream bytes of a circuit, in order, between an end and the relay."""

    network: str = field(metadata=w(NETWORK))
    sender: NodeId = field(metadata=w(Key()))
    circuit: bytes = field(metadata=w(CIRCUIT))
    data: bytes = field(metadata=w(Bin(RELAY_CHUNK, min_len=1)))


@message("relaycredit", issuer="sender")
@dataclass(frozen=True, slots=True)
class RelayCredit(Message):
    """The sender's end has read `credit` more bytes of the circuit: the other end may send that many
    more. Sent by an end to the relay, which passes it on to the other end as its own."""

    network: str = field(metadata=w(NETWORK))
    sender: NodeId = field(metadata=w(Key()))
    circuit: bytes = field(metadata=w(CIRCUIT))
    credit: int = field(metadata=w(UInt(CIRCUIT_WINDOW, minimum=1)))


@message("relayclose", issuer="sender")
@dataclass(frozen=True, slots=True)
class RelayClose(Message):
    """The circuit is closed (or was refused), and why."""

    network: str = field(metadata=w(NETWORK))
    sender: NodeId = field(metadata=w(Key()))
    circuit: bytes = field(metadata=w(CIRCUIT))
    reason: str = field(metadata=w(OneOf(*RELAY_REFUSALS)))
    text: str = field(metadata=w(Text(RELAY_TEXT_MAX)))


@message("via", issuer="node", expiry="expires")
@dataclass(frozen=True, slots=True)
class Via(Message):
    """`node` cannot be dialled; it is reached through a circuit at one of `relays`."""

    network: str = field(metadata=w(NETWORK))
    node: NodeId = field(metadata=w(Key()))
    relays: tuple[NodeId, ...] = field(metadata=w(Seq(Key(), MAX_VIA, min_items=1, order_key=BY_RAW)))
    expires: int = field(metadata=w(TIME))


# --- the relay's ledger ---


@dataclass(frozen=True, slots=True)
class RelayLimits:
    """What one relay carries for others: reservations held, circuits open in total and per node (as
    either end), and each circuit's bytes (both directions) and life in seconds."""

    reservations: int = 64
    reservation_seconds: float = 600.0
    circuits: int = 64
    circuits_per_node: int = 8
    circuit_bytes: int = 256 << 20
    circuit_seconds: float = 3600.0

    def __post_init__(self) -> None:
        for name in ("reservations", "circuits", "circuits_per_node", "circuit_bytes"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise LocalProtocolError(f"RelayLimits.{name} must be a positive integer, not {value!r}")
        for name in ("reservation_seconds", "circuit_seconds"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise LocalProtocolError(f"RelayLimits.{name} must be a positive number, not {value!r}")


class Refused(Exception):
    """What a relay will not do; `reason` is one of RELAY_REFUSALS."""

    def __init__(self, reason: str, text: str) -> None:
        super().__init__(text)
        self.reason = reason
        self.text = text


@dataclass(slots=True)
class OpenCircuit:
    circuit: bytes
    source: bytes
    target: bytes
    opened: float
    carried: int = 0

    def other(self, end: bytes) -> bytes:
        return self.target if end == self.source else self.source


class RelayBook:
    """A relay's reservations and circuits. Ends and nodes are 32-byte keys; `now` is in seconds."""

    def __init__(self, limits: RelayLimits) -> None:
        self.limits = limits
        self.reservations: dict[bytes, float] = {}
        """Node -> when its reservation ends."""
        self.circuits: dict[bytes, OpenCircuit] = {}
        self._per_node: dict[bytes, int] = {}

    def reserve(self, node: bytes, now: float) -> float:
        """Grant or renew `node`'s reservation; returns when it ends. Raises Refused."""
        self._expire_reservations(now)
        if node not in self.reservations and len(self.reservations) >= self.limits.reservations:
            raise Refused("limit", f"this relay holds {len(self.reservations)} reservations, its cap")
        until = now + self.limits.reservation_seconds
        self.reservations[node] = until
        return until

    def reserved(self, node: bytes, now: float) -> bool:
        until = self.reservations.get(node)
        return until is not None and until > now

    def open(self, circuit: bytes, source: bytes, target: bytes, now: float) -> OpenCircuit:
        """Open a circuit from `source` to `target`. Raises Refused."""
        if len(circuit) != CIRCUIT_ID_SIZE:
            raise LocalProtocolError("a circuit id is 16 bytes")
        if source == target:
            raise Refused("refused", "a circuit from a node to itself")
        if circuit in self.circuits:
            raise Refused("in_use", "that circuit id is in use at this relay")
        if not self.reserved(target, now):
            raise Refused("no_reservation", "the target holds no reservation at this relay")
        if len(self.circuits) >= self.limits.circuits:
            raise Refused("limit", f"this relay carries {len(self.circuits)} circuits, its cap")
        for end in (source, target):
            if self._per_node.get(end, 0) >= self.limits.circuits_per_node:
                raise Refused(
                    "limit", f"{NodeId(end)} has {self.limits.circuits_per_node} circuits here, the cap"
                )
        opened = OpenCircuit(circuit, source, target, now)
        self.circuits[circuit] = opened
        for end in (source, target):
            self._per_node[end] = self._per_node.get(end, 0) + 1
        return opened

    def carry(self, circuit: bytes, sender: bytes, size: int, now: float) -> bytes:
        """`sender` sends `size` stream bytes on `circuit`: the end they go to. Raises Refused (the
        circuit is then closed: the caller tells both ends) or, for an unknown circuit or a sender
        that is not one of its ends, Refused("closed")."""
        c = self.circuits.get(circuit)
        if c is None or sender not in (c.source, c.target):
            raise Refused("closed", "no such circuit at this relay")
        if now - c.opened > self.limits.circuit_seconds:
            self.close(circuit)
            raise Refused("duration", f"the circuit reached its {self.limits.circuit_seconds:g} s limit")
        if c.carried + size > self.limits.circuit_bytes:
            self.close(circuit)
            raise Refused("bytes", f"the circuit reached its {self.limits.circuit_bytes} byte limit")
        c.carried += size
        return c.other(sender)

    def close(self, circuit: bytes) -> OpenCircuit | None:
        c = self.circuits.pop(circuit, None)
        if c is not None:
            for end in (c.source, c.target):
                left = self._per_node[end] - 1
                if left:
                    self._per_node[end] = left
                else:
                    del self._per_node[end]
        return c

    def drop(self, node: bytes) -> list[OpenCircuit]:
        """`node`'s link to the relay closed: its reservation ends; returns its circuits, now closed."""
        self.reservations.pop(node, None)
        ended = [c for c in self.circuits.values() if node in (c.source, c.target)]
        for c in ended:
            self.close(c.circuit)
        return ended

    def overdue(self, now: float) -> list[OpenCircuit]:
        """Circuits past their life, now closed (each end is to be told: `duration`)."""
        ended = [c for c in self.circuits.values() if now - c.opened > self.limits.circuit_seconds]
        for c in ended:
            self.close(c.circuit)
        return ended

    def _expire_reservations(self, now: float) -> None:
        for node in [n for n, until in self.reservations.items() if until <= now]:
            del self.reservations[node]


# --- a node's view of its own reachability ---

REACHABILITY = ("unknown", "public", "private")


class Reachability:
    """What dial-backs have shown: `public` once any peer completed a handshake with this node at an
    address it observed; `private` once `needed` distinct peers tried and none did, or fewer if the
    node had fewer direct peers to ask when the last failure came (`dialed(..., peers=)`), so one
    lying peer cannot make a node with other peers private. A later success makes it public again;
    `reset()` forgets everything (the node's addresses changed). `observed` keeps linked peers'
    words only (`forget` at link down), at most MAX_OBSERVED."""

    MAX_OBSERVED = 256

    def __init__(self, needed: int = 1) -> None:
        if type(needed) is not int or needed < 1:
            raise LocalProtocolError("Reachability needs a positive number of failed dial-backs")
        self.needed = needed
        self.reachable_at: set[str] = set()
        self.failed_from: set[bytes] = set()
        self.observed: dict[bytes, str] = {}
        """Peer -> the address it says it sees this node's link come from."""
        self._threshold = needed

    @property
    def status(self) -> str:
        if self.reachable_at:
            return "public"
        if self.failed_from and len(self.failed_from) >= self._threshold:
            return "private"
        return "unknown"

    def observe(self, peer: bytes, address: str) -> None:
        self.observed.pop(peer, None)
        self.observed[peer] = address
        while len(self.observed) > self.MAX_OBSERVED:
            del self.observed[next(iter(self.observed))]

    def forget(self, peer: bytes) -> None:
        """`peer`'s link closed: what it observed no longer holds."""
        self.observed.pop(peer, None)

    def dialed(self, peer: bytes, address: str, reachable: bool, *, peers: int | None = None) -> str:
        """A dial-back by `peer` at `address` came back, `peers` direct peers linked now (None: any
        number); returns the new status."""
        if peers is not None:
            self._threshold = max(1, min(self.needed, peers))
        if reachable:
            self.reachable_at.add(address)
            self.failed_from.discard(peer)
        else:
            self.reachable_at.discard(address)
            self.failed_from.add(peer)
        return self.status

    def reset(self) -> None:
        self.reachable_at.clear()
        self.failed_from.clear()
        self.observed.clear()
