"""Reachability and relays over the node's links (the messages: e31.protocol.relay; docs/protocol.md
section 17).

The RelayService is a LinkListener beside gossip and the job path. On every direct link it says
which address it sees the peer at and whether it offers to relay (`observed`), and asks the peer to
dial it back at its listening port (`dialback`). It answers other nodes' dial-backs itself, dialling
only the IP address their link comes from and checking only that their key answers there (probe.py:
no link comes up), at most `dialbacks_per_peer` per `dialback_interval` per peer and `max_dialbacks`
at once.

When dial-backs show this node cannot be dialled (`Reachability`), it stops advertising addresses
(OwnContact.hide), holds a reservation with a linked peer that offers to relay, renewed at half its
life, and gossips a signed `via` record naming its relays. A node that hears a `via` for a node it
has no link to, through a relay it is linked to, opens a circuit there: the circuit is a RelayStream
(circuits.py), the ordinary handshake and session run over it (transport.establish), and the
resulting Connection becomes an ordinary link (PeerService.run_link), which the job path uses as any
other. The target accepts circuits only from relays it holds a reservation with.

With `offer` (config `relay = true`, `e31 node run --relay`) the node is also a relay: it keeps the
RelayBook (reservations, circuits, limits) and forwards relaydata between the two ends' links,
re-signed as its own, refusing with a typed `relayclose` what its limits do not allow.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import trio
from e31.protocol.envelope import VerifiedEnvelope, check_fresh, claimed_kind, sign_message, verify
from e31.protocol.errors import Expired, ProtocolError
from e31.protocol.ids import NodeId
from e31.protocol.relay import (
    CIRCUIT_ID_SIZE,
    DIALBACK_NONCE_SIZE,
    VIA_GOSSIP_CAP,
    Circuit,
    Dialback,
    Dialed,
    Observed,
    Reachability,
    Refused,
    RelayBook,
    RelayClose,
    RelayCredit,
    RelayData,
    RelayLimits,
    Reserve,
    Reserved,
    Via,
    check_observed,
)
from e31.protocol.schema import Message

from .addresses import dial_refusal, join_address, split_address
from .circuits import RelayStream
from .links import TokenBucket
from .peering import PeerService, Send
from .probe import probe
from .relayed_in import RelayedIn
from .transport import Connection, ConnectionClosed, DialFailed, TransportError, establish

log = logging.getLogger("e31.relay")

RELAY_KINDS = frozenset(
    {
        "observed",
        "dialback",
        "dialed",
        "reserve",
        "reserved",
        "circuit",
        "relaydata",
        "relaycredit",
        "relayclose",
    }
)
GOSSIP_KINDS = {"via": VIA_GOSSIP_CAP}
MAX_VIAS_KEPT = 1024
"""The kinds this service adds to gossip, with their size caps."""


@dataclass(frozen=True, slots=True)
class RelaySettings:
    """Seconds unless named otherwise."""

    tick: float = 2.0
    message_ttl: float = 60.0
    dialback_timeout: float = 5.0
    dialback_interval: float = 60.0
    dialbacks_per_peer: int = 2
    max_dialbacks: int = 4
    probes: int = 3
    """Peers asked to dial this node back while its reachability is unknown."""
    via_ttl: float = 600.0
    recheck: float = 600.0
    """While it cannot be dialled, a node asks one peer again this often (a port may have been opened)."""
    via_retry: float = 30.0
    """Seconds before a node reached through a relay is tried again after a failed circuit."""
    max_relays: int = 2
    """Relays a node that cannot be dialled holds reservations with."""
    max_reservation: float = 600.0
    """The longest reservation a node takes a relay's word for (RelayLimits.reservation_seconds)."""
    relayed_in_per_relay: int = 8
    relayed_in: int = 32
    """Relayed links (or their handshakes) a node accepts at once through one relay, and in all."""
    buckets_kept: int = 1024
    """Peers whose dial-back rate is remembered (least recently used first out), links up or not."""


