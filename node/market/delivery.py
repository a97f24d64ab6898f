"""An executor's delivery until acknowledged: results sent again until their ack comes, then the
acknowledged receipts logged and proved.

A finished job's outcome is committed, and its receipt (and its small outputs, the first time) goes to
the submitter in a `results` carrier, with those of the jobs that finish close together: a result waits
for others while other jobs are held here, at most GATHER_S and until MAX_RESULTS are in (one commit,
sync, signature, message and send for the set; each receipt stays signed on its own). It is sent
again every `delivery_interval` (backing off, the receipts due at once again in carriers) and
whenever its link comes up, until its `ack` arrives. An ack names a batch of our receipts; it is
checked against each (protocol/receipts.check_ack: ids of receipts we did not sign for that submitter
are ignored) and stored once for them; acknowledged receipts are gathered for `proof_batch_s`, handed
to `on_acked` (the receipt log: one append for the batch), and one signed `proof` per submitter
places all of its receipts of the batch against one new tree head; again on request (`proofreq`) or
on a repeated ack; a proof that finds no link goes when the link comes up. Receipts acknowledged but
not yet logged when the node stopped are logged when it starts. The carrier is signed anew for each
delivery and not kept: the receipt is. Delivery stops, unacknowledged, once the outputs' retention
has ended.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Iterable

import trio
from e31.protocol.blobs import BlobRef
from e31.protocol.codec import unpack_canonical
from e31.protocol.envelope import VerifiedEnvelope, reopen_stored, sign_message
from e31.protocol.errors import Mismatch
from e31.protocol.jobs import JobManifest
from e31.protocol.messages import MAX_RESULTS
from e31.protocol.receipts import Ack, UsageReceipt, check_ack
from e31.protocol.results import Delivered, make_results

from ..errors import StoreError
from ..nursery import TaskSlot
from ..store.db import Call, Store
from .commits import commit_each
from .context import MarketContext, MarketSettings
from .rules import backoff

log = logging.getLogger("e31.executor")

ROLE = "executor"
OnAcked = Callable[[list[VerifiedEnvelope[UsageReceipt]]], Awaitable[object]]
"""Acknowledged receipts of this node, to append to its receipt log (all at once)."""
Prover = Callable[[dict[bytes, list[bytes]], int], dict[bytes, list[bytes]]]
"""({peer: receipt message ids}, now in ms) -> {peer: the signed `proof` envelopes from this node's
receipt log placing those of its receipts that are in the log}, all against one signed tree head, a
proof per MAX_PROOF_ENTRIES receipts (blocking)."""
_ProofsDue = dict[bytes, tuple[frozenset[bytes], VerifiedEnvelope[UsageReceipt] | None]]
"""Receipts (message id) whose proof is due: the peers to send it to, and the receipt when it is still
to be appended to the log."""
UNACKED_KEPT = 4096
"""Unacknowledged receipts kept in memory (the store has them all)."""
PROVE_BACKOFF_MAX = 60.0
"""Seconds between tries at most when appending to the receipt log keeps failing."""
PROOFS_DUE_KEPT = 10_000
"""Proofs due kept while appending to the receipt log keeps failing (the oldest are dropped)."""
PROOFS_WAITING_KEPT = 4096
"""Proofs kept per peer for when its link comes up (the oldest dropped first)."""
GATHER_S = 0.02
"""Seconds a finished job's result waits at most for the results of other jobs held here, to share
their `results` carrier."""


class _Finished:
    """Finished jobs gathered to be committed and delivered together: each job's outcome (its store
    calls) and delivery, and once `committed` is set, the error of each that could not be stored."""

    __slots__ = ("calls", "committed", "errors", "items")

    def __init__(self) -> None:
        self.items: list[Delivered] = []
        self.calls: list[tuple[Call, ...]] = []
        self.errors: list[StoreError | None] = []
        self.committed = trio.Event()


def retention_ms(settings: MarketSettings, manifest: JobManifest) -> int:
    """How long after finishing a job its outputs stay to be fetched: the manifest's wish, within
    this node's own retention."""
    own = settings.retention_ms
    return min(manifest.retention_ms or own, own)


