"""The peer table on disk: known peers loaded from the store at start, and every change saved.

Links never wait for the disk: a change is queued (at most `STORE_QUEUE` of them; beyond that it is
dropped with a warning) and one writer task, `run()`, applies them in order, so writes keep their
order and a slow or failing disk costs saved state, never a link. `drain()` applies what is left
under a short deadline at shutdown. Loading checks every stored contact record again (signature,
signer, expiry) and keeps only the ones still good; a peer is saved only with an address to redial.
The stored rows are capped like the table (`max_rows`, the table's `max_peers`): loading reads at
most that many, most recently seen first, and trims the rest; every new row beyond it evicts the
store's least useful one; a peer the table evicts is deleted too. An address is stored as a hint:
whether a handshake confirmed it is not kept, so after a restart it is confirmed again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial

import trio
from e31.protocol.envelope import verify
from e31.protocol.errors import ProtocolError
from e31.protocol.ids import NodeId
from e31.protocol.messages import Contact

from ..store.async_store import AsyncStore
from ..store.db import Store
from .peers import Peer, PeerTable

log = logging.getLogger("e31.peers")

STORE_QUEUE = 1024
DRAIN_SECONDS = 2.0

StoreOp = Callable[[Store], object]


class PeerPersistence:
    def __init__(self, store: AsyncStore, network: str, wall: Callable[[], float], max_rows: int) -> None:
        self.store = store
        self._network = network
        self._wall = wall
        self._max_rows = max_rows
        self._in, self._out = trio.open_memory_channel[StoreOp](STORE_QUEUE)

    async def load(self, table: PeerTable) -> None:
        """Teach `table` the peers stored for this network."""
        await self.store.run(Store.trim_peers, self._network, self._max_rows)
        rows = await self.store.run(Store.peers, self._network, self._max_rows)
        now_ms = int(self._wall() * 1000)
        for row in rows:
            try:
                key = NodeId.parse(row.node_id).raw
            except ProtocolError:
                log.warning("ignoring a stored peer with a malformed node id %r", row.node_id)
                continue
            contact, expires = None, 0
            if row.contact is not None:
                try:
                    env = verify(row.contact, Contact)
                except ProtocolError:
                    env = None
                if env is not None and env.signer.raw == key and env.message.expires > now_ms:
                    contact, expires = row.contact, env.message.expires
            learned = table.learn(
                key,
                row.addresses,
                row.source,
                last_seen=row.last_seen,
                failures=row.failures,
                contact=contact,
                contact_expires=expires,
            )
            if learned is None:  # the table is full of peers worth more
                await self.store.run(Store.remove_peer, row.node_id)
        if rows:
            log.info("%d known peer(s) loaded from the store", len(rows))

    def save(self, peer: Peer) -> None:
        if not peer.addresses:
            return  # nothing to redial it by: not worth keeping
        self._queue(
            partial(
                Store.upsert_peer,
                node_id=str(NodeId(peer.node_id)),
                network=self._network,
                addresses=list(peer.addresses),
                source=peer.source,
                now=self._wall(),
                contact=peer.contact,
                max_rows=self._max_rows,
            )
        )

    def failed(self, key: bytes) -> None:
        """A dial to the peer or a link with it failed."""
        self._queue(partial(Store.peer_failed, node_id=str(NodeId(key)), now=self._wall()))

    def forget(self, key: bytes) -> None:
        self._queue(partial(Store.remove_peer, node_id=str(NodeId(key))))

    def _queue(self, op: StoreOp) -> None:
        try:
            self._in.send_nowait(op)
        except trio.WouldBlock:
            log.warning("the store is falling behind; a peer update was not saved")

    async def run(self) -> None:
        async for op in self._out:
            await self._write(op)

    async def drain(self) -> None:
        with trio.move_on_after(DRAIN_SECONDS):
            while True:
                try:
                    op = self._out.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                    return
                await self._write(op)

    async def _write(self, op: StoreOp) -> None:
        try:
            await self.store.run(op)
        except Exception as e:  # a full or failing disk must not take the links down
            log.error("saving peer state failed: %s", e)
