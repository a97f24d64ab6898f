"""The caps on relayed links a node accepts: at most so many open (handshakes included) through one
relay and in all, each also counted in the node's ConnectionCaps under the relay link's address, so a
relay cannot push more links onto a node than its TCP accepts allow from that address."""

from __future__ import annotations

from collections import Counter

from .limits import ConnectionCaps


class RelayedIn:
    def __init__(self, caps: ConnectionCaps, *, per_relay: int, total: int) -> None:
        self.caps = caps
        self.per_relay = per_relay
        self.total = total
        self.open: Counter[bytes] = Counter()
        """Relay -> the relayed links (and handshakes) accepted through it, open now."""

    def admit(self, relay: bytes, host: str) -> str | None:
        """Reserve a slot for a link through `relay` (its link from `host`): None, else why not.
        Every admitted link must be given back with `release(relay, host)`."""
        if self.open[relay] >= self.per_relay:
            return f"{self.open[relay]} relayed links open through that relay, the cap is {self.per_relay}"
        if self.open.total() >= self.total:
            return f"{self.open.total()} relayed links open, the cap is {self.total}"
        refusal = self.caps.admit(host)
        if refusal is None:
            self.open[relay] += 1
        return refusal

    def release(self, relay: bytes, host: str) -> None:
        self.caps.release(host)
        self.open[relay] -= 1
        if self.open[relay] <= 0:
            del self.open[relay]
