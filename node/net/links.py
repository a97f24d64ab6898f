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
