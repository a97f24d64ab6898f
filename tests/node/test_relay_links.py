"""Relayed links on 127.0.0.1 (node/net/relay.py, circuits.py): three real PeerServices over real
sockets, a relay and two nodes that advertise no address (as behind NAT). The two ends run the
ordinary handshake through the relay, which carries only ciphertext, and refuses what it must."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.lowlevel
import trio.testing
from e31.node.config import Address, NodeConfig
from e31.node.net.addresses import split_address
from e31.node.net.peering import PeerService, Send
from e31.node.net.peers import PeerSettings
from e31.node.net.probe import probe
from e31.node.net.relay import RELAY_KINDS, RelayService, RelaySettings
from e31.node.net.transport import Connection, HandshakeAborted, PeerRejected, TransportError, dial, establish
from e31.node.store.async_store import AsyncStore
from e31.node.store.db import Store
from e31.protocol.envelope import claimed_kind, node_id_of, sign_message, verify
from e31.protocol.ids import Digest
from e31.protocol.messages import Cancel
from e31.protocol.relay import Circuit, Dialback, Dialed, Observed, RelayData, RelayLimits, Reserved
from nacl.signing import SigningKey

FAST = PeerSettings.fast(0.05)
SAFETY = 20.0


class Heard:
    """A LinkListener that keeps every envelope of the kinds it is told, as raw bytes."""

    def __init__(self, *kinds: str) -> None:
        self.kinds = kinds
        self.raw: list[tuple[bytes, bytes]] = []

    def link_up(self, peer: bytes, send: Send) -> None:
        pass

    def link_down(self, peer: bytes) -> None:
        pass

    async def message(self, peer: bytes, raw: bytes) -> None:
        if claimed_kind(raw) in self.kinds:
            self.raw.append((peer, raw))


@asynccontextmanager
async def node(
    tmp_path: Path,
    name: str,
    *,
    relay: bool = False,
    hidden: bool = True,
    limits: RelayLimits | None = None,
    settings: RelaySettings | None = None,
) -> AsyncIterator[RelayService]:
    store = AsyncStore(Store(tmp_path / f"{name}.sqlite"))
    config = NodeConfig(
        data_dir=tmp_path / name, listen=Address("127.0.0.1", 0), mdns=False, dial_private=True, relay=relay
    )
    peering = PeerService(identity=SigningKey.generate(), config=config, store=store, settings=FAST)
    # a node "behind NAT" asks nobody to dial it back: on loopback it would learn it can be dialled
    hidden = hidden and not relay
    settings = replace(settings or RelaySettings(), probes=0) if hidden else settings
    service = RelayService(peering, offer=relay, limits=limits, settings=settings)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(peering.run)
            if hidden:  # as behind NAT: no address is advertised, so only the relay links them
                peering.contact.hide(True)
            await nursery.start(service.run)
            yield service
            nursery.cancel_scope.cancel()
    finally:
        await store.aclose()


async def until(condition: object, what: str) -> None:
    assert callable(condition)
    with trio.fail_after(SAFETY):
        while not condition():  # noqa: ASYNC110 (the state lives in other services)
            await trio.sleep(0.01)


async def linked(a: RelayService, r: RelayService) -> None:
    assert r.peering.listen is not None
    a.peering.table.learn(r.local, [r.peering.listen], "manual")
    await until(lambda: r.local in a.peering.links and a.local in r.peering.links, "a link to the relay")


def cancel_from(key: SigningKey) -> bytes:
    expires = int((time.time() + 60) * 1000)
    return sign_message(
        Cancel("main", Digest(bytes(32)), node_id_of(key), expires, "withdrawn", "x" * 40), key
    )


async def test_two_nodes_behind_nat_link_through_a_relay_that_carries_only_ciphertext(tmp_path: Path) -> None:
    async with node(tmp_path, "r", relay=True) as r, node(tmp_path, "a") as a, node(tmp_path, "b") as b:
        carried = Heard("relaydata")
        r.peering.add_listener(carried)
        got = Heard("cancel")
        b.peering.add_listener(got)
        await linked(a, r)
        await linked(b, r)
        await b.reserve(r.local)
        await until(lambda: r.local in b.reservations, "b's reservation")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(a.link_via, r.local, b.local)
            await until(lambda: b.local in a.peering.links and a.local in b.peering.links, "the relayed link")
            envelope = cancel_from(a.identity)
            assert await a.peering.send(b.local, envelope)
            await until(lambda: got.raw, "the message at b")
            assert got.raw == [(a.local, envelope)]
            # the relay saw relaydata of a and b only, and never the plaintext
            assert carried.raw and {peer for peer, _ in carried.raw} == {a.local, b.local}
            for _, raw in carried.raw:
                data = verify(raw, expect=RelayData).message.data
                assert envelope not in data and envelope[-64:] not in data
            assert r.counters["circuits_relayed"] == 1 and r.counters["bytes_relayed"] > len(envelope)
            # heartbeats answer over the relayed link as over TCP
            await until(lambda: a.peering.links[b.local].liveness.rtt is not None, "a heartbeat")
            assert a.peering.links[b.local].outbound and not b.peering.links[a.local].outbound
            (doc,) = [d for d in a.peering.peer_docs() if d["node_id"] == str(b.me)]
            assert doc["via"] == str(r.me) and doc["address"] is None and doc["state"] == "connected"
            (doc,) = [d for d in a.peering.peer_docs() if d["node_id"] == str(r.me)]
            assert doc["via"] is None and doc["address"] == r.peering.listen
            # the relay going away ends the relayed link at both ends
            await r.peering.links[b.local].conn.aclose()
            await until(lambda: b.local not in a.peering.links, "the relayed link to close")
            nursery.cancel_scope.cancel()


async def test_a_relay_refuses_a_target_without_a_reservation_and_a_node_that_is_no_relay_refuses_all(
    tmp_path: Path,
) -> None:
    async with node(tmp_path, "r", relay=True) as r, node(tmp_path, "a") as a, node(tmp_path, "b") as b:
        await linked(a, r)
        await linked(b, r)
        await linked(b, a)
        with pytest.raises(HandshakeAborted, match="no_reservation"):
            await a.dial_via(r.local, b.local)
        with pytest.raises(HandshakeAborted, match="not_relay"):
            await b.dial_via(a.local, r.local)
        assert r.book is not None and not r.book.circuits and r.counters["refusals"] >= 1


async def test_over_any_stream_the_handshake_pins_the_far_end_so_a_relay_cannot_pose_as_it() -> None:
    """A relay that answers a circuit itself (with its own key) fails the initiator's pin."""
    relay_key, a_key, b_key = SigningKey.generate(), SigningKey.generate(), SigningKey.generate()
    left, right = trio.testing.memory_stream_pair()
    ends: dict[str, object] = {}

    async def respond() -> None:
        try:
            await establish(right, initiator=False, identity=relay_key, network="main", remote=("r", 0))
        except TransportError as e:
            ends["responder"] = e

    async with trio.open_nursery() as nursery:
        nursery.start_soon(respond)
        with pytest.raises(PeerRejected):
            await establish(
                left,
                initiator=True,
                identity=a_key,
                network="main",
                remote=("r", 0),
                expect=b_key.verify_key.encode(),
            )
        await left.aclose()


