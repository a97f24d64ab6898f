"""The executor's side of the market: answer offers, run assigned jobs, deliver signed outcomes.

- An offer (from gossip, or from this node's own submitter) gets a signed `bid` or `decline`
  (market_rules.plan_bid) sent straight to the submitter. The offer is remembered under the bid's id
  until the bid expires, so an `assign` naming the bid can be matched to the exact manifest.
- An `assign` for one of our bids, signed by the job's submitter and inside its lease, becomes an
  executor job row (`fetching`): the module, inputs and stdin are fetched from the submitter by
  hash (node/transfer.py), then the job waits in the scheduler's queue (`queued`), runs (`running`),
  and ends `done` with a signed `receipt`, or `failed` when it could not be run.
- Delivery: a `result` carrying the receipt (and the job's small outputs, the first time) is sent to the
  submitter, and again every `delivery_interval`
  (backing off) and whenever its link comes up, until its `ack` arrives. An ack names a batch of our
  receipts; it is checked against each (protocol/receipts.check_ack: ids of receipts we did not sign
  for that submitter are ignored) and stored once for them; acknowledged receipts are gathered for
  `proof_batch_s`, handed to `on_acked` (the receipt log: one append for the batch), and one signed
  `proof` per submitter places all of its receipts of the batch against one new tree head; again on
  request (`proofreq`) or on a repeated ack; a proof that finds no link goes when the link comes up.
  Receipts acknowledged but not yet logged when the node stopped are logged when it starts. The
  result is signed anew for each delivery and not kept: the receipt is.

The job's seed (WASI random_get) is its 32-byte job id, so a re-run anywhere reproduces the run.
The run's stdout and stderr come whole in its result, or, when longer than 1 MiB, in files under the
run's directory (runner `streams_dir`, `whole_stream`); they are stored as blobs, checked against the
run's hashes, and named in the receipt. The run's directory is created only by a run that needs it (a
long stream or files in /output): a tiny job creates no file or directory before its outputs are
stored as blobs.

Restarts: jobs `fetching`, `queued` or `running` at a stop are resumed with the same assignment while
its lease holds (a running one is run again from the start: the same outcome and fuel, one receipt),
unless that attempt's receipt was already signed (then the job is only marked done and delivered);
a job whose lease ran out is given back. While the node is suspended for its owner, `give_back_late`
stops and gives back the jobs that could no longer meet their deadline (a `decline`, reason
`deadline`). Delivery stops, unacknowledged, once the outputs' retention has ended.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import secrets
import shutil
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast

import trio
from e31.protocol.blobs import PUSH_MAX, BlobRef, blob_ref
from e31.protocol.codec import pack, unpack_canonical
from e31.protocol.envelope import (
    VerifiedEnvelope,
    check_fresh,
    reopen_stored,
    sign_message,
    sign_verified,
)
from e31.protocol.errors import InvalidMessage, Mismatch, ProtocolError
from e31.protocol.ids import Digest
from e31.protocol.jobs import FileRef, JobManifest
from e31.protocol.messages import (
    REASON_TEXT_MAX,
    Accepted,
    Assign,
    Bid,
    BidItem,
    Cancel,
    Decline,
    Offer,
    ProofRequest,
    Release,
)
from e31.protocol.receipts import TRAP_MAX, Ack, Outcome, UsageReceipt, check_ack
from e31.protocol.results import make_result, outputs_of
from e31.sandbox.errors import SandboxError
from e31.sandbox.job import JobSpec
from e31.sandbox.limits import Limits as SandboxLimits
from e31.sandbox.limits import RunResult, Status, whole_stream

from ..errors import NodeError
from ..nursery import own_nursery
from ..store.blobs import BlobError, BlobStore
from ..store.db import Store, call
from .router import MarketContext, transition
from .rules import (
    DeclinePlan,
    ExecutorView,
    OfferView,
    backoff,
    plan_bid,
    run_estimate_ms,
)
from .scheduler import RunRecord, Scheduler
from .transfer import BlobTransfer, FetchError

FINISHED_HERE = ("done", "failed", "cancelled")

_TEST_LIE = 1 if os.environ.get("E31_TEST_CORRUPT_OUTPUT") == "1" else 0
"""TEST ONLY: E31_TEST_CORRUPT_OUTPUT=1 makes this node a lying executor that claims one fuel more than
it used (tests/node/test_faults_submitter.py catches it as `disputed`). Never set it otherwise."""

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


class JobFailed(NodeError):
    """This node cannot run an assigned job (its data could not be fetched, or the sandbox refused it)."""


@dataclass(frozen=True, slots=True)
class _Promise:
    """A live bid of this node: the offer it answers and the jobs of it the bid names (each leaves
    when it is assigned: one assignment per job of a bid)."""

    offer: VerifiedEnvelope[Offer]
    bid_expires: int
    jobs: dict[bytes, JobManifest]


@dataclass(eq=False, slots=True)
class _Held:
    """A job between assignment and its run's end: what handing it back needs."""

    scope: trio.CancelScope
    deadline: int
    estimate_ms: int
    ran: bool = False
    handed_back: bool = False
    running: bool = False
    """Whether the store has it `running` (RUNNING_MARK_DELAY after its run started)."""
    ending: bool = False
    """Its result or release is on its way: an `accepted` now would come after it."""


