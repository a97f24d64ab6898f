"""A peer flooding valid signed offers at real node processes on 127.0.0.1: cut off, refused, and the
good peers' offers still get through."""

from __future__ import annotations

import time
from pathlib import Path

import nacl.signing
import trio
from e31.node.demo.net import LocalNetwork
from e31.node.net.transport import ConnectionClosed, Timeouts, dial
from e31.protocol.blobs import chunk_list
from e31.protocol.envelope import node_id_of, sign_message
from e31.protocol.ids import sha256
from e31.protocol.jobs import JobManifest, Limits
from e31.protocol.messages import Offer

ROOT = Path(__file__).resolve().parents[2]
ECHO = ROOT / "sandbox" / "workloads" / "echo.wasm"
FLOOD_MAX = 5000
"""The flood is bounded: at most this many offers, and 20 s."""


def offer(key: nacl.signing.SigningKey, network: str, n: int) -> bytes:
    submitter = node_id_of(key)
    now = time.time_ns() // 1_000_000
    manifest = JobManifest(
        module=chunk_list(b"\x00asm\x01\x00\x00\x00 flood").ref,
        inputs=(),
        args=(str(n),),
        env=(),
        stdin=None,
        limits=Limits(fuel=10**6, memory_bytes=16 << 20, wall_ms=1000, max_output_bytes=1024),
        deadline=now + 120_000,
        retention_ms=60_000,
        replicas=1,
        profile=sha256(b"flood profile"),
        submitter=submitter,
        nonce=n.to_bytes(16, "big"),
        created_at=now,
    )
    return sign_message(Offer(network, now + 60_000, submitter, (manifest,)), key)


async def flood(address: str, network: str, key: nacl.signing.SigningKey) -> tuple[int, str | None]:
    """Send offers until the node closes the link; returns how many were sent and why it closed."""
    host, _, port = address.rpartition(":")
    conn = await dial(
        host, int(port), identity=key, network=network, timeouts=Timeouts(connect=5, handshake=5)
    )
    sent = 0
    async with trio.open_nursery() as nursery:
        await nursery.start(conn.run)
        with trio.move_on_after(20):
            try:
                while sent < FLOOD_MAX:
                    await conn.send(offer(key, network, sent))
                    sent += 1
                await conn.wait_closed()
            except ConnectionClosed:
                pass
        nursery.cancel_scope.cancel()
    await conn.aclose()
    return sent, conn.close_reason


async def refused(address: str, network: str, key: nacl.signing.SigningKey) -> bool:
    """Whether the node closes a new link from `key` at once (or refuses the handshake)."""
    host, _, port = address.rpartition(":")
    try:
        conn = await dial(
            host, int(port), identity=key, network=network, timeouts=Timeouts(connect=5, handshake=5)
        )
    except Exception:  # a refused handshake is a refusal too
        return True
    async with trio.open_nursery() as nursery:
        await nursery.start(conn.run)
        with trio.move_on_after(3):
            await conn.wait_closed()
        nursery.cancel_scope.cancel()
    await conn.aclose()
    return conn.closed


async def test_a_flooding_peer_is_cut_off_and_refused_while_good_offers_get_through(tmp_path: Path) -> None:
    network = LocalNetwork(tmp_path, 2, extra_args=("--cores", "1", "--capacity-interval", "86400"))
    await trio.to_thread.run_sync(network.start)
    try:
        a, b = network.nodes
        key = nacl.signing.SigningKey.generate()
        sent, _ = await flood(b.listen, network.network, key)
        assert sent < FLOOD_MAX, "the flooder was never cut off"
        status = await trio.to_thread.run_sync(b.ask, "/v1/status")
        gossip = status["gossip"]
        assert gossip["disconnected"] >= 1 and gossip["flooding"] >= 1
        assert gossip["delivered_offer"] <= 250  # the burst, not the flood
        assert await refused(b.listen, network.network, key)  # the penalty outlives the link
        # the good peer: a job submitted on `a` is offered to `b` through gossip, and runs
        delivered = gossip["delivered_offer"]
        api = a.api(timeout=60)
        job = (await trio.to_thread.run_sync(api.post, "/v1/jobs", {"module": str(ECHO), "args": ["hi"]}))[
            "job_id"
        ]
        doc = await trio.to_thread.run_sync(api.get, f"/v1/jobs/{job}/wait?timeout=60")
        assert doc["state"] == "done"
        after = (await trio.to_thread.run_sync(b.ask, "/v1/status"))["gossip"]
        assert after["delivered_offer"] > delivered
    finally:
        await trio.to_thread.run_sync(network.stop)
