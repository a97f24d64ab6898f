"""The submitter's outcomes: a `result` checked and taken in, its outputs collected, the job ended.

An outcome is a `result` carrying the signed `receipt` and the small outputs (protocol/results.py).
The receipt is checked against the manifest and the assignment it names (protocol/receipts.py), the
output blobs it lists that the result did not carry are fetched from the executor (every chunk
verified; a fetch that finds no link or no answer leaves the outcome to its next delivery, without
judging it), and only then is the job `done`, in one commit with the receipt and the carried outputs
(kept in the database). The receipt is countersigned with the next `ack` to its executor, one per
executor for the receipts verified over a short while (acks.py). A repeated outcome for a finished job
gets the stored ack again (or, lost in a stop, a new one), so an executor that missed it stops
retrying. A refused receipt is stored as evidence; only one from the current assignment's executor,
for that assignment, ends the attempt. With replicas, each lane takes in its own receipt, and the job
ends when all are in: `done` when they agree, `disputed` when not.

Once a job is `done`, its other assignments (a newer attempt, when an earlier one's result came after
its lease) are withdrawn with a signed `cancel` (reason `done`) to their executors at once; a result
of a withdrawn assignment is not taken (one receipt counts) and is answered with that cancel again.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import trio
from e31.protocol.assignments import ASSIGN_KINDS, Assignment, reopen_assignment
from e31.protocol.blobs import BlobRef
from e31.protocol.envelope import VerifiedEnvelope
from e31.protocol.errors import Mismatch, ProtocolError
from e31.protocol.ids import NodeId
from e31.protocol.messages import Result, Results
from e31.protocol.receipts import UsageReceipt, check_receipt_assignment, check_receipt_manifest
from e31.protocol.results import carried_outputs, check_result, outputs_of

from .. import metrics
from ..errors import StoreError
from ..lifecycle import TERMINAL
from ..store.db import Call, Store, call
from ..store.rows import JobRow
from .acks import Acknowledger
from .adverts import TrackRecord
from .commits import SharedCommits
from .context import MarketContext
from .submitted import (
    ROLE,
    Jobs,
    SubmittedJob,
    names_our_assignment,
    set_submitted_state,
    signed_cancel,
    stored_assignments,
    submitted_transition,
)
from .transfer import BlobTransfer, FetchError, PeerUnreachable

log = logging.getLogger("e31.submitter")


class Carried(NamedTuple):
    """A `result` that came as an entry of a verified `results` carrier, whose signer stands for it."""

    message: Result
    signer: NodeId


Arrived = VerifiedEnvelope[Result] | Carried
"""A result as it arrived: alone (its own envelope) or in a carrier."""

Opened = tuple[VerifiedEnvelope[UsageReceipt], dict[bytes, bytes]]
"""A result's receipt, verified, and the outputs it carried, checked against their refs (`_open`)."""

TAKES_PER_PEER = 2
"""`results` carriers from one peer taken in at once (each in one task); more wait their turn."""

CARRIERS_HELD_PER_PEER = 8
"""`results` carriers from one peer waiting or being taken; more are dropped."""

ACKS_RESENT_KEPT = 1024
"""Stored acks remembered as sent again (the oldest forgotten first: it may then go once more)."""


