"""The peer table and its decisions: whom to dial, when a link is suspect, which duplicate link stays.

Everything here is synchronous and pure: time (`now`, seconds on trio's clock) and randomness (an
rng with `random()`) come in as parameters, so the rules are tested deterministically. The trio
side that carries the decisions out is `e31.node.net.peering` (with its dialer, `e31.node.net.dialer`).

- A known peer has a node id, the addresses it accepts connections on (from its signed contact
  record or from the bootstrap address that reached it), a source and a failure count. After a failed
  dial or a lost link it waits `Backoff.delay(failures)` (exponential, capped, jittered) before the
  next dial.
- Bootstrap entries without a node id are dial targets keyed by address until a handshake names the
  node behind them; pinned entries carry the node id and are checked in the handshake.
- The dialer keeps up to `target_degree` links: bootstrap targets are always dialed (with backoff),
  other peers only while the node has fewer links than that, fewest failures first, then most recently
  seen, random among equals.
- `Liveness` counts heartbeats without an answer: after `suspect_after` the link is suspect, after
  `dead_after` it is closed.
- Two links to one peer (both dialed at once): both ends keep the one initiated by the smaller node
  key, so they agree without a message; two links with the same initiator: the newer one stays.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol


class Random(Protocol):
    def random(self) -> float: ...


MIN_LINK_TTL = 300.0
"""Seconds of life for ping, pong and peers messages at least: peers' clocks may differ by minutes."""


