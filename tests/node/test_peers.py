"""Peering: the table's decisions (pure, seeded rng), the service over real links on 127.0.0.1, and the
service's link logic over memory links on trio's virtual clock with the production settings."""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest
import trio
import trio.testing
from e31.node.config import Address, NodeConfig
from e31.node.net.addresses import split_address
from e31.node.net.contact import OwnContact
from e31.node.net.exchange import Learned, PeerExchange
from e31.node.net.links import RTT_REFRESH, Backoff, LinkHealth, Liveness, TokenBucket, keep_new_link
from e31.node.net.peering import PeerService
from e31.node.net.peers import Dial, PeerSettings, PeerState, PeerTable
from e31.node.net.transport import Connection, ConnectionClosed, dial
from e31.node.store.async_store import AsyncStore
from e31.node.store.db import Store
from e31.protocol.envelope import node_id_of, sign_message, verify
from e31.protocol.ids import Digest
from e31.protocol.messages import Cancel, Contact, Peers, Ping
from nacl.signing import SigningKey

A, B, C, D, E = (bytes([i]) * 32 for i in range(1, 6))
LOCAL = bytes([9]) * 32


def table(**kw: object) -> PeerTable:
    return PeerTable(LOCAL, PeerSettings(**kw), dial_private=True)  # type: ignore[arg-type]


# --- backoff -----------------------------------------------------------------------------------------


def test_backoff_doubles_within_jitter_and_is_capped() -> None:
    backoff = Backoff(base=1.0, maximum=60.0)
    rng = random.Random(1)
    assert backoff.delay(0, rng) == 0.0
    for n in range(1, 12):
        raw = min(60.0, 2.0 ** (n - 1))
        for _ in range(20):
            assert raw / 2 <= backoff.delay(n, rng) < raw
    assert backoff.delay(10_000, rng) < 60.0


def test_backoff_jitter_spreads_peers_that_failed_together() -> None:
    rng = random.Random(7)
    delays = {round(Backoff(1.0, 60.0).delay(5, rng), 6) for _ in range(50)}
    assert len(delays) > 40


def test_token_bucket_allows_a_burst_then_the_rate() -> None:
    bucket = TokenBucket(rate=2.0, burst=3)
    assert [bucket.allow(10.0) for _ in range(4)] == [True, True, True, False]
    assert not bucket.allow(10.25)
    assert bucket.allow(10.5) and not bucket.allow(10.5)
    assert [bucket.allow(100.0) for _ in range(4)] == [True, True, True, False]


# --- liveness ----------------------------------------------------------------------------------------


def test_liveness_suspects_then_declares_dead() -> None:
    live = Liveness(suspect_after=2, dead_after=4)
    healths = [live.tick(bytes([i]) * 16, float(i)) for i in range(6)]
    assert healths == [
        LinkHealth.ALIVE,
        LinkHealth.ALIVE,
        LinkHealth.SUSPECT,
        LinkHealth.SUSPECT,
        LinkHealth.DEAD,
        LinkHealth.DEAD,
    ]


def test_a_pong_answering_the_outstanding_ping_restores_health() -> None:
    live = Liveness(suspect_after=2, dead_after=4)
    live.tick(b"a" * 16, 0.0)
    live.tick(b"b" * 16, 1.0)
    assert live.tick(b"c" * 16, 2.0) is LinkHealth.SUSPECT
    assert not live.pong(b"b" * 16, 2.5)  # a late answer to an older ping does not count
    assert live.health is LinkHealth.SUSPECT
    assert live.pong(b"c" * 16, 2.25)
    assert live.health is LinkHealth.ALIVE and live.missed == 0
    assert live.rtt == pytest.approx(0.25)
    assert not live.pong(b"c" * 16, 2.5)  # answered once only
    assert live.tick(b"d" * 16, 3.0) is LinkHealth.ALIVE


def test_any_message_from_the_peer_shows_it_alive_as_a_pong_does() -> None:
    live = Liveness(suspect_after=2, dead_after=4)
    live.tick(b"a" * 16, 0.0)
    live.tick(b"b" * 16, 1.0)
    assert live.tick(b"c" * 16, 2.0) is LinkHealth.SUSPECT
    live.heard(2.5)  # an offer, a bid, anything over the link: not the pong
    assert live.health is LinkHealth.ALIVE and live.missed == 0
    # ping c was still unanswered at the next tick, but the peer spoke after it went: not missed
    assert live.tick(b"d" * 16, 3.0) is LinkHealth.ALIVE and live.missed == 0
    # ping d: unanswered, and nothing heard since it went: missed
    assert live.tick(b"e" * 16, 4.0) is LinkHealth.ALIVE and live.missed == 1
    assert live.pong(b"e" * 16, 4.25) and live.rtt == pytest.approx(0.25)


