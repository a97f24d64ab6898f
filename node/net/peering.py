"""The peering service: the node's links to other nodes, kept alive and kept to a target degree.

It carries out what the pure PeerTable (peers.py) decides, over transport Connections, and is the
composition of the wing's link pieces: the Dialer (dialer.py), this node's OwnContact record
(contact.py), PeerExchange (exchange.py) and PeerPersistence (persistence.py).

- `run()` loads the stored peers, listens (transport.serve) and runs the store writer, the dialer and
  the contact re-signer. Each link runs in its own task with a reader, a heartbeat and a peer-exchange
  sender; the link task ends when the connection closes, for any reason, and then updates the table.
- Every message on a link is a signed envelope. ping/pong/peers are verified here and must be signed
  by the link's own peer; a peer that sends an invalid one loses the link. Every other kind goes, as
  raw bytes, to the LinkListeners other services add (gossip relays messages signed by others and
  checks its seen-cache before paying for a signature check), which also hear when links go up and down.
- Heartbeats: every `heartbeat_interval` (jittered by +-10%) each side pings a link that has been quiet
  (any message from the peer shows it alive as a pong does, so a busy link carries a ping only every
  few intervals, for its round trip); `Liveness` makes the link suspect after `suspect_after`
  unanswered pings with nothing heard since and closes it after `dead_after`: at most
  `dead_after` + 2 intervals after the peer's last frame, under the transport's idle timeout.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Literal, Protocol, TypedDict

import nacl.signing
import trio
from e31.protocol.envelope import VerifiedEnvelope, check_fresh, claimed_kind, sign_message, verify
from e31.protocol.errors import Expired, ProtocolError
from e31.protocol.ids import NodeId
from e31.protocol.messages import AnyMessage, Peers, Ping, Pong

from .. import metrics
from ..config import NodeConfig
from ..store.async_store import AsyncStore
from .addresses import join_address
from .contact import OwnContact
from .dialer import Dialer
from .exchange import PeerExchange
from .links import LinkHealth, Liveness, TokenBucket, keep_new_link
from .peers import MIN_LINK_TTL, PeerSettings, PeerTable
from .persistence import PeerPersistence
from .transport import Connection, ConnectionCaps, ConnectionClosed, Limits, Timeouts, dial, serve

log = logging.getLogger("e31.peers")

Send = Callable[[bytes], Awaitable[None]]


class LinkListener(Protocol):
    """A service that speaks over the node's links (gossip, jobs). Peers are 32-byte node keys."""

    def link_up(self, peer: bytes, send: Send) -> None:
        """A link to `peer` opened (or replaced the previous one); `send` raises ConnectionClosed."""

    def link_down(self, peer: bytes) -> None:
        """The link to `peer` closed."""

    async def message(self, peer: bytes, raw: bytes) -> None:
        """A signed envelope of a kind other than ping/pong/peers arrived from `peer`, unverified."""


class LinkConnection(Protocol):
    """What a link needs of its connection: a transport Connection, or a stand-in in tests."""

    @property
    def peer_key(self) -> bytes: ...
    @property
    def remote_address(self) -> tuple[str, int]: ...
    @property
    def local_address(self) -> tuple[str, int]:
        """Our end; ("", 0) when unknown."""

    @property
    def close_reason(self) -> str | None: ...
    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None: ...
    async def send(self, message: bytes) -> None: ...
    async def aclose(self) -> None: ...
    def __aiter__(self) -> AsyncIterator[bytes]: ...


class PeerDoc(TypedDict):
    """One peer as `GET /v1/peers` shows it (docs/operating.md)."""

    node_id: str
    state: str
    address: str | None
    addresses: list[str]
    source: str
    direction: Literal["outbound", "inbound"] | None
    last_seen: float | None
    failures: int
    rtt_ms: float | None
    via: str | None


_LINK_KINDS = frozenset({"ping", "pong", "peers"})
_NONCE_SIZE = 16


@dataclass(eq=False)
class Link:
    conn: LinkConnection
    peer: bytes
    outbound: bool
    liveness: Liveness
    exchanges: TokenBucket
    """Limits how often the peer may make this node verify a batch of contact records."""
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    failed: bool = False
    """The link ended by a fault (heartbeats unanswered, a broken or lying peer), not a clean close."""
    misbehaved: bool = False
    """The peer sent something invalid: its links are refused for a while."""
    heard: bool = False
    """A valid message arrived. A link the peer closes before that (it refused us) counts as failed."""