@dataclass(frozen=True, slots=True)
class PeerSettings:
    """Timing and size knobs of peering; the defaults suit a real network, tests shrink them."""

    heartbeat_interval: float = 15.0
    suspect_after: int = 2
    """Unanswered heartbeats after which a link is suspect."""
    dead_after: int = 4
    """Unanswered heartbeats after which a link is closed."""
    exchange_interval: float = 60.0
    """Seconds between peer-exchange messages on each link (one is also sent when a link opens)."""
    exchange_size: int = 16
    """Contact records per peer-exchange message, this node's own included."""
    target_degree: int = 8
    contact_ttl: float = 3600.0
    """Lifetime of this node's signed contact record; it is re-signed well before it runs out."""
    max_contact_ttl: float = 24 * 3600.0
    """Contact records claiming a longer life than this are refused."""
    backoff_base: float = 1.0
    backoff_max: float = 300.0
    dial_timeout: float = 10.0
    dial_tick: float = 1.0
    """Seconds between looks at the table for peers to dial."""
    max_peers: int = 1000
    """Known peers at most; contact records of further strangers are ignored until some are forgotten."""
    exchange_burst: int = 4
    """Peer-exchange messages a link may send at once; beyond that, one per exchange_interval / burst."""
    forget_after_failures: int = 10
    forget_after: float = 7 * 24 * 3600.0
    """A peer that failed this many times in a row and was not seen for this long is forgotten."""

    def __post_init__(self) -> None:
        if not 0 < self.suspect_after < self.dead_after:
            raise ValueError("need 0 < suspect_after < dead_after")
        for name in (
            "heartbeat_interval",
            "exchange_interval",
            "backoff_base",
            "backoff_max",
            "dial_timeout",
            "dial_tick",
            "contact_ttl",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")
        if min(self.exchange_size, self.target_degree, self.max_peers, self.exchange_burst) < 1:
            raise ValueError("exchange_size, target_degree, max_peers and exchange_burst must be at least 1")

    @classmethod
    def fast(cls, heartbeat: float) -> PeerSettings:
        """Every interval scaled from one heartbeat interval (for tests and local experiments)."""
        return cls(
            heartbeat_interval=heartbeat,
            exchange_interval=4 * heartbeat,
            backoff_base=heartbeat / 2,
            backoff_max=8 * heartbeat,
            dial_timeout=max(2 * heartbeat, 1.0),
            dial_tick=heartbeat / 2,
        )


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential backoff with jitter: the n-th failure in a row waits base * 2**(n-1), capped,
    then multiplied by a factor drawn from [0.5, 1.0) so that peers who failed together spread out."""

    base: float
    maximum: float

    def delay(self, failures: int, rng: Random) -> float:
        if failures <= 0:
            return 0.0
        raw = min(self.maximum, self.base * 2.0 ** min(failures - 1, 62))
        return raw * (0.5 + rng.random() / 2)


@dataclass(slots=True)
class TokenBucket:
    """At most `burst` events at once and `rate` per second on average; `now` is passed in."""

    rate: float
    burst: float
    tokens: float = -1.0
    updated: float = 0.0

    def allow(self, now: float, cost: float = 1.0) -> bool:
        """Take `cost` tokens if there are that many (a cost over the burst is taken from a full bucket)."""
        if self.tokens < 0:
            self.tokens, self.updated = self.burst, now
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now
        cost = min(cost, self.burst)
        if self.tokens < cost:
            return False
        self.tokens -= cost
        return True


class LinkHealth(enum.Enum):
    ALIVE = "alive"
    SUSPECT = "suspect"
    DEAD = "dead"


@dataclass(slots=True)
class Liveness:
    """Heartbeat bookkeeping for one link: which ping is outstanding, how many went unanswered."""

    suspect_after: int
    dead_after: int
    missed: int = 0
    outstanding: bytes | None = None
    sent_at: float = 0.0
    rtt: float | None = None

    @property
    def health(self) -> LinkHealth:
        if self.missed >= self.dead_after:
            return LinkHealth.DEAD
        if self.missed >= self.suspect_after:
            return LinkHealth.SUSPECT
        return LinkHealth.ALIVE

    def tick(self, nonce: bytes, now: float) -> LinkHealth:
        """A heartbeat is due: the previous ping, if still unanswered, counts as missed; `nonce` is
        the next ping's. Returns the health after counting (DEAD: close the link, send nothing)."""
        if self.outstanding is not None:
            self.missed += 1
        health = self.health
        if health is not LinkHealth.DEAD:
            self.outstanding, self.sent_at = nonce, now
        return health

    def pong(self, nonce: bytes, now: float) -> bool:
        """An answer arrived; True if it answers the outstanding ping (the link is alive again)."""
        if self.outstanding is None or nonce != self.outstanding:
            return False
        self.outstanding = None
        self.missed = 0
        self.rtt = now - self.sent_at
        return True


def keep_new_link(local: bytes, peer: bytes, old_outbound: bool, new_outbound: bool) -> bool:
    """Whether a new link to `peer` replaces the existing one (True) or is dropped (False).

    `*_outbound` says whether this node dialed the link. Both ends keep the link whose initiator has
    the smaller key; with equal initiators, the newer link (the old one is likely half dead).
    """
    if old_outbound == new_outbound:
        return True
    smaller_is_local = local < peer
    return new_outbound == smaller_is_local


class PeerState(enum.Enum):
    CONNECTED = "connected"
    SUSPECT = "suspect"
    DIALING = "dialing"
    KNOWN = "known"
    """Not connected; may be dialed when a link is wanted."""
    BACKOFF = "backoff"
    """Not connected; waiting after failures before the next dial."""


@dataclass(slots=True)
class Peer:
    node_id: bytes
    source: str
    addresses: list[str] = field(default_factory=list)
    last_seen: float | None = None
    """Wall-clock time (Unix seconds) of the last sign of life, as stored."""
    failures: int = 0
    next_dial: float = 0.0
    """trio time before which the peer is not dialed."""
    connected: bool = False
    outbound: bool = False
    suspect: bool = False
    dialing: bool = False
    contact: bytes | None = None
    contact_expires: int = 0
    """Expiry (ms since the epoch) of `contact`, the peer's latest signed contact envelope."""
    bootstrap: bool = False
    """Reached through a configured bootstrap entry: always redialed, never forgotten."""
    rtt: float | None = None
    refused_until: float = 0.0
    """trio time until which links from this peer are refused (after it misbehaved)."""

    def state(self, now: float) -> PeerState:
        if self.connected:
            return PeerState.SUSPECT if self.suspect else PeerState.CONNECTED
        if self.dialing:
            return PeerState.DIALING
        if self.failures and now < self.next_dial:
            return PeerState.BACKOFF
        return PeerState.KNOWN


@dataclass(slots=True)
class BootstrapTarget:
    """A bootstrap address whose node is not known yet (no NODEID@ given)."""

    address: str
    failures: int = 0
    next_dial: float = 0.0
    dialing: bool = False
    node_id: bytes | None = None
    """Filled in by the first handshake through this address."""


@dataclass(frozen=True, slots=True)
class Dial:
    """A decision to dial: `node_id` None for an unnamed bootstrap address (nothing to pin)."""

    address: str
    node_id: bytes | None
    bootstrap: bool


class PeerTable:
    """Known peers and bootstrap targets, and the decisions about them. No I/O."""

    def __init__(self, local: bytes, settings: PeerSettings) -> None:
        self.local = local
        self.settings = settings
        self.backoff = Backoff(settings.backoff_base, settings.backoff_max)
        self.peers: dict[bytes, Peer] = {}
        self.targets: dict[str, BootstrapTarget] = {}
        self.own_addresses: set[str] = set()
        """Addresses that turned out to reach this node itself: never dialed again."""

    # --- learning about peers ---

    def add_bootstrap(self, address: str, node_id: bytes | None) -> None:
        if node_id is None:
            self.targets.setdefault(address, BootstrapTarget(address))
            return
        peer = self.learn(node_id, [address], "bootstrap")
        if peer is not None:
            peer.bootstrap = True

    def learn(
        self,
        node_id: bytes,
        addresses: Iterable[str],
        source: str,
        *,
        last_seen: float | None = None,
        failures: int = 0,
        contact: bytes | None = None,
        contact_expires: int = 0,
    ) -> Peer | None:
        """Add a peer or merge new addresses (in front) into a known one. None for this node itself, and
        for a stranger met through others (exchange, mDNS) while the table is full."""
        if node_id == self.local:
            return None
        peer = self.peers.get(node_id)
        if peer is None and len(self.peers) >= self.settings.max_peers and source in ("exchange", "mdns"):
            return None
        if peer is None:
            peer = self.peers[node_id] = Peer(node_id, source, failures=failures, last_seen=last_seen)
        new = [a for a in addresses if a not in self.own_addresses]
        peer.addresses = list(dict.fromkeys([*new, *peer.addresses]))[:16]
        if last_seen is not None and (peer.last_seen is None or last_seen > peer.last_seen):
            peer.last_seen = last_seen
        if contact is not None and contact_expires > peer.contact_expires:
            peer.contact, peer.contact_expires = contact, contact_expires
        return peer

    def forget(self, node_id: bytes) -> None:
        self.peers.pop(node_id, None)

    def mark_own_address(self, address: str) -> None:
        self.own_addresses.add(address)
        self.targets.pop(address, None)
        for peer in self.peers.values():
            if address in peer.addresses:
                peer.addresses.remove(address)

    # --- links ---

    def connected_count(self) -> int:
        return sum(1 for p in self.peers.values() if p.connected)

    def on_connected(self, node_id: bytes, outbound: bool, wall: float) -> Peer:
        peer = self.peers.get(node_id)
        if peer is None:
            peer = self.peers[node_id] = Peer(node_id, "inbound")
        peer.connected, peer.outbound, peer.suspect = True, outbound, False
        peer.failures, peer.next_dial, peer.last_seen = 0, 0.0, wall
        return peer

    def admits(self, node_id: bytes, now: float) -> bool:
        """Whether a link with `node_id` may be kept now (False while it serves a penalty)."""
        peer = self.peers.get(node_id)
        return peer is None or now >= peer.refused_until

    def on_disconnected(
        self, node_id: bytes, now: float, rng: Random, *, failed: bool, misbehaved: bool = False
    ) -> Peer | None:
        """A link ended. `failed` (heartbeats went unanswered, or the link broke) counts a failure
        and backs off before the next dial; a clean close by either side redials after the base delay.
        `misbehaved` (it sent invalid messages) also refuses its own links to us for the backoff."""
        peer = self.peers.get(node_id)
        if peer is None:
            return None
        peer.connected, peer.suspect, peer.rtt = False, False, None
        if failed or misbehaved:
            peer.failures += 1
        peer.next_dial = now + max(self.backoff.delay(peer.failures, rng), self.settings.backoff_base)
        if misbehaved:
            peer.refused_until = peer.next_dial
        return peer

    # --- dialing ---

    def due_dials(self, now: float, rng: Random) -> list[Dial]:
        """What to dial now; marks each chosen peer or target as dialing."""
        dials: list[Dial] = []
        busy_addresses = {t.address for t in self.targets.values() if t.dialing}
        for p in self.peers.values():
            if p.connected or p.dialing:
                busy_addresses.update(p.addresses)
        for target in self.targets.values():
            if target.dialing or now < target.next_dial or target.address in busy_addresses:
                continue
            if target.node_id is not None and target.node_id in self.peers:
                continue  # the peer's own entry is dialed instead
            target.dialing = True
            busy_addresses.add(target.address)
            dials.append(Dial(target.address, None, True))
        busy = sum(1 for p in self.peers.values() if p.connected or p.dialing) + len(dials)
        candidates = [
            p
            for p in self.peers.values()
            if not p.connected
            and not p.dialing
            and p.addresses
            and now >= p.next_dial
            and p.addresses[0] not in busy_addresses
        ]
        always = [p for p in candidates if p.bootstrap]
        others = [p for p in candidates if not p.bootstrap]
        others.sort(key=lambda p: (p.failures, -(p.last_seen or 0.0), rng.random()))
        room = max(0, self.settings.target_degree - busy - len(always))
        for peer in [*always, *others[:room]]:
            peer.dialing = True
            dials.append(Dial(peer.addresses[0], peer.node_id, peer.bootstrap))
        return dials

    def dial_succeeded(self, dial: Dial, node_id: bytes) -> None:
        """The handshake through `dial` named `node_id` (== dial.node_id when that was pinned)."""
        target = self.targets.get(dial.address) if dial.node_id is None else None
        if target is not None:
            target.dialing, target.failures, target.next_dial = False, 0, 0.0
            target.node_id = node_id
        if dial.node_id is not None and dial.node_id in self.peers:
            self.peers[dial.node_id].dialing = False
        peer = self.learn(node_id, [dial.address], "bootstrap" if dial.bootstrap else "exchange")
        if peer is not None:
            peer.dialing = False
            peer.bootstrap = peer.bootstrap or dial.bootstrap
            if peer.addresses and peer.addresses[0] != dial.address and dial.address in peer.addresses:
                peer.addresses.remove(dial.address)
                peer.addresses.insert(0, dial.address)

    def dial_failed(self, dial: Dial, now: float, rng: Random) -> Peer | None:
        """Count a failed dial; returns the peer it concerned (None for an unnamed bootstrap address)."""
        if dial.node_id is None:
            target = self.targets.get(dial.address)
            if target is not None:
                target.dialing = False
                target.failures += 1
                target.next_dial = now + self.backoff.delay(target.failures, rng)
            return None
        peer = self.peers.get(dial.node_id)
        if peer is None:
            return None
        peer.dialing = False
        peer.failures += 1
        peer.next_dial = now + self.backoff.delay(peer.failures, rng)
        if len(peer.addresses) > 1:  # try the next address next time
            peer.addresses.append(peer.addresses.pop(0))
        return peer

    def dial_abandoned(self, dial: Dial) -> None:
        """The dial found nothing to do (the peer connected to us meanwhile): no failure counted."""
        if dial.node_id is None:
            target = self.targets.get(dial.address)
            if target is not None:
                target.dialing = False
        elif dial.node_id in self.peers:
            self.peers[dial.node_id].dialing = False

    # --- peer exchange ---

    def contacts_to_share(self, rng: Random, now_ms: int, exclude: bytes, limit: int) -> list[bytes]:
        """Up to `limit` unexpired contact records of peers other than `exclude` (the recipient):
        the connected ones first, then a random sample of the rest."""
        live = [
            p
            for p in self.peers.values()
            if p.node_id != exclude and p.contact is not None and p.contact_expires > now_ms
        ]
        live.sort(key=lambda p: (not p.connected, p.failures, rng.random()))
        return [p.contact for p in live[: max(0, limit)] if p.contact is not None]

    def expired(self, wall: float) -> list[bytes]:
        """Peers to forget: not bootstrap, not connected, many failures, not seen for long."""
        s = self.settings
        return [
            p.node_id
            for p in self.peers.values()
            if not p.bootstrap
            and not p.connected
            and not p.dialing
            and p.failures >= s.forget_after_failures
            and (p.last_seen is None or p.last_seen < wall - s.forget_after)
        ]
