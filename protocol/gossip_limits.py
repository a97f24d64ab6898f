"""The clocks-as-parameters accounting tools of gossip: a token bucket, a decaying score and a
penalty box whose bans grow with repeat offences.

Both take `now` in milliseconds and never read a clock. A `now` that goes backwards (a wall
clock stepped back) counts as no time passing, so neither tool can be refilled or forgiven by
moving the clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(slots=True)
class TokenBucket:
    """Holds up to `burst` tokens and refills at `rate` tokens per second."""

    rate: float
    burst: float
    tokens: float
    updated: int

    @classmethod
    def full(cls, rate: float, burst: float, now: int) -> TokenBucket:
        return cls(rate, burst, burst, now)

    def take(self, cost: float, now: int) -> bool:
        """Spend `cost` tokens if there are that many; say whether they were there."""
        self._refill(now)
        if self.tokens >= cost:
            self.tokens -= cost
            return True
        return False

    def has(self, cost: float, now: int) -> bool:
        """Whether `cost` tokens are there now (nothing is spent)."""
        self._refill(now)
        return self.tokens >= cost

    def wait_ms(self, cost: float, now: int) -> int:
        """Milliseconds from `now` until `cost` tokens are there (0: now). A cost above the burst
        is never there: it waits for a full bucket."""
        self._refill(now)
        missing = min(cost, self.burst) - self.tokens
        return 0 if missing <= 0 else math.ceil(missing * 1000.0 / self.rate)

    def _refill(self, now: int) -> None:
        if now > self.updated:
            self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate / 1000.0)
            self.updated = now


@dataclass(slots=True)
class Score:
    """A peer's standing: 0 is neutral, penalties subtract, and the value halves toward 0 every
    `half_life` ms, so a peer that stops misbehaving is forgiven over time."""

    value: float
    updated: int

    def at(self, now: int, half_life: int) -> float:
        if now > self.updated:
            self.value *= 0.5 ** ((now - self.updated) / half_life)
            self.updated = now
        return self.value

    def add(self, delta: float, now: int, half_life: int) -> float:
        self.value = self.at(now, half_life) + delta
        return self.value


@dataclass(slots=True)
class _Record:
    offences: int
    until: int
    last: int


class PenaltyBox:
    """Who is refused, and until when: the n-th offence in a row bans a key for
    `base_ms * 2**(n - 1)`, at most `max_ms`. An offence is forgotten `memory_ms` after the key's
    last one, so a key that behaves starts again from `base_ms`. At most `capacity` keys are held;
    beyond that the one whose last offence is oldest is forgotten first. Takes `now` in ms."""

    def __init__(self, base_ms: int, max_ms: int, memory_ms: int, capacity: int) -> None:
        self.base_ms, self.max_ms, self.memory_ms, self.capacity = base_ms, max_ms, memory_ms, capacity
        self._records: dict[object, _Record] = {}

    def __len__(self) -> int:
        return len(self._records)

    def offend(self, key: object, now: int) -> int:
        """Record an offence by `key` at `now`; returns the end of its ban (ms)."""
        record = self._records.pop(key, None)
        if record is None or now - record.last >= self.memory_ms:
            record = _Record(0, now, now)
        record.offences += 1
        record.last = max(record.last, now)
        length = min(self.max_ms, self.base_ms * 2 ** min(record.offences - 1, 62))
        record.until = max(record.until, now + length)
        self._records[key] = record  # most recent last
        while len(self._records) > self.capacity:
            del self._records[next(iter(self._records))]
        return record.until

    def until(self, key: object, now: int) -> int | None:
        """The end of `key`'s ban, or None if it is not banned at `now`."""
        record = self._records.get(key)
        return record.until if record is not None and now < record.until else None

    def offences(self, key: object) -> int:
        record = self._records.get(key)
        return 0 if record is None else record.offences

    def prune(self, now: int) -> int:
        """Forget keys whose ban is over and whose offences are past memory; returns how many."""
        stale = [k for k, r in self._records.items() if r.until <= now and now - r.last >= self.memory_ms]
        for key in stale:
            del self._records[key]
        return len(stale)