class PeerService:
    """Links to peers: listening, dialing, heartbeats, peer exchange, persistence."""

    def __init__(
        self,
        *,
        identity: nacl.signing.SigningKey,
        config: NodeConfig,
        store: AsyncStore,
        settings: PeerSettings,
        wall: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        self.identity = identity
        self.local = bytes(identity.verify_key)
        self.node_id = str(NodeId(self.local))
        self.config = config
        self.network = config.network
        settings = dataclasses.replace(settings, max_peers=config.max_peers)
        self.settings = settings
        self.wall = wall
        self.rng = rng or random.Random()
        self.persistence = PeerPersistence(store, self.network, wall, settings.max_peers)
        self.table = PeerTable(
            self.local, settings, dial_private=config.dial_private, on_forget=self.persistence.forget
        )
        self.links: dict[bytes, Link] = {}
        self.relay_of: Callable[[object], bytes | None] = lambda conn: None
        """The relay a link's connection runs through, None for a direct one (set by net/relay.py)."""
        self._listeners: list[LinkListener] = []
        heartbeat = settings.heartbeat_interval
        self.limits = Limits(
            max_connections=config.max_connections,
            max_per_address=config.max_connections_per_address,
            timeouts=Timeouts(
                connect=settings.dial_timeout,
                handshake=settings.dial_timeout,
                # above the latest the heartbeats close a dead link (dead_after + 2 intervals after
                # the peer's last frame, jitter included), so that verdict, a failure, comes first
                idle=max(heartbeat * (settings.dead_after + 3), 2 * settings.dial_timeout),
            ),
        )
        self.caps = ConnectionCaps(self.limits)
        self.contact = OwnContact(
            identity=identity,
            network=self.network,
            listen_host=config.listen.host,
            ttl=settings.contact_ttl,
            wall=wall,
        )
        self.exchange = PeerExchange(
            identity=identity,
            network=self.network,
            table=self.table,
            settings=settings,
            own_contact=lambda: self.contact.record,
            wall=wall,
            rng=self.rng,
        )
        self.dialer = Dialer(
            table=self.table,
            caps=self.caps,
            connect=self._connect,
            on_connected=partial(self.run_link, outbound=True),
            persistence=self.persistence,
            tick=settings.dial_tick,
            forget_interval=settings.forget_interval,
            wall=wall,
            rng=self.rng,
        )
        for boot in config.bootstrap:
            node = NodeId.parse(boot.node_id).raw if boot.node_id else None
            self.table.add_bootstrap(str(boot.address), node)

    # --- public ---

    def add_listener(self, listener: LinkListener) -> None:
        """Tell `listener` about every link (those open now included) and every message for it."""
        self._listeners.append(listener)
        for peer, link in self.links.items():
            listener.link_up(peer, link.conn.send)

    async def send(self, peer: bytes, envelope: bytes) -> bool:
        """Send a signed envelope to a connected peer; False if there is no open link to it."""
        link = self.links.get(peer)
        if link is None:
            return False
        try:
            await link.conn.send(envelope)
        except ConnectionClosed:
            return False
        return True

    def connected(self) -> list[bytes]:
        return list(self.links)

    def discovered(self, peer: bytes, addresses: list[str], source: str) -> None:
        """Another service (mDNS discovery, the operator) found `peer` at `addresses`: dial it if wanted."""
        known = peer in self.table.peers
        learned = self.table.learn(peer, addresses, source)
        if learned is None:
            return
        if not known:
            self.persistence.save(learned)
            self.dialer.wake()

    def refuse(self, peer: bytes, seconds: float) -> None:
        """Refuse links with `peer` and do not dial it for `seconds` (gossip banned it)."""
        self.table.refuse(peer, trio.current_time() + seconds)

    def vouch(self, peer: bytes) -> None:
        """`peer` did work with this node (a receipt, a job): it is kept before peers that only linked."""
        self.table.vouch(peer)

    def disconnect(self, peer: bytes, reason: str) -> None:
        """Close the link to `peer` as faulty (gossip decided it misbehaves): counted as a failure."""
        link = self.links.get(peer)
        if link is not None:
            self._fault(link, reason)
            link.scope.cancel()

    @property
    def listen(self) -> str | None:
        """The bound listen address (port 0 resolved), once `run` has started."""
        return self.contact.listen

    @property
    def addresses(self) -> list[str]:
        """The addresses this node advertises in its contact record."""
        return list(self.contact.addresses())

    def peer_docs(self) -> list[PeerDoc]:
        """The peers as `GET /v1/peers` shows them: connected first, then by node id."""
        now = trio.current_time()
        docs: list[PeerDoc] = []
        for peer in self.table.peers.values():
            link = self.links.get(peer.node_id)
            address = peer.addresses[0] if peer.addresses else None
            via = None if link is None else self.relay_of(link.conn)
            if address is None and link is not None and via is None:
                address = join_address(*link.conn.remote_address)
            rtt = link.liveness.rtt if link is not None else None
            docs.append(
                {
                    "node_id": str(NodeId(peer.node_id)),
                    "state": peer.state(now).value,
                    "address": address,
                    "addresses": list(peer.addresses),
                    "source": peer.source,
                    "direction": None if link is None else ("outbound" if link.outbound else "inbound"),
                    "last_seen": peer.last_seen,
                    "failures": peer.failures,
                    "rtt_ms": None if rtt is None else round(rtt * 1000, 3),
                    "via": None if via is None else str(NodeId(via)),
                }
            )
        docs.sort(key=lambda d: (d["state"] not in ("connected", "suspect"), d["node_id"]))
        return docs

    def counts(self) -> dict[str, int]:
        now = trio.current_time()
        out = {"connected": 0, "suspect": 0, "dialing": 0, "known": 0, "backoff": 0}
        for peer in self.table.peers.values():
            out[peer.state(now).value] += 1
        return out

    # --- the service ---

    async def run(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen, load known peers, dial, until cancelled. Reports the bound listen address."""
        await self.persistence.load(self.table)
        listen = self.config.listen
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.persistence.run)
                host, port = await nursery.start(
                    partial(
                        serve,
                        self._inbound,
                        host=listen.host,
                        port=listen.port,
                        identity=self.identity,
                        network=self.network,
                        limits=self.limits,
                        caps=self.caps,
                    )
                )
                bound = self.contact.bind(host, port)
                if not self.contact.wildcard:
                    self.table.mark_own_address(bound)
                nursery.start_soon(self.dialer.run)
                nursery.start_soon(self.contact.run)
                task_status.started(bound)
        finally:
            with trio.CancelScope(shield=True):
                await self.persistence.drain()

    async def _connect(self, host: str, port: int, expect: bytes | None) -> Connection:
        return await dial(
            host,
            port,
            identity=self.identity,
            network=self.network,
            expect=expect,
            timeouts=self.limits.timeouts,
            inbox=self.limits.inbox,
            inbox_bytes=self.limits.inbox_bytes,
        )

    # --- links ---

    async def _inbound(self, conn: Connection) -> None:
        await self.run_link(conn, outbound=False)

    async def run_link(self, conn: LinkConnection, *, outbound: bool) -> None:
        """Run the link over an established connection until it closes; the caller does not close it."""
        s = self.settings
        link = Link(
            conn,
            conn.peer_key,
            outbound,
            Liveness(s.suspect_after, s.dead_after),
            TokenBucket(s.exchange_burst / s.exchange_interval, s.exchange_burst),
        )
        if not self._register(link):
            await conn.aclose()
            return
        try:
            with link.scope:
                async with trio.open_nursery() as nursery:
                    if outbound:
                        await nursery.start(conn.run)
                    nursery.start_soon(self._heartbeat, link)
                    nursery.start_soon(self.exchange.run, link.peer, conn.send)
                    await self._read(link)
                    nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await conn.aclose()
            self._unregister(link)

    def _register(self, link: Link) -> bool:
        if not self.table.admits(link.peer, trio.current_time()):
            log.debug("refusing a link from %s: it misbehaved recently", NodeId(link.peer))
            return False
        old = self.links.get(link.peer)
        if old is not None:
            if not keep_new_link(self.local, link.peer, old.outbound, link.outbound):
                log.debug("dropping a duplicate link to %s", NodeId(link.peer))
                return False
            old.scope.cancel()  # its task sees it is no longer the peer's link and leaves the table be
        self.links[link.peer] = link
        peer = self.table.on_connected(link.peer, link.outbound, self.wall())
        local = link.conn.local_address[0]
        if local:  # an in-memory test link has no address
            self.contact.observe(local)
        if old is None:
            direction = "to" if link.outbound else "from"
            log.info(
                "connected %s %s (%s)", direction, NodeId(link.peer), join_address(*link.conn.remote_address)
            )
        self.persistence.save(peer)
        for listener in self._listeners:
            listener.link_up(link.peer, link.conn.send)
        return True

    def _unregister(self, link: Link) -> None:
        if self.links.get(link.peer) is not link:
            return
        del self.links[link.peer]
        for listener in self._listeners:
            listener.link_down(link.peer)
        reason = link.conn.close_reason or "closed"
        failed = link.failed or not link.heard
        self.table.on_disconnected(
            link.peer, trio.current_time(), self.rng, failed=failed, misbehaved=link.misbehaved
        )
        log.info("disconnected from %s: %s", NodeId(link.peer), reason)
        peer = self.table.peers.get(link.peer)
        if failed and peer is not None and peer.addresses:  # a stranger without a stored row: no write
            self.persistence.failed(link.peer)
        self.dialer.wake()

    async def _read(self, link: Link) -> None:
        async for raw in link.conn:
            link.liveness.heard(trio.current_time())  # (the session is the peer's: any frame is a life sign)
            kind = claimed_kind(raw)
            metrics.message_received(kind, len(raw))
            if kind is None:
                self._fault(link, "sent something that is not a signed envelope")
                return
            if kind not in _LINK_KINDS:
                await self._hand_on(link.peer, raw)
                continue
            try:
                env = verify(raw)
                check_fresh(env, int(self.wall() * 1000), network=self.network)
            except Expired as e:
                log.debug("ignoring an expired message from %s: %s", NodeId(link.peer), e)
                continue
            except ProtocolError as e:
                metrics.VERIFICATION_FAILURES.inc(1, "link_message")
                self._fault(link, f"sent an invalid {kind}: {e}")
                return
            if env.signer.raw != link.peer:
                self._fault(link, f"sent a {kind} signed by another node")
                return
            if not await self._on_link_message(link, env):
                return

    async def _hand_on(self, peer: bytes, raw: bytes) -> None:
        for listener in self._listeners:
            try:
                await listener.message(peer, raw)
            except Exception:  # a bug in one service must not take the link down
                log.exception("a listener failed on a message from %s", NodeId(peer))

    def _fault(self, link: Link, what: str) -> None:
        log.warning("closing the link to %s: it %s", NodeId(link.peer), what)
        link.failed = link.misbehaved = True

    async def _on_link_message(self, link: Link, env: VerifiedEnvelope[AnyMessage]) -> bool:
        link.heard = True
        message = env.message
        if isinstance(message, Ping):
            pong = Pong(self.network, NodeId(self.local), message.nonce, self._expiry(self._ping_ttl()))
            try:
                await link.conn.send(sign_message(pong, self.identity))
            except ConnectionClosed:
                return False
        elif isinstance(message, Pong):
            if link.liveness.pong(message.nonce, trio.current_time()):
                self._alive(link)
        elif isinstance(message, Peers):
            if link.exchanges.allow(trio.current_time()):
                learned = self.exchange.receive(link.peer, not link.outbound, message)
                for key in learned.changed:
                    self._save(key)
                if learned.new:
                    self.dialer.wake()
            else:
                log.debug("ignoring a peers message from %s: too frequent", NodeId(link.peer))
        return True

    def _save(self, key: bytes) -> None:
        peer = self.table.peers.get(key)
        if peer is not None:
            self.persistence.save(peer)

    # --- heartbeats ---

    def _ping_ttl(self) -> float:
        # The session already stops replays; the expiry only has to survive clock skew between peers.
        return max(MIN_LINK_TTL, self.settings.heartbeat_interval * self.settings.dead_after)

    def _expiry(self, ttl_seconds: float) -> int:
        return int((self.wall() + ttl_seconds) * 1000)

    def _alive(self, link: Link) -> None:
        """The peer answered a ping, or spoke lately: no longer suspect; its sign of life and round trip."""
        peer = self.table.peers.get(link.peer)
        if peer is not None:
            if peer.suspect:
                log.info("%s answers again", NodeId(link.peer))
            peer.suspect, peer.rtt, peer.last_seen = False, link.liveness.rtt, self.wall()

    async def _heartbeat(self, link: Link) -> None:
        interval = self.settings.heartbeat_interval
        while True:
            await trio.sleep(interval * (0.9 + 0.2 * self.rng.random()))
            now = trio.current_time()
            if not link.liveness.ping_due(now, interval):
                self._alive(link)  # the link carries messages: the peer is alive, pinged lately
                continue
            nonce = os.urandom(_NONCE_SIZE)
            health = link.liveness.tick(nonce, now)
            peer = self.table.peers.get(link.peer)
            if health is LinkHealth.DEAD:
                log.warning(
                    "%s missed %d heartbeats: closing the link", NodeId(link.peer), link.liveness.missed
                )
                link.failed = True
                link.scope.cancel()
                return
            if peer is not None and health is LinkHealth.SUSPECT and not peer.suspect:
                log.info("%s is suspect: %d heartbeats unanswered", NodeId(link.peer), link.liveness.missed)
                peer.suspect = True
            elif peer is not None and health is LinkHealth.ALIVE and peer.suspect:
                self._alive(link)  # heard from since it fell suspect, though this tick pings
            ping = Ping(self.network, NodeId(self.local), nonce, self._expiry(self._ping_ttl()))
            try:
                await link.conn.send(sign_message(ping, self.identity))
            except ConnectionClosed:
                return
