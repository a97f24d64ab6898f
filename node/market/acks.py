"""A submitter's acknowledgements, a batch at a time.

The commit that ends a job records its verified receipt as delivered (Store.record_verified_receipt);
the receipt's `ack` follows with the others of the same executor gathered over
`MarketSettings.ack_batch_s`: one signed `ack` of up to MAX_ACKED receipts per executor and batch,
stored once (Store.put_acks) and sent. A tiny job then costs a fraction of a signed message here instead
of one, and its executor checks one signature per batch.

Nothing here needs to survive a stop. An ack lost with the node, or stored without a sync and taken
back by a power cut, is signed again: the executor delivers the receipt again until acknowledged
(Submitter._resend_ack queues the receipt here when no ack of it is stored), and at start the verified
receipts of ours with no ack are queued (`Store.verified_unacked`; a job this node ran itself is not
delivered again, as its receipt is marked delivered by the verification). An ack that finds no link is
sent again, from the store, when its executor delivers the receipt again. An ack the store cannot keep
is tried again, backing off.
"""

from __future__ import annotations

import logging

import trio
from e31.protocol.envelope import sign_verified
from e31.protocol.ids import Digest, NodeId
from e31.protocol.receipts import MAX_ACKED, Ack

from ..errors import StoreError
from ..store.db import Store
from .context import MarketContext
from .rules import backoff

log = logging.getLogger(__name__)

ACKS_DUE_KEPT = 100_000
"""Receipts waiting for their ack at most (the oldest are dropped first: each is queued again when its
executor delivers it again, or, executed by this node itself, at its next start)."""
RETRY_MAX = 30.0
"""Seconds between tries at most while the store refuses to keep acks (a full disk)."""


class Acknowledger:
    """Gathers verified receipts per executor and acknowledges each executor's in one signed `ack`."""

    def __init__(self, ctx: MarketContext) -> None:
        self.ctx = ctx
        self._due: dict[tuple[bytes, bytes], bytes] = {}
        """(executor, receipt id) -> job id, in the order they came."""
        self._wake = trio.Event()

    def add(self, executor: bytes, receipt_id: bytes, job_id: bytes) -> None:
        """Acknowledge this receipt (verified, and recorded delivered) with the next batch."""
        self._due[(executor, receipt_id)] = job_id
        while len(self._due) > ACKS_DUE_KEPT:
            del self._due[next(iter(self._due))]
        self._wake.set()

    async def run(self) -> None:
        failures = 0
        async with trio.open_nursery() as nursery:
            while True:
                await self._wake.wait()
                delay = self.ctx.settings.ack_batch_s
                if failures:
                    delay = backoff(max(delay, 0.05), failures, RETRY_MAX, doublings=12)
                await trio.sleep(delay)
                self._wake = trio.Event()
                due, self._due = self._due, {}
                sends, left = await self._sign_and_store(due)
                for executor, raws in sends.items():  # a stalled link holds up only its own acks
                    nursery.start_soon(self._send, executor, raws)
                if not left:
                    failures = 0
                    continue
                failures += 1  # the store failed: those receipts wait for the next try, backing off
                for (executor, receipt_id), job_id in left.items():
                    self.add(executor, receipt_id, job_id)

    async def _sign_and_store(
        self, due: dict[tuple[bytes, bytes], bytes]
    ) -> tuple[dict[bytes, list[bytes]], dict[tuple[bytes, bytes], bytes]]:
        """One ack per executor and MAX_ACKED receipts, each stored in a commit of its own (a long queue
        after a start does not hold the event loop in one long transaction). Returns the envelopes to
        send, and the receipts whose acks could not be stored."""
        ctx = self.ctx
        by_executor: dict[bytes, list[tuple[bytes, bytes]]] = {}
        for (executor, receipt_id), job_id in sorted(due.items()):
            by_executor.setdefault(executor, []).append((receipt_id, job_id))
        sends: dict[bytes, list[bytes]] = {}
        left: dict[tuple[bytes, bytes], bytes] = {}
        for executor, receipts in by_executor.items():
            for i in range(0, len(receipts), MAX_ACKED):
                part = receipts[i : i + MAX_ACKED]
                now_ms = ctx.clock()
                ids = tuple(Digest(receipt_id) for receipt_id, _ in part)
                env = sign_verified(Ack(ctx.network, ctx.node, NodeId(executor), now_ms, ids), ctx.identity)
                try:
                    await ctx.store.run(
                        Store.put_acks,
                        env.message_id.raw,
                        env.raw,
                        now_ms / 1000,
                        part,
                        durable=False,
                        delivered=True,  # each recorded so when it was verified (outcomes.py)
                    )
                except StoreError as e:
                    log.warning("could not store the acknowledgement of %d receipts: %s", len(part), e)
                    left.update(((executor, receipt_id), job_id) for receipt_id, job_id in part)
                    continue
                sends.setdefault(executor, []).append(env.raw)
        return sends, left

    async def _send(self, executor: bytes, raws: list[bytes]) -> None:
        for raw in raws:
            if not await self.ctx.send_to(executor, raw):
                return  # no link: the executor delivers its receipts again, and gets the stored acks
