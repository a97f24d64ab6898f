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
- `Liveness` counts heartbeats without an answer (and nothing else heard from the peer since): after
  `suspect_after` the link is suspect, after `dead_after` it is closed.
- Two links to one peer (both dialed at once): both ends keep the one initiated by the smaller node
  key, so they agree without a message; two links with the same initiator: the newer one stays.
  (Backoff, TokenBucket, Liveness and that rule live in `e31.node.net.links`.)
- Strangers are bounded: at most `max_peers` peers however they were met, the least useful evicted
  first (`rank_of`); a contact record's addresses are hints, dialed only where the operator allows
  (`dial_private`), within a global budget and one try per record, and confirmed by a handshake that
  answers as the record's key; only records with a confirmed address are passed on.
"""

from __future__ import annotations

import enum
import heapq
import ipaddress
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from .addresses import dial_refusal, split_address
from .links import Backoff, Random, TokenBucket

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
    """Known peers at most, however they were met (inbound handshakes included); beyond that the least
    useful and oldest are forgotten (PeerTable's ranks), or a stranger's record is ignored."""
    unverified_dials_per_minute: float = 30.0
    """Dials (and probes) of addresses no handshake has confirmed yet, across all peers, on average."""
    unverified_burst: int = 8
    """Such dials at once, before the per-minute rate applies."""
    unverified_retry: float = 600.0
    """Seconds before an unconfirmed address that failed is tried again (each record gets one try)."""
    forget_interval: float = 60.0
    """Seconds between two looks for peers to forget after repeated failures."""
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
            "unverified_dials_per_minute",
            "unverified_retry",
            "forget_interval",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")
        if (
            min(
                self.exchange_size,
                self.target_degree,
                self.max_peers,
                self.exchange_burst,
                self.unverified_burst,
            )
            < 1
        ):
            raise ValueError(
                "exchange_size, target_degree, max_peers, exchange_burst and unverified_burst "
                "must be at least 1"
            )

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
            unverified_retry=8 * heartbeat,
            forget_interval=4 * heartbeat,
        )


class PeerState(enum.Enum):
    CONNECTED = "connected"
    SUSPECT = "suspect"
    DIALING = "dialing"
    KNOWN = "known"
    """Not connected; may be dialed when a link is wanted."""
    BACKOFF = "backoff"
    """Not connected; waiting after failures before the next dial."""


PROTECTED = 4
"""The rank of bootstrap and manual peers: never evicted to make room."""


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
    verified: set[str] = field(default_factory=set)
    """Addresses where a handshake answered as this peer's key: dialed freely, passed on to others."""
    operator: set[str] = field(default_factory=set)
    """Addresses the operator gave (bootstrap, manual): dialed whatever their range."""
    lan: set[str] = field(default_factory=set)
    """Private (not loopback) addresses mDNS announced: dialed (within the budget) without dial_private."""
    useful: bool = False
    """It did work with this node (receipts, jobs): kept before peers that only linked."""
    probing: bool = False
    """A dial confirming its record's address runs while it is linked to us."""
    probe_after: float = 0.0
    """trio time before which its record's address is not probed again (after a failed probe)."""
    probed: int = -1
    """`contact_expires` of the record last probed: each record gets one probe."""
    rank: int = -1
    queued: bool = False

    def state(self, now: float) -> PeerState:
        if self.connected:
            return PeerState.SUSPECT if self.suspect else PeerState.CONNECTED
        if self.dialing:
            return PeerState.DIALING
        if self.failures and now < self.next_dial:
            return PeerState.BACKOFF
        return PeerState.KNOWN


def rank_of(peer: Peer) -> int:
    """How much a peer is worth keeping: the lowest ranks, oldest first, are evicted to make room.

    0: it only ever linked to us (no record, no address); 1: it has addresses no handshake confirmed;
    2: we dialed it and it answered; 3: it did work with this node; PROTECTED: bootstrap or manual."""
    if peer.bootstrap or peer.source in ("bootstrap", "manual"):
        return PROTECTED
    if peer.useful:
        return 3
    if peer.verified:
        return 2
    if peer.addresses or peer.contact is not None:
        return 1
    return 0


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
    """A decision to dial: `node_id` None for an unnamed bootstrap address (nothing to pin).

    `probe`: the peer is linked to us already; the dial confirms the address its record names."""

    address: str
    node_id: bytes | None
    bootstrap: bool
    probe: bool = False


class PeerTable:
    """Known peers and bootstrap targets, and the decisions about them. No I/O.

    At most `settings.max_peers` peers are kept (linked peers may go over it for as long as they stay
    linked): making room evicts the lowest rank (`rank_of`), oldest sighting first, never a linked
    peer or one being dialed. `on_forget` hears every peer evicted so the store can drop it too.
    `dial_private` lets peers' addresses in loopback, private and special-purpose ranges be dialed
    (addresses.dial_refusal); bootstrap addresses the operator typed are always dialed.
    """

    def __init__(
        self,
        local: bytes,
        settings: PeerSettings,
        *,
        dial_private: bool = False,
        on_forget: Callable[[bytes], None] | None = None,
    ) -> None:
        self.local = local
        self.settings = settings
        self.dial_private = dial_private
        self.on_forget = on_forget
        self.backoff = Backoff(settings.backoff_base, settings.backoff_max)
        self.peers: dict[bytes, Peer] = {}
        self.targets: dict[str, BootstrapTarget] = {}
        self.own_addresses: set[str] = set()
        """Addresses that turned out to reach this node itself: never dialed again."""
        self.unverified = TokenBucket(settings.unverified_dials_per_minute / 60.0, settings.unverified_burst)
        """The global budget of dials to addresses no handshake has confirmed."""
        self._ranks: list[dict[bytes, None]] = [{} for _ in range(PROTECTED + 1)]
        """Peers by rank, least recently placed first (dicts keep insertion order)."""
        self._connected: set[bytes] = set()
        self._dialing: set[bytes] = set()
        self._waiting: list[tuple[float, int, bytes]] = []
        """Idle peers with something to dial, by `next_dial` (a heap; stale entries are skipped)."""
        self._ready: dict[bytes, None] = {}
        """Idle peers whose `next_dial` has passed."""
        self._probes: dict[bytes, None] = {}
        """Linked peers whose record names addresses no handshake confirmed."""
        self._seq = itertools.count()

    # --- learning about peers ---

    def add_bootstrap(self, address: str, node_id: bytes | None) -> None:
        if node_id is None:
            self.targets.setdefault(address, BootstrapTarget(address))
            return
        peer = self.learn(node_id, [address], "bootstrap")
        if peer is not None:
            peer.bootstrap = True
            peer.operator.add(address)
            self._place(peer)

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
        for a stranger met through others (exchange, mDNS, the store) while the table is full of peers
        worth more. Bootstrap and manual peers are always added."""
        if node_id == self.local:
            return None
        new = [a for a in addresses if a not in self.own_addresses]
        peer = self.peers.get(node_id)
        if peer is None:
            forced = source in ("bootstrap", "manual")
            rank = PROTECTED if forced else 1 if new or contact is not None else 0
            if not self._make_room(rank - 1 if source in ("exchange", "mdns") else rank) and not forced:
                return None
            peer = self.peers[node_id] = Peer(node_id, source, failures=failures, last_seen=last_seen)
        peer.addresses = list(dict.fromkeys([*new, *peer.addresses]))[:16]
        if source == "manual":
            peer.operator.update(new)
        elif source == "mdns":
            peer.lan.update(a for a in new if _is_lan(a))
        if last_seen is not None and (peer.last_seen is None or last_seen > peer.last_seen):
            peer.last_seen = last_seen
        if contact is not None and contact_expires > peer.contact_expires:
            peer.contact, peer.contact_expires = contact, contact_expires
            if peer.connected and not peer.outbound:
                self._probes[node_id] = None
        self._place(peer)
        self._idle(peer)
        return peer

    def vouch(self, node_id: bytes) -> None:
        """The peer did work with this node (a receipt, a job): keep it before peers that only linked."""
        peer = self.peers.get(node_id)
        if peer is not None and not peer.useful:
            peer.useful = True
            self._place(peer)

    def forget(self, node_id: bytes) -> None:
        peer = self.peers.pop(node_id, None)
        if peer is None:
            return
        self._ranks[peer.rank].pop(node_id, None)
        for index in (self._connected, self._dialing):
            index.discard(node_id)
        self._ready.pop(node_id, None)
        self._probes.pop(node_id, None)

    def mark_own_address(self, address: str) -> None:
        self.own_addresses.add(address)
        self.targets.pop(address, None)
        for peer in self.peers.values():
            if address in peer.addresses:
                peer.addresses.remove(address)

    # --- the cap ---

    def _place(self, peer: Peer) -> None:
        """(Re)file the peer under its rank, as the most recent."""
        if peer.rank >= 0:
            self._ranks[peer.rank].pop(peer.node_id, None)
        peer.rank = rank_of(peer)
        self._ranks[peer.rank][peer.node_id] = None

    def _make_room(self, up_to_rank: int) -> bool:
        """Room for one more peer: True if there is, or once a peer of rank <= `up_to_rank` is evicted."""
        if len(self.peers) < self.settings.max_peers:
            return True
        return self._evict(up_to_rank)

    def _evict(self, up_to_rank: int) -> bool:
        for rank in range(min(up_to_rank, PROTECTED - 1) + 1):
            for key in self._ranks[rank]:
                if key in self._connected or key in self._dialing:
                    continue
                self.forget(key)
                if self.on_forget is not None:
                    self.on_forget(key)
                return True
        return False

    def _trim(self) -> None:
        """Back down to the cap once linked peers that went over it are gone."""
        while len(self.peers) > self.settings.max_peers and self._evict(PROTECTED - 1):
            pass

    # --- what may be dialed ---

    def dial_address(self, peer: Peer) -> tuple[str, bool] | None:
        """The address to dial the peer at, and whether it is confirmed (verified, or the operator's);
        None when none may be dialed."""
        unconfirmed = None
        for address in peer.addresses:
            if address in self.own_addresses:
                continue
            if address in peer.verified or address in peer.operator:
                if self.allowed(address, peer):
                    return address, True
            elif unconfirmed is None and self.allowed(address, peer):
                unconfirmed = address
        return None if unconfirmed is None else (unconfirmed, False)

    def allowed(self, address: str, peer: Peer | None = None) -> bool:
        """Whether the operator's settings let this node dial `address` (named by `peer`)."""
        if peer is not None and address in peer.operator:
            return True
        refusal = dial_refusal(address, allow_private=self.dial_private)
        if refusal is None:
            return True
        return peer is not None and address in peer.lan and dial_refusal(address, allow_private=True) is None

    def _idle(self, peer: Peer) -> None:
        """The peer is neither linked nor being dialed: index it for the dialer if it can be dialed."""
        if peer.queued or peer.connected or peer.dialing or not peer.addresses:
            return
        peer.queued = True
        heapq.heappush(self._waiting, (peer.next_dial, next(self._seq), peer.node_id))

    # --- links ---

    def connected_count(self) -> int:
        return len(self._connected)

    def on_connected(self, node_id: bytes, outbound: bool, wall: float) -> Peer:
        peer = self.peers.get(node_id)
        if peer is None:
            self._make_room(1)  # an inbound stranger displaces the oldest unconfirmed one, if any
            peer = self.peers[node_id] = Peer(node_id, "inbound")
        peer.connected, peer.outbound, peer.suspect = True, outbound, False
        peer.failures, peer.next_dial, peer.last_seen = 0, 0.0, wall
        self._connected.add(node_id)
        self._ready.pop(node_id, None)
        peer.queued = False
        if not outbound and peer.contact is not None and not peer.verified:
            self._probes[node_id] = None
        self._place(peer)
        return peer

    def admits(self, node_id: bytes, now: float) -> bool:
        """Whether a link with `node_id` may be kept now (False while it serves a penalty)."""
        peer = self.peers.get(node_id)
        return peer is None or now >= peer.refused_until

    def refuse(self, node_id: bytes, until: float) -> None:
        """Refuse links with `node_id`, and do not dial it, before `until` (trio time): a penalty
        another service decided (gossip bans a flooder). A peer not in the table is left alone."""
        peer = self.peers.get(node_id)
        if peer is not None:
            peer.refused_until = max(peer.refused_until, until)
            peer.next_dial = max(peer.next_dial, until)

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
        self._connected.discard(node_id)
        self._probes.pop(node_id, None)
        if failed or misbehaved:
            peer.failures += 1
        peer.next_dial = max(
            peer.refused_until,
            peer.probe_after,  # a failed probe was this record's one try
            now + max(self.backoff.delay(peer.failures, rng), self.settings.backoff_base),
        )
        if misbehaved:
            peer.refused_until = peer.next_dial
        self._idle(peer)
        self._trim()
        return self.peers.get(node_id)

    # --- dialing ---

    def due_dials(self, now: float, rng: Random) -> list[Dial]:
        """What to dial now; marks each chosen peer or target as dialing.

        The cost is in proportion to the bootstrap targets, the linked and dialing peers and the peers
        whose backoff has passed, never to the whole table."""
        dials: list[Dial] = []
        busy_addresses = {t.address for t in self.targets.values() if t.dialing}
        for key in self._connected | self._dialing:
            busy_addresses.update(self.peers[key].addresses)
        for target in self.targets.values():
            if target.dialing or now < target.next_dial or target.address in busy_addresses:
                continue
            if target.node_id is not None and target.node_id in self.peers:
                continue  # the peer's own entry is dialed instead
            target.dialing = True
            busy_addresses.add(target.address)
            dials.append(Dial(target.address, None, True))
        dials += self._probe_dials(now)
        self._wake_waiting(now)
        busy = len(self._connected | self._dialing) + sum(1 for d in dials if not d.probe)
        always: list[tuple[Peer, str]] = []
        others: list[tuple[Peer, str, bool]] = []
        for key in list(self._ready):
            peer = self.peers[key]
            choice = self.dial_address(peer) if not (peer.connected or peer.dialing) else None
            if choice is None:
                del self._ready[key]
                peer.queued = False
                continue
            if peer.next_dial > now:  # refused meanwhile: back to waiting
                del self._ready[key]
                heapq.heappush(self._waiting, (peer.next_dial, next(self._seq), key))
                continue
            address, confirmed = choice
            if address in busy_addresses:
                continue
            if peer.bootstrap:
                always.append((peer, address))
            else:
                others.append((peer, address, confirmed))
        others.sort(key=lambda c: (not c[2], c[0].failures, -(c[0].last_seen or 0.0), rng.random()))
        room = max(0, self.settings.target_degree - busy - len(always))
        chosen = list(always)
        for peer, address, confirmed in others:
            if len(chosen) - len(always) >= room:
                break
            if address in busy_addresses or (not confirmed and not self.unverified.allow(now)):
                continue
            busy_addresses.add(address)
            chosen.append((peer, address))
        for peer, address in chosen:
            self._start_dial(peer)
            dials.append(Dial(address, peer.node_id, peer.bootstrap))
        return dials

    def _wake_waiting(self, now: float) -> None:
        waiting = self._waiting
        while waiting and waiting[0][0] <= now:
            _, _, key = heapq.heappop(waiting)
            peer = self.peers.get(key)
            if peer is None or not peer.queued or key in self._ready:
                continue
            if peer.connected or peer.dialing or not peer.addresses:
                peer.queued = False
            elif peer.next_dial > now:  # it failed again since: wait for the new time
                heapq.heappush(waiting, (peer.next_dial, next(self._seq), key))
            else:
                self._ready[key] = None

    def _probe_dials(self, now: float) -> list[Dial]:
        """Dials confirming the addresses linked peers' records name, within the global budget."""
        dials: list[Dial] = []
        for key in list(self._probes):
            peer = self.peers.get(key)
            if peer is None or not peer.connected or peer.outbound or peer.verified or peer.probing:
                del self._probes[key]
                continue
            if peer.probed == peer.contact_expires and now < peer.probe_after:
                continue
            choice = self.dial_address(peer)
            if choice is None:
                del self._probes[key]
                continue
            if not self.unverified.allow(now):
                break
            del self._probes[key]
            peer.probing, peer.probed = True, peer.contact_expires
            dials.append(Dial(choice[0], key, False, probe=True))
        return dials

    def _start_dial(self, peer: Peer) -> None:
        peer.dialing, peer.queued = True, False
        self._dialing.add(peer.node_id)
        self._ready.pop(peer.node_id, None)

    def _end_dial(self, peer: Peer) -> None:
        peer.dialing = False
        self._dialing.discard(peer.node_id)
        self._idle(peer)

    def dial_succeeded(self, dial: Dial, node_id: bytes) -> None:
        """The handshake through `dial` named `node_id` (== dial.node_id when that was pinned): the
        address is confirmed for that key."""
        target = self.targets.get(dial.address) if dial.node_id is None else None
        if target is not None:
            target.dialing, target.failures, target.next_dial = False, 0, 0.0
            target.node_id = node_id
        if dial.probe:
            peer = self.peers.get(node_id)
            if peer is not None:
                peer.probing = False
                peer.verified.add(dial.address)
                self._place(peer)
            return
        if dial.node_id is not None and dial.node_id in self.peers:
            self.peers[dial.node_id].dialing = False
            self._dialing.discard(dial.node_id)
        peer = self.learn(node_id, [dial.address], "bootstrap" if dial.bootstrap else "exchange")
        if peer is not None:
            peer.dialing = False
            self._dialing.discard(node_id)
            peer.bootstrap = peer.bootstrap or dial.bootstrap
            if dial.bootstrap:
                peer.operator.add(dial.address)
            peer.verified.add(dial.address)
            if peer.addresses and peer.addresses[0] != dial.address and dial.address in peer.addresses:
                peer.addresses.remove(dial.address)
                peer.addresses.insert(0, dial.address)
            self._place(peer)

    def dial_failed(self, dial: Dial, now: float, rng: Random) -> Peer | None:
        """Count a failed dial; returns the peer it concerned (None for an unnamed bootstrap address,
        and for a probe: the peer's link is not at fault)."""
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
        if dial.probe:
            peer.probing = False
            peer.probe_after = now + self.settings.unverified_retry
            if peer.connected:
                self._probes[peer.node_id] = None
            return None
        peer.failures += 1
        delay = self.backoff.delay(peer.failures, rng)
        if dial.address not in peer.verified and dial.address not in peer.operator:
            delay = max(delay, self.settings.unverified_retry)  # one try per record, then back off
        peer.next_dial = now + delay
        if len(peer.addresses) > 1:  # try the next address next time
            peer.addresses.append(peer.addresses.pop(0))
        self._end_dial(peer)
        self._trim()
        return peer

    def dial_abandoned(self, dial: Dial) -> None:
        """The dial found nothing to do (the peer connected to us meanwhile): no failure counted."""
        if dial.node_id is None:
            target = self.targets.get(dial.address)
            if target is not None:
                target.dialing = False
            return
        peer = self.peers.get(dial.node_id)
        if peer is None:
            return
        if dial.probe:
            peer.probing = False
        else:
            self._end_dial(peer)

    # --- peer exchange ---

    def contacts_to_share(self, rng: Random, now_ms: int, exclude: bytes, limit: int) -> list[bytes]:
        """Up to `limit` unexpired contact records of peers other than `exclude` (the recipient) with an
        address a handshake confirmed: the connected ones first, then a random sample of the rest."""
        live = [
            p
            for p in self.peers.values()
            if p.node_id != exclude and p.contact is not None and p.contact_expires > now_ms and p.verified
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


def _is_lan(address: str) -> bool:
    """A private or link-local, not loopback, address: what mDNS on a local network announces."""
    try:
        ip = ipaddress.ip_address(split_address(address)[0])
    except ValueError:
        return False
    return (ip.is_private or ip.is_link_local) and not ip.is_loopback
