"""Gossip decisions, sans-I/O: what to do with a signed message that arrives from a peer.

`GossipEngine.receive(peer, raw, now, rng)` returns a list of actions (Deliver, Forward,
Penalise, Disconnect, Drop) for the caller to carry out; it reads no clock and draws no random
number of its own (`now` is milliseconds since the Unix epoch, `rng` any object with `sample`).

The order of the checks puts the cheap ones first, so that the costly one (Ed25519) runs once
per message and only for a peer within its rate:
  1. known peer; size below the largest gossip size cap;
  2. `peek`: strict structural parse of the envelope (canonical msgpack, 5 fields, types);
     the kind must be a gossip kind and the size within that kind's cap;
  3. message id = SHA-256(signed bytes || signer), computed without verifying anything;
  4. the peer's token bucket (a duplicate costs a fraction of a new message);
  5. the seen-cache: a known id is a duplicate, counted and dropped;
  6. the claimed signer's token bucket must hold the message's tokens (nothing spent yet), so a
     signer over its limit costs no signature check;
  7. `envelope.verify` (signature, issuer, message rules); network; expiry against `now`
     within the clock skew; expiry no further ahead than the maximum lifetime;
  8. remember the id until expiry + skew; the signer's bucket is charged (only a verified
     signer's bucket is ever charged or created, so forgeries cannot spend an honest signer's
     tokens); deliver, forward to `fanout` random peers other than the one it came from (and its
     signer, when peers are keyed by NodeId or by key bytes).
Only a message that passed step 7 enters the seen-cache: otherwise a copy of a real message
with a broken signature (same id) could shadow the real one. A failure at 1-7 that an honest
peer cannot produce costs the peer score; at or below `disconnect_below` the peer is
disconnected and banned: `ban_ms` for a first offence, doubling with each repeat (at most
`max_ban_ms`; offences are forgotten `offence_memory_ms` after the last). Scores decay toward 0
with a half-life. Every table is capped: the seen-cache (`seen_capacity`), signer buckets,
departed scores and bans (`max_senders` each, least recent forgotten first).
"""

from __future__ import annotations

import hashlib
from collections import Counter, OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from heapq import heappop, heappush
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

from .codec import unpack_canonical
from .envelope import VerifiedEnvelope, signed_bytes, verify
from .errors import (
    BadSignature,
    DecodeError,
    InvalidMessage,
    LocalProtocolError,
    ProtocolError,
    UnknownKind,
)
from .gossip_limits import PenaltyBox, Score, TokenBucket
from .ids import ENVELOPE_VERSION, KEY_SIZE, SIGNATURE_SIZE, Digest
from .messages import REGISTRY, AnyMessage

P = TypeVar("P", bound=Hashable)
T = TypeVar("T")


class Rng(Protocol):
    """What the engine needs of a random source (random.Random fits)."""

    def sample(self, population: Sequence[T], k: int) -> list[T]: ...


class Reason(StrEnum):
    """Why a message was not delivered (also the counter names)."""

    DUPLICATE = "duplicate"
    UNKNOWN_PEER = "unknown_peer"
    OVERSIZE = "oversize"
    MALFORMED = "malformed"
    NOT_GOSSIP = "not_gossip"
    FLOODING = "flooding"
    BAD_SIGNATURE = "bad_signature"
    INVALID = "invalid"
    WRONG_NETWORK = "wrong_network"
    EXPIRED = "expired"
    TOO_FAR_AHEAD = "too_far_ahead"
    SENDER_RATE = "sender_rate"


@dataclass(frozen=True, slots=True)
class Deliver:
    """A new valid message: hand it to the local subscribers of its kind."""

    envelope: VerifiedEnvelope[AnyMessage]


@dataclass(frozen=True, slots=True)
class Forward(Generic[P]):
    """Send these (verified, canonical) envelope bytes to `peer`."""

    peer: P
    raw: bytes


@dataclass(frozen=True, slots=True)
class Penalise(Generic[P]):
    peer: P
    reason: Reason
    score: float


@dataclass(frozen=True, slots=True)
class Disconnect(Generic[P]):
    """Close the connection to `peer` and refuse it until `until` (ms, the clock of `now`); the
    engine has already forgotten and banned it."""

    peer: P
    reason: Reason
    until: int = 0


@dataclass(frozen=True, slots=True)
class Drop(Generic[P]):
    reason: Reason
    peer: P | None


Action = Deliver | Forward[P] | Penalise[P] | Disconnect[P] | Drop[P]

TOKEN_BYTES = 16 * 1024
"""A gossiped message costs one rate-limit token per started TOKEN_BYTES of its envelope (default)."""