def test_a_ping_is_due_on_a_quiet_link_or_when_the_round_trip_is_old() -> None:
    live = Liveness(suspect_after=2, dead_after=4)
    assert live.ping_due(0.0, 1.0)  # nothing heard yet
    live.heard(10.0)
    assert live.ping_due(10.25, 1.0)  # busy, but never pinged: its round trip is unknown
    live.tick(b"a" * 16, 10.25)
    assert live.pong(b"a" * 16, 10.5)
    live.heard(11.0)
    assert not live.ping_due(11.25, 1.0)  # heard a quarter interval ago, pinged lately
    assert live.ping_due(11.5, 1.0)  # quiet for half an interval
    live.heard(14.0)
    assert not live.ping_due(14.0, 1.0)
    assert live.ping_due(10.25 + RTT_REFRESH, 1.0)  # busy, but the last ping went RTT_REFRESH ago


# --- duplicate links ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("x", "y"), [(A, B), (B, A)])
def test_both_ends_keep_the_same_of_two_crossing_links(x: bytes, y: bytes) -> None:
    # Link 1 dialed by x, link 2 dialed by y; each end sees them in either order.
    for first_is_1 in (True, False):
        # x's view: link 1 outbound, link 2 inbound. y's view: the opposite.
        x_old, x_new = (True, False) if first_is_1 else (False, True)
        y_old, y_new = (not x_old), (not x_new)
        x_keeps_new = keep_new_link(x, y, x_old, x_new)
        y_keeps_new = keep_new_link(y, x, y_old, y_new)
        assert x_keeps_new == y_keeps_new
        kept_initiator_is_x = x_new if x_keeps_new else x_old
        assert kept_initiator_is_x == (x < y)


def test_a_redialed_link_replaces_the_old_one_from_the_same_side() -> None:
    assert keep_new_link(A, B, True, True)
    assert keep_new_link(A, B, False, False)


# --- the table ---------------------------------------------------------------------------------------


def test_learning_merges_addresses_and_never_adds_this_node() -> None:
    t = table()
    assert t.learn(LOCAL, ["127.0.0.1:1"], "exchange") is None
    t.learn(A, ["127.0.0.8:1"], "exchange", last_seen=10.0)
    peer = t.learn(A, ["127.0.0.8:2", "127.0.0.8:1"], "mdns", last_seen=5.0)
    assert peer is not None
    assert peer.addresses == ["127.0.0.8:2", "127.0.0.8:1"]
    assert peer.source == "exchange"  # the first source stays
    assert peer.last_seen == 10.0


def test_dials_fill_up_to_the_target_degree_preferring_reliable_recent_peers() -> None:
    t = table(target_degree=3)
    t.learn(A, ["127.0.0.1:1"], "exchange", last_seen=1.0)
    t.learn(B, ["127.0.0.2:1"], "exchange", last_seen=5.0)
    t.learn(C, ["127.0.0.3:1"], "exchange", last_seen=9.0, failures=2)
    t.learn(D, ["127.0.0.4:1"], "exchange", last_seen=3.0)
    t.learn(E, [], "inbound")  # no address: cannot be dialed
    t.on_connected(A, outbound=True, wall=10.0)
    dials = t.due_dials(0.0, random.Random(1))
    assert [d.node_id for d in dials] == [B, D]
    assert all(t.peers[d.node_id].state(0.0) is PeerState.DIALING for d in dials if d.node_id)
    assert t.due_dials(0.0, random.Random(1)) == []  # already dialing: not twice


def test_bootstrap_peers_are_dialed_even_above_the_target_degree() -> None:
    t = table(target_degree=1)
    t.learn(A, ["127.0.0.1:1"], "exchange")
    t.on_connected(A, outbound=True, wall=1.0)
    t.add_bootstrap("127.0.0.2:1", B)
    t.add_bootstrap("x:1", None)
    dials = t.due_dials(0.0, random.Random(1))
    assert set(dials) == {Dial("x:1", None, True), Dial("127.0.0.2:1", B, True)}


def test_a_failed_dial_backs_off_and_rotates_addresses() -> None:
    t = table(backoff_base=1.0, backoff_max=100.0)
    t.learn(A, ["127.0.0.1:1", "127.0.0.1:2"], "exchange")
    t.peers[A].verified.update(["127.0.0.1:1", "127.0.0.1:2"])  # confirmed: no floor on the backoff
    rng = random.Random(3)
    for failures in range(1, 6):
        (dial,) = t.due_dials(1000.0 * failures, rng)
        assert dial.address == ("127.0.0.1:1" if failures % 2 else "127.0.0.1:2")
        peer = t.dial_failed(dial, 1000.0 * failures, rng)
        assert peer is not None and peer.failures == failures
        wait = peer.next_dial - 1000.0 * failures
        assert 2.0 ** (failures - 1) / 2 <= wait < 2.0 ** (failures - 1)
        assert peer.state(1000.0 * failures) is PeerState.BACKOFF
        assert t.due_dials(1000.0 * failures, rng) == []


