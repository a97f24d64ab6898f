"""Gossip dissemination: how fast one signed offer reaches every node, and at what redundancy.

Run: .venv/bin/python tests/bench/bench_gossip.py [--sizes 50,200,1000] [--modes rounds,trio]
     [--trials 5] [--seed 31] [--jobs 64] [--no-sweep]

Two simulations of N nodes on a random overlay where every node has about 8 peers (configuration
model, seeded, retried until connected), both with real signatures and real verification and
the default GossipConfig:
- rounds: bare GossipEngines driven in synchronous rounds: in round r every node processes the
  envelopes sent to it in round r - 1 (a round stands for one network hop). "time" is the CPU
  time the whole network spent until then, all nodes on this one core (a sum, not a latency).
- trio: one GossipService per node (node/net/gossip.py: per-peer sender tasks and bounded channels)
  over trio memory channels, every link delaying each envelope by one hop of 50 ms on trio's
  virtual clock (MockClock, autojump), so rounds = arrival time / 50 ms. "time" is the real
  time the simulation took until then (also every node on one core).
One trial publishes one offer (a set of --jobs tiny jobs, by default a full set of MAX_SET) from a
random node; each size runs several trials from different origins. Figures: rounds and time to
reach 99% and 100% of nodes, duplicate deliveries per node, sends per node. A fan-out sweep on 200
nodes shows the trade-off behind the default fan-out.

Floors (issue 6): at 200 nodes, 99% reached within ceil(log2 N) + 4 rounds and at most 6
duplicates per node on average (worst trial), peak RSS of the 200-node runs within 2 GB; every
trial must reach 100% of the nodes. Exits 1 if one is missed.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import resource
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import nacl.signing
import trio
import trio.testing
from e31.node.net.gossip import GossipService, Send
from e31.protocol.blobs import chunk_list
from e31.protocol.envelope import node_id_of, sign_message
from e31.protocol.gossip import Deliver, Drop, Forward, GossipConfig, GossipEngine, Reason
from e31.protocol.ids import sha256
from e31.protocol.jobs import JobManifest, Limits
from e31.protocol.messages import BY_JOB, MAX_SET, Offer

NETWORK = "bench"
T0 = 1_800_000_000_000
HOP_MS = 50
DEGREE = 8
RSS_FLOOR_BYTES = 2 << 30


@dataclass
class Trial:
    nodes: int
    reached: int
    rounds_99: int | None
    rounds_100: int | None
    cpu_99: float | None
    cpu_100: float | None
    duplicates_per_node: float
    sends: int


def overlay(n: int, degree: int, rng: random.Random) -> list[list[int]]:
    """A connected random graph where (nearly) every node has `degree` neighbours."""
    for _ in range(100):
        stubs = [i for i in range(n) for _ in range(degree)]
        rng.shuffle(stubs)
        adj: list[set[int]] = [set() for _ in range(n)]
        for a, b in zip(stubs[::2], stubs[1::2], strict=True):
            if a != b:
                adj[a].add(b)
                adj[b].add(a)
        if _connected(adj):
            return [sorted(s) for s in adj]
    raise RuntimeError("no connected overlay in 100 tries")


def _connected(adj: list[set[int]]) -> bool:
    seen, todo = {0}, [0]
    while todo:
        for j in adj[todo.pop()]:
            if j not in seen:
                seen.add(j)
                todo.append(j)
    return len(seen) == len(adj)


def make_offer(seed: int, jobs: int) -> bytes:
    """An offer of `jobs` tiny jobs (a parameter sweep: one module, one argument differing)."""
    key = nacl.signing.SigningKey(sha256(b"bench submitter %d" % seed).raw)
    module = chunk_list(b"\x00asm\x01\x00\x00\x00 bench module %d" % seed).ref
    manifests = [
        JobManifest(
            module=module,
            inputs=(),
            args=("run", f"--point={j}"),
            env=(),
            stdin=None,
            limits=Limits(fuel=10**9, memory_bytes=64 << 20, wall_ms=60_000, max_output_bytes=1 << 20),
            deadline=T0 + 3_600_000,
            retention_ms=86_400_000,
            replicas=1,
            profile=sha256(b"bench profile"),
            submitter=node_id_of(key),
            nonce=(seed * MAX_SET + j).to_bytes(16, "big"),
            created_at=T0,
        )
        for j in range(jobs)
    ]
    offer = Offer(NETWORK, T0 + 600_000, node_id_of(key), tuple(sorted(manifests, key=BY_JOB)))
    return sign_message(offer, key)


def run_trial(
    adj: list[list[int]], config: GossipConfig, origin: int, raw: bytes, rng: random.Random
) -> Trial:
    n = len(adj)
    engines: list[GossipEngine[int]] = []
    for i in range(n):
        engine = GossipEngine[int](config)
        for j in adj[i]:
            engine.add_peer(j, T0)
        engines.append(engine)
    reached_at = {origin: 0}
    duplicates = sends = 0
    cpu = 0.0
    cpu_at: dict[int, float] = {}
    inbox: list[list[tuple[int, bytes]]] = [[] for _ in range(n)]
    start = time.perf_counter()
    for action in engines[origin].publish(raw, T0, rng):
        assert isinstance(action, Forward)
        inbox[action.peer].append((origin, action.raw))
        sends += 1
    cpu += time.perf_counter() - start
    rnd = 0
    while any(inbox):
        rnd += 1
        now = T0 + rnd * HOP_MS
        outbox: list[list[tuple[int, bytes]]] = [[] for _ in range(n)]
        start = time.perf_counter()
        for i, msgs in enumerate(inbox):
            engine = engines[i]
            for sender, data in msgs:
                for action in engine.receive(sender, data, now, rng):
                    if isinstance(action, Forward):
                        outbox[action.peer].append((i, action.raw))
                        sends += 1
                    elif isinstance(action, Deliver):
                        reached_at[i] = rnd
                    elif isinstance(action, Drop) and action.reason is Reason.DUPLICATE:
                        duplicates += 1
                    else:
                        raise AssertionError(f"node {i}: unexpected {action}")
        cpu += time.perf_counter() - start
        cpu_at[rnd] = cpu
        inbox = outbox
    seconds_at = {i: cpu_at.get(r, 0.0) for i, r in reached_at.items()}
    return _summary(n, reached_at, seconds_at, duplicates, sends)


async def _trio_trial(
    adj: list[list[int]], config: GossipConfig, origin: int, raw: bytes, rng: random.Random
) -> Trial:
    n = len(adj)
    reached_at: dict[int, int] = {origin: 0}
    seconds_at: dict[int, float] = {origin: 0.0}
    start_wall = time.perf_counter()

    def clock() -> int:
        return T0 + int(trio.current_time() * 1000)

    async def watch(i: int, deliveries: trio.MemoryReceiveChannel[Any]) -> None:
        async for _ in deliveries:
            reached_at.setdefault(i, round((trio.current_time() - t_start) * 1000 / HOP_MS))
            seconds_at.setdefault(i, time.perf_counter() - start_wall)

    def link(src: int, inbox: trio.MemorySendChannel[tuple[int, bytes]]) -> Send:
        async def send(data: bytes) -> None:
            await trio.sleep(HOP_MS / 1000)
            inbox.send_nowait((src, data))

        return send

    t_start = 0.0
    async with trio.open_nursery() as nursery:
        services: list[GossipService[int]] = []
        inboxes = []
        for i in range(n):
            inbox, incoming = trio.open_memory_channel[tuple[int, bytes]](10 * DEGREE)
            service = GossipService(GossipEngine[int](config), clock=clock, rng=rng)
            await nursery.start(service.run, incoming)
            nursery.start_soon(watch, i, service.subscribe("offer"))
            services.append(service)
            inboxes.append(inbox)
        for i in range(n):
            for j in adj[i]:
                services[i].add_peer(j, link(i, inboxes[j]))
        t_start = trio.current_time()
        start_wall = time.perf_counter()
        services[origin].publish(raw)
        await trio.sleep_until(t_start + 3 * math.log2(n) * HOP_MS / 1000 + 1)
        nursery.cancel_scope.cancel()
    duplicates = sum(s.counters.get("duplicate", 0) for s in services)
    sends = sum(s.counters.get("forwarded", 0) for s in services)
    return _summary(n, reached_at, seconds_at, duplicates, sends)


def _summary(
    n: int, reached_at: dict[int, int], seconds_at: dict[int, float], duplicates: int, sends: int
) -> Trial:
    """From each reached node's round and the seconds spent until it was reached."""
    rounds = sorted(reached_at.values())
    times = sorted(seconds_at.values())
    k = math.ceil(0.99 * n)
    if len(rounds) < k:
        return Trial(n, len(rounds), None, None, None, None, duplicates / n, sends)
    full = len(rounds) == n
    return Trial(
        n,
        len(rounds),
        rounds[k - 1],
        rounds[-1] if full else None,
        times[k - 1],
        times[-1] if full else None,
        duplicates / n,
        sends,
    )


