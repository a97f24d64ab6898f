"""The market service: the job messages between nodes, routed to the submitter and executor roles.

One `Market` per node. It is a LinkListener of the peering service: every direct job message
(`bid`, `decline`, `assign`, `accepted`, `release`, `result`, `ack`, `cancel`, `blobreq`, `blobchunk`,
`proofreq`, `proof`) is verified here,
must be signed by the peer it came from, and goes to the role that handles it; offers arrive from
gossip. Handlers never block the link's reader: slow work (disk, fetches, runs) runs in the market's
own tasks.

A node is both roles at once, and its own offers reach its own executor as if from a peer: `send_to`
a peer that is this node delivers the envelope locally, so a node alone, or one on a small network,
runs its own jobs through exactly the same path (signatures, receipts, acknowledgements).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import nacl.signing
import trio
from e31.protocol.envelope import VerifiedEnvelope, claimed_kind, verify
from e31.protocol.errors import ProtocolError
from e31.protocol.ids import NodeId
from e31.protocol.messages import (
    Accepted,
    Ack,
    Assign,
    Bid,
    BlobChunk,
    BlobRequest,
    Cancel,
    Decline,
    InclusionProof,
    Offer,
    ProofRequest,
    Release,
    Result,
)

from ..lifecycle import check_transition
from ..nursery import own_nursery
from ..store.blobs import BlobStore
from ..store.db import AsyncStore, Call, Store, call
from .rules import WindowSettings
from .transfer import BlobTransfer, TransferSettings

log = logging.getLogger("e31.market")

DIRECT_KINDS = frozenset(
    {
        "bid",
        "decline",
        "assign",
        "accepted",
        "release",
        "result",
        "ack",
        "cancel",
        "blobreq",
        "blobchunk",
        "proofreq",
        "proof",
    }
)
PeerSend = Callable[[bytes, bytes], Awaitable[bool]]


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
    transfer: TransferSettings = field(default_factory=TransferSettings)


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
    local: bytes = b""
    deliver_local: Callable[[bytes, bytes], None] | None = None

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
            if self.deliver_local is None:
                return False
            self.deliver_local(peer, raw)
            return True
        if self.peer_send is None:
            return False
        return await self.peer_send(peer, raw)


class Market:
    """The LinkListener that ties the transfer, submitter and executor roles to the node's links."""

    def __init__(self, ctx: MarketContext, *, submitter: Any, executor: Any, transfer: BlobTransfer) -> None:
        self.ctx = ctx
        self.submitter = submitter
        self.executor = executor
        self.transfer = transfer
        self._nursery: trio.Nursery | None = None
        ctx.deliver_local = self._deliver_local

    async def run(
        self,
        offers: trio.abc.ReceiveChannel[VerifiedEnvelope[Any]] | None = None,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        async with own_nursery(self) as nursery:
            await nursery.start(self.transfer.run)
            await nursery.start(self.executor.run)
            await nursery.start(self.submitter.run)
            if offers is not None:
                nursery.start_soon(self._offers, offers)
            task_status.started()

    async def _offers(self, offers: trio.abc.ReceiveChannel[VerifiedEnvelope[Any]]) -> None:
        async for env in offers:
            if isinstance(env.message, Offer):
                self.executor.on_offer(env)

    # --- LinkListener ---

    def link_up(self, peer: bytes, send: Callable[[bytes], Awaitable[None]]) -> None:
        self.executor.on_link_up(peer)
        self.submitter.on_link_up(peer)

    def link_down(self, peer: bytes) -> None:
        pass

    async def message(self, peer: bytes, raw: bytes) -> None:
        kind = claimed_kind(raw)
        if kind not in DIRECT_KINDS:
            return
        try:
            env = verify(raw)
        except ProtocolError as e:
            log.info("dropping an invalid %s from %s: %s", kind, NodeId(peer), e)
            return
        if env.signer.raw != peer:
            log.info("dropping a %s from %s signed by another node", kind, NodeId(peer))
            return
        if getattr(env.message, "network", self.ctx.network) != self.ctx.network:
            return
        self.dispatch(peer, env)

    def dispatch(self, peer: bytes, env: VerifiedEnvelope[Any]) -> None:
        msg = env.message
        if isinstance(msg, BlobRequest):
            self.transfer.on_request(peer, env)
        elif isinstance(msg, BlobChunk):
            self.transfer.on_chunk(peer, env)
        elif isinstance(msg, Bid | Decline):
            self.submitter.on_answer(env)
        elif isinstance(msg, Result):
            self.submitter.on_outcome(env)
        elif isinstance(msg, Assign):
            self.executor.on_assign(env)
        elif isinstance(msg, Accepted):
            self.submitter.on_accepted(env)
        elif isinstance(msg, Release):
            self.submitter.on_release(env)
        elif isinstance(msg, Cancel):
            self.executor.on_cancel(env)
        elif isinstance(msg, Ack):
            self.executor.on_ack(env)
        elif isinstance(msg, ProofRequest):
            self.executor.on_proof_request(peer, env)
        elif isinstance(msg, InclusionProof):
            self.submitter.on_proof(env)

    def _deliver_local(self, peer: bytes, raw: bytes) -> None:
        if self._nursery is not None:
            self._nursery.start_soon(self.message, peer, raw)
