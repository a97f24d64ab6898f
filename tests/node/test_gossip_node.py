"""The gossip service over in-process links (memory channels, autojump clock): dissemination,
bad senders cut off while the rest keep working, slow peers and slow subscribers."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import nacl.signing
import pytest
import trio
import trio.testing
from e31.node.net.gossip import GossipService, Send
from e31.protocol.blobs import chunk_list
from e31.protocol.envelope import node_id_of, sign_message
from e31.protocol.gossip import GossipConfig, GossipEngine
from e31.protocol.ids import sha256
from e31.protocol.jobs import JobManifest, Limits
from e31.protocol.messages import BY_JOB, MAX_SET, Capacity, Offer, Ping

NET = "testnet"
T0 = 1_800_000_000_000
PROFILE = sha256(b"profile")


def key(name: str) -> nacl.signing.SigningKey:
    return nacl.signing.SigningKey(sha256(b"gossip node test " + name.encode()).raw)


def capacity(signer: str, *, n: int = 0, expires_in: int = 60_000) -> bytes:
    k = key(signer)
    return sign_message(Capacity(NET, node_id_of(k), now() + expires_in, 2, 1 << 30, (PROFILE,), n, 0), k)


def offer(submitter: str, jobs: int = MAX_SET) -> bytes:
    """An offer of `jobs` tiny jobs (a whole set by default)."""
    k = key(submitter)
    manifests = [
        JobManifest(
            module=chunk_list(b"\x00asm\x01\x00\x00\x00").ref,
            inputs=(),
            args=(),
            env=(),
            stdin=None,
            limits=Limits(fuel=10**6, memory_bytes=1 << 20, wall_ms=1000, max_output_bytes=1 << 10),
            deadline=now() + 3_600_000,
            retention_ms=60_000,
            replicas=1,
            profile=PROFILE,
            submitter=node_id_of(k),
            nonce=i.to_bytes(16, "big"),
            created_at=now(),
        )
        for i in range(jobs)
    ]
    return sign_message(Offer(NET, now() + 60_000, node_id_of(k), tuple(sorted(manifests, key=BY_JOB))), k)


def now() -> int:
    return T0 + int(trio.current_time() * 1000)


@dataclass
class Node:
    name: str
    service: GossipService[str]
    inbox: trio.MemorySendChannel[tuple[str, bytes]]
    disconnects: list[tuple[str, str]] = field(default_factory=list)

    def link_send(self, sender: str) -> Send:
        async def send(raw: bytes) -> None:
            await self.inbox.send((sender, raw))

        return send


async def start_node(nursery: trio.Nursery, name: str, **changes: Any) -> Node:
    service_args = {k: changes.pop(k) for k in ("send_buffer", "send_timeout") if k in changes}
    engine = GossipEngine[str](GossipConfig(NET, **changes))
    inbox, incoming = trio.open_memory_channel[tuple[str, bytes]](10_000)
    disconnects: list[tuple[str, str]] = []
    service = GossipService(
        engine,
        clock=now,
        rng=random.Random(name),
        on_disconnect=lambda peer, why: disconnects.append((peer, why)),
        **service_args,
    )
    await nursery.start(service.run, incoming)
    return Node(name, service, inbox, disconnects)


def link(a: Node, b: Node) -> None:
    assert a.service.add_peer(b.name, b.link_send(a.name))
    assert b.service.add_peer(a.name, a.link_send(b.name))


@asynccontextmanager
async def network(shape: str, n: int = 5) -> AsyncIterator[list[Node]]:
    async with trio.open_nursery() as nursery:
        nodes = [await start_node(nursery, f"n{i}") for i in range(n)]
        for i in range(n - 1):
            link(nodes[i], nodes[i + 1])
        if shape == "ring":
            link(nodes[-1], nodes[0])
        yield nodes
        nursery.cancel_scope.cancel()


async def receive_one(channel: trio.MemoryReceiveChannel[Any]) -> Any:
    with trio.fail_after(30):
        return await channel.receive()


@pytest.mark.parametrize(("shape", "kind"), [("line", "capacity"), ("ring", "capacity"), ("ring", "offer")])
async def test_a_message_reaches_every_node(
    shape: str, kind: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with network(shape) as nodes:
        subs = [node.service.subscribe(kind) for node in nodes]
        raw = capacity("n0") if kind == "capacity" else offer("n0")
        assert nodes[0].service.publish(raw) == len(nodes[0].service.peers)
        for sub in subs[1:]:
            env = await receive_one(sub)
            assert env.raw == raw and env.signer == node_id_of(key("n0"))
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(trio.WouldBlock):
            subs[0].receive_nowait()  # the publisher does not hear its own message
        for node in nodes[1:]:
            assert node.service.counters["delivered"] == 1


async def _attacker(node: Node, name: str = "x") -> trio.MemoryReceiveChannel[bytes]:
    """An attacker peer linked to `node`: what it sends goes straight into the node's inbox."""
    to_attacker, from_node = trio.open_memory_channel[bytes](10_000)
    assert node.service.add_peer(name, to_attacker.send)
    return from_node


