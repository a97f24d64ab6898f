"""The market service: the job messages between nodes, routed to the submitter and executor roles.

One `Market` per node. It is a LinkListener of the peering service: every direct job message
(`bid`, `decline`, `assign`, `accepted`, `release`, `result`, `ack`, `cancel`, `withdraw`, `blobreq`,
`blobchunk`, `proofreq`, `proof`) is verified here,
must be signed by the peer it came from, and goes to the role that handles it; offers arrive from
gossip. Handlers never block the link's reader: slow work (disk, fetches, runs) runs in the market's
own tasks.

A node's messages to itself come in through its loopback (market/context.py), served here while the
market runs, as if from a peer.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio
from e31.protocol.envelope import VerifiedEnvelope, claimed_kind, verify
from e31.protocol.errors import ProtocolError
from e31.protocol.ids import NodeId
from e31.protocol.messages import (
    Accepted,
    Ack,
    Assign,
    Award,
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
    Results,
    Withdraw,
)

from ..nursery import TaskSlot
from .context import MarketContext
from .executor import Executor
from .submitter import Submitter
from .transfer import BlobTransfer

log = logging.getLogger("e31.market")

DIRECT_KINDS = frozenset(
    {
        "bid",
        "decline",
        "assign",
        "award",
        "accepted",
        "release",
        "result",
        "results",
        "ack",
        "cancel",
        "withdraw",
        "blobreq",
        "blobchunk",
        "proofreq",
        "proof",
    }
)


class Market:
    """The LinkListener that ties the transfer, submitter and executor roles to the node's links."""

    def __init__(
        self, ctx: MarketContext, *, submitter: Submitter, executor: Executor, transfer: BlobTransfer
    ) -> None:
        self.ctx = ctx
        self.submitter = submitter
        self.executor = executor
        self.transfer = transfer
        self._tasks = TaskSlot()

    async def run(
        self,
        offers: trio.abc.ReceiveChannel[VerifiedEnvelope[Any]] | None = None,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        async with self._tasks.open() as nursery:
            with self.ctx.loopback.serving(nursery, self.message):
                await nursery.start(self.transfer.run)
                await nursery.start(self.executor.run)
                await nursery.start(self.submitter.run)
                if offers is not None:
                    nursery.start_soon(self._offers, offers)
                task_status.started()
                await trio.sleep_forever()

    async def _offers(self, offers: trio.abc.ReceiveChannel[VerifiedEnvelope[Any]]) -> None:
        async for env in offers:
            if isinstance(env.message, Offer):
                self.executor.on_offer(env)

    # --- LinkListener ---

    def link_up(self, peer: bytes, send: Callable[[bytes], Awaitable[None]]) -> None:
        self.executor.on_link_up(peer)
        self.submitter.on_link_up(peer)

    def link_down(self, peer: bytes) -> None:
        self.submitter.on_link_down(peer)

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
        elif isinstance(msg, Results):
            self.submitter.on_results(env)
        elif isinstance(msg, Result):
            self.submitter.on_outcome(env)
        elif isinstance(msg, Assign):
            self.executor.on_assign(env)
        elif isinstance(msg, Award):
            self.executor.bids.award(env)
        elif isinstance(msg, Accepted):
            self.submitter.on_accepted(env)
        elif isinstance(msg, Release):
            self.submitter.on_release(env)
        elif isinstance(msg, Cancel):
            self.executor.on_cancel(env)
        elif isinstance(msg, Withdraw):
            self.executor.on_withdraw(env)
        elif isinstance(msg, Ack):
            self.executor.on_ack(env)
        elif isinstance(msg, ProofRequest):
            self.executor.on_proof_request(peer, env)
        elif isinstance(msg, InclusionProof):
            self.submitter.on_proof(env)
