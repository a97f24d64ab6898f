"""Strangers: peer rows capped and evicted by rank, and contact records treated as hints (a dial budget,
confirmation by handshake, only confirmed addresses passed on, only allowed ranges dialed).

Pure table decisions first, then real sockets on 127.0.0.1, then a real node process."""

from __future__ import annotations

import dataclasses
import json
import random
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import trio
from e31.node.config import Address, NodeConfig
from e31.node.net.addresses import dial_refusal
from e31.node.net.peering import PeerService
from e31.node.net.peers import Dial, PeerSettings, PeerTable
from e31.node.store.async_store import AsyncStore
from e31.node.store.db import Store
from e31.protocol.envelope import node_id_of, sign_message
from e31.protocol.messages import Contact, Peers
from nacl.signing import SigningKey

LOCAL = bytes([9]) * 32
ROOT = Path(__file__).resolve().parents[2]


def key(i: int) -> bytes:
    return i.to_bytes(32, "big")


# --- the cap ------------------------------------------------------------------------------------------


def test_inbound_strangers_beyond_the_cap_evict_each_other_never_the_useful_peers() -> None:
    forgotten: list[bytes] = []
    t = PeerTable(LOCAL, PeerSettings(max_peers=50), dial_private=True, on_forget=forgotten.append)
    rng = random.Random(1)
    t.add_bootstrap("127.0.0.1:1", key(1))
    t.learn(key(2), ["127.0.0.1:2"], "exchange")
    (dial,) = [d for d in t.due_dials(0.0, rng) if d.node_id == key(2)]
    t.dial_succeeded(dial, key(2))  # dialed, and it answered
    t.on_connected(key(2), outbound=True, wall=1.0)
    t.on_disconnected(key(2), 1.0, rng, failed=False)
    t.on_connected(key(3), outbound=False, wall=1.0)
    t.vouch(key(3))  # it did work with this node
    t.on_disconnected(key(3), 1.0, rng, failed=False)
    for i in range(100, 5100):
        t.on_connected(key(i), outbound=False, wall=float(i))
        t.on_disconnected(key(i), float(i), rng, failed=True)
        assert len(t.peers) <= 50
    assert {key(1), key(2), key(3)} <= set(t.peers)
    assert len(forgotten) == 5000 + 3 - 50
    assert key(5099) in t.peers and key(100) not in t.peers  # the oldest strangers went first


def test_strangers_records_do_not_displace_peers_worth_more() -> None:
    t = PeerTable(LOCAL, PeerSettings(max_peers=3), dial_private=True)
    for i in (1, 2, 3):
        t.learn(key(i), [f"127.0.0.1:{i}"], "exchange")
        t.peers[key(i)].verified.add(f"127.0.0.1:{i}")
        t.vouch(key(i))
    assert t.learn(key(4), ["127.0.0.1:4"], "exchange") is None
    assert set(t.peers) == {key(1), key(2), key(3)}


