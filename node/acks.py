"""A submitter's acknowledgements, a batch at a time.

The commit that ends a job records its verified receipt as delivered (Store.record_verified_receipt);
the receipt's `ack` follows with the others of the same executor gathered over
`MarketSettings.ack_batch_s`: one signed `ack` of up to MAX_ACKED receipts per executor and batch,
stored once (Store.put_acks) and sent. A tiny job then costs a fraction of a signed message here instead
of one, and its executor checks one signature per batch.

Nothing here needs to survive a stop. An ack lost with the node, or stored without a sync and taken
back by a power cut, is signed again: the executor delivers the receipt again until acknowledged
(Submitter._resend_ack queues the receipt here when no ack of it is stored), and at start every verified
receipt of ours with no ack is queued (`Store.verified_unacked`). An ack that finds no link is sent
again, from the store, when its executor delivers the receipt again.
"""

from __future__ import annotations

import logging

import trio
from e31.protocol.envelope import sign_verified
from e31.protocol.ids import Digest, NodeId
from e31.protocol.receipts import MAX_ACKED, Ack

from .market import MarketContext
from .store import Store, StoreError, call

log = logging.getLogger(__name__)

ACKS_DUE_KEPT = 100_000
"""Receipts waiting for their ack at most (the oldest are dropped first: each is queued again when its
executor delivers it again)."""


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
        async with trio.open_nursery() as nursery:
            while True:
                await self._wake.wait()
                await trio.sleep(self.ctx.settings.ack_batch_s)
                self._wake = trio.Event()
                due, self._due = self._due, {}
                sends = await self._sign_and_store(due)
                for executor, raws in sends.items():  # a stalled link holds up only its own acks
                    nursery.start_soon(self._send, executor, raws)

    async def _sign_and_store(self, due: dict[tuple[bytes, bytes], bytes]) -> dict[bytes, list[bytes]]:
        """One ack per executor and MAX_ACKED receipts, all stored in one commit; the envelopes to send."""
        ctx = self.ctx
        now_ms = ctx.clock()
        by_executor: dict[bytes, list[tuple[bytes, bytes]]] = {}
        for (executor, receipt_id), job_id in sorted(due.items()):
            by_executor.setdefault(executor, []).append((receipt_id, job_id))
        calls, sends = [], {}
        for executor, receipts in by_executor.items():
            for i in range(0, len(receipts), MAX_ACKED):
                part = receipts[i:i + MAX_ACKED]
                ids = tuple(Digest(receipt_id) for receipt_id, _ in part)
                env = sign_verified(Ack(ctx.network, ctx.node, NodeId(executor), now_ms, ids), ctx.identity)
                calls.append(call(Store.put_acks, env.message_id.raw, env.raw, now_ms / 1000, part,
                                  durable=False))
                sends.setdefault(executor, []).append(env.raw)
        try:
            await ctx.store.atomically(*calls, durable=False)
        except StoreError as e:  # each receipt is delivered again, and acknowledged then
            log.warning("could not store %d acknowledgements: %s", len(calls), e)
            return {}
        return sends

    async def _send(self, executor: bytes, raws: list[bytes]) -> None:
        for raw in raws:
            if not await self.ctx.send_to(executor, raw):
                return  # no link: the executor delivers its receipts again, and gets the stored acks