class MemoryEnd(trio.abc.Stream):
    """One end of a memory stream pair that can close at once, as a Connection over a circuit needs."""

    def __init__(self, end: trio.StapledStream[Any, Any]) -> None:
        self.end = end

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.end.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.end.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self.end.receive_some(max_bytes)

    def close_now(self) -> None:
        self.end.send_stream.close()
        self.end.receive_stream.close()

    async def aclose(self) -> None:
        await self.end.aclose()


def memory_pair() -> tuple[MemoryEnd, MemoryEnd]:
    one, two = trio.testing.memory_stream_pair()
    return MemoryEnd(one), MemoryEnd(two)


async def test_over_a_memory_stream_the_ordinary_handshake_and_session_carry_messages() -> None:
    a_key, b_key = SigningKey.generate(), SigningKey.generate()
    left, right = memory_pair()
    conns: dict[str, Connection] = {}

    async def respond() -> None:
        conns["b"] = await establish(right, initiator=False, identity=b_key, network="main", remote=("a", 0))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(respond)
        a = await establish(
            left,
            initiator=True,
            identity=a_key,
            network="main",
            remote=("b", 0),
            expect=b_key.verify_key.encode(),
        )
    b = conns["b"]
    assert a.peer_key == b_key.verify_key.encode() and b.peer_key == a_key.verify_key.encode()
    assert a.local_address == ("", 0)
    async with trio.open_nursery() as nursery:
        await nursery.start(a.run)
        await nursery.start(b.run)
        await a.send(b"x" * 300_000)
        assert await b.receive() == b"x" * 300_000
        await b.aclose()
        await a.aclose()


