"""Assembles the job path of a running node: scheduler, blob transfer, capacity, executor, submitter
and market. `build_job_path` makes them, each given what it needs at construction, in dependency order
(tests build their in-memory nodes with it too); the daemon starts them with one
`nursery.start(run_jobs, ...)`.

Wiring: the market is a LinkListener of the peering service (direct job messages); offers come from
gossip's `offer` subscription and go out through `gossip.publish`; the executor's acknowledged
receipts are appended to the receipt log when one is given. The net wing is seen through the `Peers`
and `Gossip` protocols, so the job path runs over the in-memory network of the tests as well.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import nacl.signing
import trio
from e31.protocol.envelope import VerifiedEnvelope
from e31.protocol.errors import ProtocolError
from e31.protocol.ids import NodeId
from e31.protocol.receipts import UsageReceipt

from ..config import NodeConfig
from ..host.capacity import CapacityPolicy, sampler_from_env
from ..net.peering import LinkListener
from ..store.async_store import AsyncStore
from ..store.blobs import BlobStore
from ..store.db import Store
from ..store.receiptlog import ReceiptLog, ReceiptLogError
from .adverts import CapacityService, TrackRecord
from .context import MarketContext, MarketSettings, settings_from_env
from .delivery import OnAcked, Prover
from .executor import Executor
from .held import HeldJobs
from .offering import Publish
from .router import Market
from .scheduler import Scheduler
from .submitter import Submitter
from .transfer import BlobTransfer, SmallBlobs

log = logging.getLogger("e31.market")
X = TypeVar("X")
Y = TypeVar("Y")

MODULE_CACHE_DIR = "module-cache"
RUNS_DIR = "runs"
ENGINE_OVERHEAD = 512 << 20
"""RLIMIT_DATA of a worker beyond the job's memory and output: Python, wasmtime and compilation."""


class Peers(Protocol):
    """The links the job path speaks over (net.peering.PeerService; an in-memory fake in tests)."""

    async def send(self, peer: bytes, envelope: bytes) -> bool: ...
    def connected(self) -> list[bytes]: ...
    def add_listener(self, listener: LinkListener) -> None: ...


class Gossip(Protocol):
    """Dissemination of offers and capacity advertisements (net.gossip.GossipService)."""

    def publish(self, message: bytes | VerifiedEnvelope[Any]) -> int: ...
    def subscribe(self, kind: str, buffer: int = 256) -> trio.MemoryReceiveChannel[VerifiedEnvelope[Any]]: ...


@dataclass(frozen=True, slots=True)
class JobPath:
    """The job path's objects, each built with what it needs (`build_job_path`)."""

    ctx: MarketContext
    transfer: BlobTransfer
    scheduler: Scheduler
    held: HeldJobs
    capacity: CapacityService
    executor: Executor
    submitter: Submitter
    market: Market


def bootstrap_keys(config: NodeConfig) -> list[bytes]:
    """The keys of the bootstrap peers the operator pinned (NODEID@HOST:PORT): evidence for them."""
    keys = []
    for peer in config.bootstrap:
        if peer.node_id is not None:
            try:
                keys.append(NodeId.parse(peer.node_id).raw)
            except ProtocolError:
                continue
    return keys


def build_job_path(
    *,
    identity: nacl.signing.SigningKey,
    config: NodeConfig,
    store: AsyncStore,
    blobs: BlobStore,
    peers: Peers,
    publish: Publish | None = None,
    receipt_log: ReceiptLog | None = None,
    settings: MarketSettings | None = None,
    on_acked: OnAcked | None = None,
) -> JobPath:
    """Build the job path in dependency order, nothing started: the context, the blob transfer, the
    scheduler and its worker pool, the jobs held (which the capacity service may hand back while the
    node is suspended), the capacity service (what bids count on), the executor, the submitter and the
    market over them. `publish` gossips offers and advertisements (None: offers reach only this node's
    own executor); the executor's acknowledged receipts go to `on_acked`, else to `receipt_log`."""
    from e31.sandbox.limits import Limits as SandboxLimits
    from e31.sandbox.pool import WorkerPool
    from e31.sandbox.profile import PROFILE

    settings = settings or settings_from_env()
    ctx = MarketContext(
        identity=identity,
        network=config.network,
        store=store,
        blobs=blobs,
        settings=settings,
        peer_send=peers.send,
        connected=peers.connected,
    )
    transfer = BlobTransfer(
        identity=identity,
        network=config.network,
        blobs=blobs,
        send=ctx.send_to,
        wall_ms=ctx.clock,
        settings=settings.transfer,
        small_blobs=small_blob_reader(store),
    )
    workers = config.cores  # 0: a submit-only node, which starts no pool and declines every offer
    data_limit = (
        max(config.memory, SandboxLimits.DEFAULT_MEMORY_BYTES)
        + SandboxLimits.DEFAULT_MAX_OUTPUT_BYTES
        + ENGINE_OVERHEAD
    )

    def pool() -> WorkerPool:
        return WorkerPool(workers, config.data_dir / MODULE_CACHE_DIR, data_limit_bytes=data_limit)

    scheduler = Scheduler(workers, pool, weights={bytes(identity.verify_key): settings.own_share})
    held = HeldJobs(ctx.clock)
    track = TrackRecord(ctx.clock, bootstrap_keys(config))
    capacity = CapacityService(
        identity=identity,
        network=config.network,
        policy=CapacityPolicy.from_config(config),
        scheduler=scheduler,
        profile=PROFILE.digest,
        interval=config.capacity_interval,
        # The node's own process is ours too, not the owner's: its CPU (gossip, transfers, signatures)
        # must not count as owner load, or a busy node would talk itself out of capacity.
        worker_pids=lambda: [os.getpid(), *scheduler.worker_pids()],
        sampler=sampler_from_env(),
        clock=ctx.clock,
        publish=publish,
        late=held,
        track=track,
    )
    executor = Executor(
        ctx,
        transfer=transfer,
        scheduler=scheduler,
        held=held,
        runs_dir=config.data_dir / RUNS_DIR,
        profile=PROFILE.digest,
        memory_bytes=config.memory,
        capacity=capacity,
        on_acked=on_acked or log_appender(receipt_log),
        prover=None if receipt_log is None else log_prover(receipt_log),
    )
    own = executor.on_offer if workers > 0 else None  # a submit-only node offers its jobs to others only
    submitter = Submitter(
        ctx, transfer=transfer, publish=publish, local_offer=own, track=track, adverts=capacity.peers
    )
    transfer.on_corrupt = submitter.on_corrupt_blob
    market = Market(ctx, submitter=submitter, executor=executor, transfer=transfer)
    return JobPath(ctx, transfer, scheduler, held, capacity, executor, submitter, market)