def test_an_unnamed_bootstrap_target_learns_its_node_and_is_not_dialed_twice() -> None:
    t = table()
    t.add_bootstrap("boot:1", None)
    rng = random.Random(1)
    (dial,) = t.due_dials(0.0, rng)
    assert dial == Dial("boot:1", None, True)
    t.dial_succeeded(dial, A)
    t.on_connected(A, outbound=True, wall=1.0)
    assert t.peers[A].bootstrap and t.peers[A].addresses == ["boot:1"]
    assert t.due_dials(1.0, rng) == []
    t.on_disconnected(A, 1.0, rng, failed=True)
    # After the backoff the peer's own entry is redialed (pinned to A), not the bare address.
    assert t.due_dials(1.0, rng) == []
    assert t.due_dials(100.0, rng) == [Dial("boot:1", A, True)]


def test_a_failing_bootstrap_target_backs_off() -> None:
    t = table(backoff_base=2.0)
    t.add_bootstrap("boot:1", None)
    rng = random.Random(1)
    (dial,) = t.due_dials(0.0, rng)
    assert t.dial_failed(dial, 0.0, rng) is None
    assert t.due_dials(0.5, rng) == []
    assert t.due_dials(2.0, rng) == [dial]


def test_an_address_that_reached_this_node_is_never_dialed_again() -> None:
    t = table()
    t.add_bootstrap("127.0.0.9:1", None)
    t.learn(A, ["127.0.0.9:1", "127.0.0.1:1"], "exchange")
    t.mark_own_address("127.0.0.9:1")
    assert t.peers[A].addresses == ["127.0.0.1:1"]
    t.learn(A, ["127.0.0.9:1"], "exchange")
    assert t.peers[A].addresses == ["127.0.0.1:1"]
    assert [d.address for d in t.due_dials(0.0, random.Random(1))] == ["127.0.0.1:1"]


def test_a_bootstrap_dial_is_skipped_while_a_known_peer_at_that_address_is_being_dialed() -> None:
    t = table()
    t.learn(A, ["boot:1"], "bootstrap")
    t.add_bootstrap("boot:1", None)
    dials = t.due_dials(0.0, random.Random(1))
    assert len(dials) == 1


def test_a_peer_that_misbehaved_is_refused_until_its_backoff_ends() -> None:
    t = table(backoff_base=10.0)
    t.learn(A, ["127.0.0.1:1"], "exchange")
    t.on_connected(A, outbound=False, wall=1.0)
    peer = t.on_disconnected(A, 100.0, random.Random(1), failed=True, misbehaved=True)
    assert peer is not None and peer.failures == 1
    assert not t.admits(A, 100.0) and not t.admits(A, peer.next_dial - 0.001)
    assert t.admits(A, peer.next_dial) and t.admits(B, 100.0)
    t.on_connected(A, outbound=True, wall=2.0)
    t.on_disconnected(A, 200.0, random.Random(1), failed=True)
    assert t.admits(A, 200.0)  # unanswered heartbeats are no misbehaviour


def test_a_lost_link_redials_after_a_delay() -> None:
    t = table(backoff_base=1.0)
    t.learn(A, ["127.0.0.1:1"], "exchange")
    t.on_connected(A, outbound=True, wall=1.0)
    rng = random.Random(2)
    peer = t.on_disconnected(A, 10.0, rng, failed=False)
    assert peer is not None and peer.failures == 0
    assert t.due_dials(10.5, rng) == []
    assert [d.node_id for d in t.due_dials(11.0, rng)] == [A]


def test_contacts_shared_are_unexpired_and_never_the_recipients_own() -> None:
    t = table()
    for key, expires, connected in (
        (A, 100, True),
        (B, 100, False),
        (C, 5, True),
        (D, 100, True),
        (E, 100, True),
    ):
        peer = t.learn(
            key, ["127.0.0.8:1"], "exchange", contact=b"contact-" + key[:1], contact_expires=expires
        )
        assert peer is not None
        if key != E:  # E's address was never confirmed by a handshake: not passed on
            peer.verified.add("127.0.0.8:1")
        if connected:
            t.on_connected(key, outbound=True, wall=1.0)
    shared = t.contacts_to_share(random.Random(1), now_ms=50, exclude=A, limit=10)
    assert sorted(shared) == [b"contact-\x02", b"contact-\x04"]
    assert shared[0] == b"contact-\x04"  # connected peers first
    assert t.contacts_to_share(random.Random(1), now_ms=50, exclude=A, limit=1) == [b"contact-\x04"]