async def test_nodes_on_loopback_learn_that_they_can_be_dialled(tmp_path: Path) -> None:
    async with node(tmp_path, "r", relay=True) as r, node(tmp_path, "a", hidden=False) as a:
        await linked(a, r)
        await until(lambda: a.status == "public" and r.status == "public", "both dialled back")
        assert r.local in a.relays_offered and a.local not in r.relays_offered
        assert a.reach.observed[r.local].startswith("127.0.0.1:")


async def test_a_dialback_probe_checks_the_key_at_an_address_and_leaves_no_link_or_peer_there(
    tmp_path: Path,
) -> None:
    async with node(tmp_path, "r", relay=True) as r:
        assert r.peering.listen is not None
        host, port = split_address(r.peering.listen)
        await probe(host, port, network="main", expect=r.local, seconds=SAFETY)
        with pytest.raises(PeerRejected):
            await probe(host, port, network="main", expect=bytes(32), seconds=SAFETY)
        with pytest.raises(PeerRejected):
            await probe(host, port, network="other", expect=r.local, seconds=SAFETY)
        await trio.testing.wait_all_tasks_blocked()
        assert not r.peering.links and not r.peering.table.peers


async def test_a_relay_ends_a_circuit_at_its_byte_limit_and_both_ends_see_the_link_close(
    tmp_path: Path,
) -> None:
    limits = RelayLimits(circuit_bytes=64 * 1024)
    async with (
        node(tmp_path, "r", relay=True, limits=limits) as r,
        node(tmp_path, "a") as a,
        node(tmp_path, "b") as b,
    ):
        await linked(a, r)
        await linked(b, r)
        await b.reserve(r.local)
        await until(lambda: r.local in b.reservations, "b's reservation")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(a.link_via, r.local, b.local)
            await until(lambda: b.local in a.peering.links and a.local in b.peering.links, "the relayed link")
            link_at_b = b.peering.links[a.local]
            envelope = cancel_from(a.identity)
            sent = 0
            while await a.peering.send(b.local, envelope):  # until the relay cuts the circuit
                sent += len(envelope)
                await trio.lowlevel.checkpoint()
            assert sent > 0
            await until(
                lambda: b.local not in a.peering.links and a.local not in b.peering.links, "both ends closed"
            )
            assert "bytes" in (link_at_b.conn.close_reason or ""), link_at_b.conn.close_reason
            assert r.book is not None and not r.book.circuits and r.counters["refusals"] >= 1
            nursery.cancel_scope.cancel()


def test_node_status_says_whether_the_node_can_be_dialled_and_what_it_relays() -> None:
    from e31.node.cli.tables import format_status

    def line(reach: dict[str, object]) -> str:
        text = format_status({"node_id": "e31nabc", "reachability": reach})
        return dict(row.split(":", 1) for row in text.splitlines())["reachable"].strip()

    assert line({"status": "unknown", "relay": False}) == "not known yet"
    assert line({"status": "public", "relay": True, "circuits": 2, "reserved_here": 3}) == (
        "yes (a peer dialled it back); relays for others: 2 circuit(s), 3 reserved"
    )
    assert line({"status": "private", "reservations": {"e31nrelay": 580.0}, "relayed_links": ["e31nb"]}) == (
        "no (behind NAT or a firewall): reached through relay e31nrelay; 1 peer(s) linked through a relay"
    )
    assert line({"status": "private", "reservations": {}}) == "no (behind NAT or a firewall): no relay yet"


