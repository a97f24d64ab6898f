"""The peering service: the node's links to other nodes, kept alive and kept to a target degree.

It carries out what the pure PeerTable (node/peers.py) decides, over transport Connections:

- `run()` listens (transport.serve) and runs three tasks: the dialer (every `dial_tick`, or when woken,
  it dials what `due_dials` names, pinning the node id whenever one is known), the store writer, and
  the contact re-signer. Each link runs in its own task with a reader, a heartbeat and a peer-exchange
  sender; the link task ends when the connection closes, for any reason, and then updates the table.
- Every message on a link is a signed envelope. ping/pong/peers are verified here and must be signed
  by the link's own peer; a peer that sends an invalid one loses the link. Every other kind goes, as
  raw bytes, to the LinkListeners other services add (gossip relays messages signed by others and
  checks its seen-cache before paying for a signature check), which also hear when links go up and down.
- Peer exchange: on a new link and then every `exchange_interval`, each side sends a `peers` message
  with its own signed contact record first and contact records of other known peers after it; every
  record is verified (signature, network, expiry) on arrival and then kept, stored and passed on as the
  exact bytes its node signed.
- The store (peers table) is written by one task from a queue, so a slow disk never stalls a link and
  writes keep their order; on shutdown the queue is drained under a short deadline.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

import nacl.signing
import trio
from e31.protocol.envelope import VerifiedEnvelope, check_fresh, claimed_kind, sign_message, verify
from e31.protocol.errors import Expired, ProtocolError
from e31.protocol.ids import NodeId
from e31.protocol.messages import MAX_ADDRESSES, MAX_CONTACTS, Contact, Peers, Ping, Pong

from ..config import NodeConfig
from ..store.db import AsyncStore, Store
from .peers import Dial, LinkHealth, Liveness, PeerSettings, PeerTable, TokenBucket, keep_new_link
from .transport import (
    ConnectedToSelf,
    Connection,
    ConnectionCaps,
    ConnectionClosed,
    Limits,
    Timeouts,
    TransportError,
    dial,
    serve,
)

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


_LINK_KINDS = frozenset({"ping", "pong", "peers"})
_NONCE_SIZE = 16
_STORE_QUEUE = 1024
_DRAIN_SECONDS = 2.0
_MIN_LINK_TTL = 300.0
"""Seconds of life for ping, pong and peers messages at least: peers' clocks may differ by minutes."""


def node_text(key: bytes) -> str:
    return str(NodeId(key))


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def join_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _is_wildcard(host: str) -> bool:
    return host in ("", "0.0.0.0", "::")


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _local_host(conn: Connection) -> str | None:
    """The address of our end of `conn`, if it has one (an in-memory test link has none)."""
    address = getattr(conn, "local_address", None)
    return str(address[0]) if address and address[0] else None


