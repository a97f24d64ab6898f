"""The node's capacity at run time: what it offers, when it gives the machine back, what peers offer.

- The monitor (capacity.run_capacity_monitor, policy from the config, the pool's worker pids) reports
  each change. Without only-when-idle the owner's use only lowers what new jobs are offered. With it,
  offered cores falling to 0 (the owner is working) suspends the scheduler: running jobs are stopped in
  place (SIGSTOP) and queued ones wait; cores coming back resume them. A paused job's outcome and
  fuel do not change (the sandbox is deterministic and its wall clock excludes the pause). With
  only-when-idle the node starts suspended, until the owner is seen idle.
- While suspended, every interval the executor hands back the jobs that would now miss their deadline
  (held.HeldJobs.give_back_late), so their submitters reassign them.
- Bids use the offered cores and memory (`for_bids`): with only-when-idle, a node offering 0 cores
  declines ("busy"); without it the owner's use lowers the cores bids count on, down to one.
- A signed `capacity` advertisement goes out through gossip at start, whenever the offer changes, and
  again before it expires and after a new link comes up (a fresh message, so a node that joins late
  hears it: a repeated one would be dropped as a duplicate).
  Peers' advertisements are kept (until they expire) for `e31 node status` and `GET /v1/status`,
  each with the evidence behind its key (`TrackRecord`: receipts this node verified from it, the age of
  its link, whether the operator pinned it as a bootstrap peer). What the node believes of the
  network's capacity (`believed`, rules.believe) takes known keys' adverts whole and strangers'
  together only up to a small share; at most STRANGER_ADVERTS strangers' adverts are kept at all. The
  same evidence puts known executors' bids ahead of strangers' (rules.choose_bid).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

import nacl.signing
import trio
from e31.protocol.envelope import VerifiedEnvelope, sign_message
from e31.protocol.errors import ProtocolError
from e31.protocol.ids import Digest, NodeId
from e31.protocol.messages import Capacity as CapacityAd

from ..host.capacity import Capacity, CapacityPolicy, Sample, State, run_capacity_monitor
from .rules import Believed, Evidence, believe
from .scheduler import Scheduler

log = logging.getLogger("e31.capacity")

ADVERT_TTL_MS = 120_000
"""Life of one advertisement; it is renewed at a third of it."""
ADVERT_DELAY = 0.5
"""Seconds to wait after a change or a new link before advertising (they come in bursts)."""
STRANGER_ADVERTS = 256
"""Adverts kept at most from keys with no evidence behind them (the soonest to expire dropped first)."""


class TrackRecord:
    """The evidence this node holds about other keys, beyond what they say of themselves: receipts
    from each that its submitter verified, when its current link came up, and the bootstrap peers its
    operator pinned. A key with any of it is `known` (rules.Evidence); `key in record` says so."""

    def __init__(self, clock: Callable[[], int], bootstrap: Iterable[bytes] = ()) -> None:
        self.clock = clock
        self.bootstrap = frozenset(bootstrap)
        self.receipts: Counter[bytes] = Counter()
        self._linked: dict[bytes, int] = {}

    def verified(self, executor: bytes, count: int = 1) -> None:
        self.receipts[executor] += count

    def link_up(self, peer: bytes) -> None:
        self._linked.setdefault(peer, self.clock())

    def link_down(self, peer: bytes) -> None:
        self._linked.pop(peer, None)

    def of(self, key: bytes) -> Evidence:
        since = self._linked.get(key)
        age = 0 if since is None else max(0, self.clock() - since)
        return Evidence(self.receipts.get(key, 0), age, key in self.bootstrap)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, bytes) and self.of(key).known


class LateJobs(Protocol):
    """The jobs held here that can be handed back (held.HeldJobs)."""

    async def give_back_late(self) -> int: ...


@dataclass(frozen=True, slots=True)
class PeerCapacity:
    cores: int
    memory_bytes: int
    queue_length: int
    fuel_rate: int
    expires: int

    def to_json(self) -> dict[str, Any]:
        return {
            "cores": self.cores,
            "memory_bytes": self.memory_bytes,
            "queue_length": self.queue_length,
            "fuel_rate": self.fuel_rate,
            "expires": self.expires,
        }


class CapacityService:
    def __init__(
        self,
        *,
        identity: nacl.signing.SigningKey,
        network: str,
        policy: CapacityPolicy,
        scheduler: Scheduler,
        profile: bytes,
        interval: float,
        worker_pids: Callable[[], Iterable[int]],
        sampler: Callable[[Sequence[int]], Sample],
        clock: Callable[[], int],
        publish: Callable[[bytes], object] | None = None,
        late: LateJobs | None = None,
        track: TrackRecord | None = None,
    ) -> None:
        self.identity = identity
        self.node = NodeId(bytes(identity.verify_key))
        self.network = network
        self.policy = policy
        self.scheduler = scheduler
        self.profile = profile
        self.interval = interval
        self.worker_pids = worker_pids
        self.sampler = sampler
        self.clock = clock
        self.publish = publish
        self.late = late
        self.track = track or TrackRecord(clock)
        if policy.only_when_idle:
            self.current = Capacity(0, 0, State.WAITING)
        else:
            self.current = Capacity(policy.cores, policy.memory, State.AVAILABLE)
        self.peers: dict[bytes, PeerCapacity] = {}
        self._advertise_now = trio.Event()

    @property
    def offered(self) -> tuple[int, int]:
        return self.current.offered

    @property
    def for_bids(self) -> tuple[int, int]:
        """(cores, memory) bids are made with. With only-when-idle, the offer itself: 0 cores declines.
        Otherwise at least one core: the operator offered the machine whatever else runs on it, so the
        owner's use makes the node's estimates later but never makes it refuse work."""
        cores, memory = self.current.offered
        if self.policy.only_when_idle:
            return cores, memory
        return max(1, cores), memory

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._apply(self.current)
        async with trio.open_nursery() as nursery:
            await nursery.start(
                partial(
                    run_capacity_monitor,
                    policy=self.policy,
                    on_change=self.on_change,
                    interval=self.interval,
                    worker_pids=self.worker_pids,
                    sampler=self.sampler,
                )
            )
            nursery.start_soon(self._advertise_loop)
            nursery.start_soon(self._deadline_loop)
            task_status.started()

    def on_change(self, capacity: Capacity) -> None:
        before = self.current.offered
        self.current = capacity
        self._apply(capacity)
        if capacity.offered != before:
            self._advertise_now.set()

    def _apply(self, capacity: Capacity) -> None:
        if not self.policy.only_when_idle:
            return  # the owner's use lowers what is offered to new jobs; running ones keep going
        if capacity.cores == 0 and not self.scheduler.suspended:
            log.info("offering no cores (%s): suspending jobs", capacity.state.value)
            self.scheduler.suspend()
            self._advertise_now.set()
        elif capacity.cores > 0 and self.scheduler.suspended:
            log.info("offering %d core(s) again: resuming jobs", capacity.cores)
            self.scheduler.resume()

    # --- advertisements ---

    def advertisement(self) -> bytes:
        cores, memory = self.current.offered
        ad = CapacityAd(
            network=self.network,
            node=self.node,
            expires=self.clock() + ADVERT_TTL_MS,
            cores=min(cores, 0xFFFF),
            memory_bytes=memory,
            profiles=(Digest(self.profile),),
            queue_length=min(self.scheduler.queue_length, 0xFFFFFFFF),
            fuel_rate=self.scheduler.fuel_rate,
        )
        return sign_message(ad, self.identity)

    async def _advertise_loop(self) -> None:
        while True:
            raw = self.advertisement()
            if self.publish is not None and self.policy.cores > 0:  # a submit-only node offers nothing
                try:
                    self.publish(raw)
                except ProtocolError as e:
                    log.warning("cannot publish the capacity advertisement: %s", e)
            with trio.move_on_after(ADVERT_TTL_MS / 3000):
                await self._advertise_now.wait()
            self._advertise_now = trio.Event()
            await trio.sleep(ADVERT_DELAY)

    def link_up(self, peer: bytes, send: Callable[[bytes], Any]) -> None:
        """A new link: advertise afresh (a new message, so gossip floods it to the newcomer too)."""
        self.track.link_up(peer)
        self._advertise_now.set()

    def link_down(self, peer: bytes) -> None:
        self.track.link_down(peer)

    async def message(self, peer: bytes, raw: bytes) -> None:
        pass

    async def listen(self, adverts: trio.MemoryReceiveChannel[VerifiedEnvelope[Any]]) -> None:
        """Keep the latest unexpired advertisement of every peer (from gossip's `capacity` channel)."""
        async for env in adverts:
            msg = env.message
            if not isinstance(msg, CapacityAd) or msg.network != self.network or msg.node == self.node:
                continue
            self.heard(msg)

    def heard(self, msg: CapacityAd) -> bool:
        """Keep a peer's advertisement if it is newer than the one kept; a stranger's (a key with no
        evidence) only while fewer than STRANGER_ADVERTS strangers' are kept. True if kept."""
        key = msg.node.raw
        kept = self.peers.get(key)
        if kept is not None and kept.expires >= msg.expires:
            return False
        if kept is None and key not in self.track and self._strangers() >= STRANGER_ADVERTS:
            return False
        ad = PeerCapacity(msg.cores, msg.memory_bytes, msg.queue_length, msg.fuel_rate, msg.expires)
        self.peers[key] = ad
        return True

    def _strangers(self) -> int:
        self._prune()
        return sum(1 for key in self.peers if key not in self.track)

    def _prune(self) -> None:
        now = self.clock()
        for key in [k for k, p in self.peers.items() if p.expires <= now]:
            del self.peers[key]

    def believed(self) -> Believed:
        """The network's capacity as this node believes it (rules.believe over the adverts kept)."""
        self._prune()
        return believe((p.cores, p.memory_bytes, key in self.track) for key, p in self.peers.items())

    def peer_table(self) -> dict[str, dict[str, Any]]:
        """Each kept advert (a stranger's counts only within the strangers' share of `believed`)."""
        self._prune()
        return {str(NodeId(k)): p.to_json() for k, p in sorted(self.peers.items())}

    # --- deadlines while suspended ---

    async def _deadline_loop(self) -> None:
        while True:
            await trio.sleep(self.interval)
            if self.scheduler.suspended and self.late is not None:
                handed = await self.late.give_back_late()
                if handed:
                    log.info("handed back %d job(s) that would miss their deadline while suspended", handed)

    def to_json(self) -> dict[str, Any]:
        doc = self.current.to_json()
        doc.update(only_when_idle=self.policy.only_when_idle, suspended=self.scheduler.suspended)
        return doc


__all__ = ["ADVERT_TTL_MS", "CapacityService", "PeerCapacity", "TrackRecord"]