def test_a_full_table_ignores_strangers_met_through_others_and_makes_room_for_the_operators() -> None:
    forgotten: list[bytes] = []
    t = PeerTable(LOCAL, PeerSettings(max_peers=2), dial_private=True, on_forget=forgotten.append)
    t.learn(A, ["127.0.0.1:1"], "exchange")
    t.learn(B, ["127.0.0.2:1"], "exchange")
    assert t.learn(C, ["127.0.0.3:1"], "exchange") is None and t.learn(C, ["127.0.0.3:1"], "mdns") is None
    assert t.learn(A, ["127.0.0.1:2"], "exchange") is not None  # known peers still update
    t.add_bootstrap("127.0.0.4:1", D)  # the operator's peer displaces the stalest stranger
    assert set(t.peers) == {A, D} and forgotten == [B]
    t.on_connected(E, outbound=False, wall=1.0)  # an inbound stranger displaces an unconfirmed one
    assert set(t.peers) == {D, E} and forgotten == [B, A]
    t.on_connected(C, outbound=False, wall=1.0)  # nothing left to displace: kept while linked
    assert set(t.peers) == {C, D, E}
    t.on_disconnected(C, 2.0, random.Random(1), failed=True)
    assert set(t.peers) == {D, E} and forgotten == [B, A, C]


def test_a_newer_contact_replaces_an_older_one_only() -> None:
    t = table()
    t.learn(A, ["127.0.0.8:1"], "exchange", contact=b"new", contact_expires=200)
    t.learn(A, ["127.0.0.8:1"], "exchange", contact=b"old", contact_expires=100)
    assert t.peers[A].contact == b"new"


def test_peers_that_keep_failing_are_forgotten_but_bootstrap_peers_never() -> None:
    t = table(forget_after_failures=3, forget_after=100.0)
    t.learn(A, ["127.0.0.1:1"], "exchange", last_seen=0.0, failures=3)
    t.learn(B, ["127.0.0.2:1"], "exchange", last_seen=950.0, failures=3)
    t.learn(C, ["127.0.0.3:1"], "exchange", last_seen=0.0, failures=1)
    t.add_bootstrap("127.0.0.4:1", D)
    t.peers[D].failures, t.peers[D].last_seen = 50, 0.0
    assert t.expired(1000.0) == [A]


def test_settings_reject_inconsistent_values() -> None:
    with pytest.raises(ValueError):
        PeerSettings(suspect_after=3, dead_after=3)
    with pytest.raises(ValueError):
        PeerSettings(heartbeat_interval=0)
    fast = PeerSettings.fast(0.2)
    assert fast.heartbeat_interval == 0.2 and fast.exchange_interval > fast.heartbeat_interval


def test_connection_bookkeeping_over_many_random_events_stays_consistent() -> None:
    rng = random.Random(11)
    t = table(target_degree=2, backoff_base=0.5, backoff_max=4.0)
    keys = [bytes([i]) * 32 for i in range(1, 8)]
    for i, key in enumerate(keys):
        t.learn(key, [f"127.0.0.8:{i + 1}"], "exchange")
    now = 0.0
    for step in itertools.count():
        if step == 400:
            break
        now += rng.random()
        for d in t.due_dials(now, rng):
            assert d.node_id is not None
            if rng.random() < 0.5:
                t.dial_failed(d, now, rng)
            else:
                t.dial_succeeded(d, d.node_id)
                t.on_connected(d.node_id, outbound=True, wall=now)
        for key in keys:
            if t.peers[key].connected and rng.random() < 0.2:
                t.on_disconnected(key, now, rng, failed=rng.random() < 0.5)
        assert t.connected_count() <= 2
        assert not any(p.connected and p.dialing for p in t.peers.values())


# --- this node's contact record and peer exchange, without links ---------------------------------------


def test_a_wildcard_listener_advertises_the_hosts_peers_reached_most_recent_first_loopback_last() -> None:
    key = SigningKey.generate()
    now = [1000.0]
    own = OwnContact(identity=key, network="main", listen_host="0.0.0.0", ttl=600.0, wall=lambda: now[0])
    own.observe("192.0.2.1")
    assert own.record is None and own.addresses() == ()  # nothing before the listener is bound
    assert own.bind("0.0.0.0", 7531) == "0.0.0.0:7531"
    for host in ("127.0.0.1", "2001:db8::1", "192.0.2.1"):
        own.observe(host)
    assert own.addresses() == ("192.0.2.1:7531", "[2001:db8::1]:7531", "127.0.0.1:7531")
    first = own.record
    assert first is not None and verify(first, Contact).message.addresses == own.addresses()
    now[0] += 299  # within half the record's life and the same addresses: not signed again
    own.refresh()
    assert own.record == first
    now[0] += 2
    own.refresh()
    assert own.record != first and verify(own.record or b"", Contact).message.expires == (1301 + 600) * 1000


def test_a_named_listener_advertises_its_bound_address_only() -> None:
    own = OwnContact(
        identity=SigningKey.generate(), network="main", listen_host="127.0.0.1", ttl=600.0, wall=time.time
    )
    own.bind("127.0.0.1", 7531)
    own.observe("192.0.2.1")
    assert own.addresses() == ("127.0.0.1:7531",)