@asynccontextmanager
async def hand_link(service: RelayService, key: SigningKey) -> AsyncIterator[tuple[Connection, Heard]]:
    """A hand-driven peer linked to `service`: a raw transport connection that keeps what it receives."""
    assert service.peering.listen is not None
    host, port = split_address(service.peering.listen)
    conn = await dial(host, port, identity=key, network="main")
    got = Heard(*RELAY_KINDS)
    async with trio.open_nursery() as nursery:
        await nursery.start(conn.run)

        async def read() -> None:
            async for raw in conn:
                await got.message(service.local, raw)

        nursery.start_soon(read)
        try:
            yield conn, got
        finally:
            await conn.aclose()
            nursery.cancel_scope.cancel()


def kinds(got: Heard, kind: str) -> list[Any]:
    return [verify(raw).message for _, raw in got.raw if claimed_kind(raw) == kind]


def soon() -> int:
    return int((time.time() + 60) * 1000)


async def test_a_node_dials_back_only_the_links_own_ip_and_refuses_past_its_rate(tmp_path: Path) -> None:
    async with node(tmp_path, "r", relay=True) as r:
        r.settings = RelaySettings(dialbacks_per_peer=2, dialback_interval=3600.0)
        key = SigningKey.generate()
        async with hand_link(r, key) as (conn, got):
            # the hand peer listens nowhere: each dial-back finds nobody at the port of its own IP
            for i in range(3):
                nonce = bytes([i]) * 16
                await conn.send(sign_message(Dialback("main", node_id_of(key), 9, nonce, soon()), key))
            await until(lambda: len(kinds(got, "dialed")) == 3, "three answers")
            answers = sorted(kinds(got, "dialed"), key=lambda m: m.nonce)
            assert all(m.address == "127.0.0.1:9" and not m.reachable for m in answers)
            assert [m.refused for m in answers] == [False, False, True]


async def test_a_node_whose_dialbacks_fail_hides_its_addresses_and_reserves_at_a_relay(
    tmp_path: Path,
) -> None:
    async with node(tmp_path, "n", hidden=False) as n:
        assert n.peering.addresses
        key = SigningKey.generate()
        async with hand_link(n, key) as (conn, got):
            await until(lambda: kinds(got, "dialback"), "n to ask for a dial-back")
            (ask,) = kinds(got, "dialback")
            assert ask.port == split_address(n.peering.listen or "")[1]
            me = node_id_of(key)
            await conn.send(sign_message(Observed("main", me, "127.0.0.1:1234", True, soon()), key))
            await conn.send(
                sign_message(Dialed("main", me, ask.nonce, "127.0.0.1:1", False, False, soon()), key)
            )
            await until(lambda: n.status == "private", "n to learn it cannot be dialled")
            assert n.peering.addresses == [] and n.peering.contact.record is None
            await until(lambda: kinds(got, "reserve"), "a reservation asked of the peer that relays")
            await conn.send(sign_message(Reserved("main", me, n.me, soon() + 600_000, ""), key))
            await until(lambda: key.verify_key.encode() in n.reservations, "the reservation held")
            # a truthful dial-back later makes it public again, advertising its address
            await conn.send(
                sign_message(Dialed("main", me, ask.nonce, "127.0.0.1:1", True, False, soon()), key)
            )
            await until(lambda: n.status == "public", "n public again")
            assert n.peering.addresses


def test_metrics_carry_the_relay_counters_from_the_status() -> None:
    from e31.node.api.prometheus import scraped
    from e31.node.metrics import render

    doc = {"reachability": {"status": "public", "circuits_relayed": 3, "bytes_relayed": 4096, "refusals": 1}}
    text = render(scraped(doc, {}, None, 0))
    assert 'e31_relay_events_total{event="circuits_relayed"} 3' in text
    assert 'e31_relay_events_total{event="bytes_relayed"} 4096' in text
    assert 'e31_relay_events_total{event="refusals"} 1' in text


def test_e31_peers_shows_the_relay_of_a_relayed_peer_as_its_address() -> None:
    from e31.node.cli.tables import format_peers

    row = {"node_id": "e31nb", "state": "connected", "address": None, "via": "e31nrelay0123456789"}
    text = format_peers([{**row, "source": "inbound", "last_seen": None, "rtt_ms": 2.0}])
    assert "via relay e31nrelay012..." in text.splitlines()[1]


