"""The two clocks-as-parameters accounting tools of gossip: a token bucket and a decaying score.

Both take `now` in milliseconds and never read a clock. A `now` that goes backwards (a wall
clock stepped back) counts as no time passing, so neither tool can be refilled or forgiven by
moving the clock.
"""

from __future__ import annotations

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
        if now > self.updated:
            self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate / 1000.0)
            self.updated = now
        if self.tokens >= cost:
            self.tokens -= cost
            return True
        return False


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