def test_the_store_caps_its_rows_and_keeps_the_operators(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.sqlite")
    try:
        store.upsert_peer("boot", "main", ["127.0.0.1:1"], "bootstrap", 0.0, max_rows=10)
        for i in range(200):
            source = "inbound" if i % 2 else "exchange"
            store.upsert_peer(f"p{i}", "main", [f"127.0.0.1:{i + 2}"], source, float(i + 1), max_rows=10)
            assert store.count_peers("main") <= 10
        names = {row.node_id for row in store.peers("main")}
        # inbound-only rows go first (the newest row stays): the operator's, the newest, 8 exchanged ones
        assert names == {"boot", "p199", *(f"p{i}" for i in range(184, 199, 2))}
        assert store.trim_peers("main", 3) == 7 and store.count_peers("main") == 3
    finally:
        store.close()


def test_a_full_table_dials_in_proportion_to_what_can_be_dialed() -> None:
    t = PeerTable(LOCAL, PeerSettings(max_peers=10_000, target_degree=2), dial_private=True)
    rng = random.Random(1)
    for i in range(10, 10_010):  # inbound-only strangers: nothing to dial
        t.on_connected(key(i), outbound=False, wall=1.0)
        t.on_disconnected(key(i), 0.0, rng, failed=True)
    t.learn(key(1), ["127.0.0.1:1"], "exchange")
    t.peers[key(1)].verified.add("127.0.0.1:1")
    assert len(t._ready) + len(t._waiting) <= 2  # only the dialable peer is indexed
    assert [d.node_id for d in t.due_dials(1000.0, rng)] == [key(1)]


# --- addresses: allowed ranges, a budget, confirmation, what is passed on --------------------------------


def test_special_purpose_addresses_are_refused_unless_allowed() -> None:
    for address in ("127.0.0.1:7531", "[::1]:7531", "10.1.2.3:7531", "192.168.0.1:1", "172.16.0.1:1",
                    "[fd00::1]:1", "[fe80::1]:1", "169.254.0.1:1", "100.64.0.1:1", "192.0.2.7:7531",
                    "[2001:db8::7]:7531", "[::ffff:127.0.0.1]:1", "0.0.0.0:1"):  # fmt: skip
        assert dial_refusal(address, allow_private=False) is not None, address
    assert dial_refusal("127.0.0.1:7531", allow_private=True) is None
    for address in ("224.0.0.251:5353", "255.255.255.255:1", "[::]:1", "127.0.0.1:0", "host.example:7531"):
        assert dial_refusal(address, allow_private=True) is not None, address


def test_without_dial_private_a_strangers_loopback_record_is_never_dialed_but_the_operators_is() -> None:
    t = PeerTable(LOCAL, PeerSettings(), dial_private=False)
    t.learn(key(1), ["127.0.0.1:7531", "10.0.0.1:7531"], "exchange", contact=b"c", contact_expires=10**15)
    t.add_bootstrap("127.0.0.1:7532", key(2))
    t.add_bootstrap("localhost:7533", None)
    dials = t.due_dials(0.0, random.Random(1))
    assert set(dials) == {Dial("127.0.0.1:7532", key(2), True), Dial("localhost:7533", None, True)}


def test_unconfirmed_addresses_are_dialed_within_a_global_and_a_per_record_budget() -> None:
    s = PeerSettings(target_degree=100, unverified_burst=5, unverified_dials_per_minute=6.0)
    t = PeerTable(LOCAL, s, dial_private=True)
    rng = random.Random(1)
    for i in range(1, 41):
        t.learn(key(i), [f"127.0.0.1:{1000 + i}"], "exchange")
    first = t.due_dials(0.0, rng)
    assert len(first) == 5  # the burst
    assert t.due_dials(1.0, rng) == []  # 6 a minute: none yet
    assert len(t.due_dials(11.0, rng)) == 1
    for d in first:
        peer = t.dial_failed(d, 11.0, rng)
        assert peer is not None and peer.next_dial >= 11.0 + s.unverified_retry  # one try, then back off
    dialed = {d.node_id for d in t.due_dials(600.0, rng)}
    assert not dialed & {d.node_id for d in first}


def test_only_confirmed_addresses_are_passed_on() -> None:
    t = PeerTable(LOCAL, PeerSettings(), dial_private=True)
    rng = random.Random(1)
    t.learn(key(1), ["127.0.0.1:1"], "exchange", contact=b"one", contact_expires=10**15)
    t.learn(key(2), ["127.0.0.1:2"], "exchange", contact=b"two", contact_expires=10**15)
    assert t.contacts_to_share(rng, 0, exclude=LOCAL, limit=10) == []
    dial = next(d for d in t.due_dials(0.0, rng) if d.node_id == key(1))
    t.dial_succeeded(dial, key(1))
    assert t.peers[key(1)].verified == {"127.0.0.1:1"}
    assert t.contacts_to_share(rng, 0, exclude=LOCAL, limit=10) == [b"one"]


def _config(data_dir: Path, dial_private: bool) -> NodeConfig:
    return NodeConfig(
        data_dir=data_dir, listen=Address("127.0.0.1", 0), mdns=False, dial_private=dial_private
    )


async def _stranger_names(service: PeerService, stranger: SigningKey, named: str) -> None:
    """A stranger links to `service` and sends a record of a throwaway key naming `named`."""
    from e31.node.net.addresses import split_address
    from e31.node.net.transport import dial

    assert service.listen is not None
    host, port = split_address(service.listen)
    expires = int((time.time() + 600) * 1000)
    throwaway = SigningKey.generate()
    records = tuple(
        sign_message(Contact("main", node_id_of(k), (named,), expires), k) for k in (stranger, throwaway)
    )
    conn = await dial(host, port, identity=stranger, network="main")
    async with trio.open_nursery() as nursery:
        await nursery.start(conn.run)
        await conn.send(sign_message(Peers("main", node_id_of(stranger), records, expires), stranger))
        with trio.fail_after(10):
            while bytes(throwaway.verify_key) not in service.table.peers:  # noqa: ASYNC110 (polls state)
                await trio.sleep(0.01)
        await trio.sleep(0.5)  # some dial ticks
        await conn.aclose()
        nursery.cancel_scope.cancel()


async def _accepts_while(service_config: NodeConfig, tmp_path: Path) -> tuple[int, PeerService]:
    accepts = 0

    async def count(stream: trio.SocketStream) -> None:
        nonlocal accepts
        accepts += 1
        await stream.aclose()

    store = AsyncStore(Store(tmp_path / "a.sqlite"))
    service = PeerService(
        identity=SigningKey.generate(),
        config=service_config,
        store=store,
        settings=dataclasses.replace(PeerSettings.fast(0.05), unverified_retry=600.0),
    )
    try:
        async with trio.open_nursery() as nursery:
            (listener,) = await nursery.start(partial(trio.serve_tcp, count, 0, host="127.0.0.1"))
            target = f"127.0.0.1:{listener.socket.getsockname()[1]}"
            await nursery.start(service.run)
            await _stranger_names(service, SigningKey.generate(), target)
            nursery.cancel_scope.cancel()
    finally:
        await store.aclose()
    return accepts, service


async def test_a_node_never_dials_a_loopback_address_a_stranger_names_unless_allowed(tmp_path: Path) -> None:
    accepts, service = await _accepts_while(_config(tmp_path / "a", dial_private=False), tmp_path)
    assert accepts == 0
    assert all(not p.verified for p in service.table.peers.values())


async def test_with_dial_private_a_named_address_is_tried_once_and_not_confirmed_by_a_liar(
    tmp_path: Path,
) -> None:
    accepts, service = await _accepts_while(_config(tmp_path / "a", dial_private=True), tmp_path)
    assert 1 <= accepts <= 2  # the stranger's probe and the throwaway key's dial: once each, no retries
    assert all(not p.verified for p in service.table.peers.values())  # nobody there answered as them
    assert service.exchange.message_for(LOCAL) is not None
    shared = service.table.contacts_to_share(random.Random(1), 0, exclude=LOCAL, limit=16)
    assert shared == []


# --- a real node process -------------------------------------------------------------------------------


def test_a_node_process_keeps_its_peer_table_and_rows_at_the_cap_through_2000_strangers() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tests" / "bench" / "bench_strangers.py"),
            "--handshakes",
            "2000",
            "--warmup",
            "500",
            "--max-peers",
            "200",
            "--record-every",
            "4",
            "--samples",
            "3",
            "--deadline",
            "120",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode in (0, 1), proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["sent"] == 2000 and out["succeeded"] >= 1900
    assert out["worst_table"] <= 200 and out["after"]["table"] == 200  # at the cap, never above
    assert 0 < out["worst_rows"] <= 200
    assert out["exit_code"] == 0