def test_peer_exchange_sends_its_own_record_first_and_reports_what_it_learned() -> None:
    key, sender, other = SigningKey.generate(), SigningKey.generate(), SigningKey.generate()
    local, them = bytes(key.verify_key), bytes(sender.verify_key)
    table = PeerTable(local, PeerSettings())
    mine = contact(key, "127.0.0.1:1")
    exchange = PeerExchange(
        identity=key,
        network="main",
        table=table,
        settings=PeerSettings(),
        own_contact=lambda: mine,
        wall=time.time,
        rng=random.Random(1),
    )
    message = verify(exchange.message_for(them) or b"", Peers).message
    assert message.contacts == (mine,)
    records = (contact(sender, "127.0.0.1:2"), contact(other, "127.0.0.1:3"), mine)
    peers = Peers("main", node_id_of(sender), records, int((time.time() + 60) * 1000))
    learned = exchange.receive(them, True, peers)
    assert learned == Learned((them, bytes(other.verify_key)), 2)
    assert table.peers[them].source == "inbound" and table.peers[bytes(other.verify_key)].source == "exchange"
    assert local not in table.peers
    assert exchange.receive(them, True, peers) == Learned((), 0)  # the same records again teach nothing


# --- the peering service over real links on 127.0.0.1 ------------------------------------------------
# Real sockets and the real clock with short intervals; every wait is bounded, and the assertions are
# about what happens, never about how fast.

FAST = PeerSettings.fast(0.05)
SAFETY = 15.0


def _config(data_dir: Path, network: str = "main") -> NodeConfig:
    return NodeConfig(
        data_dir=data_dir, listen=Address("127.0.0.1", 0), network=network, mdns=False, dial_private=True
    )


@asynccontextmanager
async def running(tmp_path: Path, name: str, settings: PeerSettings = FAST) -> AsyncIterator[PeerService]:
    store = AsyncStore(Store(tmp_path / f"{name}.sqlite"))
    service = PeerService(
        identity=SigningKey.generate(), config=_config(tmp_path / name), store=store, settings=settings
    )
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(service.run)
            yield service
            nursery.cancel_scope.cancel()
    finally:
        await store.aclose()


async def until(condition: Callable[[], object], what: str) -> None:
    with trio.fail_after(SAFETY):
        while True:
            if condition():
                return
            await trio.sleep(0.01)
    raise AssertionError(what)


@asynccontextmanager
async def raw_link(
    service: PeerService, key: SigningKey | None = None, network: str = "main"
) -> AsyncIterator[Connection]:
    """A hand-driven peer: a transport connection to `service` that does only what the test says."""
    assert service.listen is not None
    host, port = split_address(service.listen)
    conn = await dial(host, port, identity=key or SigningKey.generate(), network=network)
    async with trio.open_nursery() as nursery:
        await nursery.start(conn.run)
        try:
            yield conn
        finally:
            await conn.aclose()


def contact(key: SigningKey, address: str, *, network: str = "main", expires_in: float = 600.0) -> bytes:
    expires = int((time.time() + expires_in) * 1000)
    return sign_message(Contact(network, node_id_of(key), (address,), expires), key)


async def test_two_services_link_and_answer_each_others_heartbeats(tmp_path: Path) -> None:
    async with running(tmp_path, "a") as a, running(tmp_path, "b") as b:
        assert b.listen is not None
        a.table.learn(b.local, [b.listen], "manual")
        await until(lambda: a.local in b.links and b.local in a.links, "a link")
        await until(lambda: a.links[b.local].liveness.rtt is not None, "a heartbeat answered")
        assert a.table.peers[b.local].state(trio.current_time()) is PeerState.CONNECTED
        docs = a.peer_docs()
        assert [d["node_id"] for d in docs] == [b.node_id]
        # b confirms a's address by dialing it: one of the two links stays, at both ends
        assert docs[0]["direction"] in ("outbound", "inbound") and docs[0]["address"] == b.listen
        # b learned a's listen address from a's signed contact record
        await until(lambda: b.table.peers[a.local].addresses == [a.listen], "a's contact at b")
        assert a.counts()["connected"] == 1


async def test_crossing_dials_leave_one_link_that_both_ends_agree_on(tmp_path: Path) -> None:
    for round_ in range(3):
        async with running(tmp_path, f"a{round_}") as a, running(tmp_path, f"b{round_}") as b:
            assert a.listen is not None and b.listen is not None
            a.table.learn(b.local, [b.listen], "manual")
            b.table.learn(a.local, [a.listen], "manual")
            a.dialer.wake()
            b.dialer.wake()

            def settled(a: PeerService = a, b: PeerService = b) -> bool:
                la, lb = a.links.get(b.local), b.links.get(a.local)
                return (
                    la is not None and lb is not None and la.conn.transcript_hash == lb.conn.transcript_hash
                )

            await until(settled, "one shared link")
            kept = a.links[b.local]
            await trio.sleep(0.3)  # several heartbeats later it is still that same link
            assert a.links[b.local] is kept and settled()