def _forged() -> bytes:
    raw = bytearray(capacity("victim"))
    raw[-3] ^= 0x10
    return bytes(raw)


@pytest.mark.parametrize(
    ("bad", "count", "reason"),
    [
        (lambda: [_forged()], 1, "bad_signature"),
        (lambda: [capacity("x", n=i, expires_in=-60_000) for i in range(10)], 10, "expired"),
        (lambda: [b"\x95\x01\xa8capacity\xc4\x00"], 1, "malformed"),
    ],
)
async def test_a_peer_sending_invalid_messages_is_disconnected_and_the_rest_keep_working(
    bad: Any, count: int, reason: str, autojump_clock: trio.testing.MockClock
) -> None:
    async with network("line") as nodes:
        subs = [node.service.subscribe("capacity") for node in nodes]
        heard = await _attacker(nodes[2])
        for raw in bad():
            await nodes[2].inbox.send(("x", raw))
        await trio.testing.wait_all_tasks_blocked()
        assert nodes[2].disconnects == [("x", reason)]
        assert "x" not in nodes[2].service.peers
        assert nodes[2].service.counters[reason] == count
        assert not nodes[2].service.add_peer("x", nodes[0].link_send("x"))  # banned
        for node in nodes:
            assert node.service.counters.get("delivered", 0) == 0
        nodes[4].service.publish(capacity("n4"))
        for sub in subs[:4]:
            assert (await receive_one(sub)).signer == node_id_of(key("n4"))
        with pytest.raises(trio.WouldBlock):
            heard.receive_nowait()  # the cut-off peer hears nothing more