class Delivery:
    def __init__(
        self,
        ctx: MarketContext,
        *,
        on_acked: OnAcked | None,
        prover: Prover | None,
        tidy: Callable[[], Awaitable[None]],
        busy: Callable[[set[bytes]], bool] = lambda _: False,
    ) -> None:
        self.ctx = ctx
        self.on_acked = on_acked
        self.prover = prover
        self.tidy = tidy
        """Run at each turn of the delivery loop (the executor deletes the run directories it moved aside)."""
        self.busy = busy
        """Whether jobs other than these (ids) are held here: their results may join a carrier soon."""
        self._batch = _Finished()
        """Finished jobs gathered for the next commit and carrier (`finish`)."""
        self._gathering = trio.Event()
        self._more = trio.Event()
        self._tasks = TaskSlot()
        self._deliver_now = trio.Event()
        self._to_prove: _ProofsDue = {}
        self._prove_now = trio.Event()
        self._proofs_waiting: dict[bytes, dict[bytes, None]] = {}
        """Proofs (by receipt id) a peer could not be sent for want of a link, sent when it comes up."""
        self._unacked: dict[bytes, VerifiedEnvelope[UsageReceipt]] = {}
        """Receipts signed here and not yet acknowledged (at most UNACKED_KEPT, oldest dropped first):
        their ack needs no store read and no re-verify. The store has them all."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with self._tasks.open() as nursery:
            nursery.start_soon(self._delivery_loop)
            nursery.start_soon(self._send_loop)
            nursery.start_soon(self._prove_loop)
            await self._log_acked_unlogged()
            task_status.started()

    def now(self) -> None:
        """Deliver the unacknowledged receipts now, not at their next retry."""
        self._deliver_now.set()

    def link_up(self, peer: bytes) -> None:
        self._deliver_now.set()
        for receipt_id in self._proofs_waiting.pop(peer, {}):
            self.prove(peer, receipt_id, None)

    def signed(self, receipt: VerifiedEnvelope[UsageReceipt]) -> None:
        """A receipt signed here and stored, to deliver: kept for its ack."""
        self._unacked[receipt.message_id.raw] = receipt
        if len(self._unacked) > UNACKED_KEPT:
            del self._unacked[next(iter(self._unacked))]

    async def withdrawn(self, job_id: bytes) -> None:
        """The job's submitter withdrew it after its run here was over: its receipts still
        unacknowledged are not delivered again (kept, signed, never logged)."""
        me = str(self.ctx.node)
        for row in await self.ctx.store.run(Store.receipts_for_job, job_id):
            if row.executor == me and row.delivered is None and row.next_delivery is not None:
                await self.ctx.store.run(Store.receipt_delivery_failed, row.digest, math.inf)
                self._unacked.pop(row.digest, None)
                log.info("stopped delivering the receipt of job %s: withdrawn", job_id.hex()[:12])

    async def finish(
        self,
        calls: tuple[Call, ...],
        receipt: VerifiedEnvelope[UsageReceipt],
        available: int,
        small: Iterable[tuple[BlobRef, bytes]] = (),
    ) -> None:
        """Keep a finished job's outcome (`calls`: all commit or none) and deliver its receipt: with
        the jobs that end close together, in one commit and one carrier. Returns once the outcome is
        committed (durably); raises the StoreError of a commit that failed (it is then not sent)."""
        batch = self._batch
        index = len(batch.items)
        batch.items.append((receipt, available, tuple(small)))
        batch.calls.append(calls)
        self._gathering.set()
        self._more.set()
        await batch.committed.wait()
        error = batch.errors[index]
        if error is not None:
            raise error

    async def _send_loop(self) -> None:
        """Commit and send what `finish` gathered: at once when no other job is held here (nothing is
        coming), else when MAX_RESULTS are in or GATHER_S has passed since the first."""
        while True:
            await self._gathering.wait()
            with trio.move_on_after(GATHER_S):
                while len(self._batch.items) < MAX_RESULTS and self.busy(
                    {d[0].message.job_id.raw for d in self._batch.items}
                ):
                    await self._more.wait()
                    self._more = trio.Event()
            batch, self._batch = self._batch, _Finished()
            self._gathering, self._more = trio.Event(), trio.Event()
            with trio.CancelScope(shield=True):  # the jobs' tasks wait for this commit
                await self._commit(batch)
            kept = [d for d, error in zip(batch.items, batch.errors, strict=True) if error is None]
            for receipt, _, _ in kept:
                self.signed(receipt)
            await self.deliver(kept)

    async def _commit(self, batch: _Finished) -> None:
        """One durable commit for the batch's outcomes; if it fails, each is committed alone, so one
        that cannot be stored does not take the others with it."""
        try:
            results = await commit_each(self.ctx.store, batch.calls)
            batch.errors = [r if isinstance(r, StoreError) else None for r in results]
        finally:
            batch.errors += [StoreError("the outcome was not stored")] * (
                len(batch.calls) - len(batch.errors)
            )
            batch.committed.set()

    async def deliver(self, delivered: list[Delivered]) -> None:
        """Send each receipt's submitter its results, in as few `results` carriers as fit (signed anew
        each time: they are not kept, the receipts are). One that finds no link goes again with the
        receipt's next delivery."""
        by_submitter: dict[bytes, list[Delivered]] = {}
        for d in delivered:
            by_submitter.setdefault(d[0].message.submitter.raw, []).append(d)
        for submitter, items in by_submitter.items():
            for carrier in make_results(self.ctx.network, self.ctx.node, items):
                if not await self.ctx.send_to(submitter, sign_message(carrier, self.ctx.identity)):
                    break

    async def _delivery_loop(self) -> None:
        settings = self.ctx.settings
        while True:
            with trio.move_on_after(settings.delivery_interval):
                await self._deliver_now.wait()
            self._deliver_now = trio.Event()
            await self.tidy()
            now = self.ctx.now_s()
            due: list[Delivered] = []
            for row in await self.ctx.store.run(Store.receipts_due, now):
                stored = await self.ctx.store.run(Store.envelope, row.message_id)
                job = await self.ctx.store.run(Store.job, row.job_id, ROLE)
                if stored is None or job is None:  # forgotten (pruned): nothing left to deliver
                    await self.ctx.store.run(Store.receipt_delivery_failed, row.digest, math.inf)
                    continue
                receipt = reopen_stored(stored.raw, UsageReceipt)
                manifest = JobManifest.from_wire(unpack_canonical(job.manifest))
                available = receipt.message.finished_at + retention_ms(settings, manifest)
                if available <= self.ctx.clock():
                    # Retention is over: the outputs may be collected, so stop offering the receipt.
                    log.info(
                        "stopped delivering the receipt of job %s: retention ended unacknowledged",
                        row.job_id.hex()[:12],
                    )
                    await self.ctx.store.run(Store.receipt_delivery_failed, row.digest, math.inf)
                    continue
                due.append((receipt, available, ()))  # the submitter fetches the outputs it lacks
                delay = backoff(
                    settings.delivery_interval, row.delivery_tries, settings.delivery_backoff_max, doublings=8
                )
                await self.ctx.store.run(Store.receipt_delivery_failed, row.digest, now + delay)
            if due:
                await self.deliver(due)

    async def take_ack(self, env: VerifiedEnvelope[Ack]) -> None:
        """The submitter countersigned a batch of our receipts: keep the ack once, as the ack of each
        receipt it names that we signed for that submitter (others are ignored), mark those delivered,
        and log and prove them with the next batch."""
        ack = env.message
        if ack.executor != self.ctx.node:
            return
        ids = [receipt_id.raw for receipt_id in ack.receipt_ids]
        fresh: list[tuple[bytes, bytes]] = []
        prove: list[tuple[bytes, VerifiedEnvelope[UsageReceipt] | None]] = []
        for row, raw in await self.ctx.store.run(Store.receipts_with_envelopes, ids):
            receipt = self._unacked.get(row.digest) or reopen_stored(raw, UsageReceipt)
            try:
                check_ack(ack, receipt.message, receipt.message_id)
            except Mismatch as e:
                log.warning(
                    "ignoring an ack from %s for receipt %s: %s", env.signer, row.digest.hex()[:12], e
                )
                continue
            self._unacked.pop(row.digest, None)
            if row.delivered is None:
                fresh.append((row.digest, row.job_id))
            prove.append((row.digest, receipt if row.log_index is None else None))
        if fresh:
            # not durable: lost to a power cut, the receipts are delivered again and their submitter
            # sends the stored ack again; the receipt log's append (durable) makes it durable within
            # moments
            await self.ctx.store.run(
                Store.put_acks, env.message_id.raw, env.raw, self.ctx.now_s(), fresh, durable=False
            )
        # Log each receipt once, whoever stored the ack first: when this node submitted the job itself,
        # its submitter role has already stored the same ack (and marked the receipt delivered).
        for receipt_id, to_log in prove:
            self.prove(ack.submitter.raw, receipt_id, to_log)

    def prove(self, peer: bytes, receipt_id: bytes, to_log: VerifiedEnvelope[UsageReceipt] | None) -> None:
        """Send `peer` the receipt's inclusion proof with the next batch (appending it to the log first
        when `to_log` is given). Every peer that asked meanwhile gets it."""
        peers, queued = self._to_prove.get(receipt_id, (frozenset(), None))
        self._to_prove[receipt_id] = (peers | {peer}, to_log or queued)
        self._prove_now.set()

    async def _prove_loop(self) -> None:
        """Every `proof_batch_s` while proofs are due: one append to the receipt log for the receipts
        acknowledged meanwhile, one signed tree head, a proof each (store/receiptlog.py). A batch that
        fails (the disk) is tried again, backing off."""
        failures = 0
        while True:
            await self._prove_now.wait()
            delay = self.ctx.settings.proof_batch_s
            if failures:
                delay = backoff(max(delay, 0.05), failures, PROVE_BACKOFF_MAX, doublings=12)
            await trio.sleep(delay)
            self._prove_now = trio.Event()
            batch, self._to_prove = self._to_prove, {}
            if await self._prove_batch(batch):
                failures = 0
                continue
            failures += 1
            for receipt_id, (peers, to_log) in batch.items():  # back in line, with anything new
                for peer in peers:
                    self.prove(peer, receipt_id, to_log)
            while len(self._to_prove) > PROOFS_DUE_KEPT:  # a long outage: the oldest wait for a restart
                del self._to_prove[next(iter(self._to_prove))]  # (acked_unlogged finds them then)

    async def _prove_batch(self, batch: _ProofsDue) -> bool:
        """Log and prove a batch; False if it must be tried again."""
        to_log = [receipt for _, receipt in batch.values() if receipt is not None]
        if to_log and self.on_acked is not None:
            try:
                await self.on_acked(to_log)
            except Exception:
                log.exception("appending %d receipts to the receipt log failed; trying again", len(to_log))
                return False
        if self.prover is None:
            return True
        wanted: dict[bytes, list[bytes]] = {}
        for receipt_id, (peers, _) in batch.items():
            for peer in peers:
                wanted.setdefault(peer, []).append(receipt_id)
        try:
            proofs = await trio.to_thread.run_sync(self.prover, wanted, self.ctx.clock())
        except Exception:
            log.exception("proving %d receipts failed; trying again", len(batch))
            return False
        nursery = self._tasks.nursery
        assert nursery is not None
        for peer, raws in proofs.items():  # a stalled link holds up only its own proofs
            if raws:
                nursery.start_soon(self._send_proofs, peer, raws, wanted[peer])
        return True

    async def _send_proofs(self, peer: bytes, proofs: list[bytes], receipt_ids: list[bytes]) -> None:
        """Send a peer the proofs placing `receipt_ids`; if it cannot take them now, all of them go
        again (to a replaced link with the next batch; else when its link comes up): a proof it gets
        twice is only checked twice."""
        for raw in proofs:
            if not await self.ctx.send_to(peer, raw):
                if peer in self.ctx.connected():  # the link was replaced meanwhile: the next batch
                    for receipt_id in receipt_ids:
                        self.prove(peer, receipt_id, None)
                    return
                waiting = self._proofs_waiting.setdefault(peer, {})
                for receipt_id in receipt_ids:
                    waiting[receipt_id] = None
                while len(waiting) > PROOFS_WAITING_KEPT:
                    del waiting[next(iter(waiting))]
                return

    async def _log_acked_unlogged(self) -> None:
        """Receipts acknowledged before a stop but not yet in the log: log and prove them now."""
        for row in await self.ctx.store.run(Store.acked_unlogged, str(self.ctx.node)):
            stored = await self.ctx.store.run(Store.envelope, row.message_id)
            if stored is None:
                continue
            receipt = reopen_stored(stored.raw, UsageReceipt)
            self.prove(receipt.message.submitter.raw, receipt.message_id.raw, receipt)