RUNNING_MARK_DELAY = 0.1
"""Seconds after a run starts before the job is recorded `running`; a run that ends sooner (a tiny job) is
recorded once, from queued to done, saving a store write. `e31 jobs` shows a job queued that long."""
ACCEPT_DELAY = 0.5
"""Seconds between queueing a job and telling its submitter (`accepted`), skipped when the job ends first.
Well under the submitter's first re-send of an unaccepted assignment (MarketSettings.delivery_interval,
2 s), so the wait costs no extra message; a tiny job's result arrives instead."""
PROMISED_BYTES_MAX = 16 << 20
"""Bytes of offers that this node's live bids may keep (each keeps the offer it answers, decoded, for
the assignment): past it, offers are declined `busy` until bids lapse or are assigned. A set of 64 tiny
jobs is about 20 KiB, so this is hundreds of open bids; it bounds what a signer gossiping large offers
that it never assigns can make every executor hold."""
ANSWERED_PRUNE_MIN = 1024
"""Answered offers held before the expired ones are first forgotten (an expired offer is refused anyway)."""
UNACKED_KEPT = 4096
"""Unacknowledged receipts kept in memory (the store has them all)."""
STORE_IN_SLOT_MAX = 1 << 20
"""A run's outputs up to this size in all are stored in the thread that waited for it, while its worker
is still reserved (a millisecond or so); larger ones in a hop of their own once the worker is free."""
PROVE_BACKOFF_MAX = 60.0
"""Seconds between tries at most when appending to the receipt log keeps failing."""
PROOFS_DUE_KEPT = 10_000
"""Proofs due kept while appending to the receipt log keeps failing (the oldest are dropped)."""
PROOFS_WAITING_KEPT = 4096
"""Proofs kept per peer for when its link comes up (the oldest dropped first)."""
TRASH_PREFIX = ".trash-"
"""Run directories moved aside to be deleted are named so (never a job id: GC removes them too)."""
LEASE_LOST_TEXT = "the node stopped while holding the job and its lease ran out"
GIVE_BACK_TEXT = "the machine's owner needs it back and the job would miss its deadline here"