async def test_a_silent_peer_becomes_suspect_and_is_then_dropped(tmp_path: Path) -> None:
    async with running(tmp_path, "a") as a:
        silent = SigningKey.generate()
        key = bytes(silent.verify_key)
        seen_suspect = False
        async with raw_link(a, silent) as conn:
            await until(lambda: key in a.links, "the link")
            with trio.fail_after(SAFETY):
                while key in a.links:
                    seen_suspect = seen_suspect or a.table.peers[key].suspect
                    await trio.sleep(0.005)
            await until(lambda: conn.closed, "the connection closed")
        assert seen_suspect
        assert a.table.peers[key].failures == 1


async def test_a_peer_sending_garbage_loses_its_link(tmp_path: Path) -> None:
    async with running(tmp_path, "a") as a, raw_link(a) as conn:
        await conn.send(b"\x93not an envelope")
        await until(lambda: conn.closed, "the link closed")
        assert not a.links


async def test_a_ping_signed_by_another_node_loses_the_link(tmp_path: Path) -> None:
    async with running(tmp_path, "a") as a:
        other = SigningKey.generate()
        async with raw_link(a) as conn:
            ping = Ping("main", node_id_of(other), b"n" * 16, int((time.time() + 60) * 1000))
            await conn.send(sign_message(ping, other))
            await until(lambda: conn.closed, "the link closed")
        assert not a.links


async def test_peer_exchange_keeps_only_valid_fresh_contacts_of_its_network(tmp_path: Path) -> None:
    async with running(tmp_path, "a") as a:
        sender, good, foreign, stale = (SigningKey.generate() for _ in range(4))
        forged = bytearray(contact(SigningKey.generate(), "127.0.0.1:9"))
        forged[-1] ^= 1
        records = (
            contact(sender, "127.0.0.1:1"),
            contact(good, "127.0.0.1:2"),
            contact(foreign, "127.0.0.1:3", network="other"),
            contact(stale, "127.0.0.1:4", expires_in=-5),
            bytes(forged),
        )
        message = Peers("main", node_id_of(sender), records, int((time.time() + 60) * 1000))
        async with raw_link(a, sender) as conn:
            await conn.send(sign_message(message, sender))
            await until(lambda: bytes(good.verify_key) in a.table.peers, "the good contact")
            assert a.table.peers[bytes(sender.verify_key)].addresses == ["127.0.0.1:1"]
            learned = a.table.peers[bytes(good.verify_key)]
            assert learned.source == "exchange" and learned.addresses == ["127.0.0.1:2"]
            assert set(a.table.peers) == {bytes(sender.verify_key), bytes(good.verify_key)}
            assert a.links  # invalid records are ignored; the sender keeps its link

            def stored() -> set[str]:
                return {row.node_id for row in a.persistence.store.store.peers("main")}

            await until(lambda: str(node_id_of(good)) in stored(), "the contact stored")
            assert str(node_id_of(foreign)) not in stored()


async def test_listeners_hear_links_and_every_other_message_kind(tmp_path: Path) -> None:
    events: list[tuple[str, bytes]] = []
    raws: list[bytes] = []

    class Listener:
        def link_up(self, peer: bytes, send: Callable[[bytes], Awaitable[None]]) -> None:
            events.append(("up", peer))

        def link_down(self, peer: bytes) -> None:
            events.append(("down", peer))

        async def message(self, peer: bytes, raw: bytes) -> None:
            raws.append(raw)

    async with running(tmp_path, "a") as a:
        a.add_listener(Listener())
        key = SigningKey.generate()
        peer = bytes(key.verify_key)
        expires = int(time.time() * 1000) + 60_000
        cancel = Cancel("main", Digest(b"j" * 32), node_id_of(key), expires, "withdrawn", "")
        offer = sign_message(cancel, key)
        async with raw_link(a, key) as conn:
            await until(lambda: events == [("up", peer)], "link_up")
            await conn.send(offer)
            await until(lambda: raws == [offer], "the message handed on")
        await until(lambda: events == [("up", peer), ("down", peer)], "link_down")
        assert await a.send(peer, offer) is False