class Outcomes:
    def __init__(
        self,
        ctx: MarketContext,
        jobs: Jobs,
        *,
        transfer: BlobTransfer,
        acks: Acknowledger,
        notify: Callable[[bytes], None],
        track: TrackRecord | None = None,
    ) -> None:
        self.ctx = ctx
        self.track = track
        self.jobs = jobs
        self.transfer = transfer
        self.acks = acks
        self.notify = notify
        self._commits = SharedCommits(ctx.store)
        """The entries of a carrier end their jobs in one commit."""
        self._acks_resent: dict[tuple[bytes, bytes], float] = {}
        """(executor, ack id) -> when that stored ack was last sent again (ACKS_RESENT_KEPT at most)."""
        self._held: dict[bytes, int] = {}
        """Peer -> its `results` carriers waiting or being taken (CARRIERS_HELD_PER_PEER at most)."""
        self._turns: dict[bytes, trio.Semaphore] = {}
        """Peer -> the turns to take its carriers (TAKES_PER_PEER), while it has some held."""

    def admit(self, env: Arrived) -> bool:
        """Whether a `result` is to be taken in (`take`). One carrying a receipt already taken in for a
        job still under way is dropped at once: executors deliver again until acknowledged, and each
        copy would otherwise cost a signature check and store work while the first is being verified.
        Copies for ended jobs go through (they get the ack again)."""
        job = self.jobs.get(env.message.job_id.raw)
        if job is not None:
            key = outcome_key(env)
            if key in job.outcomes:
                return False
            job.outcomes.add(key)
        return True

    def take_carrier_soon(self, nursery: trio.Nursery, env: VerifiedEnvelope[Results]) -> None:
        """Take a `results` carrier in a task of its own (`take_carrier`), TAKES_PER_PEER of a peer's at
        once, the others waiting their turn; beyond CARRIERS_HELD_PER_PEER of its signer's (waiting or
        being taken) it is dropped (its executor delivers them again until acknowledged)."""
        peer = env.signer.raw
        held = self._held.get(peer, 0)
        if held >= CARRIERS_HELD_PER_PEER:
            log.debug("dropping a results carrier from %s: %d are held", env.signer, held)
            return
        if held == 0:
            self._turns[peer] = trio.Semaphore(TAKES_PER_PEER)
        self._held[peer] = held + 1
        nursery.start_soon(self._take_carrier_in_turn, env)

    async def _take_carrier_in_turn(self, env: VerifiedEnvelope[Results]) -> None:
        peer = env.signer.raw
        try:
            async with self._turns[peer]:
                await self.take_carrier(env)
        finally:
            self._held[peer] -= 1
            if self._held[peer] <= 0:
                del self._held[peer], self._turns[peer]

    async def take_carrier(self, env: VerifiedEnvelope[Results]) -> None:
        """Take each entry of a carrier as the `result` it stands for, on its own (a bad one is refused
        alone). Entries that name no assignment this node made, to the carrier's signer, are dropped
        before any signature is checked; the others' receipts are verified one after another here, and
        those that open are taken together, so their commits share one transaction (SharedCommits)."""
        carrier = env.message
        if carrier.executor != env.signer:  # its receipts could never be this signer's: none is looked at
            log.info("ignoring a results carrier from %s naming executor %s", env.signer, carrier.executor)
            return
        arrived = [Carried(carrier.result(entry), env.signer) for entry in carrier.entries]
        ours = [a for a in arrived if await self._names_ours(a.message) and self.admit(a)]
        opened: list[tuple[Arrived, Opened]] = [(a, o) for a in ours if (o := self._open(a)) is not None]
        if len(opened) == 1:
            await self._take_opened(*opened[0])
            return
        if opened:
            async with trio.open_nursery() as nursery:
                await self._take_together(opened, nursery)

    async def _take_together(self, opened: list[tuple[Arrived, Opened]], nursery: trio.Nursery) -> None:
        """End in one pass, with one read and one shared commit, the jobs of a carrier's verified
        receipts that need nothing more: each job under way here alone (no replicas, no other
        outcome being taken), the receipt naming the assignment this node holds for it in memory and
        checking out against it, every output carried or held. The others are each taken in a task
        of their own in `nursery`, started before the commit (`_take_opened`: a fetch, a store read,
        a refusal, or an ended job's ack)."""
        rows = await self.ctx.store.run(Store.jobs_by_id, [a.message.job_id.raw for a, _ in opened], ROLE)
        taking: list[tuple[bytes, SubmittedJob, VerifiedEnvelope[UsageReceipt], tuple[Call, ...]]] = []
        try:
            for arrived, (receipt_env, carried) in opened:
                job_id = arrived.message.job_id.raw
                row, job = rows.get(job_id), self.jobs.get(job_id)
                receipt = receipt_env.message
                if row is None:
                    continue  # (as _take_opened: no such job here)
                assign = None if job is None else job.assign
                if (
                    job is None
                    or row.state in TERMINAL
                    or job.manifest.replicas > 1  # (lanes: only a job of replicas has them)
                    or job.completing
                    or assign is None
                    or assign.assignment_id != receipt.assignment_id
                ):
                    nursery.start_soon(self._take_opened, arrived, (receipt_env, carried))
                    continue
                try:
                    _check(receipt, job, assign, self.ctx.network)
                except ProtocolError:  # refused on its own, as evidence (_take_opened checks it again)
                    nursery.start_soon(self._take_opened, arrived, (receipt_env, carried))
                    continue
                small, missing = self._carried(outputs_of(receipt), carried)
                if missing:  # an output to fetch
                    nursery.start_soon(self._take_opened, arrived, (receipt_env, carried))
                    continue
                job.completing, job.settled = True, trio.Event()
                calls = self._ending(job_id, job, row, receipt_env, assign.attempt, small)
                taking.append((job_id, job, receipt_env, calls))
            if taking:
                results = await self._commits.each([calls for *_, calls in taking])
                failed: StoreError | None = None
                for (job_id, job, receipt_env, _), result in zip(taking, results, strict=True):
                    try:
                        if isinstance(result, StoreError):
                            raise result
                        await self._ended(job_id, job, receipt_env, bool(result[-1]))
                    except StoreError as e:  # the others still end; raised after, as its own task would
                        failed = failed or e
                if failed is not None:
                    raise failed
        finally:
            for _, job, _, _ in taking:
                job.completing = False
                job.settled.set()

    async def take(self, env: Arrived) -> None:
        """Take in a `result` that came alone (admitted: `admit`)."""
        if not await self._names_ours(env.message):
            self._forget_outcome(env.message.job_id.raw, env)
            return
        opened = self._open(env)
        if opened is not None:
            await self._take_opened(env, opened)

    async def _names_ours(self, msg: Result) -> bool:
        """Whether a result names an assignment this node made, of that job, to that executor (looked
        up here or in the store; no signature is checked)."""
        if await names_our_assignment(self.ctx, self.jobs, msg):
            return True
        log.info(  # nothing a node that holds no assignment sends is kept
            "ignoring a result for job %s from %s, which holds no assignment of it",
            msg.job_id.raw.hex()[:12],
            msg.executor,
        )
        return False

    def _open(self, env: Arrived) -> Opened | None:
        """The receipt a result carries, verified, and the outputs it carries; None (logged) if either
        is refused."""
        msg = env.message
        job_id = msg.job_id.raw
        try:
            receipt_env = check_result(
                msg, env.signer
            )  # a receipt that does not open never will: its copies stay out
        except ProtocolError as e:
            metrics.VERIFICATION_FAILURES.inc(1, "result")
            log.warning("job %s: dropping a result from %s: %s", job_id.hex()[:12], env.signer, e)
            return None
        try:
            carried = carried_outputs(msg, receipt_env.message)
        except Mismatch as e:  # the receipt may come again without them: the outputs are fetched then
            metrics.VERIFICATION_FAILURES.inc(1, "result")
            log.warning("job %s: dropping a result from %s: %s", job_id.hex()[:12], env.signer, e)
            self._forget_outcome(job_id, env)
            return None
        return receipt_env, carried

    async def _take_opened(self, env: Arrived, opened: Opened) -> None:
        receipt_env, carried = opened
        job_id = env.message.job_id.raw
        row = await self.ctx.store.run(Store.job, job_id, ROLE)
        if row is None:
            return
        if row.state in TERMINAL:  # done, or disputed with this receipt verified: its ack again
            await self._resend_ack(receipt_env)
            return
        job = self.jobs.get(job_id)
        if job is not None and job.lanes is not None:
            signer = receipt_env.signer.raw
            job = next((lane for lane in job.lanes if lane.holder == signer and lane.receipt is None), None)
        if job is not None and job.completing:
            self._forget_outcome(job_id, env)  # another outcome is being verified: take a copy later
            return
        if job is None:
            return
        job.completing, job.settled = True, trio.Event()
        try:
            await self._complete(job_id, job, row, receipt_env, carried)
        except PeerUnreachable as e:
            # Not a verdict on the outcome: its outputs could not be fetched for now (the link went
            # down, or no answer). Its executor delivers it again until acknowledged, and it is taken
            # then; failing the attempt here would run a finished job again elsewhere.
            log.info("job %s: the outcome from %s waits: %s", job_id.hex()[:12], receipt_env.signer, e)
            self._forget_outcome(job_id, env)
        except (Mismatch, ProtocolError, FetchError) as e:
            metrics.VERIFICATION_FAILURES.inc(1, "outcome")
            log.warning(
                "job %s: the outcome from %s is refused: %s", job_id.hex()[:12], receipt_env.signer, e
            )
            # kept as evidence (not durably: a power cut loses only that)
            await self.ctx.store.run(
                Store.put_envelope,
                receipt_env.message_id.raw,
                "receipt",
                receipt_env.raw,
                self.ctx.now_s(),
                job_id,
            )
            signer = receipt_env.signer.raw
            job.rejected.add(signer)
            # Only the current assignment's executor, with an outcome for that assignment, ends the
            # attempt: a stranger (or an earlier attempt's executor) sending a bad one must not take
            # the job away. (Checked on the assignment, which outlives the wait for its lease.)
            current = job.assign
            if (
                current is not None
                and receipt_env.message.assignment_id == current.assignment_id
                and signer == current.executor.raw
            ):
                job.refusal = f"its outcome was refused: {e}"
                job.fail_outcome()
        finally:
            job.completing = False
            job.settled.set()

    def _forget_outcome(self, job_id: bytes, env: Arrived) -> None:
        """Let a later copy of this result's receipt, from its signer, in again."""
        top = self.jobs.get(job_id)
        if top is not None:
            top.outcomes.discard(outcome_key(env))

    async def _complete(
        self,
        job_id: bytes,
        job: SubmittedJob,
        row: JobRow,
        receipt_env: VerifiedEnvelope[UsageReceipt],
        carried: dict[bytes, bytes],
    ) -> None:
        receipt = receipt_env.message
        assign = job.assign
        if assign is None or assign.assignment_id != receipt.assignment_id:  # an earlier attempt's
            assign_row = await self.ctx.store.run(Store.envelope, receipt.assignment_id.raw)
            if assign_row is None or assign_row.kind not in ASSIGN_KINDS:
                raise Mismatch("the receipt names an assignment this node never made")
            assign = reopen_assignment(assign_row.raw, receipt.job_id)
            if assign is None:
                raise Mismatch("the receipt names an assignment of other jobs")
        _check(receipt, job, assign, self.ctx.network)
        small = await self._collect(receipt.executor.raw, outputs_of(receipt), carried)
        calls = self._ending(job_id, job, row, receipt_env, assign.attempt, small)
        if job.manifest.replicas > 1:  # a lane: the job ends when every replica is in (_replicas)
            await self._commits.atomically(*calls)
            job.receipt = receipt_env
            job.finish()
            self.acks.add(receipt.executor.raw, receipt_env.message_id.raw, job_id)
            return
        # one commit: the receipt, outputs and ack, with the job's end
        *_, moved = await self._commits.atomically(*calls)
        await self._ended(job_id, job, receipt_env, moved)

    def _ending(
        self,
        job_id: bytes,
        job: SubmittedJob,
        row: JobRow,
        receipt_env: VerifiedEnvelope[UsageReceipt],
        attempt: int,
        small: list[Call],
    ) -> tuple[Call, ...]:
        """The writes that end the job with this verified receipt, to commit together: the carried
        outputs (`small`), the receipt kept and recorded, and (not for a replica's lane) the job
        moved from its state in `row` to `done` (the last call's result: whether it moved)."""
        receipt = receipt_env.message
        if self.track is not None:  # (counted once verified, a moment before it is stored)
            self.track.verified(receipt.executor.raw)
        now = self.ctx.now_s()
        recorded = call(
            Store.record_verified_receipt,
            receipt_digest=receipt_env.message_id.raw,
            job_id=job_id,
            attempt=attempt,
            executor=str(receipt.executor),
            now=now,
            blobs=[ref.root.hex() for ref in outputs_of(receipt)],
        )
        kept = call(Store.put_envelope, receipt_env.message_id.raw, "receipt", receipt_env.raw, now, job_id)
        if job.manifest.replicas > 1:
            return (*small, kept, recorded)
        done = submitted_transition(self.ctx, job_id, row.state, "done", **_end_fields(receipt))
        return (*small, kept, recorded, done)

    async def _ended(
        self, job_id: bytes, job: SubmittedJob, receipt_env: VerifiedEnvelope[UsageReceipt], moved: bool
    ) -> None:
        """After the commit that ended the job (`moved`: whether it moved to `done` from the state it
        was read in): the job finished here, its other assignments withdrawn, its receipt to be acked."""
        receipt = receipt_env.message
        for _ in range(3):  # it moved on while the outcome was verified (offered again, or assigned)
            if moved:
                break
            now = await self.ctx.store.run(Store.job, job_id, ROLE)
            if now is None or now.state in TERMINAL:
                break
            method, args, kwargs = submitted_transition(
                self.ctx, job_id, now.state, "done", **_end_fields(receipt)
            )
            moved = await self.ctx.store.run(method, *args, **kwargs)
        self.notify(job_id)
        job.finish()
        await self._withdraw_others(job_id, job, receipt_env)
        log.debug(  # per job: nothing at the default level (a sweep would write a line per job)
            "job %s done on %s: %s, %d fuel",
            job_id.hex()[:12],
            receipt.executor,
            outcome_text(receipt.outcome.status, receipt.outcome.exit_code, receipt.outcome.trap),
            receipt.fuel_used,
        )
        self.acks.add(receipt.executor.raw, receipt_env.message_id.raw, job_id)

    async def _withdraw_others(
        self, job_id: bytes, job: SubmittedJob, receipt_env: VerifiedEnvelope[UsageReceipt]
    ) -> None:
        """The job is done with this receipt: every other executor assigned it (a newer attempt, when
        an earlier one's result came late; or an earlier one still running) is sent a signed `cancel`
        (reason `done`) at once, so it drops or stops the job and sends no result for it."""
        receipt = receipt_env.message
        current = job.assign
        if current is not None and current.attempt == 1 and current.assignment_id == receipt.assignment_id:
            # The job's first assignment is still its latest (`_assign` keeps each as soon as it is
            # stored, before it is sent): a later one is not sent, as it finds the job finished. The
            # common case, with no store read.
            return
        signer = receipt.executor.raw
        others = {
            a.executor.raw
            for a in await stored_assignments(self.ctx, job_id)
            if a.assignment_id != receipt.assignment_id and a.executor.raw != signer
        }
        if not others:
            return
        text = "the job is done: another attempt's result completed it"
        env = await signed_cancel(self.ctx, job_id, job.manifest.deadline, "done", text)
        for executor in sorted(others):
            log.info("job %s: withdrawing its assignment from %s", job_id.hex()[:12], NodeId(executor))
            await self.ctx.send_to(executor, env.raw)

    def _carried(
        self, outputs: Sequence[BlobRef], carried: dict[bytes, bytes]
    ) -> tuple[list[Call], list[BlobRef]]:
        """The store calls keeping the outputs a result carried (already checked against their
        BlobRefs), to keep them in the database in the commit that ends the job, and the outputs
        neither carried nor held here (an empty stream's blob is), to fetch from the executor."""
        keep: list[Call] = []
        missing: list[BlobRef] = []
        for ref in outputs:
            root = ref.root.raw
            if self.ctx.blobs.has(root):
                continue
            if root in carried:
                keep.append(call(Store.put_small_blob, ref.root.hex(), carried[root]))
            else:
                missing.append(ref)
        return keep, missing

    async def _collect(
        self, executor: bytes, outputs: Sequence[BlobRef], carried: dict[bytes, bytes]
    ) -> list[Call]:
        """Make every output of a receipt present here: the carried ones as store calls to commit with
        the job's end, the others fetched from the executor into the blob store (`_carried`)."""
        keep, missing = self._carried(outputs, carried)
        for ref in missing:
            await self.transfer.fetch(executor, ref)
        return keep

    async def _resend_ack(self, receipt_env: VerifiedEnvelope[UsageReceipt]) -> None:
        """A result came again for a finished job: send its receipt's stored ack (at most once per
        `delivery_interval` to each executor: an ack names a batch, whose receipts all come again when
        it is lost), or acknowledge it with the next batch when it was verified here and its ack is not
        stored (lost in a stop)."""
        receipt_id = receipt_env.message_id.raw
        ack = await self.ctx.store.run(Store.ack_for, receipt_id)
        if ack is not None:
            signer = receipt_env.signer.raw
            if self._once_a_while(signer, ack.message_id):
                await self.ctx.send_to(signer, ack.raw)
            return
        row = await self.ctx.store.run(Store.receipt, receipt_id)
        if row is not None and row.delivered is not None:  # verified (never a receipt only seen)
            self.acks.add(receipt_env.signer.raw, receipt_id, row.job_id)
            return
        # A result of an assignment this node withdrew (the job was cancelled, or done with another
        # receipt): not taken; its executor is sent the withdrawal again, and stops delivering it.
        job_id = receipt_env.message.job_id.raw
        cancels = await self.ctx.store.run(Store.envelopes_for_job, job_id, "cancel")
        if cancels and self._once_a_while(receipt_env.signer.raw, cancels[-1].message_id):
            await self.ctx.send_to(receipt_env.signer.raw, cancels[-1].raw)

    def _once_a_while(self, peer: bytes, message_id: bytes) -> bool:
        """Whether a stored message may be sent to `peer` again now: at most once per
        `delivery_interval` (results of a batch, or copies of one, come again together)."""
        now = trio.current_time()
        key = (peer, message_id)
        if now < self._acks_resent.get(key, -math.inf) + self.ctx.settings.delivery_interval:
            return False
        self._acks_resent[key] = now
        while len(self._acks_resent) > ACKS_RESENT_KEPT:
            del self._acks_resent[next(iter(self._acks_resent))]
        return True

    async def judge_replicas(self, job_id: bytes, job: SubmittedJob) -> None:
        """Once every lane of a job with replicas is over, compare their verified receipts: the same
        outcome, fuel and output hashes make it `done`; anything else makes it `disputed`, every receipt
        kept as evidence."""
        assert job.lanes is not None
        k = job.manifest.replicas
        receipts = [lane.receipt for lane in job.lanes if lane.receipt is not None]
        row = await self.ctx.store.run(Store.job, job_id, ROLE)
        if row is None or row.state in TERMINAL or len(receipts) < k:
            return
        claims = {_claim(r.message) for r in receipts}
        first = receipts[0].message
        if len(claims) == 1:
            await set_submitted_state(
                self.ctx,
                self.notify,
                job_id,
                row.state,
                "done",
                executor=str(first.executor),
                started=first.started_at / 1000,
                finished=first.finished_at / 1000,
                fuel_used=first.fuel_used,
                reason=outcome_text(first.outcome.status, first.outcome.exit_code, first.outcome.trap),
            )
            log.debug("job %s done: %d replicas agree", job_id.hex()[:12], k)
        else:
            why = "replicas disagree: " + "; ".join(_describe(r) for r in receipts)
            metrics.VERIFICATION_FAILURES.inc(1, "replicas")
            await set_submitted_state(self.ctx, self.notify, job_id, row.state, "disputed", reason=why[:500])
            log.warning("job %s disputed: %s", job_id.hex()[:12], why)
        job.finish()