class Executor:
    def __init__(
        self,
        ctx: MarketContext,
        *,
        transfer: BlobTransfer,
        scheduler: Scheduler,
        runs_dir: Path,
        profile: bytes,
        memory_bytes: int,
        on_acked: OnAcked | None = None,
        prover: Prover | None = None,
    ) -> None:
        self.ctx = ctx
        self.prover = prover
        self.transfer = transfer
        self.scheduler = scheduler
        self.runs_dir = runs_dir
        self.profile = profile
        self.memory_bytes = memory_bytes
        self.on_acked = on_acked
        self._promises: dict[bytes, _Promise] = {}
        self._promised_bytes = 0
        """The offers' bytes the live bids keep (at most PROMISED_BYTES_MAX)."""
        self._answered: dict[bytes, int] = {}
        """Offers (message id) answered, with their expiry: an offer heard again is not answered twice."""
        self._answered_prune_at = ANSWERED_PRUNE_MIN
        self._active: set[bytes] = set()
        self._held: dict[bytes, _Held] = {}
        self.capacity: Callable[[], tuple[int, int]] | None = None
        """The (cores, memory) this node offers now (capacity_service); None: the configured ceiling."""
        self._nursery: trio.Nursery | None = None
        self._deliver_now = trio.Event()
        self._to_prove: _ProofsDue = {}
        self._prove_now = trio.Event()
        self._proofs_waiting: dict[bytes, dict[bytes, None]] = {}
        """Proofs (by receipt id) a peer could not be sent for want of a link, sent when it comes up."""
        self._trash: deque[Path] = deque()
        """Run directories moved aside, to delete (_discard)."""
        self._unacked: dict[bytes, VerifiedEnvelope[UsageReceipt]] = {}
        """Receipts signed here and not yet acknowledged (at most UNACKED_KEPT, oldest dropped first):
        their ack needs no store read and no re-verify. The store has them all."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with own_nursery(self) as nursery:
            await nursery.start(self.scheduler.run)
            for row in await self.ctx.store.run(
                Store.jobs, role=ROLE, states=("fetching", "queued", "running")
            ):
                nursery.start_soon(self._resume, row.job_id)
            nursery.start_soon(self._delivery_loop)
            nursery.start_soon(self._prove_loop)
            await self._log_acked_unlogged()
            task_status.started()

    def on_link_up(self, peer: bytes) -> None:
        self._deliver_now.set()
        for receipt_id in self._proofs_waiting.pop(peer, {}):
            self._prove(peer, receipt_id, None)

    # --- offers ---

    def on_offer(self, env: VerifiedEnvelope[Offer]) -> None:
        if env.message_id.raw in self._answered or self._nursery is None:
            return
        self._answered[env.message_id.raw] = env.message.expires
        if len(self._answered) >= self._answered_prune_at:  # amortized: the live set at least doubles
            now = self.ctx.clock()
            self._answered = {o: exp for o, exp in self._answered.items() if exp > now}
            self._answered_prune_at = max(ANSWERED_PRUNE_MIN, 2 * len(self._answered))
        self._nursery.start_soon(self._answer, env)

    async def _answer(self, env: VerifiedEnvelope[Offer]) -> None:
        """Answer an offer with one `bid` for the jobs this node can finish in time (each planned as if
        offered alone: against the queue as it is now) and a `decline` per reason for the others."""
        now = self.ctx.clock()
        try:
            check_fresh(env, now, network=self.ctx.network)
        except ProtocolError:
            return
        offer = env.message
        held = await self.ctx.store.run(Store.jobs_held, [m.job_id.raw for m in offer.manifests], ROLE)
        cores, memory = self.scheduler.workers, self.memory_bytes
        if self.capacity is not None:
            offered_cores, offered_memory = self.capacity()
            cores, memory = min(cores, offered_cores), min(memory, offered_memory)
        me = ExecutorView(
            self.profile,
            0 if self.scheduler.suspended else cores,
            memory,
            self.scheduler.backlog_ms,
            self.scheduler.queue_length,
            cores * self.ctx.settings.max_queue_per_core,
            self.scheduler.fuel_rate,
        )
        items: list[BidItem] = []
        manifests: dict[bytes, JobManifest] = {}
        bid_expires = None
        declined: dict[str, tuple[list[Digest], str, int]] = {}
        self._forget_old_promises(now)
        room = self._promised_bytes + len(env.raw) <= PROMISED_BYTES_MAX
        reserved = len(env.raw) if room else 0  # taken now: answers to other offers run meanwhile
        self._promised_bytes += reserved
        full = DeclinePlan(
            "busy", "this node holds as many open bids as it keeps", now + self.ctx.settings.bid_ttl_ms
        )
        for manifest in offer.manifests:
            job_id = manifest.job_id
            if job_id.raw in held:
                continue
            limits = manifest.limits
            view = OfferView(
                manifest.profile.raw,
                limits.fuel,
                limits.memory_bytes,
                limits.wall_ms,
                manifest.deadline,
                offer.expires,
            )
            # every live bid keeps its offer: their memory is bounded (PROMISED_BYTES_MAX)
            plan = plan_bid(view, me, now, bid_ttl_ms=self.ctx.settings.bid_ttl_ms) if room else full
            if isinstance(plan, DeclinePlan):
                ids, text, expires = declined.get(plan.reason, ([], plan.text, plan.expires))
                ids.append(job_id)
                # one text for all: the first job's, unless another job's differs (then the code says it)
                declined[plan.reason] = (ids, text if text == plan.text else "", min(expires, plan.expires))
                continue
            items.append(BidItem(job_id, plan.expected_start, plan.expected_finish))
            manifests[job_id.raw] = manifest
            # the latest any item allows: a job near its deadline does not cut the others' bids short
            # (the submitter assigns no job after its deadline, whatever the bid's expiry)
            bid_expires = plan.expires if bid_expires is None else max(bid_expires, plan.expires)
        answers: list[Bid | Decline] = [
            Decline(self.ctx.network, tuple(ids), env.message_id, self.ctx.node, expires, reason, _clip(text))
            for reason, (ids, text, expires) in declined.items()
        ]
        if bid_expires is not None:
            answers.append(Bid(self.ctx.network, env.message_id, self.ctx.node, bid_expires, tuple(items)))
        else:
            self._promised_bytes -= reserved  # no bid keeps this offer
        for answer in answers:  # bid items and declined ids are in the offer's (job id) order already
            signed = sign_verified(answer, self.ctx.identity)
            if isinstance(answer, Bid):
                self._promises[signed.message_id.raw] = _Promise(env, answer.expires, manifests)
            await self.ctx.send_to(offer.submitter.raw, signed.raw)

    def _forget_old_promises(self, now: int) -> None:
        """Drop lapsed bids from the front: bids are made with one TTL (or expire earlier, with their
        jobs' deadline), so the dict, in insertion order, is nearly in expiry order, and this costs O(1)
        a bid instead of a scan of every live one. A lapsed bid kept a little longer (behind a live one,
        or after a clock step) is refused by `_on_assign` all the same."""
        promises = self._promises
        while promises:
            bid_id = next(iter(promises))
            if promises[bid_id].bid_expires > now:
                return
            self._drop_promise(bid_id)

    def _drop_promise(self, bid_id: bytes) -> None:
        promise = self._promises.pop(bid_id, None)
        if promise is not None:
            self._promised_bytes -= len(promise.offer.raw)

    # --- assignments ---

    def on_assign(self, env: VerifiedEnvelope[Assign]) -> None:
        if self._nursery is not None:
            self._nursery.start_soon(self._on_assign, env)

    async def _on_assign(self, env: VerifiedEnvelope[Assign]) -> None:
        assign = env.message
        if assign.executor != self.ctx.node:
            return
        promise = self._promises.get(assign.bid_id.raw)
        if promise is not None and promise.bid_expires <= self.ctx.clock():
            promise = None  # only a live bid of ours can be assigned
        manifest = None if promise is None else promise.jobs.get(assign.job_id.raw)
        if promise is None or manifest is None:
            await self._redeliver(env)
            return
        if assign.submitter != manifest.submitter:
            log.info("ignoring an assignment that does not match our bid")
            return
        if assign.lease_expires <= self.ctx.clock():
            return
        job_id = manifest.job_id.raw
        now = self.ctx.now_s()
        offer = promise.offer
        # a job whose blobs are all here already (a sweep's module) is queued at once: no fetch to wait for
        fetched = all(self.ctx.blobs.has(ref.root.raw) for ref in _blob_refs(manifest))
        *_, added = await self.ctx.store.atomically(
            call(Store.put_envelope, env.message_id.raw, "assign", env.raw, now, job_id),
            call(Store.put_shared_envelope, offer.message_id.raw, "offer", offer.raw, now, [job_id]),
            call(
                Store.add_job,
                job_id=job_id,
                role=ROLE,
                manifest=pack(manifest.to_wire()),
                state="queued" if fetched else "fetching",
                submitter=str(manifest.submitter),
                created=now,
                deadline=manifest.deadline / 1000,
                fuel_limit=manifest.limits.fuel,
                executor=str(self.ctx.node),
                attempt=assign.attempt,
                durable=False,
            ),
            # Not synced: nothing is promised yet. A power cut may take the job back; its submitter
            # sends the assignment again and hears `release` (unknown). The promise is `accepted`, made
            # after a sync (_accepted), or the result, whose commit is synced.
            durable=False,
        )
        if not added:
            self._deliver_now.set()  # a repeated assignment: make sure the outcome goes out again
            return
        promise.jobs.pop(job_id, None)
        if not promise.jobs and self._promises.get(assign.bid_id.raw) is promise:
            self._drop_promise(assign.bid_id.raw)  # (its bid may have lapsed and gone meanwhile)
        await self._execute(job_id, manifest, env, fetched=fetched)

    async def _redeliver(self, env: VerifiedEnvelope[Assign]) -> None:
        """An assignment sent again, with no live bid of ours behind it. Held here: its submitter is
        back and asks for the outcome, so `accepted` goes again for a job queued or running, unacknowledged
        receipts are delivered now (not at the next retry), and a job that failed here is released
        again (the first release may not have reached it). Not held (this node restarted between its bid
        and storing the assignment, or the bid had lapsed): released at once, so the submitter need not
        wait out the lease."""
        assign = env.message
        if assign.lease_expires <= self.ctx.clock():
            return
        job = await self.ctx.store.run(Store.job, assign.job_id.raw, ROLE)
        if job is None or job.attempt != assign.attempt:
            log.info("releasing an assignment of job %s this node does not hold", assign.job_id.hex()[:12])
            await self._release(env, "unknown", "this node holds no bid or job for that assignment")
            return
        if job.state == "failed":
            await self._release(env, _release_reason(job.reason), job.reason or "it failed here")
            return
        held = self._held.get(assign.job_id.raw)
        if job.state in ("queued", "running") and held is not None:
            await self._accepted(env, held)  # its submitter may have missed the first
        now = self.ctx.now_s()
        for row in await self.ctx.store.run(Store.receipts_for_job, assign.job_id.raw):
            if row.delivered is None:
                await self.ctx.store.run(Store.receipt_delivery_failed, row.digest, now)
        self._deliver_now.set()

    async def _resume(self, job_id: bytes) -> None:
        """Finish a job that was interrupted by a restart, if its lease still holds."""
        row = await self.ctx.store.run(Store.job, job_id, ROLE)
        env = await self._own_assign(job_id)
        if row is None or env is None:
            return
        if await self._signed_before_stop(job_id, env.message.attempt):
            return
        manifest = JobManifest.from_wire(unpack_canonical(row.manifest))
        if env.message.lease_expires <= self.ctx.clock():
            await self._fail(job_id, row.state, LEASE_LOST_TEXT, reason="lease")
            return
        if row.state != "fetching":
            await self.ctx.store.run(Store.update_job, job_id, ROLE, self.ctx.now_s(), state="fetching")
        await self._execute(job_id, manifest, env)

    async def _signed_before_stop(self, job_id: bytes, attempt: int) -> bool:
        """True if this attempt's receipt was signed and stored before the node stopped (between that and
        marking the job done): the job is marked done and its delivery goes on; it never runs twice."""
        me = str(self.ctx.node)
        rows = await self.ctx.store.run(Store.receipts_for_job, job_id)
        row = next((r for r in rows if r.executor == me and r.attempt == attempt), None)
        stored = None if row is None else await self.ctx.store.run(Store.envelope, row.message_id)
        if stored is None:
            return False
        msg = reopen_stored(stored.raw, UsageReceipt).message
        await self.ctx.store.run(
            Store.update_job,
            job_id,
            ROLE,
            self.ctx.now_s(),
            state="done",
            finished=msg.finished_at / 1000,
            fuel_used=msg.fuel_used,
        )
        self._deliver_now.set()
        return True

    async def _execute(
        self, job_id: bytes, manifest: JobManifest, assign: VerifiedEnvelope[Assign], *, fetched: bool = False
    ) -> None:
        if job_id in self._active:
            return
        self._active.add(job_id)
        work = self.runs_dir / job_id.hex()
        estimate = run_estimate_ms(manifest.limits.fuel, manifest.limits.wall_ms, self.scheduler.fuel_rate)
        held = self._held[job_id] = _Held(trio.CancelScope(), manifest.deadline, estimate)
        try:
            with held.scope:
                await self._run(job_id, manifest, assign, work, held, fetched)
            if held.handed_back:
                row = await self.ctx.store.run(Store.job, job_id, ROLE)
                await self._fail(job_id, row.state if row else "queued", GIVE_BACK_TEXT, reason="deadline")
        finally:
            self._active.discard(job_id)
            self._held.pop(job_id, None)
            self._discard(work)

    def _discard(self, work: Path) -> None:
        """Move a finished run's directory aside (one rename, here); the delivery loop deletes what was
        moved aside at its next turn, in one thread hop for all (GC would too, after a stop)."""
        trash = work.with_name(f"{TRASH_PREFIX}{work.name}-{secrets.token_hex(4)}")
        try:
            os.rename(work, trash)
        except FileNotFoundError:
            return
        except OSError as e:  # left for GC, which removes run directories of jobs not running
            log.warning("cannot move the run directory %s aside: %s", work, e)
            return
        self._trash.append(trash)

    def _empty_trash(self) -> None:
        while self._trash:
            shutil.rmtree(self._trash.popleft(), ignore_errors=True)

    async def give_back_late(self) -> int:
        """Hand back every job held here that would now miss its deadline (called while this node is
        suspended for its owner): its run is stopped and its submitter told, so it runs elsewhere."""
        now = self.ctx.clock()
        late = [
            h
            for h in self._held.values()
            if not h.ran and not h.handed_back and now + h.estimate_ms > h.deadline
        ]
        for held in late:
            held.handed_back = True
            held.scope.cancel()
        return len(late)

    async def _run(
        self,
        job_id: bytes,
        manifest: JobManifest,
        assign: VerifiedEnvelope[Assign],
        work: Path,
        held: _Held,
        fetched: bool,
    ) -> None:
        try:
            if not fetched:  # (stored as queued when every blob was here already)
                await self._fetch_inputs(manifest)
                await self._set_state(job_id, "fetching", "queued")
            if self._nursery is not None:
                self._nursery.start_soon(self._accept_unless_done, assign, held)
            estimate = held.estimate_ms

            marked = trio.Event()
            marking = trio.CancelScope()

            def started(at: int) -> None:
                assert self._nursery is not None
                self._nursery.start_soon(self._mark_running, job_id, at, held, marking, marked)

            blobs = self.ctx.blobs

            def then(result: RunResult) -> _Stored | None:
                held.ran = True  # the run is over: giving the job back now would waste it
                if result.stdout_bytes + result.stderr_bytes + result.output_bytes > STORE_IN_SLOT_MAX:
                    return None  # stored below, once the worker is free for the next job
                return _store_outputs(blobs, work, result)

            record = await self.scheduler.execute(  # the spec is read and small outputs stored in its threads
                partial(self._prepare, manifest, work),
                work / "output",
                estimate_ms=estimate,
                on_start=started,
                streams_dir=work / "streams",
                then=then,
            )
            held.ran = True
            marking.cancel()  # a run that ended before it was marked running goes from queued to done
            await marked.wait()  # a `running` being written is in the store before `done` can be
            stored = cast("_Stored | None", record.after)
            if stored is None:
                stored = await trio.to_thread.run_sync(_store_outputs, blobs, work, record.result)
            receipt = self._receipt(manifest, assign, record, stored.stdout, stored.stderr, stored.outputs)
        except (JobFailed, FetchError, SandboxError, BlobError, OSError, InvalidMessage) as e:
            held.ending = True
            row = await self.ctx.store.run(Store.job, job_id, ROLE)
            await self._fail(job_id, row.state if row else "fetching", str(e))
            return
        held.ending = True
        await self._finish(
            job_id, manifest, assign, receipt, stored.small, state="running" if held.running else "queued"
        )

    async def _accept_unless_done(self, assign: VerifiedEnvelope[Assign], held: _Held) -> None:
        """The hand-off, ACCEPT_DELAY after the job was queued, unless the job is ending by then (its
        result or release is being sent): that tells the submitter more, so a short job costs no
        `accepted` at all, and none comes after the job's end."""
        await trio.sleep(ACCEPT_DELAY)
        await self._accepted(assign, held)

    async def _accepted(self, assign: VerifiedEnvelope[Assign], held: _Held) -> None:
        """Tell the submitter this node holds the job's data and has queued it: the hand-off, a promise
        made only once the job's rows are on disk (they are stored without a sync), and only while the
        job is still held and not ending, checked again after that sync: an `accepted` never follows
        the job's result or release (their sends begin after `ending` is set)."""

        def still() -> bool:
            return self._held.get(assign.message.job_id.raw) is held and not (held.handed_back or held.ending)

        if not still():
            return
        await self.ctx.store.flush()
        if still():  # no await between this check and the send's turn on the link
            msg = Accepted(self.ctx.network, assign.message.job_id, assign.message_id, self.ctx.node)
            await self.ctx.send_to(assign.message.submitter.raw, sign_message(msg, self.ctx.identity))

    async def _fetch_inputs(self, manifest: JobManifest) -> None:
        peer = manifest.submitter.raw
        for ref in _blob_refs(manifest):
            await self.transfer.fetch(peer, ref)

    def _prepare(self, manifest: JobManifest, work: Path) -> JobSpec:
        """The run's spec, with whatever an earlier run of the job left in its work dir removed (in a
        thread: it reads the module and touches the disk). The sandbox creates the dir if it needs it."""
        spec = self._spec(manifest)
        shutil.rmtree(work, ignore_errors=True)
        return spec

    def _spec(self, manifest: JobManifest) -> JobSpec:
        blobs = self.ctx.blobs
        lim = manifest.limits
        try:
            limits = SandboxLimits(
                fuel=lim.fuel,
                memory_bytes=lim.memory_bytes,
                wall_seconds=lim.wall_ms / 1000,
                max_output_bytes=lim.max_output_bytes,
            )
            return JobSpec(
                module=blobs.read(manifest.module.root.raw),
                args=manifest.args,
                env=tuple((e.name, e.value) for e in manifest.env),
                stdin=None if manifest.stdin is None else blobs.path(manifest.stdin.root.raw),
                inputs={f.name: blobs.path(f.blob.root.raw) for f in manifest.inputs},
                limits=limits,
                seed=manifest.job_id.raw,
            )
        except SandboxError as e:
            raise JobFailed(f"the sandbox refuses the job: {e}") from None

    async def _mark_running(
        self, job_id: bytes, at: int, held: _Held, marking: trio.CancelScope, marked: trio.Event
    ) -> None:
        """Record that the job runs, RUNNING_MARK_DELAY after it started, unless its run has ended by
        then (`marking` is cancelled): a tiny job goes from queued to done in one write."""
        try:
            with marking:
                await trio.sleep(RUNNING_MARK_DELAY)
            if not marking.cancelled_caught:
                await self._set_state(job_id, "queued", "running", started=at / 1000)
                held.running = True
        finally:
            marked.set()

    def _receipt(
        self,
        manifest: JobManifest,
        assign: VerifiedEnvelope[Assign],
        record: RunRecord,
        stdout: BlobRef,
        stderr: BlobRef,
        outputs: tuple[FileRef, ...],
    ) -> VerifiedEnvelope[UsageReceipt]:
        """The signed receipt of a run whose outputs are stored."""
        result = record.result
        receipt = UsageReceipt(
            network=self.ctx.network,
            job_id=manifest.job_id,
            assignment_id=assign.message_id,
            submitter=manifest.submitter,
            executor=self.ctx.node,
            module=manifest.module,
            inputs=manifest.inputs,
            stdin=manifest.stdin,
            stdout=stdout,
            stderr=stderr,
            outputs=outputs,
            profile=manifest.profile,
            limits=manifest.limits,
            outcome=_outcome(result),
            fuel_used=result.fuel_used + _TEST_LIE,
            peak_memory=min(result.peak_memory_bytes, manifest.limits.memory_bytes),
            compute_ms=record.compute_ms,
            queued_at=record.queued_at,
            started_at=record.started_at,
            finished_at=record.finished_at,
        )
        return sign_verified(receipt, self.ctx.identity)

    async def _finish(
        self,
        job_id: bytes,
        manifest: JobManifest,
        assign: VerifiedEnvelope[Assign],
        receipt: VerifiedEnvelope[UsageReceipt],
        small: tuple[tuple[BlobRef, bytes], ...],
        *,
        state: str,
    ) -> None:
        """Keep the outcome and deliver it: one `result` carrying the signed receipt and the small outputs
        the submitter would ask for next. `state` is the job's state until then: running, or queued for a
        run too short to be marked."""
        now = self.ctx.now_s()
        available = self.ctx.clock() + self._retention_ms(manifest)
        job_hex = job_id.hex()
        owner = f"result:{job_hex}"
        msg = receipt.message
        receipt_id = receipt.message_id.raw
        await self.ctx.store.atomically(  # one commit: the outcome is kept whole or not at all
            call(Store.put_envelope, receipt_id, "receipt", receipt.raw, now, job_id),
            *(call(Store.put_small_blob, ref.root.hex(), data) for ref, data in small),
            *(call(Store.ref_blob, ref.root.hex(), owner, available / 1000) for ref in outputs_of(msg)),
            call(
                Store.put_result,
                job_id=job_id,
                attempt=assign.message.attempt,
                executor=str(self.ctx.node),
                message_id=receipt_id,
                status=msg.outcome.status,
                now=now,
                fuel_used=msg.fuel_used,
                outputs={f.name: f.blob.root.hex() for f in msg.outputs},
            ),
            call(
                Store.put_receipt,
                digest=receipt_id,
                job_id=job_id,
                attempt=assign.message.attempt,
                executor=str(self.ctx.node),
                message_id=receipt_id,
                now=now,
                next_delivery=now + self.ctx.settings.delivery_interval,
            ),
            transition(
                ROLE,
                job_id,
                state,
                "done",
                now,
                started=msg.started_at / 1000,
                finished=msg.finished_at / 1000,
                fuel_used=msg.fuel_used,
            ),
        )
        log.info(
            "job %s ran: %s, %d fuel, %d ms compute, %d ms queued",
            job_hex[:12],
            msg.outcome.status,
            msg.fuel_used,
            msg.compute_ms,
            msg.waited_ms,
        )
        self._unacked[receipt_id] = receipt
        if len(self._unacked) > UNACKED_KEPT:
            del self._unacked[next(iter(self._unacked))]
        await self._deliver(receipt, available, small)

    def _retention_ms(self, manifest: JobManifest) -> int:
        """How long after finishing a job its outputs stay to be fetched: the manifest's wish, within
        this node's own retention."""
        own = self.ctx.settings.retention_ms
        return min(manifest.retention_ms or own, own)

    async def _fail(self, job_id: bytes, state: str, why: str, *, reason: str = "failed") -> None:
        """Give up a job this node cannot run: record why, and give the assignment back to the submitter
        (a `release` naming it) so it is offered elsewhere at once."""
        log.warning("job %s failed here: %s", job_id.hex()[:12], why)
        if state in ("done", "failed"):
            return
        await self.ctx.store.run(
            Store.update_job, job_id, ROLE, self.ctx.now_s(), state="failed", reason=why[:500]
        )
        mine = await self._own_assign(job_id)
        if mine is not None:
            await self._release(mine, reason, why)

    async def _own_assign(self, job_id: bytes) -> VerifiedEnvelope[Assign] | None:
        """This node's latest assignment of the job (a node that is also the submitter stores every
        assignment of its own jobs, those of other executors included)."""
        rows = await self.ctx.store.run(Store.envelopes_for_job, job_id, "assign")
        stored = (reopen_stored(r.raw, Assign) for r in rows)
        mine = [e for e in stored if e.message.executor == self.ctx.node]
        return max(mine, key=lambda e: e.message.attempt) if mine else None

    async def _release(self, assign: VerifiedEnvelope[Assign], reason: str, why: str) -> None:
        msg = Release(
            self.ctx.network, assign.message.job_id, assign.message_id, self.ctx.node, reason, _clip(why)
        )
        await self.ctx.send_to(assign.message.submitter.raw, sign_message(msg, self.ctx.identity))

    async def _set_state(self, job_id: bytes, old: str, new: str, **changes: Any) -> None:
        method, args, kwargs = transition(ROLE, job_id, old, new, self.ctx.now_s(), **changes)
        await self.ctx.store.run(method, *args, **kwargs)

    # --- delivery until acknowledged ---

    async def _deliver(
        self,
        receipt: VerifiedEnvelope[UsageReceipt],
        available: int,
        small: Iterable[tuple[BlobRef, bytes]] = (),
    ) -> bool:
        """Send the receipt's submitter its `result` (signed anew each time: it is not kept, its
        receipt is); False when there is no link to it."""
        result = make_result(self.ctx.network, receipt, available, small)
        return await self.ctx.send_to(receipt.message.submitter.raw, sign_message(result, self.ctx.identity))

    async def _delivery_loop(self) -> None:
        settings = self.ctx.settings
        while True:
            with trio.move_on_after(settings.delivery_interval):
                await self._deliver_now.wait()
            self._deliver_now = trio.Event()
            if self._trash:
                await trio.to_thread.run_sync(self._empty_trash)
            now = self.ctx.now_s()
            for row in await self.ctx.store.run(Store.receipts_due, now):
                stored = await self.ctx.store.run(Store.envelope, row.message_id)
                job = await self.ctx.store.run(Store.job, row.job_id, ROLE)
                if stored is None or job is None:  # forgotten (pruned): nothing left to deliver
                    await self.ctx.store.run(Store.receipt_delivery_failed, row.digest, math.inf)
                    continue
                receipt = reopen_stored(stored.raw, UsageReceipt)
                manifest = JobManifest.from_wire(unpack_canonical(job.manifest))
                available = receipt.message.finished_at + self._retention_ms(manifest)
                if available <= self.ctx.clock():
                    # Retention is over: the outputs may be collected, so stop offering the receipt.
                    log.info(
                        "stopped delivering the receipt of job %s: retention ended unacknowledged",
                        row.job_id.hex()[:12],
                    )
                    await self.ctx.store.run(Store.receipt_delivery_failed, row.digest, math.inf)
                    continue
                await self._deliver(receipt, available)  # the submitter fetches the outputs it lacks
                delay = backoff(
                    settings.delivery_interval, row.delivery_tries, settings.delivery_backoff_max, doublings=8
                )
                await self.ctx.store.run(Store.receipt_delivery_failed, row.digest, now + delay)

    def on_ack(self, env: VerifiedEnvelope[Ack]) -> None:
        if self._nursery is not None:
            self._nursery.start_soon(self._on_ack, env)

    async def _on_ack(self, env: VerifiedEnvelope[Ack]) -> None:
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
            self._prove(ack.submitter.raw, receipt_id, to_log)

    def _prove(self, peer: bytes, receipt_id: bytes, to_log: VerifiedEnvelope[UsageReceipt] | None) -> None:
        """Send `peer` the receipt's inclusion proof with the next batch (appending it to the log first
        when `to_log` is given). Every peer that asked meanwhile gets it."""
        peers, queued = self._to_prove.get(receipt_id, (frozenset(), None))
        self._to_prove[receipt_id] = (peers | {peer}, to_log or queued)
        self._prove_now.set()

    async def _prove_loop(self) -> None:
        """Every `proof_batch_s` while proofs are due: one append to the receipt log for the receipts
        acknowledged meanwhile, one signed tree head, a proof each (node/receiptlog.py). A batch that
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
                    self._prove(peer, receipt_id, to_log)
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
        assert self._nursery is not None
        for peer, raws in proofs.items():  # a stalled link holds up only its own proofs
            if raws:
                self._nursery.start_soon(self._send_proofs, peer, raws, wanted[peer])
        return True

    async def _send_proofs(self, peer: bytes, proofs: list[bytes], receipt_ids: list[bytes]) -> None:
        """Send a peer the proofs placing `receipt_ids`; if it cannot take them now, all of them go
        again (to a replaced link with the next batch; else when its link comes up): a proof it gets
        twice is only checked twice."""
        for raw in proofs:
            if not await self.ctx.send_to(peer, raw):
                if peer in self.ctx.connected():  # the link was replaced meanwhile: the next batch
                    for receipt_id in receipt_ids:
                        self._prove(peer, receipt_id, None)
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
            self._prove(receipt.message.submitter.raw, receipt.message_id.raw, receipt)

    # --- cancel ---

    def on_cancel(self, env: VerifiedEnvelope[Cancel]) -> None:
        if self._nursery is not None:
            self._nursery.start_soon(self._on_cancel, env)

    async def _on_cancel(self, env: VerifiedEnvelope[Cancel]) -> None:
        """The submitter withdrew a job: stop its run if this node holds it, and end it `cancelled`."""
        msg = env.message
        job_id = msg.job_id.raw
        held = self._held.get(job_id)
        if held is not None and await self._cancellable(job_id, str(msg.submitter)):
            held.scope.cancel()
        for _ in range(3):  # the run may move the state on meanwhile
            row = await self.ctx.store.run(Store.job, job_id, ROLE)
            if row is None or row.submitter != str(msg.submitter) or row.state in FINISHED_HERE:
                return
            if await self.ctx.store.run(
                Store.update_job,
                job_id,
                ROLE,
                self.ctx.now_s(),
                expect_state=row.state,
                state="cancelled",
                reason="cancelled by its submitter",
            ):
                log.info("job %s cancelled by its submitter", job_id.hex()[:12])
                return

    async def _cancellable(self, job_id: bytes, submitter: str) -> bool:
        row = await self.ctx.store.run(Store.job, job_id, ROLE)
        return row is not None and row.submitter == submitter and row.state not in FINISHED_HERE

    def on_proof_request(self, peer: bytes, env: VerifiedEnvelope[ProofRequest]) -> None:
        msg = env.message
        if msg.executor == self.ctx.node and msg.expires > self.ctx.clock() and self._nursery is not None:
            self._prove(peer, msg.receipt_id.raw, None)


def _outcome(result: RunResult) -> Outcome:
    if result.status is Status.EXITED:
        return Outcome("exited", result.exit_code if result.exit_code is not None else 0, None)
    if result.status is Status.TRAP:
        trap = (result.trap or "unknown")[:TRAP_MAX] or "unknown"
        return Outcome("trap", None, trap)
    return Outcome(str(result.status), None, None)


def _clip(text: str) -> str:
    """`text` cut to fit a decline's reason text (REASON_TEXT_MAX bytes of UTF-8)."""
    return text.encode("utf-8", "replace")[:REASON_TEXT_MAX].decode("utf-8", "ignore")


