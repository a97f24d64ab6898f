"""Link primitives of peering: backoff with jitter, token buckets, heartbeat liveness, and the rule that
picks one of two links to the same peer. Pure: time and randomness come in as parameters."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol


class Random(Protocol):
    def random(self) -> float: ...


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


RTT_REFRESH = 4
"""Heartbeat intervals after which a link that keeps carrying messages is pinged all the same, so its
round trip (`e31 peers`) stays current."""


@dataclass(slots=True)
class Liveness:
    """Heartbeat bookkeeping for one link: which ping is outstanding, how many went unanswered, and
    when the peer was last heard from.

    Any message the peer sends over the link (its session is authenticated) shows it alive as a pong
    does: `heard` clears the count of missed pings, and a ping outstanding when a message arrived
    afterwards does not count as missed. So a ping is only worth sending on a link that has been
    quiet (`ping_due`): a link busy with a sweep's offers, bids and results carries a heartbeat only
    every RTT_REFRESH intervals or so, to keep its round trip current."""

    suspect_after: int
    dead_after: int
    missed: int = 0
    outstanding: bytes | None = None
    sent_at: float = float("-inf")
    """When the last ping went."""
    rtt: float | None = None
    heard_at: float = float("-inf")
    """When the last message from the peer arrived."""

    @property
    def health(self) -> LinkHealth:
        if self.missed >= self.dead_after:
            return LinkHealth.DEAD
        if self.missed >= self.suspect_after:
            return LinkHealth.SUSPECT
        return LinkHealth.ALIVE

    def heard(self, now: float) -> None:
        """A message from the peer arrived: it is alive."""
        self.heard_at = now
        self.missed = 0

    def ping_due(self, now: float, interval: float) -> bool:
        """Whether a heartbeat should go now: nothing was heard from the peer for half an `interval`
        (the heartbeat task wakes about once an interval), or the last ping went RTT_REFRESH intervals
        ago or more."""
        return now - self.heard_at >= interval / 2 or now - self.sent_at >= RTT_REFRESH * interval

    def tick(self, nonce: bytes, now: float) -> LinkHealth:
        """A heartbeat is due: the previous ping, if still unanswered and nothing was heard from the
        peer since it went, counts as missed; `nonce` is the next ping's. Returns the health after
        counting (DEAD: close the link, send nothing)."""
        if self.outstanding is not None and self.heard_at < self.sent_at:
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