def outcome_key(env: Arrived) -> bytes:
    """A delivered receipt, as the submitter dedupes it: its signer's result carrying those bytes (a
    node that wraps another's receipt in a result of its own does not keep the real one out)."""
    return env.signer.raw + hashlib.sha256(env.message.receipt).digest()


def _claim(r: UsageReceipt) -> tuple[Any, ...]:
    """What replicas must agree on: the outcome, the fuel, and every output by hash."""
    return (r.outcome, r.fuel_used, r.stdout, r.stderr, r.outputs)


def _describe(env: VerifiedEnvelope[UsageReceipt]) -> str:
    r = env.message
    text = outcome_text(r.outcome.status, r.outcome.exit_code, r.outcome.trap)
    return f"{str(r.executor)[:16]} says {text}, {r.fuel_used} fuel, stdout {r.stdout.root.hex()[:12]}"


def _check(receipt: UsageReceipt, job: SubmittedJob, assign: Assignment, network: str) -> None:
    """Mismatch (or another ProtocolError) unless the verified receipt is for the job's manifest,
    under `assign`, on this node's network."""
    check_receipt_manifest(receipt, job.manifest)
    check_receipt_assignment(receipt, assign)
    if receipt.network != network:
        raise Mismatch("the receipt is for another network")


def _end_fields(receipt: UsageReceipt) -> dict[str, Any]:
    """The job row's fields that a verified receipt ends it with."""
    outcome = receipt.outcome
    return {
        "executor": str(receipt.executor),
        "started": receipt.started_at / 1000,
        "finished": receipt.finished_at / 1000,
        "fuel_used": receipt.fuel_used,
        "reason": outcome_text(outcome.status, outcome.exit_code, outcome.trap),
    }


def outcome_text(status: str, exit_code: int | None, trap: str | None) -> str:
    if status == "exited":
        return f"exited {exit_code}"
    if status == "trap":
        return f"trap {trap}"
    return status