def trio_trial(
    adj: list[list[int]], config: GossipConfig, origin: int, raw: bytes, rng: random.Random
) -> Trial:
    return trio.run(
        _trio_trial, adj, config, origin, raw, rng, clock=trio.testing.MockClock(autojump_threshold=0)
    )


def run_size(
    n: int, config: GossipConfig, trials: int, seed: int, jobs: int, mode: str = "rounds"
) -> list[Trial]:
    rng = random.Random(seed * 1_000_003 + n)
    adj = overlay(n, DEGREE, rng)
    trial = run_trial if mode == "rounds" else trio_trial
    out = []
    for t in range(trials):
        origin = rng.randrange(n)
        out.append(trial(adj, config, origin, make_offer(seed * 100 + t, jobs), rng))
    return out


def _fmt(values: Sequence[float | None], unit: str = "", scale: float = 1.0) -> str:
    if any(v is None for v in values):
        return "missed"
    nums = [float(v) * scale for v in values if v is not None]
    return f"median {statistics.median(nums):g}{unit}, worst {max(nums):g}{unit}"


def report(n: int, mode: str, trials: list[Trial]) -> None:
    print(f"{n} nodes (about {DEGREE} peers each), {len(trials)} offers from random origins; {MODES[mode]}:")
    print(f"  reached            : min {min(t.reached for t in trials)}/{n}")
    print(f"  rounds to 99%      : {_fmt([t.rounds_99 for t in trials])}")
    print(f"  rounds to 100%     : {_fmt([t.rounds_100 for t in trials])}")
    print(f"  time to 99% (ms)   : {_fmt([_ms(t.cpu_99) for t in trials])}")
    print(f"  time to 100% (ms)  : {_fmt([_ms(t.cpu_100) for t in trials])}")
    print(f"  duplicates/node    : {_fmt([round(t.duplicates_per_node, 2) for t in trials])}")
    print(f"  sends/node         : {_fmt([round(t.sends / n, 2) for t in trials])}")


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1e3, 1)


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def per_message_cost(jobs: int) -> tuple[float, float]:
    """Median microseconds of one `receive` for a new offer (verified) and for a duplicate."""
    config = GossipConfig(NETWORK, peer_burst=1e9, sender_burst=1e9)
    offers = [make_offer(10_000 + i, jobs) for i in range(300)]
    rng = random.Random(0)
    new, dup = [], []
    for _ in range(5):
        engine = GossipEngine[int](config)
        for p in range(8):
            engine.add_peer(p, T0)
        start = time.perf_counter()
        for raw in offers:
            engine.receive(0, raw, T0, rng)
        new.append((time.perf_counter() - start) / len(offers) * 1e6)
        start = time.perf_counter()
        for raw in offers:
            engine.receive(1, raw, T0, rng)
        dup.append((time.perf_counter() - start) / len(offers) * 1e6)
    return statistics.median(new), statistics.median(dup)