class RelayService:
    def __init__(
        self,
        peering: PeerService,
        *,
        offer: bool,
        publish: Callable[[bytes], int] | None = None,
        via: trio.MemoryReceiveChannel[VerifiedEnvelope[Any]] | None = None,
        limits: RelayLimits | None = None,
        settings: RelaySettings | None = None,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.peering = peering
        self.identity = peering.identity
        self.local = peering.local
        self.me = NodeId(self.local)
        self.network = peering.network
        self.offer = offer
        self.book = RelayBook(limits or RelayLimits()) if offer else None
        self.settings = settings or RelaySettings()
        self.reach = Reachability(needed=2)
        self.reservations: dict[bytes, float] = {}
        """Relay -> when this node's reservation there ends (trio time)."""
        self.relays_offered: set[bytes] = set()
        self._publish = publish
        self._via = via
        self._wall = wall
        self._sends: dict[bytes, Send] = {}
        self._ends: dict[tuple[bytes, bytes], RelayStream] = {}
        self._relayed: dict[Connection, bytes] = {}
        """Each relayed link's connection -> its relay."""
        self._asked: dict[bytes, bytes] = {}
        """Peer -> the nonce of the dial-back it was asked for (answered or not)."""
        self._buckets: OrderedDict[bytes, TokenBucket] = OrderedDict()
        self._inbound = RelayedIn(
            peering.caps, per_relay=self.settings.relayed_in_per_relay, total=self.settings.relayed_in
        )
        self._dialing = 0
        self._via_tried: dict[bytes, float] = {}
        self._vias: dict[bytes, Via] = {}
        """The latest `via` of each node heard (at most MAX_VIAS_KEPT), to link again after a drop."""
        self._granted: dict[bytes, float] = {}
        self._reserve_asked: dict[bytes, float] = {}
        self._via_due = 0.0
        self._recheck_due = 0.0
        # unbounded: credits must not be dropped; what is queued is bounded by the circuits' traffic
        self._queue_in, self._queue = trio.open_memory_channel[tuple[bytes, bytes]](math.inf)
        self._nursery: trio.Nursery | None = None
        self.counters = {"circuits_relayed": 0, "bytes_relayed": 0, "relayed_links_opened": 0, "refusals": 0}

    @property
    def status(self) -> str:
        """`unknown`, `public` (a peer dialled this node back) or `private` (none could)."""
        return self.reach.status

    def to_json(self) -> dict[str, Any]:
        """The `reachability` part of GET /v1/status (docs/operating.md)."""
        now = trio.current_time()
        return {
            "status": self.status,
            "relay": self.offer,
            "observed": sorted(set(self.reach.observed.values())),
            "reservations": {str(NodeId(r)): round(until - now, 1) for r, until in self.reservations.items()},
            "relays_offered": sorted(str(NodeId(r)) for r in self.relays_offered),
            "relayed_links": sorted(str(NodeId(c.peer_key)) for c in self._relayed),
            "circuits": 0 if self.book is None else len(self.book.circuits),
            "reserved_here": 0 if self.book is None else len(self.book.reservations),
            **self.counters,
        }

    # --- the service ---

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._recheck_due = trio.current_time() + self.settings.recheck
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._sender)
            nursery.start_soon(self._maintain)
            if self._via is not None:
                nursery.start_soon(self._watch_via, self._via)
            self.peering.add_listener(self)
            self.peering.relay_of = self._relay_of
            task_status.started()

    def _envelope(self, message: Message) -> bytes:
        return sign_message(message, self.identity)

    def _expiry(self) -> int:
        return int((self._wall() + self.settings.message_ttl) * 1000)

    def _later(self, peer: bytes, message: Message) -> None:
        """Send from synchronous code (link_down, a stream closing, a reader's credit): queued."""
        self._queue_in.send_nowait((peer, self._envelope(message)))

    async def _sender(self) -> None:
        async for peer, raw in self._queue:
            await self.peering.send(peer, raw)

    async def _send(self, peer: bytes, message: Message) -> bool:
        return await self.peering.send(peer, self._envelope(message))

    def _relay_of(self, conn: object) -> bytes | None:
        """The relay a link's connection runs through; None for a direct link."""
        return self._relayed.get(conn) if isinstance(conn, Connection) else None

    def _direct(self, peer: bytes) -> Connection | None:
        """The connection of `peer`'s link if it is a direct (TCP) one."""
        link = self.peering.links.get(peer)
        if link is None or link.conn in self._relayed or not isinstance(link.conn, Connection):
            return None
        return link.conn

    # --- LinkListener ---

    def link_up(self, peer: bytes, send: Send) -> None:
        self._sends[peer] = send
        if self._nursery is not None and self._direct(peer) is not None:
            self._nursery.start_soon(self._introduce, peer)

    def link_down(self, peer: bytes) -> None:
        self._sends.pop(peer, None)
        self._asked.pop(peer, None)
        self.reach.forget(peer)
        self.relays_offered.discard(peer)
        self._reserve_asked.pop(peer, None)
        if self.reservations.pop(peer, None) is not None:
            log.info("lost the reservation at relay %s: its link closed", NodeId(peer))
        for key in [k for k in self._ends if k[0] == peer]:
            self._ends.pop(key).end("the link to the relay closed")
        if self.book is not None:
            for c in self.book.drop(peer):
                other = c.other(peer)
                text = "the other end's link to the relay closed"
                self._later(other, RelayClose(self.network, self.me, c.circuit, "closed", text))

    async def message(self, peer: bytes, raw: bytes) -> None:
        kind = claimed_kind(raw)
        if kind not in RELAY_KINDS:
            return
        try:
            env = verify(raw)
            if env.message.EXPIRY is not None:
                check_fresh(env, int(self._wall() * 1000), network=self.network)
            elif env.message.network != self.network:
                raise ProtocolError(f"a {kind} of network {env.message.network!r}")
        except Expired as e:
            log.debug("ignoring an expired %s from %s: %s", kind, NodeId(peer), e)
            return
        except ProtocolError as e:
            self.peering.disconnect(peer, f"sent an invalid {kind}: {e}")
            return
        if env.signer.raw != peer:
            self.peering.disconnect(peer, f"sent a {kind} signed by another node")
            return
        m = env.message
        if isinstance(m, RelayData):
            await self._on_data(peer, m)
        elif isinstance(m, RelayCredit):
            await self._on_credit(peer, m)
        elif isinstance(m, RelayClose):
            await self._on_close(peer, m)
        elif isinstance(m, Circuit):
            await self._on_circuit(peer, m)
        elif isinstance(m, Observed):
            self._on_observed(peer, m)
        elif isinstance(m, Dialback):
            if self._nursery is not None:
                self._nursery.start_soon(self._dial_back, peer, m)
        elif isinstance(m, Dialed):
            self._on_dialed(peer, m)
        elif isinstance(m, Reserve):
            await self._on_reserve(peer, m)
        elif isinstance(m, Reserved):
            self._on_reserved(peer, m)

    # --- reachability ---

    async def _introduce(self, peer: bytes) -> None:
        conn = self._direct(peer)
        if conn is None:
            return
        seen = join_address(*conn.remote_address)
        if check_observed(seen) is None:
            offer = self.offer and self.status != "private"  # a relay nobody can dial helps nobody
            await self._send(peer, Observed(self.network, self.me, seen, offer, self._expiry()))
        await self._probe(peer)

    async def _probe(self, peer: bytes, *, again: bool = False) -> None:
        """Ask `peer` to dial this node back: while its reachability is unknown, a few peers once each;
        `again`, one more time whatever the status."""
        listen = self.peering.listen
        if listen is None or self._direct(peer) is None:
            return
        if not again and (
            self.status != "unknown" or peer in self._asked or len(self._asked) >= self.settings.probes
        ):
            return
        nonce = os.urandom(DIALBACK_NONCE_SIZE)
        self._asked[peer] = nonce
        port = split_address(listen)[1]
        await self._send(peer, Dialback(self.network, self.me, port, nonce, self._expiry()))

    def _on_observed(self, peer: bytes, m: Observed) -> None:
        self.reach.observe(peer, m.address)
        if m.relay and self._direct(peer) is not None:
            self.relays_offered.add(peer)
        else:
            self.relays_offered.discard(peer)

    async def _dial_back(self, peer: bytes, m: Dialback) -> None:
        """Dial `peer` back at its link's own IP address (never another) and say whether it answered."""
        conn = self._direct(peer)
        if conn is None:
            return
        host = conn.remote_address[0]
        address = join_address(host, m.port)
        s = self.settings
        bucket = self._buckets.pop(peer, None) or TokenBucket(
            s.dialbacks_per_peer / s.dialback_interval, s.dialbacks_per_peer
        )
        self._buckets[peer] = bucket  # kept across reconnects, least recently used dropped first
        while len(self._buckets) > s.buckets_kept:
            self._buckets.popitem(last=False)
        refused = (
            self._dialing >= s.max_dialbacks
            or not bucket.allow(trio.current_time())
            or dial_refusal(address, allow_private=self.peering.config.dial_private) is not None
        )
        reachable = False
        if not refused:
            self._dialing += 1
            try:
                await probe(
                    host, m.port, network=self.network, expect=m.requester.raw, seconds=s.dialback_timeout
                )
                reachable = True
            except TransportError as e:
                log.debug("dial-back of %s at %s failed: %s", NodeId(peer), address, e)
            finally:
                self._dialing -= 1
        if check_observed(address) is None:
            await self._send(
                peer, Dialed(self.network, self.me, m.nonce, address, reachable, refused, self._expiry())
            )

    def _on_dialed(self, peer: bytes, m: Dialed) -> None:
        if self._asked.get(peer) != m.nonce or m.refused:
            return
        before = self.status
        direct = sum(1 for p in self._sends if self._direct(p) is not None)
        after = self.reach.dialed(peer, m.address, m.reachable, peers=direct)
        if after == before:
            return
        if after == "private":
            log.info("peers cannot dial this node (it is behind NAT or a firewall): reached through relays")
            self.peering.contact.hide(True)
            if self._nursery is not None:
                self._nursery.start_soon(self._keep_reservations, trio.current_time())
        elif after == "public":
            log.info("peers can dial this node at %s", m.address)
            self.peering.contact.hide(False)

    # --- reservations and via records (this node cannot be dialled) ---

    async def _maintain(self) -> None:
        while True:
            now = trio.current_time()
            for relay in [r for r, until in self.reservations.items() if until <= now]:
                log.info("the reservation at relay %s ended unrenewed", NodeId(relay))
                del self.reservations[relay]
            if self.book is not None:
                for c in self.book.overdue(now):
                    for end in (c.source, c.target):
                        text = "the circuit reached its time limit"
                        self._later(end, RelayClose(self.network, self.me, c.circuit, "duration", text))
            self._link_vias()
            if self.status == "unknown":
                for peer in list(self._sends):
                    await self._probe(peer)
            elif self.status == "private":
                await self._keep_reservations(now)
                if now >= self._recheck_due:
                    self._recheck_due = now + self.settings.recheck
                    direct = [p for p in self._sends if self._direct(p) is not None]
                    if direct:
                        await self._probe(direct[int(now) % len(direct)], again=True)
            await trio.sleep(self.settings.tick)

    async def _keep_reservations(self, now: float) -> None:
        """Ask relays for reservations up to `max_relays` and renew each at half its life; an ask
        not answered is repeated after `message_ttl`."""
        due = [r for r in self.relays_offered if r not in self.reservations and self._direct(r) is not None]
        due = due[: max(self.settings.max_relays - len(self.reservations), 0)]
        due += [r for r, until in self.reservations.items() if until - now <= self._granted.get(r, 0.0) / 2]
        for relay in due:
            if now >= self._reserve_asked.get(relay, -1e18) + self.settings.message_ttl:
                self._reserve_asked[relay] = now
                await self._send(relay, Reserve(self.network, self.me, self._expiry()))
        if self.reservations and now >= self._via_due:
            self._publish_via(now)

    def _publish_via(self, now: float) -> None:
        if self._publish is None or not self.reservations:
            return
        relays = tuple(sorted((NodeId(r) for r in self.reservations), key=lambda n: n.raw))[:4]
        expires = int((self._wall() + self.settings.via_ttl) * 1000)
        self._publish(self._envelope(Via(self.network, self.me, relays, expires)))
        self._via_due = now + self.settings.via_ttl / 2

    async def _on_reserve(self, peer: bytes, m: Reserve) -> None:
        expires, refusal = self._expiry(), ""
        if self.book is None:
            refusal = "not_relay"
        elif m.node.raw != peer or self._direct(peer) is None:  # never a circuit inside a circuit
            refusal = "refused"
        else:
            try:
                until = self.book.reserve(peer, trio.current_time())
                expires = int((self._wall() + until - trio.current_time()) * 1000)
            except Refused as e:
                refusal = e.reason
        if refusal:
            self.counters["refusals"] += 1
        await self._send(peer, Reserved(self.network, self.me, m.node, expires, refusal))

    def _on_reserved(self, peer: bytes, m: Reserved) -> None:
        """Taken only as the answer to an ask still open, over a direct link, while this node is not
        known to be dialable, up to `max_relays`; its life is capped at `max_reservation`."""
        if m.node != self.me or peer not in self._reserve_asked or self._direct(peer) is None:
            log.debug("ignoring a reserved from %s: not asked for there", NodeId(peer))
            return
        if self.status == "public":
            self._reserve_asked.pop(peer, None)
            return
        if peer not in self.reservations and len(self.reservations) >= self.settings.max_relays:
            self._reserve_asked.pop(peer, None)
            return
        if m.refusal:
            log.info("relay %s refused a reservation: %s", NodeId(peer), m.refusal)
            self.relays_offered.discard(peer)
            return
        now = trio.current_time()
        new = peer not in self.reservations
        self._granted[peer] = min(max(0.0, m.expires / 1000 - self._wall()), self.settings.max_reservation)
        self.reservations[peer] = now + self._granted[peer]
        self._reserve_asked.pop(peer, None)
        if new:
            log.info("holding a reservation at relay %s", NodeId(peer))
            self._publish_via(now)

    async def _watch_via(self, channel: trio.MemoryReceiveChannel[VerifiedEnvelope[Any]]) -> None:
        async for env in channel:
            m = env.message
            if not isinstance(m, Via) or m.node == self.me:
                continue
            self._vias.pop(m.node.raw, None)
            self._vias[m.node.raw] = m
            if len(self._vias) > MAX_VIAS_KEPT:
                oldest = next(iter(self._vias))
                del self._vias[oldest]
                self._via_tried.pop(oldest, None)
            self._link_vias()

    def _link_vias(self) -> None:
        """Link through a relay with nodes that cannot be dialled, heard of in `via` records, that
        this node has no link with, while it has fewer links than the peer table's target degree."""
        now, wall_ms = trio.current_time(), int(self._wall() * 1000)
        for node, m in list(self._vias.items()):
            if m.expires <= wall_ms:
                del self._vias[node]
                self._via_tried.pop(node, None)
                continue
            if len(self.peering.links) >= self.peering.settings.target_degree or self._nursery is None:
                return
            if node in self.peering.links or now < self._via_tried.get(node, -1e18) + self.settings.via_retry:
                continue
            relay = next((r.raw for r in m.relays if r != self.me and self._direct(r.raw) is not None), None)
            if relay is not None:
                self._via_tried[node] = now
                self._nursery.start_soon(self._link_via, relay, node)

    # --- circuits, as an end ---

    def _new_stream(self, relay: bytes, circuit: bytes) -> RelayStream:
        async def send_chunk(data: bytes) -> None:
            if not await self._send(relay, RelayData(self.network, self.me, circuit, data)):
                raise ConnectionClosed("the link to the relay is closed")

        def on_close(stream: RelayStream) -> None:
            if self._ends.get((relay, circuit)) is stream:
                del self._ends[(relay, circuit)]
                if stream.ended is None:
                    self._later(relay, RelayClose(self.network, self.me, circuit, "closed", ""))

        def grant(n: int) -> None:
            self._later(relay, RelayCredit(self.network, self.me, circuit, n))

        stream = RelayStream(circuit, send_chunk=send_chunk, grant=grant, on_close=on_close)
        self._ends[(relay, circuit)] = stream
        return stream

    def _remote(self, relay: bytes) -> tuple[str, int]:
        link = self.peering.links.get(relay)
        return link.conn.remote_address if link is not None else ("", 0)

    async def dial_via(self, relay: bytes, target: bytes) -> Connection:
        """Open a circuit to `target` through `relay` (a linked peer) and run the handshake over it as
        initiator, pinning `target`. Raises TransportError; the caller runs the Connection."""
        circuit = os.urandom(CIRCUIT_ID_SIZE)
        stream = self._new_stream(relay, circuit)
        try:
            opened = Circuit(self.network, self.me, circuit, self.me, NodeId(target), self._expiry())
            if not await self._send(relay, opened):
                raise DialFailed(f"no link to relay {NodeId(relay)}")
            limits = self.peering.limits
            return await establish(
                stream,
                initiator=True,
                identity=self.identity,
                network=self.network,
                remote=self._remote(relay),
                expect=target,
                timeouts=limits.timeouts,
                inbox=limits.inbox,
                inbox_bytes=limits.inbox_bytes,
            )
        except BaseException:
            stream.close_now()
            raise

    async def reserve(self, relay: bytes) -> bool:
        """Ask `relay` (a linked peer) for a reservation; the answer lands in `reservations`."""
        self._reserve_asked[relay] = trio.current_time()
        return await self._send(relay, Reserve(self.network, self.me, self._expiry()))

    async def link_via(self, relay: bytes, target: bytes) -> None:
        """Link with `target` through `relay` and run the link until it closes (logged if it fails)."""
        await self._link_via(relay, target)

    async def _link_via(self, relay: bytes, target: bytes) -> None:
        try:
            conn = await self.dial_via(relay, target)
        except TransportError as e:
            log.info("cannot reach %s through relay %s: %s", NodeId(target), NodeId(relay), e)
            return
        await self._run_relayed(conn, relay, outbound=True)

    async def _run_relayed(self, conn: Connection, relay: bytes, *, outbound: bool) -> None:
        self._relayed[conn] = relay
        self.counters["relayed_links_opened"] += 1
        log.info("linked with %s through relay %s", NodeId(conn.peer_key), NodeId(relay))
        try:
            if outbound:
                await self.peering.run_link(conn, outbound=True)
            else:
                async with trio.open_nursery() as nursery:
                    await nursery.start(conn.run)
                    await self.peering.run_link(conn, outbound=False)
                    nursery.cancel_scope.cancel()
        finally:
            self._relayed.pop(conn, None)
            await conn.aclose()

    async def _accept(self, relay: bytes, host: str, stream: RelayStream, source: bytes) -> None:
        try:
            await self._accept_admitted(relay, stream, source)
        finally:
            self._inbound.release(relay, host)

    async def _accept_admitted(self, relay: bytes, stream: RelayStream, source: bytes) -> None:
        limits = self.peering.limits
        try:
            conn = await establish(
                stream,
                initiator=False,
                identity=self.identity,
                network=self.network,
                remote=self._remote(relay),
                timeouts=limits.timeouts,
                inbox=limits.inbox,
                inbox_bytes=limits.inbox_bytes,
            )
        except TransportError as e:
            log.info(
                "a circuit from %s through %s failed its handshake: %s", NodeId(source), NodeId(relay), e
            )
            stream.close_now()
            return
        await self._run_relayed(conn, relay, outbound=False)

    # --- circuits: messages from an end or the relay ---

    async def _on_circuit(self, peer: bytes, m: Circuit) -> None:
        if m.target == self.me and m.sender.raw == peer and m.source != self.me:
            if (peer, m.circuit) in self._ends:
                return
            host, reason = self._remote(peer)[0], "refused"
            why: str | None = "this node holds no reservation at that relay"
            if peer in self.reservations and self._direct(peer) is not None and self._nursery is not None:
                reason, why = "limit", self._inbound.admit(peer, host)
            if why is not None or self._nursery is None:
                self.counters["refusals"] += 1
                log.info("refused a circuit from %s through %s: %s", m.source, NodeId(peer), why)
                await self._send(peer, RelayClose(self.network, self.me, m.circuit, reason, why or ""))
                return
            stream = self._new_stream(peer, m.circuit)
            self._nursery.start_soon(self._accept, peer, host, stream, m.source.raw)
            return
        await self._relay_circuit(peer, m)

    async def _relay_circuit(self, peer: bytes, m: Circuit) -> None:
        def refuse(reason: str, text: str) -> RelayClose:
            self.counters["refusals"] += 1
            return RelayClose(self.network, self.me, m.circuit, reason, text)

        if self.book is None:
            await self._send(peer, refuse("not_relay", "this node does not relay"))
            return
        if m.source.raw != peer or self._direct(peer) is None:
            await self._send(peer, refuse("refused", "a circuit is opened by its source, over a direct link"))
            return
        target = m.target.raw
        try:
            self.book.open(m.circuit, peer, target, trio.current_time())
        except Refused as e:
            await self._send(peer, refuse(e.reason, e.text))
            return
        forward = Circuit(self.network, self.me, m.circuit, m.source, m.target, self._expiry())
        if not await self._send(target, forward):
            self.book.close(m.circuit)
            await self._send(peer, refuse("no_reservation", "the target's link to this relay is closed"))
            return
        self.counters["circuits_relayed"] += 1

    async def _on_data(self, peer: bytes, m: RelayData) -> None:
        stream = self._ends.get((peer, m.circuit))
        if stream is not None:
            if not stream.feed(m.data):
                del self._ends[(peer, m.circuit)]
                text = "it sent more than its credit"
                await self._send(peer, RelayClose(self.network, self.me, m.circuit, "closed", text))
            return
        if self.book is None or m.circuit not in self.book.circuits:
            return  # a circuit closed a moment ago: its last bytes still in flight
        circuit = self.book.circuits[m.circuit]
        try:
            other = self.book.carry(m.circuit, peer, len(m.data), trio.current_time())
        except Refused as e:
            self.counters["refusals"] += 1
            ends = (circuit.source, circuit.target) if peer in (circuit.source, circuit.target) else (peer,)
            for end in ends:
                await self._send(end, RelayClose(self.network, self.me, m.circuit, e.reason, e.text))
            return
        if await self._send(other, RelayData(self.network, self.me, m.circuit, m.data)):
            self.counters["bytes_relayed"] += len(m.data)
            return
        self.book.close(m.circuit)
        text = "the other end's link to the relay closed"
        await self._send(peer, RelayClose(self.network, self.me, m.circuit, "closed", text))

    async def _on_credit(self, peer: bytes, m: RelayCredit) -> None:
        stream = self._ends.get((peer, m.circuit))
        if stream is not None:
            stream.credit(m.credit)
            return
        circuit = None if self.book is None else self.book.circuits.get(m.circuit)
        if circuit is not None and peer in (circuit.source, circuit.target):
            other = circuit.other(peer)
            await self._send(other, RelayCredit(self.network, self.me, m.circuit, m.credit))

    async def _on_close(self, peer: bytes, m: RelayClose) -> None:
        stream = self._ends.pop((peer, m.circuit), None)
        if stream is not None:
            stream.end("closed" if m.reason == "closed" and not m.text else f"{m.reason}: {m.text}")
            return
        if self.book is None:
            return
        circuit = self.book.circuits.get(m.circuit)
        if circuit is None or peer not in (circuit.source, circuit.target):
            return
        self.book.close(m.circuit)
        await self._send(circuit.other(peer), RelayClose(self.network, self.me, m.circuit, m.reason, m.text))