async def run_jobs(
    *,
    identity: nacl.signing.SigningKey,
    config: NodeConfig,
    store: AsyncStore,
    blobs: BlobStore,
    peering: Peers,
    gossip: Gossip | None = None,
    receipt_log: ReceiptLog | None = None,
    settings: MarketSettings | None = None,
    on_capacity: Callable[[CapacityService], object] | None = None,
    adverts: trio.MemoryReceiveChannel[VerifiedEnvelope[Any]] | None = None,
    task_status: trio.TaskStatus[Market] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the job path until cancelled; `nursery.start` returns the Market once it is ready.

    `gossip` None: offers reach only this node's own executor; `on_capacity` is handed the node's
    CapacityService (for the status document); `adverts` is gossip's `capacity` subscription when the
    caller opened it early (so no advertisement is missed at start)."""
    if adverts is None and gossip is not None:
        adverts = gossip.subscribe("capacity")
    path = build_job_path(
        identity=identity,
        config=config,
        store=store,
        blobs=blobs,
        peers=peering,
        publish=None if gossip is None else gossip.publish,
        receipt_log=receipt_log,
        settings=settings,
    )
    if on_capacity is not None:
        on_capacity(path.capacity)
    offers = None if gossip is None else gossip.subscribe("offer")
    async with trio.open_nursery() as nursery:
        await nursery.start(path.market.run, offers)
        peering.add_listener(path.market)
        await nursery.start(path.capacity.run)
        peering.add_listener(path.capacity)
        if adverts is not None:
            nursery.start_soon(path.capacity.listen, adverts)
        task_status.started(path.market)


def log_appender(receipt_log: ReceiptLog | None) -> OnAcked:
    """The executor's OnAcked over this node's receipt log (none: acknowledged receipts are not logged).
    Each receipt's row is marked with its log index in the same commit."""

    def append(receipts: list[VerifiedEnvelope[UsageReceipt]]) -> None:
        assert receipt_log is not None
        _all_or_each(
            receipt_log.append_many,
            receipt_log.append,
            receipts,
            lambda r: f"receipt {r.message_id.hex()[:12]} stays out of the receipt log",
        )

    async def acked(receipts: list[VerifiedEnvelope[UsageReceipt]]) -> None:
        if receipt_log is not None:
            await trio.to_thread.run_sync(append, receipts)

    return acked


def small_blob_reader(store: AsyncStore) -> SmallBlobs:
    """The transfer's reader of the small blobs this node keeps in its database (outputs of jobs)."""

    async def small_blob(root: bytes) -> bytes | None:
        return (await store.run(Store.small_blobs, [root.hex()])).get(root.hex())

    return small_blob


def log_prover(receipt_log: ReceiptLog) -> Prover:
    """The executor's Prover over this node's receipt log: for each peer, the proofs placing the receipts
    due to it (one proof per MAX_PROOF_ENTRIES of them). A receipt the log cannot prove (a damaged row:
    ReceiptLogError) is left out with a warning, and the peer's others still go, one by one."""

    def prove(wanted: dict[bytes, list[bytes]], now: int) -> dict[bytes, list[bytes]]:
        out: dict[bytes, list[bytes]] = {}
        for peer, receipt_ids in wanted.items():
            try:
                out[peer] = receipt_log.inclusions(receipt_ids, now)
            except ReceiptLogError:
                out[peer] = []
                for receipt_id in receipt_ids:
                    try:
                        out[peer] += receipt_log.inclusions([receipt_id], now)
                    except ReceiptLogError as e:
                        log.warning("no inclusion proof for receipt %s: %s", receipt_id.hex()[:12], e)
        return out

    return prove


def _all_or_each(
    whole: Callable[[list[X]], Sequence[Y | None]],
    one: Callable[[X], Y],
    items: list[X],
    refused: Callable[[X], str],
) -> list[Y | None]:
    """`whole(items)` in one go; if the receipt log refuses it (ReceiptLogError: one item it cannot
    take), `one(item)` for each, so the others still go, None (and a warning) for each refused."""
    try:
        return list(whole(items))
    except ReceiptLogError:
        out: list[Y | None] = []
        for item in items:
            try:
                out.append(one(item))
            except ReceiptLogError as e:
                log.warning("%s: %s", refused(item), e)
                out.append(None)
        return out