@dataclass(eq=False)
class Link:
    conn: Connection
    peer: bytes
    outbound: bool
    liveness: Liveness
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    failed: bool = False
    """The link ended by a fault (heartbeats unanswered, a broken or lying peer), not a clean close."""
    misbehaved: bool = False
    """The peer sent something invalid: its links are refused for a while."""
    heard: bool = False
    """A valid message arrived. A link the peer closes before that (it refused us) counts as failed."""
    exchanges: TokenBucket | None = None
    """Limits how often the peer may make this node verify a batch of contact records."""


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
        self.node_id = node_text(self.local)
        self.config = config
        self.network = config.network
        self.store = store
        self.settings = settings
        self.wall = wall
        self.rng = rng or random.Random()
        self.table = PeerTable(self.local, settings)
        self.links: dict[bytes, Link] = {}
        self.listeners: list[LinkListener] = []
        self.listen: str | None = None
        """The bound listen address (port 0 resolved), once `run` has started."""
        self._listen_port = 0
        self._observed_hosts: list[str] = []
        self._contact: bytes | None = None
        self._contact_addresses: tuple[str, ...] = ()
        self._contact_expires = 0
        self._wake = trio.Event()
        heartbeat = settings.heartbeat_interval
        self.limits = Limits(
            max_connections=config.max_connections,
            max_per_address=config.max_connections_per_address,
            timeouts=Timeouts(
                connect=settings.dial_timeout,
                handshake=settings.dial_timeout,
                idle=max(heartbeat * (settings.dead_after + 2), 2 * settings.dial_timeout),
            ),
        )
        self.caps = ConnectionCaps(self.limits)
        self._store_in, self._store_out = trio.open_memory_channel[Callable[[Store], object]](_STORE_QUEUE)
        for boot in config.bootstrap:
            node = NodeId.parse(boot.node_id).raw if boot.node_id else None
            self.table.add_bootstrap(str(boot.address), node)

    # --- public ---

    def add_listener(self, listener: LinkListener) -> None:
        """Tell `listener` about every link (those open now included) and every message for it."""
        self.listeners.append(listener)
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
        if self.table.learn(peer, addresses, source) is None:
            return
        if not known:
            self._persist_peer(peer)
            self._wake.set()

    def disconnect(self, peer: bytes, reason: str) -> None:
        """Close the link to `peer` as faulty (gossip decided it misbehaves): counted as a failure."""
        link = self.links.get(peer)
        if link is not None:
            self._fault(link, reason)
            link.scope.cancel()

    @property
    def addresses(self) -> list[str]:
        """The addresses this node advertises in its contact record."""
        return list(self._advertised())

    def peer_docs(self) -> list[dict[str, Any]]:
        """The peers as `GET /v1/peers` shows them: connected first, then by node id."""
        now = trio.current_time()
        docs = []
        for peer in self.table.peers.values():
            link = self.links.get(peer.node_id)
            address = peer.addresses[0] if peer.addresses else None
            if address is None and link is not None:
                address = join_address(*link.conn.remote_address)
            rtt = link.liveness.rtt if link is not None else None
            docs.append(
                {
                    "node_id": node_text(peer.node_id),
                    "state": peer.state(now).value,
                    "address": address,
                    "addresses": list(peer.addresses),
                    "source": peer.source,
                    "direction": None if link is None else ("outbound" if link.outbound else "inbound"),
                    "last_seen": peer.last_seen,
                    "failures": peer.failures,
                    "rtt_ms": None if rtt is None else round(rtt * 1000, 3),
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
        await self._load_known_peers()
        listen = self.config.listen
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._store_writer)
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
                self._listen_port = port
                self.listen = join_address(host, port)
                if not _is_wildcard(listen.host):
                    self.table.mark_own_address(self.listen)
                self._refresh_contact()
                nursery.start_soon(self._dialer, nursery)
                nursery.start_soon(self._contact_refresher)
                task_status.started(self.listen)
        finally:
            with trio.CancelScope(shield=True):
                await self._drain_store()

    async def _load_known_peers(self) -> None:
        rows = await self.store.run(Store.peers, self.network)
        now_ms = int(self.wall() * 1000)
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
            self.table.learn(
                key,
                row.addresses,
                row.source,
                last_seen=row.last_seen,
                failures=row.failures,
                contact=contact,
                contact_expires=expires,
            )
        if rows:
            log.info("%d known peer(s) loaded from the store", len(rows))

    # --- dialing ---

    async def _dialer(self, nursery: trio.Nursery) -> None:
        while True:
            now = trio.current_time()
            for d in self.table.due_dials(now, self.rng):
                nursery.start_soon(self._dial, d)
            for key in self.table.expired(self.wall()):
                self.table.forget(key)
                self._persist(partial(Store.remove_peer, node_id=node_text(key)))
                log.info("forgot peer %s after repeated failures", node_text(key))
            with trio.move_on_after(self.settings.dial_tick):
                await self._wake.wait()
            self._wake = trio.Event()

    async def _dial(self, d: Dial) -> None:
        host, port = split_address(d.address)
        refusal = self.caps.admit(host)
        if refusal is not None:
            log.debug("not dialing %s: %s", d.address, refusal)
            self.table.dial_abandoned(d)
            return
        try:
            try:
                conn = await dial(
                    host,
                    port,
                    identity=self.identity,
                    network=self.network,
                    expect=d.node_id,
                    timeouts=self.limits.timeouts,
                    inbox=self.limits.inbox,
                    inbox_bytes=self.limits.inbox_bytes,
                )
            except ConnectedToSelf:
                log.info("%s is this node's own address; not dialing it again", d.address)
                self.table.mark_own_address(d.address)
                self.table.dial_abandoned(d)
                return
            except TransportError as e:
                self._dial_failed(d, e)
                return
            self.table.dial_succeeded(d, conn.peer_key)
            await self._run_link(conn, outbound=True)
        finally:
            self.caps.release(host)

    def _dial_failed(self, d: Dial, error: Exception) -> None:
        peer = self.table.dial_failed(d, trio.current_time(), self.rng)
        who = d.address if d.node_id is None else f"{node_text(d.node_id)} at {d.address}"
        target = self.table.targets.get(d.address)
        failures = peer.failures if peer is not None else target.failures if target is not None else 1
        # The first failure in a row is news; the retries after it are not.
        log.log(logging.INFO if failures <= 1 else logging.DEBUG, "cannot reach %s: %s", who, error)
        if peer is not None:
            self._persist(partial(Store.peer_failed, node_id=node_text(peer.node_id), now=self.wall()))

    # --- links ---

    async def _inbound(self, conn: Connection) -> None:
        await self._run_link(conn, outbound=False)

    async def _run_link(self, conn: Connection, *, outbound: bool) -> None:
        s = self.settings
        link = Link(
            conn,
            conn.peer_key,
            outbound,
            Liveness(s.suspect_after, s.dead_after),
            exchanges=TokenBucket(s.exchange_burst / s.exchange_interval, s.exchange_burst),
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
                    nursery.start_soon(self._exchange, link)
                    await self._read(link)
                    nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await conn.aclose()
            self._unregister(link)

    def _register(self, link: Link) -> bool:
        if not self.table.admits(link.peer, trio.current_time()):
            log.debug("refusing a link from %s: it misbehaved recently", node_text(link.peer))
            return False
        old = self.links.get(link.peer)
        if old is not None:
            if not keep_new_link(self.local, link.peer, old.outbound, link.outbound):
                log.debug("dropping a duplicate link to %s", node_text(link.peer))
                return False
            old.scope.cancel()  # its task sees it is no longer the peer's link and leaves the table be
        self.links[link.peer] = link
        peer = self.table.on_connected(link.peer, link.outbound, self.wall())
        local = _local_host(link.conn)
        if local is not None and _is_wildcard(self.config.listen.host):
            self._observe_host(local)
        if old is None:
            direction = "to" if link.outbound else "from"
            log.info(
                "connected %s %s (%s)",
                direction,
                node_text(link.peer),
                join_address(*link.conn.remote_address),
            )
        self._persist_peer(peer.node_id)
        for listener in self.listeners:
            listener.link_up(link.peer, link.conn.send)
        return True

    def _unregister(self, link: Link) -> None:
        if self.links.get(link.peer) is not link:
            return
        del self.links[link.peer]
        for listener in self.listeners:
            listener.link_down(link.peer)
        reason = link.conn.close_reason or "closed"
        failed = link.failed or not link.heard
        self.table.on_disconnected(
            link.peer, trio.current_time(), self.rng, failed=failed, misbehaved=link.misbehaved
        )
        log.info("disconnected from %s: %s", node_text(link.peer), reason)
        if failed:
            self._persist(partial(Store.peer_failed, node_id=node_text(link.peer), now=self.wall()))
        self._wake.set()

    async def _read(self, link: Link) -> None:
        async for raw in link.conn:
            kind = claimed_kind(raw)
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
                log.debug("ignoring an expired message from %s: %s", node_text(link.peer), e)
                continue
            except ProtocolError as e:
                self._fault(link, f"sent an invalid {kind}: {e}")
                return
            if env.signer.raw != link.peer:
                self._fault(link, f"sent a {kind} signed by another node")
                return
            if not await self._on_link_message(link, env):
                return

    async def _hand_on(self, peer: bytes, raw: bytes) -> None:
        for listener in self.listeners:
            try:
                await listener.message(peer, raw)
            except Exception:  # a bug in one service must not take the link down
                log.exception("a listener failed on a message from %s", node_text(peer))

    def _fault(self, link: Link, what: str) -> None:
        log.warning("closing the link to %s: it %s", node_text(link.peer), what)
        link.failed = link.misbehaved = True

    async def _on_link_message(self, link: Link, env: VerifiedEnvelope[Any]) -> bool:
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
                peer = self.table.peers.get(link.peer)
                if peer is not None:
                    if peer.suspect:
                        log.info("%s answers again", node_text(link.peer))
                    peer.suspect, peer.rtt, peer.last_seen = False, link.liveness.rtt, self.wall()
        elif isinstance(message, Peers):
            if link.exchanges is None or link.exchanges.allow(trio.current_time()):
                self._on_peers(link, message)
            else:
                log.debug("ignoring a peers message from %s: too frequent", node_text(link.peer))
        return True

    # --- heartbeats ---

    def _ping_ttl(self) -> float:
        # The session already stops replays; the expiry only has to survive clock skew between peers.
        return max(_MIN_LINK_TTL, self.settings.heartbeat_interval * self.settings.dead_after)

    def _expiry(self, ttl_seconds: float) -> int:
        return int((self.wall() + ttl_seconds) * 1000)

    async def _heartbeat(self, link: Link) -> None:
        interval = self.settings.heartbeat_interval
        while True:
            await trio.sleep(interval * (0.9 + 0.2 * self.rng.random()))
            nonce = os.urandom(_NONCE_SIZE)
            health = link.liveness.tick(nonce, trio.current_time())
            peer = self.table.peers.get(link.peer)
            if health is LinkHealth.DEAD:
                log.warning(
                    "%s missed %d heartbeats: closing the link", node_text(link.peer), link.liveness.missed
                )
                link.failed = True
                link.scope.cancel()
                return
            if peer is not None and health is LinkHealth.SUSPECT and not peer.suspect:
                log.info(
                    "%s is suspect: %d heartbeats unanswered", node_text(link.peer), link.liveness.missed
                )
                peer.suspect = True
            ping = Ping(self.network, NodeId(self.local), nonce, self._expiry(self._ping_ttl()))
            try:
                await link.conn.send(sign_message(ping, self.identity))
            except ConnectionClosed:
                return

    # --- peer exchange ---

    async def _exchange(self, link: Link) -> None:
        interval = self.settings.exchange_interval
        while True:
            message = self._peers_message(link.peer)
            if message is not None:
                try:
                    await link.conn.send(message)
                except ConnectionClosed:
                    return
            await trio.sleep(interval * (0.8 + 0.4 * self.rng.random()))

    def _peers_message(self, recipient: bytes) -> bytes | None:
        now_ms = int(self.wall() * 1000)
        contacts = [] if self._contact is None else [self._contact]
        limit = min(self.settings.exchange_size, MAX_CONTACTS) - len(contacts)
        contacts += self.table.contacts_to_share(self.rng, now_ms, recipient, limit)
        if not contacts:
            return None
        expires = now_ms + int(max(_MIN_LINK_TTL, 2 * self.settings.exchange_interval) * 1000)
        return sign_message(Peers(self.network, NodeId(self.local), tuple(contacts), expires), self.identity)

    def _on_peers(self, link: Link, message: Peers) -> None:
        now_ms = int(self.wall() * 1000)
        max_ttl = int(self.settings.max_contact_ttl * 1000)
        learned = 0
        for record in message.contacts:
            try:
                env = verify(record, Contact)
                check_fresh(env, now_ms, network=self.network, max_ttl=max_ttl)
            except ProtocolError as e:
                log.debug("ignoring a contact record from %s: %s", node_text(link.peer), e)
                continue
            contact: Contact = env.message
            key = contact.node.raw
            if key == self.local:
                continue
            known = key in self.table.peers
            previous = self.table.peers[key].contact_expires if known else 0
            source = "inbound" if key == link.peer and not link.outbound else "exchange"
            peer = self.table.learn(
                key, contact.addresses, source, contact=record, contact_expires=contact.expires
            )
            if peer is None:
                continue
            if not known or (key == link.peer and contact.expires > previous):
                self._persist_peer(key)
            if not known:
                learned += 1
        if learned:
            log.debug("learned %d peer(s) from %s", learned, node_text(link.peer))
            self._wake.set()

    # --- this node's contact record ---

    def _observe_host(self, host: str) -> None:
        if host in self._observed_hosts:
            self._observed_hosts.remove(host)
        self._observed_hosts.insert(0, host)
        del self._observed_hosts[MAX_ADDRESSES:]
        self._refresh_contact()

    def _advertised(self) -> tuple[str, ...]:
        if self.listen is None:
            return ()
        host = self.config.listen.host
        if not _is_wildcard(host):
            return (self.listen,)
        hosts = sorted(self._observed_hosts, key=_is_loopback)  # stable: most recent first within each
        return tuple(join_address(h, self._listen_port) for h in hosts[:MAX_ADDRESSES])

    def _refresh_contact(self) -> None:
        """Re-sign this node's contact record if its addresses changed or half its life has passed."""
        addresses = self._advertised()
        if not addresses:
            return
        now_ms = int(self.wall() * 1000)
        ttl_ms = int(self.settings.contact_ttl * 1000)
        if addresses == self._contact_addresses and self._contact_expires - now_ms > ttl_ms // 2:
            return
        contact = Contact(self.network, NodeId(self.local), addresses, now_ms + ttl_ms)
        self._contact = sign_message(contact, self.identity)
        self._contact_addresses, self._contact_expires = addresses, contact.expires

    async def _contact_refresher(self) -> None:
        while True:
            await trio.sleep(self.settings.contact_ttl / 4)
            self._refresh_contact()

    # --- persistence ---

    def _persist(self, op: Callable[[Store], object]) -> None:
        try:
            self._store_in.send_nowait(op)
        except trio.WouldBlock:
            log.warning("the store is falling behind; a peer update was not saved")

    def _persist_peer(self, key: bytes) -> None:
        peer = self.table.peers.get(key)
        if peer is None or not peer.addresses:
            return  # nothing to redial it by: not worth keeping
        self._persist(
            partial(
                Store.upsert_peer,
                node_id=node_text(key),
                network=self.network,
                addresses=list(peer.addresses),
                source=peer.source,
                now=self.wall(),
                contact=peer.contact,
            )
        )

    async def _store_writer(self) -> None:
        async for op in self._store_out:
            await self._write(op)

    async def _write(self, op: Callable[[Store], object]) -> None:
        try:
            await self.store.run(op)
        except Exception as e:  # a full or failing disk must not take the links down
            log.error("saving peer state failed: %s", e)

    async def _drain_store(self) -> None:
        with trio.move_on_after(_DRAIN_SECONDS):
            while True:
                try:
                    op = self._store_out.receive_nowait()
                except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                    return
                await self._write(op)