@dataclass(frozen=True, slots=True)
class _Stored:
    """A run's stdout, stderr and output files, checked; the larger ones stored as blobs, and the small
    ones (1..PUSH_MAX bytes) in `small`: kept in the database with the job's end (no file, no fsync of
    their own) and carried to the submitter in the result."""

    stdout: BlobRef
    stderr: BlobRef
    outputs: tuple[FileRef, ...]
    small: tuple[tuple[BlobRef, bytes], ...]


def _store_outputs(blobs: BlobStore, work: Path, result: RunResult) -> _Stored:
    """Check a run's stdout, stderr and output files against the hashes the run reported and store the
    larger ones as blobs (in the thread that waited for the run); the small ones are returned."""
    streams = work / "streams"
    small: list[tuple[BlobRef, bytes]] = []
    stdout = _put_checked(blobs, streams, "stdout", result, small)
    stderr = _put_checked(blobs, streams, "stderr", result, small)
    outputs = []
    for name, sha in sorted(result.output_files.items()):
        data = (work / "output" / name).read_bytes()
        if hashlib.sha256(data).hexdigest() != sha:
            raise JobFailed(f"output file {name!r} changed after the run")
        ref = _small(small, data) or BlobRef(Digest(bytes.fromhex(blobs.put(data))), len(data))
        outputs.append(FileRef(name, ref))
    return _Stored(stdout, stderr, tuple(outputs), tuple(small))


