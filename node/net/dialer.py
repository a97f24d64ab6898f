"""The dialer: carries out the PeerTable's plan of whom to dial, and forgets whom it gives up on.

Every `dial_tick`, or sooner when woken (a peer was learned, a link went down), it starts a task for
each Dial the table says is due, pinning the node id whenever one is known, and every
`forget_interval` forgets the peers the table has given up on. A dial the connection caps refuse, or
one that reaches this node itself, is abandoned without counting as a failure; a failed one counts,
logged at info only for the first failure in a row. A connected dial is handed to `on_connected`,
which runs the link until it closes (a probe of a linked peer's address too: the duplicate-link rule
then keeps one of the two links, the same one at both ends).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio
from e31.protocol.ids import NodeId

from .addresses import split_address
from .limits import ConnectionCaps
from .links import Random
from .peers import Dial, PeerTable
from .persistence import PeerPersistence
from .transport import ConnectedToSelf, Connection, NetworkMismatch, TransportError

log = logging.getLogger("e31.peers")

Connect = Callable[[str, int, bytes | None], Awaitable[Connection]]
"""Dial host, port, expecting that node key (None: whoever answers); raises TransportError."""


class Dialer:
    def __init__(
        self,
        *,
        table: PeerTable,
        caps: ConnectionCaps,
        connect: Connect,
        on_connected: Callable[[Connection], Awaitable[None]],
        persistence: PeerPersistence,
        tick: float,
        forget_interval: float,
        wall: Callable[[], float],
        rng: Random,
    ) -> None:
        self._table = table
        self._caps = caps
        self._connect = connect
        self._on_connected = on_connected
        self._persistence = persistence
        self._tick = tick
        self._forget_interval = forget_interval
        self._wall = wall
        self._rng = rng
        self._wake = trio.Event()

    def wake(self) -> None:
        """Look at the table now rather than at the next tick."""
        self._wake.set()

    async def run(self) -> None:
        next_forget = trio.current_time()
        async with trio.open_nursery() as nursery:
            while True:
                now = trio.current_time()
                for d in self._table.due_dials(now, self._rng):
                    nursery.start_soon(self._dial, d)
                if now >= next_forget:  # a look at the whole table: not every tick
                    next_forget = now + self._forget_interval
                    for key in self._table.expired(self._wall()):
                        self._table.forget(key)
                        self._persistence.forget(key)
                        log.info("forgot peer %s after repeated failures", NodeId(key))
                with trio.move_on_after(self._tick):
                    await self._wake.wait()
                self._wake = trio.Event()

    async def _dial(self, d: Dial) -> None:
        host, port = split_address(d.address)
        peer = None if d.node_id is None else self._table.peers.get(d.node_id)
        if d.node_id is not None and not self._table.allowed(d.address, peer):
            log.debug("not dialing %s: not an address this node may dial", d.address)
            self._table.dial_abandoned(d)
            return
        refusal = self._caps.admit(host)
        if refusal is not None:
            log.debug("not dialing %s: %s", d.address, refusal)
            self._table.dial_abandoned(d)
            return
        try:
            try:
                conn = await self._connect(host, port, d.node_id)
            except ConnectedToSelf:
                log.info("%s is this node's own address; not dialing it again", d.address)
                self._table.mark_own_address(d.address)
                self._table.dial_abandoned(d)
                return
            except TransportError as e:
                self._failed(d, e)
                return
            self._table.dial_succeeded(d, conn.peer_key)
            await self._on_connected(conn)
        finally:
            self._caps.release(host)

    def _failed(self, d: Dial, error: Exception) -> None:
        peer = self._table.dial_failed(d, trio.current_time(), self._rng)
        if d.probe:
            log.debug("no answer at %s, the address a linked peer's record names: %s", d.address, error)
            return
        who = d.address if d.node_id is None else f"{NodeId(d.node_id)} at {d.address}"
        target = self._table.targets.get(d.address)
        failures = peer.failures if peer is not None else target.failures if target is not None else 1
        # The first failure in a row is news; the retries after it are not. Another network is a
        # setting to fix: a warning, naming both networks.
        if isinstance(error, NetworkMismatch):
            level = logging.WARNING if failures <= 1 else logging.DEBUG
            log.log(level, "%s: nodes of different networks never connect (the `network` setting)", error)
        else:
            log.log(logging.INFO if failures <= 1 else logging.DEBUG, "cannot reach %s: %s", who, error)
        if peer is not None:
            self._persistence.failed(peer.node_id)
