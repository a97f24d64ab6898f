"""What the market's roles share: the node's identity and stores, the market's settings, and the way to
reach a peer, this node itself included.

A node is both roles at once, and its own offers reach its own executor as if from a peer: `send_to`
a peer that is this node hands the envelope to its market's loopback (router.Market serves it while it
runs), so a node alone, or one on a small network, runs its own jobs through exactly the same path
(signatures, receipts, acknowledgements).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import nacl.signing
import trio
from e31.protocol.ids import NodeId

from ..lifecycle import check_transition
from ..store.async_store import AsyncStore
from ..store.blobs import BlobStore
from ..store.db import Call, Store, call
from .rules import WindowSettings
from .transfer import TransferSettings

PeerSend = Callable[[bytes, bytes], Awaitable[bool]]
Handler = Callable[[bytes, bytes], Awaitable[None]]


def transition(role: str, job_id: bytes, old: str, new: str, now: float, **changes: Any) -> Call:
    """The store call moving a job of `role` from `old` to `new` (compare-and-set: a no-op if the job
    has left `old`), checked against the allowed moves first; for `AsyncStore.run` or, with other
    writes in one commit, `AsyncStore.atomically`."""
    check_transition(role, old, new)
    return call(Store.update_job, job_id, role, now, expect_state=old, state=new, **changes)


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class MarketSettings:
    window: WindowSettings = field(default_factory=WindowSettings)
    offer_ttl_ms: int = 60_000
    bid_ttl_ms: int = 30_000
    lease_slack_ms: int = 30_000
    reoffer_delay: float = 1.0
    """Seconds between rounds of an offer that found no bid."""
    delivery_interval: float = 2.0
    """Seconds between attempts to deliver an unacknowledged result to its submitter."""
    delivery_backoff_max: float = 60.0
    retention_ms: int = 7 * 24 * 3600 * 1000
    proof_batch_s: float = 0.2
    """An executor gathers the receipts acknowledged over this long, then appends them to its receipt
    log in one commit and proves them against one new signed tree head (not one of each per job)."""
    ack_batch_s: float = 0.2
    """A submitter gathers the receipts it verified over this long, then acknowledges each executor's
    with one signed `ack` (node/acks.py), well inside the executor's first re-delivery."""
    max_queue_per_core: int = 64
    execute_own_jobs: bool = True
    own_share: float = 1.0
    """The fair-share weight this node's own jobs get in its queue, against 1 for every other submitter
    (policy.py): no preference by default."""
    transfer: TransferSettings = field(default_factory=TransferSettings)
    collect_wait: float = 30.0
    """Seconds a restarted submitter waits for the executor of a job whose lease ran out while it was
    away to be reachable again (and again each time that link drops), before it reassigns the job
    (submitter.py: collect before reassigning)."""


TEST_TIMING_ENV = "E31_TEST_MARKET_TIMING"
"""TEST ONLY: `lease_slack_ms=N,collect_wait=S,delivery_interval=S` sets those for a node process (the
tests stop a submitter until its leases run out). Never set otherwise."""


def settings_from_env() -> MarketSettings:
    """The default settings, with the test timing knob applied when it is set (a bad one is ignored)."""
    settings = MarketSettings()
    text = os.environ.get(TEST_TIMING_ENV, "")
    changes: dict[str, Any] = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        try:
            if key == "lease_slack_ms":
                changes[key] = max(0, int(value))
            elif key in ("collect_wait", "delivery_interval"):
                changes[key] = max(0.0, float(value))
        except ValueError:
            continue
    return dataclasses.replace(settings, **changes) if changes else settings


class Loopback:
    """Envelopes this node sends itself, each handed to the market's handler in a task of its own, as a
    peer's would be. Made before the roles (they send through it) and served by the market while it
    runs; one sent while it does not is refused."""

    def __init__(self) -> None:
        self._serve: tuple[trio.Nursery, Handler] | None = None

    @contextmanager
    def serving(self, nursery: trio.Nursery, handler: Handler) -> Iterator[None]:
        self._serve = (nursery, handler)
        try:
            yield
        finally:
            self._serve = None

    def deliver(self, peer: bytes, raw: bytes) -> bool:
        if self._serve is None:
            return False
        nursery, handler = self._serve
        nursery.start_soon(handler, peer, raw)
        return True


@dataclass
class MarketContext:
    """What both roles share: who we are, where things are kept, how to reach a peer."""

    identity: nacl.signing.SigningKey
    network: str
    store: AsyncStore
    blobs: BlobStore
    settings: MarketSettings
    clock: Callable[[], int] = wall_ms
    peer_send: PeerSend | None = None
    connected: Callable[[], list[bytes]] = list
    loopback: Loopback = field(default_factory=Loopback)
    local: bytes = field(init=False)

    def __post_init__(self) -> None:
        self.local = bytes(self.identity.verify_key)

    @property
    def node(self) -> NodeId:
        return NodeId(self.local)

    def now_s(self) -> float:
        return self.clock() / 1000

    async def send_to(self, peer: bytes, raw: bytes) -> bool:
        """Send a signed envelope to `peer`; to this node itself, it is delivered locally."""
        if peer == self.local:
            return self.loopback.deliver(peer, raw)
        if self.peer_send is None:
            return False
        return await self.peer_send(peer, raw)
