"""Benchmark: what a relay costs a link. Bytes per second and round trips through a relayed link
against a direct one, on 127.0.0.1, all in one process (one core for everything).

Three nodes (PeerService + RelayService, real sockets, real SQLite): a relay R and two nodes A and B
that advertise no address (as behind NAT). B reserves at R and A links to B through R
(RelayService.link_via): the ordinary handshake and session run over a circuit of `relaydata`
messages, each re-signed by the relay. For comparison A2 and B2 link directly. On each link A sends
`--messages` envelopes of `--size` bytes (bulk) and then `--pings` messages one at a time, each
answered (round trips). Prints medians of `--rounds`; bounded by its counts.

    .venv/bin/python tests/bench/bench_relay.py [--size 262144] [--messages 200] [--pings 300] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio
from e31.node.config import Address, NodeConfig
from e31.node.net.peering import PeerService, Send
from e31.node.net.peers import PeerSettings
from e31.node.net.relay import RelayService, RelaySettings
from e31.node.store.async_store import AsyncStore
from e31.node.store.db import Store
from e31.protocol.envelope import sign
from nacl.signing import SigningKey

SETTINGS = PeerSettings.fast(1.0)


class Counter:
    """A LinkListener that counts what arrives and wakes a waiter at a target count."""

    def __init__(self) -> None:
        self.count = 0
        self.target = -1
        self.reached = trio.Event()
        self.answer: tuple[bytes, bytes] | None = None
        self.send: dict[bytes, Send] = {}

    def link_up(self, peer: bytes, send: Send) -> None:
        self.send[peer] = send

    def link_down(self, peer: bytes) -> None:
        self.send.pop(peer, None)

    async def message(self, peer: bytes, raw: bytes) -> None:
        self.count += 1
        if self.answer is not None and self.answer[0] == peer:
            await self.send[peer](self.answer[1])
        if self.count == self.target:
            self.reached.set()

    def expect(self, n: int) -> trio.Event:
        self.count, self.target, self.reached = 0, n, trio.Event()
        return self.reached


@asynccontextmanager
async def node(tmp: Path, name: str, *, relay: bool) -> AsyncIterator[tuple[RelayService, Counter]]:
    store = AsyncStore(Store(tmp / f"{name}.sqlite"))
    config = NodeConfig(data_dir=tmp / name, listen=Address("127.0.0.1", 0), mdns=False, dial_private=True)
    peering = PeerService(identity=SigningKey.generate(), config=config, store=store, settings=SETTINGS)
    service = RelayService(peering, offer=relay, settings=RelaySettings(probes=0))
    counter = Counter()
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(peering.run)
            if not relay:
                peering.contact.hide(True)
            await nursery.start(service.run)
            peering.add_listener(counter)
            yield service, counter
            nursery.cancel_scope.cancel()
    finally:
        await store.aclose()


async def wait_for(check: object) -> None:
    assert callable(check)
    with trio.fail_after(60):
        while not check():  # noqa: ASYNC110 (state in other services)
            await trio.sleep(0.01)


async def link(a: RelayService, b: RelayService) -> None:
    assert b.peering.listen is not None
    a.peering.table.learn(b.local, [b.peering.listen], "manual")
    await wait_for(lambda: b.local in a.peering.links and a.local in b.peering.links)


async def measure(
    a: RelayService, b: RelayService, b_count: Counter, a_count: Counter, args: argparse.Namespace
) -> tuple[float, float]:
    """(MB/s bulk, round trips/s) from a to b over their link."""
    key = a.identity
    bulk = sign("blobchunk", b"\xc4" + bytes(3) + bytes(args.size - 8), key)  # an opaque signed envelope
    done = b_count.expect(args.messages)
    t0 = time.perf_counter()
    for _ in range(args.messages):
        assert await a.peering.send(b.local, bulk)
    await done.wait()
    bulk_s = time.perf_counter() - t0
    small = sign("blobchunk", b"\xc4\x00\x00\x00\x10" + bytes(16), key)
    b_count.answer = (a.local, sign("blobchunk", b"\xc4\x00\x00\x00\x10" + bytes(16), b.identity))
    t0 = time.perf_counter()
    for _ in range(args.pings):
        got = a_count.expect(1)
        assert await a.peering.send(b.local, small)
        await got.wait()
    rtt_s = time.perf_counter() - t0
    b_count.answer = None
    return args.messages * len(bulk) / bulk_s / 1e6, args.pings / rtt_s


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        async with (
            node(tmp, "r", relay=True) as (r, _),
            node(tmp, "a", relay=False) as (a, a_count),
            node(tmp, "b", relay=False) as (b, b_count),
            node(tmp, "a2", relay=False) as (a2, a2_count),
            node(tmp, "b2", relay=True) as (b2, b2_count),
        ):
            await link(a, r)
            await link(b, r)
            await b.reserve(r.local)
            await wait_for(lambda: r.local in b.reservations)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(a.link_via, r.local, b.local)
                await wait_for(lambda: b.local in a.peering.links)
                await link(a2, b2)
                rows: dict[str, list[tuple[float, float]]] = {"relayed": [], "direct": []}
                for _ in range(args.rounds):
                    rows["relayed"].append(await measure(a, b, b_count, a_count, args))
                    rows["direct"].append(await measure(a2, b2, b2_count, a2_count, args))
                nursery.cancel_scope.cancel()
    med = {
        k: (statistics.median(x for x, _ in v), statistics.median(y for _, y in v)) for k, v in rows.items()
    }
    print(f"{args.messages} x {args.size} B bulk, {args.pings} round trips, median of {args.rounds}")
    for k, (mbs, rtts) in med.items():
        print(f"{k:8s} {mbs:8.1f} MB/s   {rtts:8.0f} round trips/s")
    bulk = med["relayed"][0] / med["direct"][0]
    trips = med["relayed"][1] / med["direct"][1]
    print(f"relayed/direct: bulk {bulk:.2f}, round trips {trips:.2f}")
    print(f"relay carried {r.counters['bytes_relayed']} bytes in {r.counters['circuits_relayed']} circuit(s)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=256 * 1024)
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--pings", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    trio.run(main, parser.parse_args())
    sys.exit(0)