def _small(small: list[tuple[BlobRef, bytes]], data: bytes) -> BlobRef | None:
    """The BlobRef of an output of 1..PUSH_MAX bytes, added to `small` (kept in the database, carried
    in the result: protocol/results.make_result takes the first MAX_PUSHED); None for another size."""
    if not 0 < len(data) <= PUSH_MAX:
        return None
    ref = blob_ref(data)
    small.append((ref, data))
    return ref


def _put_checked(
    blobs: BlobStore, streams: Path, name: str, result: RunResult, small: list[tuple[BlobRef, bytes]]
) -> BlobRef:
    """Store the run's stream `name` as a blob, from the result when it holds it whole, else from its
    file under `streams`, if it is exactly the size and hash the run reported (a small one goes to
    `small` instead)."""
    _, total, sha = result.stream(name)
    where = whole_stream(result, streams, name)
    if isinstance(where, bytes):
        if hashlib.sha256(where).hexdigest() != sha:
            raise JobFailed(f"the run's {name} does not match the hash it reported")
        return _small(small, where) or BlobRef(Digest(bytes.fromhex(blobs.put(where))), total)
    path = where
    digest = hashlib.sha256()
    size = 0

    def chunks() -> Iterator[bytes]:
        nonlocal size
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
                size += len(chunk)
                yield chunk

    try:
        root, _ = blobs.put_stream(chunks())
    except FileNotFoundError:
        raise JobFailed(f"the sandbox left no {path.name} stream") from None
    if size != total or digest.hexdigest() != sha:
        raise JobFailed(
            f"the {path.name} stream holds {size} bytes that do not match the {total} bytes the run reported"
        )
    return BlobRef(Digest(bytes.fromhex(root)), total)


def _blob_refs(manifest: JobManifest) -> list[BlobRef]:
    """The blobs a job needs to run: its module, inputs and stdin."""
    refs = [manifest.module, *(f.blob for f in manifest.inputs)]
    if manifest.stdin is not None:
        refs.append(manifest.stdin)
    return refs


def _release_reason(why: str | None) -> str:
    """The release reason of a job that failed here, from the reason recorded when it did."""
    return {GIVE_BACK_TEXT: "deadline", LEASE_LOST_TEXT: "lease"}.get(why or "", "failed")