async def test_a_discovered_peer_is_dialed_and_a_disconnected_one_backs_off(tmp_path: Path) -> None:
    settings = PeerSettings(heartbeat_interval=0.05, backoff_base=30.0, dial_tick=0.02)
    async with running(tmp_path, "a", settings) as a, running(tmp_path, "b") as b:
        assert b.listen is not None
        a.discovered(b.local, [b.listen], "mdns")
        await until(lambda: b.local in a.links, "the link")
        assert a.table.peers[b.local].source == "mdns"
        await until(lambda: a.local in b.table.peers and b.table.peers[a.local].addresses, "a's contact at b")
        a.disconnect(b.local, "misbehaved")
        await until(lambda: b.local not in a.links, "the link closed")
        peer = a.table.peers[b.local]
        assert peer.failures == 1
        assert peer.state(trio.current_time()) is PeerState.BACKOFF
        # a does not redial during the backoff, and refuses b's own attempts to come back, which b
        # counts as failures and backs off from
        await until(lambda: b.table.peers[a.local].failures >= 1, "b's attempt to come back refused")
        assert b.local not in a.links


# --- the same service over memory links, on trio's virtual clock ---------------------------------------
# A MemoryConnection stands in for a transport Connection (peering.LinkConnection: run, send, iteration,
# aclose), so the link logic runs under autojump_clock with the production settings and no waiting.


class MemoryConnection:
    def __init__(
        self,
        peer_key: bytes,
        initiator: bool,
        inbox: trio.MemoryReceiveChannel[bytes],
        outbox: trio.MemorySendChannel[bytes],
    ) -> None:
        self.peer_key = peer_key
        self.initiator = initiator
        self.remote_address = ("127.0.0.1", 1)
        self.local_address = ("", 0)
        self.close_reason: str | None = None
        self._inbox, self._outbox = inbox, outbox
        self._closed = trio.Event()

    @property
    def closed(self) -> bool:
        return self.close_reason is not None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        await self._closed.wait()

    async def send(self, message: bytes) -> None:
        if self.closed:
            raise ConnectionClosed(self.close_reason or "closed")
        try:
            self._outbox.send_nowait(message)
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            await self.aclose("the peer went away")
            raise ConnectionClosed("the peer went away") from None

    def __aiter__(self) -> MemoryConnection:
        return self

    async def __anext__(self) -> bytes:
        if self.closed:
            raise StopAsyncIteration
        try:
            return await self._inbox.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            await self.aclose("the peer closed the connection")
            raise StopAsyncIteration from None

    async def aclose(self, reason: str = "closed locally") -> None:
        if self.close_reason is None:
            self.close_reason = reason
            self._outbox.close()
            self._inbox.close()
            self._closed.set()
        await trio.lowlevel.checkpoint()


def memory_pair(a: bytes, b: bytes) -> tuple[MemoryConnection, MemoryConnection]:
    """A's end (dialed by a, so its peer is b) and b's end."""
    a_out, b_in = trio.open_memory_channel[bytes](1000)
    b_out, a_in = trio.open_memory_channel[bytes](1000)
    return MemoryConnection(b, True, a_in, a_out), MemoryConnection(a, False, b_in, b_out)


def service(tmp_path: Path, name: str, settings: PeerSettings | None = None) -> PeerService:
    store = AsyncStore(Store(tmp_path / f"{name}.sqlite"))
    return PeerService(
        identity=SigningKey.generate(),
        config=_config(tmp_path / name),
        store=store,
        settings=settings or PeerSettings(),
    )


@dataclass
class ScriptedPeer:
    """The far end of one of `a`'s links, played by the test: it answers no ping, records the kinds of
    what `a` sends it, and speaks when told to."""

    a: PeerService
    key: SigningKey
    mine: MemoryConnection
    theirs: MemoryConnection
    kinds: list[str]

    @property
    def peer(self) -> bytes:
        return bytes(self.key.verify_key)

    def suspect(self) -> bool:
        row = self.a.table.peers.get(self.peer)
        return row is not None and row.suspect

    async def speak(self) -> float:
        """Send `a` one message that is not a heartbeat (a `cancel`); returns when it went."""
        expires = int(time.time() * 1000) + 60_000
        cancel = Cancel("main", Digest(b"j" * 32), node_id_of(self.key), expires, "withdrawn", "")
        await self.theirs.send(sign_message(cancel, self.key))
        return trio.current_time()

    async def until_suspect(self) -> None:
        with trio.fail_after(4 * 15):  # two heartbeats missed
            while not self.suspect():  # noqa: ASYNC110 (polled)
                await trio.sleep(0.5)

    async def until_closed(self) -> tuple[float | None, float]:
        """Wait for `a` to close the link: when it fell suspect (None: never) and when it closed."""
        suspect_at = None
        while not self.mine.closed:
            await trio.sleep(0.5)
            if self.suspect() and suspect_at is None:
                suspect_at = trio.current_time()
        return suspect_at, trio.current_time()

    async def next_ping(self) -> None:
        seen = self.kinds.count("ping")
        with trio.fail_after(2 * 15):
            while self.kinds.count("ping") == seen:  # noqa: ASYNC110 (polled)
                await trio.sleep(0.1)