def message_cost(size: int, token_bytes: int = TOKEN_BYTES) -> int:
    """The rate-limit tokens a gossiped envelope of `size` bytes costs: one per started `token_bytes`."""
    return max(1, -(-size // token_bytes))


DEFAULT_KINDS: Mapping[str, int] = {"capacity": 4 * 1024, "offer": 256 * 1024, "cancel": 2 * 1024}
"""The kinds gossip carries, each with its largest accepted envelope in bytes."""

DEFAULT_PENALTIES: Mapping[Reason, float] = {
    # Never produced by an honest peer, which verifies before forwarding.
    Reason.OVERSIZE: 100.0,
    Reason.MALFORMED: 100.0,
    Reason.BAD_SIGNATURE: 100.0,
    Reason.INVALID: 100.0,
    Reason.WRONG_NETWORK: 50.0,
    # An honest peer can produce these now and then: clocks further apart than the skew, a burst,
    # a kind introduced by a newer version.
    Reason.EXPIRED: 10.0,
    Reason.TOO_FAR_AHEAD: 10.0,
    Reason.FLOODING: 2.0,
    Reason.NOT_GOSSIP: 1.0,
}


def _default_kinds() -> dict[str, int]:
    return dict(DEFAULT_KINDS)


def _default_penalties() -> dict[Reason, float]:
    return dict(DEFAULT_PENALTIES)


@dataclass(frozen=True)
class GossipConfig:
    network: str
    kinds: Mapping[str, int] = field(default_factory=_default_kinds)
    fanout: int = 6
    """Peers each new message is forwarded to (tests/bench/bench_gossip.py measures the choice)."""
    publish_fanout: int | None = None
    """Peers our own messages go to; None: every peer."""
    clock_skew_ms: int = 30_000
    max_ttl_ms: int = 24 * 3600 * 1000
    seen_capacity: int = 100_000
    peer_rate: float = 100.0
    """Sustained tokens per second accepted from one peer. A new message costs this node about
    0.6 ms of CPU in all (decryption, parse, signature check, delivery, forwarding; measured by
    tests/bench/bench_flood.py), so one peer at its limit costs at most about 6% of a core, and a
    peer over it is cut off within about `peer_burst / peer_rate` seconds."""
    peer_burst: float = 200.0
    duplicate_cost: float = 0.1
    """Tokens a duplicate costs, as a fraction of a new message."""
    token_bytes: int = TOKEN_BYTES
    """A message costs one token (of both buckets) per started `token_bytes` of its envelope, so the
    limits bound bytes as well as messages: a 256 KiB offer costs 16."""
    sender_rate: float = 50.0
    """Sustained tokens per second accepted from one signer: a submitter offers its job sets at up
    to this rate (node/market/offering.py paces under it), below `peer_rate`."""
    sender_burst: float = 100.0
    max_senders: int = 4096
    """Signers whose buckets are tracked, and departed peers whose negative scores are kept
    (least recently used forgotten first)."""
    penalties: Mapping[Reason, float] = field(default_factory=_default_penalties)
    disconnect_below: float = -100.0
    score_half_life_ms: int = 10 * 60 * 1000
    ban_ms: int = 10 * 60 * 1000
    """How long a first offence (score at `disconnect_below`) bans a peer; each repeat doubles it."""
    max_ban_ms: int = 24 * 3600 * 1000
    offence_memory_ms: int = 24 * 3600 * 1000
    """Offences are forgotten this long after a peer's last one."""

    def __post_init__(self) -> None:
        for kind, cap in self.kinds.items():
            cls = REGISTRY.get(kind)
            if cls is None:
                raise LocalProtocolError(f"gossip kind {kind!r} is not a message kind")
            if cls.EXPIRY is None:
                raise LocalProtocolError(
                    f"gossip kind {kind!r} has no expiry; gossip carries only messages that expire"
                )
            if type(cap) is not int or cap < 1:
                raise LocalProtocolError(f"size cap of gossip kind {kind!r} must be a positive int")
        if not self.kinds:
            raise LocalProtocolError("gossip needs at least one kind")
        if self.fanout < 1 or (self.publish_fanout is not None and self.publish_fanout < 1):
            raise LocalProtocolError("fan-out must be at least 1")
        positive = {
            "seen_capacity": self.seen_capacity,
            "peer_rate": self.peer_rate,
            "peer_burst": self.peer_burst,
            "sender_rate": self.sender_rate,
            "sender_burst": self.sender_burst,
            "max_senders": self.max_senders,
            "score_half_life_ms": self.score_half_life_ms,
            "max_ttl_ms": self.max_ttl_ms,
        }
        for name, value in positive.items():
            if not value > 0:
                raise LocalProtocolError(f"gossip {name} must be positive, got {value}")
        if type(self.token_bytes) is not int or self.token_bytes < 1:
            raise LocalProtocolError("token_bytes must be a positive int")
        if self.clock_skew_ms < 0 or self.ban_ms < 0 or self.duplicate_cost < 0 or self.offence_memory_ms < 0:
            raise LocalProtocolError(
                "clock_skew_ms, ban_ms, offence_memory_ms and duplicate_cost cannot be negative"
            )
        if self.max_ban_ms < self.ban_ms:
            raise LocalProtocolError("max_ban_ms cannot be below ban_ms")
        if self.peer_burst < 1 or self.sender_burst < 1:
            raise LocalProtocolError("a burst below 1 would refuse every message")
        if self.disconnect_below >= 0:
            raise LocalProtocolError("disconnect_below must be negative (0 is a new peer's score)")
        if any(v < 0 for v in self.penalties.values()):
            raise LocalProtocolError("penalties are non-negative points")


class Header(NamedTuple):
    """An envelope's fields, parsed but not verified, and the id they give."""

    kind: str
    body: bytes
    signer: bytes
    message_id: bytes


def peek(raw: bytes, kinds: Mapping[str, int]) -> Header:
    """Parse an envelope's structure and compute its message id, without verifying the signature.

    Raises DecodeError or NonCanonical for bytes that are not a canonical envelope or that exceed
    their kind's size cap, and UnknownKind for a kind not in `kinds`.
    """
    env = unpack_canonical(raw, max_len=max(kinds.values()))
    if type(env) is not tuple or len(env) != 5:
        raise DecodeError("an envelope is an array of 5 items")
    version, kind, body, signer, signature = env
    if type(version) is not int or version != ENVELOPE_VERSION:
        raise DecodeError(f"unsupported envelope version {version!r}")
    if type(kind) is not str or kind not in kinds:
        raise _NotGossip(f"kind {str(kind)[:32]!r} is not carried by gossip")
    if len(raw) > kinds[kind]:
        raise _Oversize(f"{kind} envelope of {len(raw)} bytes exceeds its cap of {kinds[kind]}")
    if (
        type(body) is not bytes
        or type(signer) is not bytes
        or len(signer) != KEY_SIZE
        or type(signature) is not bytes
        or len(signature) != SIGNATURE_SIZE
    ):
        raise DecodeError("envelope fields of the wrong type or size")
    return Header(kind, body, signer, hashlib.sha256(signed_bytes(kind, body) + signer).digest())


def _expiry(env: VerifiedEnvelope[Any]) -> int:
    expires: int | None = env.message.expires
    if expires is None:  # GossipConfig admits only kinds with an expiry
        raise LocalProtocolError(f"a {env.kind} has no expiry")
    return expires


class _NotGossip(UnknownKind):
    pass


class _Oversize(DecodeError):
    pass


@dataclass(slots=True)
class _Peer:
    bucket: TokenBucket
    score: Score


class GossipEngine(Generic[P]):
    """The gossip state of one node: its peers, their buckets and scores, the seen-cache."""

    def __init__(self, config: GossipConfig) -> None:
        self.config = config
        self.counters: Counter[str] = Counter()
        self._peers: dict[P, _Peer] = {}
        self._banned = PenaltyBox(
            config.ban_ms, config.max_ban_ms, config.offence_memory_ms, config.max_senders
        )
        self._seen: dict[bytes, int] = {}
        self._deadlines: list[tuple[int, bytes]] = []
        self._senders: OrderedDict[bytes, TokenBucket] = OrderedDict()
        self._departed: OrderedDict[P, Score] = OrderedDict()
        self._max_size = max(config.kinds.values())

    # -- peers --------------------------------------------------------------------------------

    @property
    def peers(self) -> tuple[P, ...]:
        return tuple(self._peers)

    def add_peer(self, peer: P, now: int) -> bool:
        """Start gossiping with `peer`; False (and nothing changes) while it is banned.
        A peer that left with a negative score gets it back (decayed), so reconnecting does not
        wipe the slate clean."""
        if self.is_banned(peer, now):
            return False
        if peer not in self._peers:
            c = self.config
            score = self._departed.pop(peer, None) or Score(0.0, now)
            self._peers[peer] = _Peer(TokenBucket.full(c.peer_rate, c.peer_burst, now), score)
        return True

    def remove_peer(self, peer: P) -> None:
        state = self._peers.pop(peer, None)
        if state is not None and state.score.value < 0:
            self._departed[peer] = state.score
            if len(self._departed) > self.config.max_senders:
                self._departed.popitem(last=False)

    def is_banned(self, peer: P, now: int) -> bool:
        return self._banned.until(peer, now) is not None

    def banned_until(self, peer: P, now: int) -> int | None:
        """The end of `peer`'s ban (ms), or None if it is not banned at `now`."""
        return self._banned.until(peer, now)

    def offences(self, peer: P) -> int:
        """How many times `peer` was disconnected within the offence memory."""
        return self._banned.offences(peer)

    @property
    def sizes(self) -> dict[str, int]:
        """How many entries each of the engine's tables holds (each is capped by the config)."""
        return {
            "peers": len(self._peers),
            "seen": len(self._seen),
            "senders": len(self._senders),
            "departed": len(self._departed),
            "banned": len(self._banned),
        }

    def score(self, peer: P, now: int) -> float:
        state = self._peers.get(peer)
        return 0.0 if state is None else state.score.at(now, self.config.score_half_life_ms)

    def scores(self, now: int) -> dict[P, float]:
        """Every connected peer's score (0 neutral; disconnected at `disconnect_below`)."""
        half_life = self.config.score_half_life_ms
        return {peer: state.score.at(now, half_life) for peer, state in self._peers.items()}

    # -- the seen-cache -----------------------------------------------------------------------

    def has_seen(self, message_id: Digest) -> bool:
        return message_id.raw in self._seen

    @property
    def seen_size(self) -> int:
        return len(self._seen)

    def _remember(self, mid: bytes, keep_until: int) -> None:
        if len(self._seen) >= self.config.seen_capacity:
            # Full before anything expired: forget the entry closest to its expiry. A replay of it
            # within its remaining life would be delivered twice; nothing worse.
            _, old = heappop(self._deadlines)
            del self._seen[old]
            self.counters["seen_evicted"] += 1
        self._seen[mid] = keep_until
        heappush(self._deadlines, (keep_until, mid))

    def expire(self, now: int) -> int:
        """Forget ids whose messages can no longer pass the expiry check, and finished bans.
        Returns how many ids were forgotten. Call it now and then (every few seconds)."""
        pruned = 0
        while self._deadlines and self._deadlines[0][0] <= now:
            _, mid = heappop(self._deadlines)
            del self._seen[mid]
            pruned += 1
        self._banned.prune(now)
        return pruned

    # -- messages -----------------------------------------------------------------------------

    def receive(self, peer: P, raw: bytes, now: int, rng: Rng) -> list[Action[P]]:
        """Decide what to do with envelope bytes that `peer` sent."""
        self.counters["received"] += 1
        state = self._peers.get(peer)
        if state is None:
            return self._drop(Reason.UNKNOWN_PEER, peer)
        if type(raw) is not bytes:
            raise LocalProtocolError(f"gossip takes bytes, got {type(raw).__name__}")
        if len(raw) > self._max_size:
            return self._fault(peer, state, Reason.OVERSIZE, now)
        try:
            head = peek(raw, self.config.kinds)
        except _NotGossip:
            # Possibly a kind from a newer version: cheap to drop, so it costs a duplicate's tokens
            # and a point, not a disconnect.
            if not state.bucket.take(self.config.duplicate_cost, now):
                return self._fault(peer, state, Reason.FLOODING, now)
            return self._fault(peer, state, Reason.NOT_GOSSIP, now)
        except _Oversize:
            return self._fault(peer, state, Reason.OVERSIZE, now)
        except ProtocolError:
            return self._fault(peer, state, Reason.MALFORMED, now)
        duplicate = head.message_id in self._seen
        cost = self.cost(len(raw))
        if not state.bucket.take(self.config.duplicate_cost * cost if duplicate else cost, now):
            return self._fault(peer, state, Reason.FLOODING, now)
        if duplicate:
            return self._drop(Reason.DUPLICATE, peer)
        sender = self._senders.get(head.signer)
        if sender is not None and not sender.has(float(cost), now):
            return self._drop(Reason.SENDER_RATE, peer)
        try:
            env = verify(raw, max_len=self._max_size)
        except BadSignature:
            return self._fault(peer, state, Reason.BAD_SIGNATURE, now)
        except InvalidMessage:
            return self._fault(peer, state, Reason.INVALID, now)
        except ProtocolError:
            return self._fault(peer, state, Reason.MALFORMED, now)
        stale = self._staleness(env, now)
        if stale is not None:
            return self._fault(peer, state, stale, now)
        self._remember(head.message_id, _expiry(env) + self.config.clock_skew_ms)
        if not self._sender_take(head.signer, cost, now):
            return self._drop(Reason.SENDER_RATE, peer)
        self.counters["delivered"] += 1
        self.counters[f"delivered_{env.kind}"] += 1
        targets = self._choose(self.config.fanout, rng, exclude=(peer, env.signer, env.signer.raw))
        self.counters["forwarded"] += len(targets)
        return [Deliver(env), *(Forward(p, raw) for p in targets)]

    def publish(self, message: bytes | VerifiedEnvelope[Any], now: int, rng: Rng) -> list[Action[P]]:
        """Send one of our own messages: the actions are Forwards (or a Drop if already sent).

        The message is checked like a received one (its signature too when given as bytes: a
        VerifiedEnvelope was checked when it was made); a ProtocolError says why it cannot be sent.
        It is not delivered to the local subscribers.
        """
        env = message if isinstance(message, VerifiedEnvelope) else verify(message, max_len=self._max_size)
        raw = env.raw
        if len(raw) > self._max_size:
            raise LocalProtocolError(f"{env.kind} envelope of {len(raw)} bytes exceeds {self._max_size}")
        cap = self.config.kinds.get(env.kind)
        if cap is None:
            raise LocalProtocolError(f"kind {env.kind!r} is not carried by gossip")
        if len(raw) > cap:
            raise LocalProtocolError(f"{env.kind} envelope of {len(raw)} bytes exceeds its cap of {cap}")
        stale = self._staleness(env, now)
        if stale is not None:
            raise LocalProtocolError(f"cannot publish this {env.kind}: {stale.value.replace('_', ' ')}")
        if env.message_id.raw in self._seen:
            return self._drop(Reason.DUPLICATE, None)
        self._remember(env.message_id.raw, _expiry(env) + self.config.clock_skew_ms)
        self.counters["published"] += 1
        n = len(self._peers) if self.config.publish_fanout is None else self.config.publish_fanout
        targets = self._choose(n, rng, exclude=())
        self.counters["forwarded"] += len(targets)
        return [Forward(p, raw) for p in targets]

    # -- helpers ------------------------------------------------------------------------------

    def _staleness(self, env: VerifiedEnvelope[Any], now: int) -> Reason | None:
        if env.message.network_name != self.config.network:
            return Reason.WRONG_NETWORK
        expires = _expiry(env)
        skew = self.config.clock_skew_ms
        if expires + skew <= now:
            return Reason.EXPIRED
        if expires - now > self.config.max_ttl_ms + skew:
            return Reason.TOO_FAR_AHEAD
        return None

    def cost(self, size: int) -> int:
        """The tokens a message of `size` envelope bytes costs (GossipConfig.token_bytes)."""
        return message_cost(size, self.config.token_bytes)

    def _sender_take(self, signer: bytes, cost: int, now: int) -> bool:
        bucket = self._senders.get(signer)
        if bucket is None:
            c = self.config
            bucket = self._senders[signer] = TokenBucket.full(c.sender_rate, c.sender_burst, now)
            if len(self._senders) > c.max_senders:
                self._senders.popitem(last=False)
        else:
            self._senders.move_to_end(signer)
        return bucket.take(float(cost), now)

    def _choose(self, k: int, rng: Rng, exclude: tuple[object, ...]) -> list[P]:
        eligible = [p for p in self._peers if p not in exclude]
        if len(eligible) <= k:
            return eligible
        return rng.sample(eligible, k)

    def _drop(self, reason: Reason, peer: P | None) -> list[Action[P]]:
        self.counters[reason.value] += 1
        return [Drop(reason, peer)]

    def _fault(self, peer: P, state: _Peer, reason: Reason, now: int) -> list[Action[P]]:
        actions = self._drop(reason, peer)
        points = self.config.penalties.get(reason, 0.0)
        if points:
            score = state.score.add(-points, now, self.config.score_half_life_ms)
            actions.append(Penalise(peer, reason, score))
            if score <= self.config.disconnect_below:
                del self._peers[peer]
                until = self._banned.offend(peer, now)
                self.counters["disconnected"] += 1
                actions.append(Disconnect(peer, reason, until))
        return actions


__all__ = [
    "DEFAULT_KINDS",
    "DEFAULT_PENALTIES",
    "TOKEN_BYTES",
    "Action",
    "Deliver",
    "Disconnect",
    "Drop",
    "Forward",
    "GossipConfig",
    "GossipEngine",
    "Header",
    "Penalise",
    "Reason",
    "Rng",
    "message_cost",
    "peek",
]