async def test_a_flooding_peer_is_cut_off_and_its_signer_limited(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with network("line") as nodes:
        subs = [node.service.subscribe("capacity", buffer=1000) for node in nodes]
        heard = await _attacker(nodes[2])
        config = nodes[2].service.engine.config
        flood = [capacity("x", n=i) for i in range(int(config.peer_burst) + 100)]  # 50 over, 2 points each
        for raw in flood:
            await nodes[2].inbox.send(("x", raw))
        await trio.testing.wait_all_tasks_blocked()
        assert nodes[2].disconnects == [("x", "flooding")]
        counters = nodes[2].service.counters
        assert counters["delivered"] == config.sender_burst  # the signer's limit
        assert counters["sender_rate"] == config.peer_burst - config.sender_burst
        assert counters["flooding"] == 50  # 2 points each, disconnected at -100
        for i, node in enumerate(nodes):
            if i != 2:
                assert node.service.counters["delivered"] == config.sender_burst
        nodes[0].service.publish(capacity("n0"))
        await trio.testing.wait_all_tasks_blocked()
        for sub in subs[1:]:
            signers = []
            while True:
                try:
                    signers.append(sub.receive_nowait().signer)
                except trio.WouldBlock:
                    break
            assert signers == [node_id_of(key("x"))] * int(config.sender_burst) + [node_id_of(key("n0"))]
        with pytest.raises(trio.WouldBlock):
            heard.receive_nowait()


async def test_a_slow_peer_loses_messages_and_is_dropped_without_stalling_others(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        a = await start_node(nursery, "a", send_buffer=2, send_timeout=10)
        b = await start_node(nursery, "b")
        link(a, b)
        sub = b.service.subscribe("capacity")

        async def stuck(raw: bytes) -> None:
            await trio.sleep_forever()

        assert a.service.add_peer("slow", stuck)
        for i in range(5):
            a.service.publish(capacity("a", n=i))
            await trio.testing.wait_all_tasks_blocked()
        # one message stuck in the slow peer's send, two queued, two dropped; b was not held up
        assert a.service.counters["send_dropped"] == 2
        assert sorted([(await receive_one(sub)).message.queue_length for _ in range(5)]) == list(range(5))
        await trio.sleep(11)
        assert a.disconnects == [("slow", "send failed: TooSlowError")]
        assert a.service.peers == ("b",)
        nursery.cancel_scope.cancel()


async def test_a_broken_link_is_removed_and_reported(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        a = await start_node(nursery, "a")

        async def broken(raw: bytes) -> None:
            raise trio.BrokenResourceError

        a.service.add_peer("gone", broken)
        a.service.publish(capacity("a"))
        await trio.testing.wait_all_tasks_blocked()
        assert a.disconnects == [("gone", "send failed: BrokenResourceError")]
        assert a.service.peers == () and a.service.engine.peers == ()
        assert a.service.counters["send_failed"] == 1
        nursery.cancel_scope.cancel()


async def test_a_slow_subscriber_loses_messages_others_do_not(autojump_clock: trio.testing.MockClock) -> None:
    async with network("line", 2) as (a, b):
        lazy = b.service.subscribe("capacity", buffer=1)
        keen = b.service.subscribe("capacity", buffer=10)
        for i in range(3):
            a.service.publish(capacity("a", n=i))
        await trio.testing.wait_all_tasks_blocked()
        assert b.service.counters["subscriber_dropped"] == 2
        assert lazy.receive_nowait().message.queue_length == 0
        assert [keen.receive_nowait().message.queue_length for _ in range(3)] == [0, 1, 2]
        lazy.close()
        a.service.publish(capacity("a", n=3))
        assert (await receive_one(keen)).message.queue_length == 3


async def test_removed_peer_gets_nothing_more(autojump_clock: trio.testing.MockClock) -> None:
    async with network("line", 3) as (a, b, c):
        sub = c.service.subscribe("capacity")
        b.service.remove_peer(c.name)
        a.service.publish(capacity("a"))
        await trio.testing.wait_all_tasks_blocked()
        assert b.service.counters["delivered"] == 1 and b.service.counters["forwarded"] == 0
        with pytest.raises(trio.WouldBlock):
            sub.receive_nowait()


async def test_seen_ids_are_pruned_by_the_service(autojump_clock: trio.testing.MockClock) -> None:
    async with network("line", 2) as (a, b):
        a.service.publish(capacity("a", expires_in=1000))
        await trio.testing.wait_all_tasks_blocked()
        assert b.service.engine.seen_size == 1
        await trio.sleep(1 + 30 + 5 + 1)  # expiry, clock skew, one prune interval
        assert b.service.engine.seen_size == 0 and a.service.engine.seen_size == 0


async def discard(raw: bytes) -> None:
    await trio.lowlevel.checkpoint()


async def test_subscribing_to_a_kind_gossip_does_not_carry_is_refused() -> None:
    service = GossipService[str](GossipEngine[str](GossipConfig(NET)), clock=now)
    with pytest.raises(ValueError, match="does not carry"):
        service.subscribe("ping")


async def test_as_a_link_listener(autojump_clock: trio.testing.MockClock) -> None:
    """The peering service's interface: links announced before the service runs wait for it; only
    gossip kinds are taken; a banned peer's new link is refused; link_down ends the link."""
    sent: list[bytes] = []
    asked: list[tuple[bytes, str]] = []

    async def send(raw: bytes) -> None:
        sent.append(raw)

    a_key, b_key = node_id_of(key("a")).raw, node_id_of(key("b")).raw
    service = GossipService[bytes](
        GossipEngine[bytes](GossipConfig(NET)),
        clock=now,
        on_disconnect=lambda peer, why: asked.append((peer, why)),
    )
    service.link_up(a_key, send)
    service.link_up(b_key, send)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run)
        assert service.peers == (a_key, b_key)
        ping = sign_message(Ping(NET, node_id_of(key("b")), bytes(16), now() + 1000), key("b"))
        await service.message(b_key, ping)
        assert service.counters.get("received", 0) == 0  # not gossip's: left to other services
        await service.message(b_key, capacity("a"))  # signed by a: not sent back to a
        await trio.testing.wait_all_tasks_blocked()
        assert service.counters["delivered"] == 1 and sent == []
        await service.message(b_key, b"\x95\x01\xa8capacity\xc0\xc0\xc0")
        assert asked == [(b_key, "malformed")]
        service.link_down(b_key)
        service.link_up(b_key, send)
        assert asked[-1] == (b_key, "banned by gossip") and service.peers == (a_key,)
        service.link_down(a_key)
        assert service.peers == () and service.engine.peers == ()
        nursery.cancel_scope.cancel()


async def test_run_ends_when_the_incoming_stream_closes(autojump_clock: trio.testing.MockClock) -> None:
    inbox, incoming = trio.open_memory_channel[tuple[str, bytes]](1)
    service = GossipService[str](GossipEngine[str](GossipConfig(NET)), clock=now)
    async with trio.open_nursery() as nursery:
        await nursery.start(service.run, incoming)
        service.add_peer("p", discard)
        await inbox.aclose()
    assert service.peers == ()
