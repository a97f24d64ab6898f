"""The gossip service: runs a GossipEngine (protocol/gossip.py) over pluggable peer links.

The service is a LinkListener of the peering service (peering.py): `link_up(peer, send)`
when a link opens, `link_down(peer)` when it closes, `message(peer, raw)` for each envelope that
arrives; it takes the gossip kinds and ignores the rest (they are for other services). It can also
be driven without peering: `run(incoming)` with a channel of (peer, bytes), `add_peer(peer, send)`.

Every action the engine returns is carried out without blocking: forwards go into the peer's own
bounded channel, drained by one sender task per peer (so a slow peer loses messages, never stalls
the others; a send that fails or takes longer than `send_timeout` ends the link); deliveries go
into each subscriber's bounded channel (a full one loses the message, counted). A peer the engine
disconnects, or whose link died, is reported through `on_disconnect(peer, reason)`, for peering
to close the connection (`PeerService.disconnect` fits); a peer the engine banned is also reported
through `on_refuse(peer, seconds)` first, for peering to refuse its redials and reconnects for the
ban (`PeerService.refuse` fits).

Each link's sender paces what it sends with the receiver's own per-peer limit (GossipConfig
`peer_rate` and `peer_burst`, at `pace` of them), so an honest node never looks like a flooder
to a peer that applies the same defaults: what does not fit waits in the link's queue, bounded by
count (`send_buffer`) and bytes (`send_buffer_bytes`), and beyond that is dropped.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

import trio
from e31.protocol.envelope import VerifiedEnvelope, claimed_kind
from e31.protocol.gossip import Deliver, Disconnect, Forward, GossipEngine, Penalise, Rng
from e31.protocol.gossip_limits import TokenBucket
from e31.protocol.messages import AnyMessage, Message

from .transport import TransportError

P = TypeVar("P", bound=Hashable)
M = TypeVar("M", bound=Message)

Verified = VerifiedEnvelope[AnyMessage]
Send = Callable[[bytes], Awaitable[None]]

LINK_ERRORS = (TransportError, trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError, OSError)
"""What a link's `send` may raise when the link is dead; anything else is a bug and propagates."""


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def _trio_ms() -> int:
    """trio's clock in ms: pacing needs a clock that never steps (and MockClock drives it in tests)."""
    return int(trio.current_time() * 1000)


@dataclass(slots=True)
class _Link:
    channel: trio.MemorySendChannel[bytes]
    scope: trio.CancelScope
    queued_bytes: int = 0