def circuit_to(n: RelayService, key: SigningKey, i: int) -> bytes:
    """A `circuit` to `n` from the hand-driven relay `key`, as if from some other node."""
    source = node_id_of(SigningKey.generate())
    return sign_message(Circuit("main", node_id_of(key), bytes([i]) * 16, source, n.me, soon()), key)


async def test_a_reserved_nobody_asked_for_is_ignored_and_its_sender_cannot_open_circuits(
    tmp_path: Path,
) -> None:
    async with node(tmp_path, "n") as n:
        key = SigningKey.generate()
        async with hand_link(n, key) as (conn, got):
            me = node_id_of(key)
            await conn.send(sign_message(Reserved("main", me, n.me, soon() + 3_600_000, ""), key))
            await conn.send(circuit_to(n, key, 1))
            await until(lambda: kinds(got, "relayclose"), "the circuit refused")
            (close,) = kinds(got, "relayclose")
            assert close.reason == "refused" and n.reservations == {}
            # asked, the answer is taken, but for no longer than the node would hold it
            await n.reserve(key.verify_key.encode())
            await conn.send(sign_message(Reserved("main", me, n.me, soon() + 3_600_000, ""), key))
            await until(lambda: n.reservations, "the reservation asked for")
            (until_,) = n.reservations.values()
            assert until_ - trio.current_time() <= n.settings.max_reservation
            # a second, unasked answer is not taken (the ask is answered)
            assert key.verify_key.encode() not in n._reserve_asked


async def test_a_public_node_takes_no_reservation_even_when_it_asked(tmp_path: Path) -> None:
    async with node(tmp_path, "n") as n:
        n.reach.dialed(b"\x09" * 32, "127.0.0.1:1", True)
        assert n.status == "public"
        key = SigningKey.generate()
        async with hand_link(n, key) as (conn, got):
            await n.reserve(key.verify_key.encode())
            await conn.send(sign_message(Reserved("main", node_id_of(key), n.me, soon(), ""), key))
            await conn.send(circuit_to(n, key, 1))
            await until(lambda: kinds(got, "relayclose"), "the circuit refused")
            assert n.reservations == {}


async def test_a_relay_can_push_only_so_many_relayed_links_and_each_counts_in_the_connection_caps(
    tmp_path: Path,
) -> None:
    async with node(tmp_path, "n", settings=RelaySettings(relayed_in_per_relay=2)) as n:
        key = SigningKey.generate()
        async with hand_link(n, key) as (conn, got):
            await n.reserve(key.verify_key.encode())
            await conn.send(sign_message(Reserved("main", node_id_of(key), n.me, soon(), ""), key))
            await until(lambda: n.reservations, "the reservation")
            before = n.peering.caps.count("127.0.0.1")
            for i in range(3):  # the relay never sends the handshakes: two wait, the third is refused
                await conn.send(circuit_to(n, key, i))
            await until(lambda: kinds(got, "relayclose"), "the third circuit refused")
            (close,) = kinds(got, "relayclose")
            assert close.reason == "limit" and close.circuit == bytes([2]) * 16, close
            assert n.peering.caps.count("127.0.0.1") == before + 2


async def test_the_dialback_rate_per_peer_holds_across_reconnects(tmp_path: Path) -> None:
    async with node(tmp_path, "r", relay=True) as r:
        r.settings = RelaySettings(dialbacks_per_peer=2, dialback_interval=3600.0)
        key = SigningKey.generate()
        me = node_id_of(key)
        async with hand_link(r, key) as (conn, got):
            for i in range(2):
                await conn.send(sign_message(Dialback("main", me, 9, bytes([i]) * 16, soon()), key))
            await until(lambda: len(kinds(got, "dialed")) == 2, "two answers")
            assert not any(m.refused for m in kinds(got, "dialed"))
        await until(lambda: key.verify_key.encode() not in r.peering.links, "the link closed")
        async with hand_link(r, key) as (conn, got):
            await conn.send(sign_message(Dialback("main", me, 9, bytes([3]) * 16, soon()), key))
            await until(lambda: kinds(got, "dialed"), "the answer")
            (answer,) = kinds(got, "dialed")
            assert answer.refused
