"""A peer flooding valid signed offers: what it costs the good nodes, and how soon it is cut off.

    .venv/bin/python tests/bench/bench_flood.py [--seconds 10] [--max-messages 200000] [--jobs 5]

Starts three `e31 node run` processes on 127.0.0.1 (temporary data dirs, no mDNS, one core each),
then:
1. quiet: `--jobs` small jobs (sandbox/workloads/echo.wasm) submitted one at a time through the
   first node's local API (node/api/client.py's ApiClient), each timed from submit to done, while
   each node's CPU (/proc/PID/stat utime + stime, the node process alone) is read over a window of
   `--seconds`;
2. flood: a client with its own key opens a real transport connection to every node (answering
   their heartbeats) and sends valid signed offers (one tiny job each, every one a new message,
   signed by its own key) as fast as it can, at most `--max-messages` in all and for `--seconds`;
   when a link is closed it redials every 0.2 s and counts the redials the node refuses (closed
   right after the handshake). The same jobs are timed meanwhile, and the CPU read the same way.
Figures: per node, the share of a core over the quiet and the flood windows, the flood's extra
share, the core-seconds spent until the cut-off, and the time from the first offer to the cut-off;
the refused and accepted redials; job latency (median) quiet and under the flood.
Floors (issue 18): the flood's extra CPU at most 10% of a core per good node over the flood window,
every node cuts the flooder off, no redial is accepted, and job latency under the flood within 1.5x
of the quiet figure. Exits 1 if one is missed.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import secrets
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import nacl.signing
import trio
from e31.node.api.client import ApiClient
from e31.node.demo.net import LocalNetwork
from e31.node.net.transport import ConnectionClosed, Timeouts, dial
from e31.protocol.blobs import chunk_list
from e31.protocol.envelope import claimed_kind, node_id_of, sign_message, verify
from e31.protocol.ids import sha256
from e31.protocol.jobs import JobManifest, Limits
from e31.protocol.messages import Offer, Ping, Pong

ROOT = Path(__file__).resolve().parents[2]
ECHO = ROOT / "sandbox" / "workloads" / "echo.wasm"
TICKS = os.sysconf("SC_CLK_TCK")
FLOOR_CPU_SHARE = 0.10
FLOOR_LATENCY_RATIO = 1.5
NODE_ARGS = ("--cores", "1", "--capacity-interval", "86400")
REFUSED_WITHIN = 1.0
"""A redial whose link the node closes within this many seconds of the handshake counts as refused."""


def cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class Link:
    address: str
    first_offer: float | None = None
    cut_off: float | None = None
    sent: int = 0
    refused: int = 0
    accepted: int = 0


@dataclass
class Flood:
    network: str
    links: list[Link]
    seconds: float
    max_messages: int
    events: Any = None
    """A multiprocessing queue that hears (link index, time) as each link is first cut off."""
    key: nacl.signing.SigningKey = field(default_factory=lambda: nacl.signing.SigningKey.generate())
    sent: int = 0
    started: float = 0.0
    nonce: int = 0

    def offer(self) -> bytes:
        self.nonce += 1
        submitter = node_id_of(self.key)
        created = now_ms()
        manifest = JobManifest(
            module=chunk_list(b"\x00asm\x01\x00\x00\x00 flood").ref,
            inputs=(),
            args=(str(self.nonce),),
            env=(),
            stdin=None,
            limits=Limits(fuel=10**6, memory_bytes=16 << 20, wall_ms=1000, max_output_bytes=1024),
            deadline=created + 120_000,
            retention_ms=60_000,
            replicas=1,
            profile=sha256(b"flood profile"),
            submitter=submitter,
            nonce=self.nonce.to_bytes(16, "big"),
            created_at=created,
        )
        return sign_message(Offer(self.network, created + 60_000, submitter, (manifest,)), self.key)

    async def run(self) -> None:
        self.started = time.monotonic()
        with trio.move_on_after(self.seconds):
            async with trio.open_nursery() as nursery:
                for link in self.links:
                    nursery.start_soon(self._link, link)

    async def _link(self, link: Link) -> None:
        host, _, port = link.address.rpartition(":")
        first = True
        while self.sent < self.max_messages:
            try:
                conn = await dial(
                    host,
                    int(port),
                    identity=self.key,
                    network=self.network,
                    timeouts=Timeouts(connect=2, handshake=2),
                )
            except (OSError, trio.TooSlowError, Exception) as e:  # a refused handshake, a busy node
                if isinstance(e, trio.Cancelled):
                    raise
                await trio.sleep(0.2)
                continue
            opened = time.monotonic()
            async with trio.open_nursery() as nursery:
                await nursery.start(conn.run)
                nursery.start_soon(self._answer, conn)
                try:
                    while self.sent < self.max_messages:
                        raw = self.offer()
                        await conn.send(raw)
                        self.sent += 1
                        link.sent += 1
                        if link.first_offer is None:
                            link.first_offer = time.monotonic()
                            if self.events is not None:
                                self.events.put(("started",))
                except ConnectionClosed:
                    pass
                nursery.cancel_scope.cancel()
            closed = time.monotonic()
            if first:
                link.cut_off = closed
                first = False
                if self.events is not None:
                    self.events.put((self.links.index(link), closed))
            elif closed - opened < REFUSED_WITHIN:
                link.refused += 1
            else:
                link.accepted += 1
            await trio.sleep(0.2)

    async def _answer(self, conn: object) -> None:
        from e31.node.net.transport import Connection

        assert isinstance(conn, Connection)
        async for raw in conn:
            if claimed_kind(raw) != "ping":
                continue
            ping = verify(raw).message
            assert isinstance(ping, Ping)
            pong = Pong(self.network, node_id_of(self.key), ping.nonce, now_ms() + 30_000)
            try:
                await conn.send(sign_message(pong, self.key))
            except ConnectionClosed:
                return


def flooder(network: str, addresses: list[str], seconds: float, max_messages: int, events: Any) -> None:
    """The flooding client, in a process of its own (its signing loop must not slow the timed jobs)."""
    flood = Flood(network, [Link(a) for a in addresses], seconds, max_messages, events)
    trio.run(flood.run)
    events.put(("done", flood.sent, [asdict(link) for link in flood.links]))


def job_latencies(api: ApiClient, count: int, tag: str) -> list[float]:
    out = []
    for i in range(count):
        t0 = time.monotonic()
        job = api.post("/v1/jobs", {"module": str(ECHO), "args": [f"{tag}-{i}"]})["job_id"]
        while True:
            doc = api.get(f"/v1/jobs/{job}/wait?timeout=30")
            if doc["state"] in ("done", "failed", "expired", "cancelled", "disputed"):
                break
        if doc["state"] != "done":
            raise SystemExit(f"job {job} ended {doc['state']}: {doc.get('reason')}")
        out.append(time.monotonic() - t0)
    return out


def measure(pids: list[int], seconds: float, work: threading.Thread) -> list[float]:
    """CPU seconds of each pid over `seconds` (the `work` thread running meanwhile)."""
    before = [cpu(p) for p in pids]
    t0 = time.monotonic()
    work.start()
    time.sleep(max(0.0, seconds - (time.monotonic() - t0)))
    work.join(timeout=120)
    elapsed = time.monotonic() - t0
    return [(cpu(p) - b) / elapsed for p, b in zip(pids, before, strict=True)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--seconds", type=float, default=10.0, help="length of the quiet and the flood windows"
    )
    parser.add_argument("--max-messages", type=int, default=200_000, help="offers the flooder sends at most")
    parser.add_argument("--jobs", type=int, default=5, help="jobs timed in each window")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="e31-flood-") as tmp:
        network = LocalNetwork(Path(tmp), 3, extra_args=NODE_ARGS, network=f"flood-{secrets.token_hex(3)}")
        try:
            network.start()
            return run(network, args.seconds, args.max_messages, args.jobs)
        finally:
            network.stop()


def run(network: LocalNetwork, seconds: float, max_messages: int, jobs: int) -> int:
    nodes = network.nodes
    pids = [n.pid for n in nodes]
    api = nodes[0].api(timeout=60)
    job_latencies(api, 4, "warm")  # compile cache, first connections

    quiet: list[float] = []
    quiet_cpu = measure(
        pids, seconds, threading.Thread(target=lambda: quiet.extend(job_latencies(api, jobs, "q")))
    )

    ctx = multiprocessing.get_context("spawn")
    events = ctx.Queue()
    process = ctx.Process(
        target=flooder, args=(network.network, [n.listen for n in nodes], seconds, max_messages, events)
    )
    flood = Flood(network.network, [Link(n.listen) for n in nodes], seconds, max_messages)
    cut_cpu: list[float | None] = [None] * len(nodes)
    start_cpu = [cpu(p) for p in pids]

    def watch() -> None:  # the node's CPU at the moment its link to the flooder closes
        while True:
            event = events.get(timeout=seconds + 60)
            if event[0] == "started":
                started.set()
                continue
            if event[0] == "done":
                flood.sent, flood.links = event[1], [Link(**link) for link in event[2]]
                return
            cut_cpu[event[0]] = cpu(pids[event[0]]) - start_cpu[event[0]]

    loud: list[float] = []
    started = threading.Event()

    def loud_jobs() -> None:
        watcher = threading.Thread(target=watch)
        watcher.start()
        process.start()
        started.wait(timeout=30)  # the jobs start with the flood
        loud.extend(job_latencies(api, jobs, "f"))
        process.join(timeout=seconds + 30)
        watcher.join(timeout=30)
        if process.is_alive():
            process.kill()

    flood_cpu = measure(pids, seconds, threading.Thread(target=loud_jobs))
    statuses = [n.ask("/v1/status") or {} for n in nodes]

    failures = []
    print(f"3 nodes on 127.0.0.1, one flooder linked to each; windows of {seconds:g} s")
    print(f"flooder: {flood.sent} offers sent in all (at most {max_messages})")
    for i, (node, link) in enumerate(zip(nodes, flood.links, strict=True)):
        extra = flood_cpu[i] - quiet_cpu[i]
        cut = None if link.cut_off is None or link.first_offer is None else link.cut_off - link.first_offer
        gossip = statuses[i].get("gossip", {})
        spent = cut_cpu[i]
        print(
            f"  {node.name}: CPU quiet {quiet_cpu[i]:6.1%}  flood {flood_cpu[i]:6.1%}  extra {extra:6.1%}"
            f"  | cut off after {'never' if cut is None else f'{cut:.2f} s'}"
            f" ({link.sent} offers on the link, {'-' if spent is None else f'{spent:.3f}'} core-s until then)"
            f"  | redials refused {link.refused}, accepted {link.accepted}"
        )
        print(
            "      gossip: "
            + ", ".join(
                f"{k} {gossip.get(k, 0)}"
                for k in ("received", "delivered", "flooding", "sender_rate", "disconnected", "refused")
            )
        )
        if extra > FLOOR_CPU_SHARE:
            failures.append(
                f"{node.name}: the flood cost {extra:.1%} of a core (floor {FLOOR_CPU_SHARE:.0%})"
            )
        if cut is None:
            failures.append(f"{node.name}: the flooder was never cut off")
        if link.accepted:
            failures.append(f"{node.name}: {link.accepted} redials of the flooder were accepted")
    q, f = statistics.median(quiet), statistics.median(loud)
    print("  quiet (ms):", " ".join(f"{x * 1000:.0f}" for x in quiet))
    print("  flood (ms):", " ".join(f"{x * 1000:.0f}" for x in loud))
    print(
        f"job latency (echo.wasm, median of {jobs}): quiet {q * 1000:.0f} ms, flood {f * 1000:.0f} ms"
        f" ({f / q:.2f}x); slowest: quiet {max(quiet) * 1000:.0f} ms, flood {max(loud) * 1000:.0f} ms"
    )
    if f > FLOOR_LATENCY_RATIO * q:
        failures.append(f"job latency {f / q:.2f}x the quiet figure (floor {FLOOR_LATENCY_RATIO}x)")
    for failure in failures:
        print("FAIL:", failure)
    if not failures:
        print("ok: every floor met")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