class GossipService(Generic[P]):
    def __init__(
        self,
        engine: GossipEngine[P],
        *,
        clock: Callable[[], int] = wall_clock_ms,
        rng: Rng | None = None,
        send_buffer: int = 1024,
        send_buffer_bytes: int = 4 << 20,
        send_timeout: float = 10.0,
        prune_interval: float = 5.0,
        pace: float = 0.9,
        on_disconnect: Callable[[P, str], None] | None = None,
        on_refuse: Callable[[P, float], None] | None = None,
    ) -> None:
        """`clock` gives milliseconds since the Unix epoch (expiry is wall-clock time). `send_buffer`
        and `send_buffer_bytes`: messages and bytes queued per link before more are dropped, above a
        signer's burst (GossipConfig), so a burst one signer may send is forwarded whole. `pace`: the
        share of the peers' limit (`peer_rate`, `peer_burst`) each link's sender keeps to (None or 0:
        no pacing)."""
        self.engine = engine
        self._clock = clock
        self._rng: Rng = rng if rng is not None else random.Random()
        self._send_buffer = send_buffer
        self._send_timeout = send_timeout
        self._prune_interval = prune_interval
        self._send_buffer_bytes = send_buffer_bytes
        self._pace = pace
        self._on_disconnect = on_disconnect
        self._on_refuse = on_refuse
        self._links: dict[P, _Link] = {}
        self._waiting: dict[P, Send] = {}
        self._subscribers: dict[str, list[trio.MemorySendChannel[Verified]]] = {}
        self._nursery: trio.Nursery | None = None
        self._counters: Counter[str] = Counter()

    @property
    def counters(self) -> dict[str, int]:
        """The engine's decisions (received, delivered, forwarded, duplicate, each drop reason...)
        plus the service's own: penalties, send_dropped, send_failed, subscriber_dropped."""
        merged = Counter(self.engine.counters)
        merged.update(self._counters)
        return dict(merged)

    @property
    def peers(self) -> tuple[P, ...]:
        return tuple(self._links)

    async def run(
        self,
        incoming: trio.abc.ReceiveChannel[tuple[P, bytes]] | None = None,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve until cancelled, or until `incoming` (if given) is closed by its sender."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._prune)
            waiting, self._waiting = self._waiting, {}
            for peer, send in waiting.items():
                self.add_peer(peer, send)
            task_status.started()
            try:
                if incoming is None:
                    await trio.sleep_forever()
                async with incoming:
                    async for peer, raw in incoming:
                        self.handle(peer, raw)
            finally:
                self._nursery = None
                for peer in list(self._links):
                    self.remove_peer(peer)
                nursery.cancel_scope.cancel()

    # -- links ---------------------------------------------------------------------------------

    def add_peer(self, peer: P, send: Send) -> bool:
        """Gossip with `peer` through `send` (replacing an earlier link to it). False if the engine
        has banned the peer. Before `run` starts, the link waits for it."""
        if self._nursery is None:
            self._waiting[peer] = send
            return True
        if peer in self._links:
            self._drop_link(peer)
        if not self.engine.add_peer(peer, self._clock()):
            return False
        channel, outgoing = trio.open_memory_channel[bytes](self._send_buffer)
        link = _Link(channel, trio.CancelScope())
        self._links[peer] = link
        self._nursery.start_soon(self._sender, peer, send, outgoing, link)
        return True

    def remove_peer(self, peer: P) -> None:
        """Stop gossiping with `peer` (its connection is gone). Not reported back."""
        self._waiting.pop(peer, None)
        self.engine.remove_peer(peer)
        self._drop_link(peer)

    def link_up(self, peer: P, send: Send) -> None:
        """LinkListener: a link opened. A peer gossip has banned is refused and disconnected."""
        if not self.add_peer(peer, send):
            now = self._clock()
            self._refuse(peer, self.engine.banned_until(peer, now), now)
            self._report(peer, "banned by gossip")

    def link_down(self, peer: P) -> None:
        """LinkListener: a link closed."""
        self.remove_peer(peer)

    async def message(self, peer: P, raw: bytes) -> None:
        """LinkListener: an envelope arrived; gossip takes those of the kinds it carries."""
        if claimed_kind(raw) in self.engine.config.kinds:
            self.handle(peer, raw)

    # -- messages ------------------------------------------------------------------------------

    def subscribe(self, kind: str, buffer: int = 256) -> trio.MemoryReceiveChannel[Verified]:
        """A channel of every new valid message of `kind` from the network (not our own).
        Close it to unsubscribe; if it is not read, messages beyond `buffer` are dropped."""
        if kind not in self.engine.config.kinds:
            raise ValueError(
                f"gossip does not carry {kind!r} messages "
                f"(it carries {', '.join(sorted(self.engine.config.kinds))})"
            )
        send, receive = trio.open_memory_channel[Verified](buffer)
        self._subscribers.setdefault(kind, []).append(send)
        return receive

    def publish(self, message: bytes | VerifiedEnvelope[M]) -> int:
        """Send one of our own signed messages (its bytes, or the envelope `sign_verified` made); returns
        the number of peers it was queued for. Raises ProtocolError if it is not a valid, fresh gossip
        message of our network."""
        queued = 0
        for action in self.engine.publish(message, self._clock(), self._rng):
            if isinstance(action, Forward):
                queued += self._queue(action.peer, action.raw)
        return queued

    def handle(self, peer: P, raw: bytes) -> None:
        """Process one envelope from `peer` (never blocks)."""
        for action in self.engine.receive(peer, raw, self._clock(), self._rng):
            if isinstance(action, Forward):
                self._queue(action.peer, action.raw)
            elif isinstance(action, Deliver):
                self._deliver(action.envelope)
            elif isinstance(action, Disconnect):
                self._drop_link(action.peer)
                self._refuse(action.peer, action.until, self._clock())
                self._report(action.peer, action.reason.value)
            elif isinstance(action, Penalise):
                self._counters["penalties"] += 1

    def _queue(self, peer: P, raw: bytes) -> int:
        link = self._links.get(peer)
        if link is None:
            return 0
        if link.queued_bytes + len(raw) > self._send_buffer_bytes:
            self._counters["send_dropped"] += 1
            return 0
        try:
            link.channel.send_nowait(raw)
        except trio.WouldBlock:
            self._counters["send_dropped"] += 1
            return 0
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return 0
        link.queued_bytes += len(raw)
        return 1

    def _deliver(self, env: Verified) -> None:
        subscribers = self._subscribers.get(env.kind, [])
        for channel in list(subscribers):
            try:
                channel.send_nowait(env)
            except trio.WouldBlock:
                self._counters["subscriber_dropped"] += 1
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                subscribers.remove(channel)

    def _drop_link(self, peer: P) -> None:
        link = self._links.pop(peer, None)
        if link is not None:
            link.scope.cancel()
            link.channel.close()

    def _report(self, peer: P, reason: str) -> None:
        if self._on_disconnect is not None:
            self._on_disconnect(peer, reason)

    def _refuse(self, peer: P, until: int | None, now: int) -> None:
        if until is not None and until > now:
            self._counters["refused"] += 1
            if self._on_refuse is not None:
                self._on_refuse(peer, (until - now) / 1000.0)

    def _pacer(self) -> TokenBucket | None:
        c = self.engine.config
        if not self._pace:
            return None
        return TokenBucket.full(c.peer_rate * self._pace, max(1.0, c.peer_burst * self._pace), _trio_ms())

    async def _sender(
        self, peer: P, send: Send, outgoing: trio.MemoryReceiveChannel[bytes], link: _Link
    ) -> None:
        pacer = self._pacer()
        with link.scope:
            async with outgoing:
                async for raw in outgoing:
                    link.queued_bytes -= len(raw)
                    if pacer is not None:
                        cost = float(self.engine.cost(len(raw)))
                        wait = pacer.wait_ms(cost, _trio_ms())
                        if wait:
                            await trio.sleep(wait / 1000.0)
                        pacer.take(cost, _trio_ms())  # the wait (rounded up) made room for it
                    try:
                        with trio.fail_after(self._send_timeout):
                            await send(raw)
                    except LINK_ERRORS as e:
                        self._counters["send_failed"] += 1
                        if self._links.get(peer) is link:
                            self.remove_peer(peer)
                            self._report(peer, f"send failed: {type(e).__name__}")
                        return

    async def _prune(self) -> None:
        while True:
            await trio.sleep(self._prune_interval)
            self.engine.expire(self._clock())