@asynccontextmanager
async def scripted_peer(tmp_path: Path) -> AsyncIterator[ScriptedPeer]:
    """`a` (the production settings: a heartbeat every 15 s, +-10%) linked to a ScriptedPeer."""
    a = service(tmp_path, "a")
    key = SigningKey.generate()
    mine, theirs = memory_pair(a.local, bytes(key.verify_key))
    far = ScriptedPeer(a, key, mine, theirs, [])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(a.run_link, mine, outbound=True))

        async def listen() -> None:
            async for raw in theirs:
                far.kinds.append(verify(raw).kind)

        nursery.start_soon(listen)
        yield far
        nursery.cancel_scope.cancel()


async def test_a_busy_link_carries_few_heartbeats_and_falls_suspect_once_it_goes_quiet(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A peer that answers no ping, silent at first (suspect), then sending a message every 5 s: alive
    again while it speaks (pinged only every RTT_REFRESH intervals, for the round trip), then suspect
    and dropped on the same count of missed heartbeats as a silent peer."""
    busy_for = 600.0
    async with scripted_peer(tmp_path) as far:
        await far.until_suspect()
        far.kinds.clear()
        start = last_frame = trio.current_time()
        while trio.current_time() - start < busy_for:
            last_frame = await far.speak()
            await trio.sleep(5.0)
            assert not far.mine.closed
            if trio.current_time() - start > 1.1 * 15:  # (its heartbeat task sees it alive again)
                assert not far.suspect()
        pings_while_busy = far.kinds.count("ping")
        suspect_at, closed_at = await far.until_closed()
    # a ping at the start, then one per RTT_REFRESH intervals: not one per 15 s (40)
    assert 1 <= pings_while_busy <= busy_for / (RTT_REFRESH * 15 * 0.9) + 2
    # from its last frame: a tick within half an interval of it skips its ping (up to 7.5 s, 1.1 with
    # jitter), then two (four) pings go unanswered, a tick apart
    assert suspect_at is not None
    assert last_frame + 2 * 15 * 0.9 <= suspect_at <= last_frame + 7.5 * 1.1 + 3 * 15 * 1.1 + 0.5
    assert last_frame + 4 * 15 * 0.9 <= closed_at <= last_frame + 7.5 * 1.1 + 5 * 15 * 1.1 + 0.5
    assert far.a.links == {}


async def test_a_suspect_peer_heard_from_again_is_alive_at_the_next_heartbeat_even_one_that_pings(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A suspect peer that speaks once, right after a ping (so the next heartbeat, an interval later,
    still pings: the link was quiet for over half an interval), is no longer suspect after that tick,
    though it answers no ping."""
    async with scripted_peer(tmp_path) as far:
        await far.until_suspect()
        await far.next_ping()
        await far.speak()
        await far.next_ping()  # this tick pings (nothing heard for an interval) and finds it heard since
        assert not far.suspect() and not far.mine.closed


async def test_a_silent_peer_is_suspect_after_two_missed_heartbeats_and_dropped_after_four(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async with scripted_peer(tmp_path) as far:
        suspect_at, closed_at = await far.until_closed()
    assert suspect_at is not None and 3 * 15 * 0.9 <= suspect_at <= 3 * 15 * 1.1 + 0.5
    assert 5 * 15 * 0.9 <= closed_at <= 5 * 15 * 1.1 + 0.5
    assert far.kinds == ["ping"] * 4  # nothing to share yet: no contact record without a listen address
    assert far.a.table.peers[far.peer].failures == 1
    assert far.a.links == {}


async def test_two_linked_services_stay_linked_for_an_hour_and_share_what_they_know(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    a, b = service(tmp_path, "a"), service(tmp_path, "b")
    third = SigningKey.generate()
    record = contact(third, "127.0.0.1:7532", expires_in=7200)
    known = a.table.learn(
        bytes(third.verify_key),
        ["127.0.0.1:7532"],
        "exchange",
        contact=record,
        contact_expires=int((time.time() + 7200) * 1000),
    )
    assert known is not None
    known.verified.add("127.0.0.1:7532")  # a reached it there once: its record is passed on
    for s in (a, b):
        s.contact.bind("127.0.0.1", 7531)  # as `run` does once listening: gives each a record to advertise
    mine, theirs = memory_pair(a.local, b.local)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(a.run_link, mine, outbound=True))
        nursery.start_soon(partial(b.run_link, theirs, outbound=False))
        await trio.sleep(3600)
        assert b.local in a.links and a.local in b.links
        assert a.links[b.local].liveness.missed == 0 and a.links[b.local].liveness.rtt is not None
        assert not a.table.peers[b.local].suspect
        learned = b.table.peers.get(bytes(third.verify_key))
        assert learned is not None and learned.contact == record and learned.source == "exchange"
        assert b.table.peers[a.local].addresses == ["127.0.0.1:7531"]
        nursery.cancel_scope.cancel()