MODES = {
    "rounds": "synchronous rounds over GossipEngines (one round = one hop)",
    "trio": f"GossipService over trio memory channels, {HOP_MS} ms per hop on a virtual clock",
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="50,200,1000")
    parser.add_argument("--modes", default="rounds,trio", help="rounds, trio or both (comma-separated)")
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--seed", type=int, default=31)
    parser.add_argument("--jobs", type=int, default=MAX_SET, help=f"jobs in each offer (1..{MAX_SET})")
    parser.add_argument("--no-sweep", action="store_true", help="skip the fan-out sweep")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    modes = args.modes.split(",")
    if not set(modes) <= set(MODES):
        parser.error(f"--modes takes {', '.join(MODES)}")
    if not 1 <= args.jobs <= MAX_SET:
        parser.error(f"--jobs takes 1..{MAX_SET}")
    config = GossipConfig(NETWORK)
    print(
        f"gossip dissemination of one signed offer: real GossipEngine and Ed25519, default config "
        f"(fan-out {config.fanout}; the origin sends to all its peers)"
    )
    new_us, dup_us = per_message_cost(args.jobs)
    print(
        f"one receive (offer of {args.jobs} jobs, {len(make_offer(0, args.jobs))} bytes): "
        f"new {new_us:.0f} us (verified; {new_us / args.jobs:.1f} us per job), "
        f"duplicate {dup_us:.1f} us (no signature work)"
    )
    failures: list[str] = []
    for n in sizes:
        for mode in modes:
            wall = time.perf_counter()
            trials = run_size(n, config, args.trials, args.seed, args.jobs, mode)
            report(n, mode, trials)
            print(f"  wall time          : {time.perf_counter() - wall:.2f} s for {args.trials} offers")
            failures += check(n, mode, trials)
        if n == 200:
            rss = peak_rss_bytes()
            print(f"peak RSS after the 200-node runs: {rss / 2**20:.0f} MiB")
            if rss > RSS_FLOOR_BYTES:
                failures.append(f"200 nodes: peak RSS {rss / 2**20:.0f} MiB above 2 GiB")
    if not args.no_sweep:
        print("fan-out sweep, 200 nodes, rounds (rounds to 99% / 100%, duplicates per node; medians):")
        for fanout in range(2, DEGREE + 1):
            sweep = dataclasses.replace(config, fanout=fanout)
            trials = run_size(200, sweep, args.trials, args.seed, args.jobs)
            r99 = [t.rounds_99 for t in trials]
            r100 = [t.rounds_100 for t in trials]
            missed = sum(1 for t in trials if t.reached < 200)
            print(
                f"  fan-out {fanout}: 99% {_med(r99)}, 100% {_med(r100)}, "
                f"duplicates {statistics.median(t.duplicates_per_node for t in trials):.2f}"
                + (f", {missed}/{len(trials)} offers missed a node" if missed else "")
            )
    print(f"peak RSS: {peak_rss_bytes() / 2**20:.0f} MiB")
    for f in failures:
        print("FLOOR MISSED:", f)
    return 1 if failures else 0


def check(n: int, mode: str, trials: list[Trial]) -> list[str]:
    failures = []
    if any(t.reached < n for t in trials):
        failures.append(f"{n} nodes ({mode}): an offer did not reach every node")
    if n == 200:
        bound = math.ceil(math.log2(n)) + 4
        worst99 = max((t.rounds_99 for t in trials if t.rounds_99 is not None), default=None)
        if worst99 is None or worst99 > bound:
            failures.append(f"200 nodes ({mode}): 99% reached in {worst99} rounds, floor {bound}")
        worst_dup = max(t.duplicates_per_node for t in trials)
        if worst_dup > 6:
            failures.append(f"200 nodes ({mode}): {worst_dup:.2f} duplicates per node, floor 6")
    return failures


def _med(values: Sequence[int | None]) -> str:
    nums = [v for v in values if v is not None]
    if not nums:
        return "never"
    partial = f" (in {len(nums)} of {len(values)} offers)" if len(nums) < len(values) else ""
    return f"{statistics.median(nums):g}{partial}"


if __name__ == "__main__":
    sys.exit(main())
