"""The submitter's side of the market: offer a job, collect answers, assign it, verify what comes back.

Each job the node submitted and has not finished has one driver task, which runs rounds:

    offer (signed, gossiped, and shown to this node's own executor)
      -> answers arrive (bids and declines, direct messages) -> the window decides (market_rules)
      -> assign (signed, with a lease) to the chosen bid -> wait for a verified outcome until the lease
    ends; a lease that runs out, a refused assignment or an outcome that fails verification starts a
    new round without that executor; the deadline ends it all (`expired`).

An outcome is a `result` carrying the signed `receipt` and the small outputs (protocol/results.py).
The receipt is checked against the manifest and the assignment it names (protocol/receipts.py), the
output blobs it lists that the result did not carry are fetched from the executor (every chunk
verified), and only then is the job `done`, in one commit with the receipt and the carried outputs
(kept in the database). The receipt is countersigned with the next `ack` to its executor, one per
executor for the receipts verified over a short while (node/acks.py). A repeated outcome for a finished
job gets the stored ack again (or, lost in a stop, a new one), so an executor that missed it stops
retrying. A refused receipt is stored as evidence. One lost in a stop is delivered again, as executors
re-send until acknowledged. Inclusion proofs come a batch at a time; one whose entry for a receipt of
ours fails is refused whole.

Hand-off: the assigned executor's `accepted` (it holds every blob and has queued the job) is stored
with the job; from then on this node may go offline. An executor leaves it out for a job whose outcome
goes within moments (half a second for the reference executor): the job is then done instead. A node
that comes back re-sends its assignments to the executors it can reach again (`pull`), so each delivers
its outcome at once instead of at its next backed-off retry. Reassigning a job whose executor vanished
needs this node online.

Cancel (`e31 cancel`): a signed `cancel` goes to the assigned executor and out on gossip, the job ends
`cancelled` and its driver stops; an outcome arriving later is ignored (its executor re-sends it until
its retention ends).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio
from e31.protocol.blobs import BlobRef
from e31.protocol.codec import pack
from e31.protocol.envelope import VerifiedEnvelope, reopen_stored, sign_message, sign_verified, verify
from e31.protocol.errors import Mismatch, ProtocolError
from e31.protocol.gossip import message_cost
from e31.protocol.ids import Digest, NodeId
from e31.protocol.jobs import JobManifest
from e31.protocol.merkle import verify_entry_inclusion
from e31.protocol.messages import (
    MAX_SET,
    Accepted,
    Assign,
    Bid,
    Cancel,
    Decline,
    InclusionProof,
    Offer,
    ProofRequest,
    Release,
    Result,
    TreeHead,
)
from e31.protocol.receipts import UsageReceipt, check_receipt_assignment, check_receipt_manifest
from e31.protocol.results import carried_outputs, open_result, outputs_of

from ..errors import UsageError
from ..lifecycle import TERMINAL
from ..net.peers import TokenBucket
from ..nursery import own_nursery
from ..store.db import Call, JobRow, ReceiptRow, Store, call
from .acks import Acknowledger
from .admission import Admission
from .router import MarketContext, transition
from .rules import (
    BidView,
    Window,
    backoff,
    choose_bid,
    lease_expiry,
    offer_expiry,
    window_state,
)
from .transfer import BlobTransfer, FetchError

log = logging.getLogger("e31.submitter")

ROLE = "submitter"
POLL = 0.05
OFFER_RATE = 135.0
OFFER_BURST = 540.0
"""Offers gossiped per second, and at once: under what each node accepts from one signer (GossipConfig:
150 per second, burst 600), so none is dropped at the first hop. Rounds wait in line for a token, so a
sweep of thousands of jobs is offered at this pace instead of spinning."""
IN_FLIGHT = 128
"""Jobs this node offers or has assigned at once; the rest of a sweep waits `queued`, its deadline
running. Outcomes are verified here one blob fetch at a time, so a node that put thousands of jobs out
at once would let leases run out before it got to their results, and offer them all again."""
ACKS_RESENT_KEPT = 1024
"""Stored acks remembered as sent again (the oldest forgotten first: it may then go once more)."""
ADMIT_STEP = 16
"""Waiting jobs are admitted this many at a time (node/admission.py), so they share an offer."""
REOFFER_MAX = 8.0
"""Seconds between rounds at most: the delay after a round without a bid doubles up to this."""
CANCEL_TTL_MS = 3600 * 1000
"""How long a cancel of a job whose deadline has passed stays on gossip."""
OFFER_BYTES = 240 * 1024
"""Manifest bytes in one offer at most: under the gossip cap of an offer (256 KiB) with room for its
envelope. A manifest alone over it is still offered, alone (gossip refuses it; this node may run it)."""
EXPIRIES_PRUNE_MIN = 4096
"""Expiries of offers signed here held before the past ones are first forgotten (no two live offers of
this node share an expiry, so none is the same message as another)."""
HEADS_KEPT = 64
"""Verified signed tree heads kept (executors' latest heads)."""
PROOFS_ASKED = 100
"""Missing inclusion proofs asked of an executor each time its link comes up (a page, newest first)."""
PROOF_PAGES_KEPT = 1024
"""Executors whose next page of missing proofs is remembered (the others start again from the newest)."""
PROOF_REQUEST_TTL_MS = 60_000
"""How long such a `proofreq` stays valid."""
RETRYABLE_RELEASES = frozenset({"unknown", "lease"})
"""Release reasons that say nothing against the executor: it may bid for the job again (once)."""


class UnknownJob(UsageError, LookupError):
    """No job with this id was submitted from this node."""


@dataclass(eq=False)
class _Round:
    offer_id: bytes
    opened: float
    bids: dict[bytes, BidView] = field(default_factory=dict)
    answered: set[bytes] = field(default_factory=set)
    raw: dict[bytes, bytes] = field(default_factory=dict)
    """The signed bids by message id (the chosen one is stored with the job)."""
    wake: trio.Event = field(default_factory=trio.Event)


@dataclass(eq=False)
class _Joining:
    """A job waiting for the next offer (`_offer_sets` takes it, signs and sends the offer, opens the
    job's round and sets `done`)."""

    job_id: bytes
    job: _Job
    expires: int
    """The latest expiry this round of the job allows (market_rules.offer_expiry)."""
    to_offered: Call | None = None
    """The store call moving the job to `offered`, made in the commit that stores the offer (None: the
    job is there already)."""
    done: trio.Event = field(default_factory=trio.Event)
    gossiped: bool = False
    error: Exception | None = None


@dataclass(eq=False)
class _Job:
    manifest: JobManifest
    round: _Round | None = None
    finished: trio.Event = field(default_factory=trio.Event)
    rejected: set[bytes] = field(default_factory=set)
    """Executors whose assignment failed (lease ran out, or their outcome failed verification)."""
    outcome_failed: trio.Event = field(default_factory=trio.Event)
    completing: bool = False
    rounds: int = 0
    round_step: int = 1
    """Rounds of one job's replica lanes interleave (lane i uses i, i + K, ...): no two offers are equal."""
    assigned_to: bytes | None = None
    assign_env: VerifiedEnvelope[Assign] | None = None
    """The current assignment as this node signed it: re-sent until its executor accepts it, and an
    outcome for it needs no store read and no re-verify."""
    accepted: bytes | None = None
    """The assignment (message id) its executor has accepted."""
    released: dict[bytes, str] = field(default_factory=dict)
    """Assignments (message ids) their executor gave back with a `release`, and its reason."""
    forgiven: set[bytes] = field(default_factory=set)
    """Executors whose one retryable release of this job was not held against them."""
    refusal: str | None = None
    """Why the last executor gave the job back or had its outcome refused."""
    settled: trio.Event = field(default_factory=trio.Event)
    """Set when the outcome being verified (while `completing`) has been accepted or refused."""
    declined: str | None = None
    """The last decline heard for this job's offers (it explains an expiry)."""
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    """The driver's scope: a cancel stops the driver through it."""
    lanes: list[_Job] | None = None
    """With replicas: one lane (a _Job of its own) per replica, each with its own executor."""
    holder: bytes | None = None
    """A lane's executor, from the moment its bid is chosen (other lanes avoid it)."""
    receipt: VerifiedEnvelope[UsageReceipt] | None = None
    """A lane's verified receipt."""
    outcomes: set[bytes] = field(default_factory=set)
    """The receipts taken in for this job, by signer and SHA-256 of their bytes (`_outcome_key`):
    results from that signer carrying one of them again are dropped."""

    @functools.cached_property
    def size(self) -> int:
        """The manifest's encoded size (what it adds to an offer)."""
        return len(pack(self.manifest.to_wire()))

    @property
    def assignment(self) -> bytes | None:
        """The current assignment's `assign` message id."""
        return None if self.assign_env is None else self.assign_env.message_id.raw


class Submitter:
    def __init__(
        self,
        ctx: MarketContext,
        *,
        transfer: BlobTransfer,
        publish: Callable[[bytes | VerifiedEnvelope[Any]], int] | None = None,
        local_offer: Callable[[VerifiedEnvelope[Any]], None] | None = None,
    ) -> None:
        self.ctx = ctx
        self.transfer = transfer
        self.publish = publish
        self.local_offer = local_offer
        self.jobs: dict[bytes, _Job] = {}
        self.load: Counter[bytes] = Counter()
        self._nursery: trio.Nursery | None = None
        self.acks = Acknowledger(ctx)
        self._acks_resent: dict[tuple[bytes, bytes], float] = {}
        """(executor, ack id) -> when that stored ack was last sent again (ACKS_RESENT_KEPT at most)."""
        self._offers = TokenBucket(OFFER_RATE, OFFER_BURST)
        self._offer_line = trio.Lock()
        self._in_flight = Admission(IN_FLIGHT, ADMIT_STEP)
        self._proofs_asked: dict[bytes, tuple[float, bytes]] = {}
        """Per executor, where the last page of missing proofs asked of it ended (_ask_proofs)."""
        self._joining: list[_Joining] = []
        self._offer_wake = trio.Event()
        self._expiries: set[int] = set()
        self._expiries_prune_at = EXPIRIES_PRUNE_MIN
        self._heads: dict[bytes, VerifiedEnvelope[TreeHead]] = {}
        """Signed tree heads already verified, by their bytes (HEADS_KEPT, least recently used dropped
        first): an executor proves a batch of receipts against one head."""
        self.changed = trio.Event()
        self._job_changed: dict[bytes, trio.Event] = {}
        """Set (and replaced) whenever a job's state changes: `e31 wait` long-polls on it."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        rows = await self.ctx.store.run(Store.jobs, role=ROLE)
        unacked = await self.ctx.store.run(Store.verified_unacked)
        async with own_nursery(self) as nursery:
            nursery.start_soon(self._offer_sets)
            nursery.start_soon(self.acks.run)
            for receipt in unacked:  # verified before a stop, its ack not stored: acknowledge it now
                try:
                    executor = NodeId.parse(receipt.executor)
                except ProtocolError:  # a row altered on disk: that receipt goes unacknowledged
                    log.warning("receipt %s names no executor", receipt.digest.hex()[:12])
                    continue
                self.acks.add(executor.raw, receipt.digest, receipt.job_id)
            for row in rows:
                if row.state not in TERMINAL:
                    self._start(row)
            task_status.started()
            await trio.sleep_forever()

    # --- submitting ---

    async def submit(self, manifest: JobManifest) -> bytes:
        """Record a new job (its blobs already stored) and start offering it; returns the job id."""
        job_id = manifest.job_id.raw
        added = await self.ctx.store.run(Store.add_job, **new_job(manifest, self.ctx.now_s()))
        if added and job_id not in self.jobs:
            self._drive_job(job_id, manifest)
        return job_id

    async def submit_batch(self, manifests: list[JobManifest]) -> str:
        """Record many new jobs and their batch in one transaction, then start offering them; returns
        the batch id."""
        from ..store import batches as batch

        now = self.ctx.now_s()
        jobs = [new_job(m, now) for m in manifests]
        bid = await self.ctx.store.run(batch.store_batch, jobs, now)
        wanted = {m.job_id.raw for m in manifests}
        for row in await self.ctx.store.run(Store.jobs, role=ROLE, states=("queued",)):
            if row.job_id in wanted and row.job_id not in self.jobs:
                self._start(row)
        return bid

    def _start(self, row: JobRow) -> None:
        try:
            manifest = JobManifest.from_wire(_unpack(row.manifest))
        except ProtocolError as e:
            log.error("stored job %s has an unreadable manifest: %s", row.job_id.hex(), e)
            return
        self._drive_job(row.job_id, manifest)

    def _drive_job(self, job_id: bytes, manifest: JobManifest) -> None:
        if self._nursery is None:  # stopping (or not started): the stored job is driven at the next start
            return
        job = _Job(manifest)
        self.jobs[job_id] = job
        self._nursery.start_soon(self._drive, job_id, job)

    def _transition(self, job_id: bytes, old: str, new: str, **changes: Any) -> Call:
        """`transition` of one of our submitted jobs (whoever runs it notifies waiters after)."""
        return transition(ROLE, job_id, old, new, self.ctx.now_s(), **changes)

    async def _set_state(self, job_id: bytes, old: str, new: str, **changes: Any) -> bool:
        method, args, kwargs = self._transition(job_id, old, new, **changes)
        ok: bool = await self.ctx.store.run(method, *args, **kwargs)
        self._notify(job_id)
        return ok

    def changed_for(self, job_id: bytes) -> trio.Event:
        """An event set at this job's next change: a waiter on one job is not woken by every job."""
        return self._job_changed.setdefault(job_id, trio.Event())

    def ended_for(self, job_id: bytes, event: trio.Event) -> None:
        """A waiter took `event` from changed_for and then found the job ended: forget the event (no
        change will ever pop it) and set it, so any other waiter holding it re-reads and sees the end."""
        if self._job_changed.get(job_id) is event:
            del self._job_changed[job_id]
        event.set()

    def _notify(self, job_id: bytes) -> None:
        self.changed.set()
        self.changed = trio.Event()
        event = self._job_changed.pop(job_id, None)
        if event is not None:
            event.set()

    # --- the driver ---

    async def _drive(self, job_id: bytes, job: _Job) -> None:
        try:
            with job.scope:
                await self._rounds(job_id, job)
        finally:
            self.jobs.pop(job_id, None)

    # --- cancel ---

    async def cancel(self, job_id: bytes, text: str = "") -> tuple[str, bool]:
        """Withdraw a job: sign a `cancel`, end the job `cancelled`, tell its executor and the network.
        Returns the job's state afterwards and whether this call withdrew it (a job that had already
        ended keeps its state)."""
        while True:
            row = await self.ctx.store.run(Store.job, job_id, ROLE)
            if row is None:
                raise UnknownJob(job_id.hex())
            if row.state in TERMINAL:
                return row.state, False
            now = self.ctx.clock()
            expires = max(int(row.deadline * 1000), now + CANCEL_TTL_MS)
            cancel = Cancel(self.ctx.network, Digest(job_id), self.ctx.node, expires, "withdrawn", text)
            env = sign_verified(cancel, self.ctx.identity)
            raw = env.raw
            await self.ctx.store.run(
                Store.put_envelope, env.message_id.raw, env.kind, raw, self.ctx.now_s(), job_id
            )
            reason = "cancelled by its submitter" + (f": {text}" if text else "")
            if await self._set_state(job_id, row.state, "cancelled", reason=reason[:500]):
                break
        job = self.jobs.get(job_id)
        if job is not None:
            job.finished.set()
            job.scope.cancel()
        log.info("job %s cancelled", job_id.hex()[:12])
        if self.publish is not None:
            try:
                self.publish(env)
            except ProtocolError as e:
                log.warning("cannot gossip the cancel of job %s: %s", job_id.hex()[:12], e)
        for executor in {a.message.executor.raw for a in await self._assigns(job_id)}:
            await self.ctx.send_to(executor, raw)
        return "cancelled", True

    async def _assigns(self, job_id: bytes) -> list[VerifiedEnvelope[Assign]]:
        rows = await self.ctx.store.run(Store.envelopes_for_job, job_id, "assign")
        return [reopen_stored(r.raw, Assign) for r in rows]

    # --- hand-off ---

    def on_accepted(self, env: VerifiedEnvelope[Accepted]) -> None:
        if self._nursery is not None:
            self._nursery.start_soon(self._on_accepted, env)

    async def _names_our_assignment(self, msg: Accepted | Release | Result) -> bool:
        """Whether an executor's message names an assignment this node made, of that job, to it."""
        current = next(
            (
                h.assign_env
                for h in self._holders(msg.job_id.raw)
                if h.assign_env is not None and h.assign_env.message_id == msg.assignment_id
            ),
            None,
        )
        if current is not None:
            assign = current.message  # one in flight, as signed here
        else:
            stored = await self.ctx.store.run(Store.envelope, msg.assignment_id.raw)
            if stored is None or stored.kind != "assign":
                return False
            assign = reopen_stored(stored.raw, Assign).message
        if assign.job_id != msg.job_id or assign.executor != msg.executor:
            log.info("ignoring a %s from %s that does not match its assignment", msg.KIND, msg.executor)
            return False
        return True

    async def _on_accepted(self, env: VerifiedEnvelope[Accepted]) -> None:
        msg = env.message
        if not await self._names_our_assignment(msg):
            return
        await self.ctx.store.run(
            Store.put_envelope, env.message_id.raw, env.kind, env.raw, self.ctx.now_s(), msg.job_id.raw
        )
        log.debug("job %s handed off to %s", msg.job_id.hex()[:12], msg.executor)
        for holder in self._holders(msg.job_id.raw):
            if holder.assignment == msg.assignment_id.raw:
                holder.accepted = holder.assignment
        self._notify(msg.job_id.raw)

    async def handed_off(self, rows: list[JobRow]) -> set[bytes]:
        """The ids of the jobs among `rows` that no longer need this node online until their result
        comes back: verified, or accepted by their current executor for the current assignment."""
        from ..store.handoff import handed_off

        if not any(r.state == "assigned" for r in rows):  # nothing to look up: no thread hop
            return {r.job_id for r in rows if r.state == "done"}
        return await self.ctx.store.run(handed_off, rows)

    def on_link_up(self, peer: bytes) -> None:
        """A peer is reachable (again): re-send it the assignments of jobs still waiting on it, so it
        delivers their outcomes now (the pull of a submitter that was away), and ask it for the
        inclusion proofs of its receipts that this node acknowledged but holds no proof of."""
        if self._nursery is not None:
            self._nursery.start_soon(self._pull, peer)
            self._nursery.start_soon(self._ask_proofs, peer)

    async def _ask_proofs(self, peer: bytes) -> None:
        # A page at a time, each link-up the next older one (then from the newest again), so proofs an
        # executor can never give do not keep it from being asked for the others.
        before = self._proofs_asked.pop(peer, None)
        rows = await self.ctx.store.run(Store.acked_without_proof, str(NodeId(peer)), PROOFS_ASKED, before)
        if not rows and before is not None:  # the last page was the oldest, and full: the newest again
            rows = await self.ctx.store.run(Store.acked_without_proof, str(NodeId(peer)), PROOFS_ASKED)
        if len(rows) == PROOFS_ASKED:
            self._proofs_asked[peer] = (rows[-1].delivered or 0.0, rows[-1].digest)
            if len(self._proofs_asked) > PROOF_PAGES_KEPT:
                del self._proofs_asked[next(iter(self._proofs_asked))]
        expires = self.ctx.clock() + PROOF_REQUEST_TTL_MS
        for row in rows:
            ask = ProofRequest(self.ctx.network, self.ctx.node, NodeId(peer), Digest(row.message_id), expires)
            if not await self.ctx.send_to(peer, sign_message(ask, self.ctx.identity)):
                return

    async def _pull(self, peer: bytes) -> None:
        executor = str(NodeId(peer))
        rows = await self.ctx.store.run(Store.jobs, role=ROLE, states=("assigned",))
        for row in rows:
            if row.executor != executor:
                continue
            current = [a for a in await self._assigns(row.job_id) if a.message.attempt == row.attempt]
            for a in current:
                if a.message.lease_expires > self.ctx.clock():
                    await self.ctx.send_to(peer, a.raw)

    async def _rounds(self, job_id: bytes, job: _Job) -> None:
        deadline_ms = job.manifest.deadline
        with trio.move_on_after(max(0.0, (deadline_ms - self.ctx.clock()) / 1000)):
            async with self._in_flight:
                await self._attempts(job_id, job)
            return
        row = await self.ctx.store.run(Store.job, job_id, ROLE)
        if row is not None and row.state not in TERMINAL and not job.completing:
            why = "the deadline passed before a verified result arrived"
            if row.attempt == 0 and job.declined is not None:
                why += f"; no node would take it ({job.declined})"
            elif row.attempt == 0:
                why += "; no node bid for it"
            await self._set_state(job_id, row.state, "expired", reason=why[:500])
            log.info("job %s expired", job_id.hex()[:12])

    async def _attempts(self, job_id: bytes, job: _Job) -> None:
        """Offer and assign the job round after round until it ends (the deadline is the caller's)."""
        if job.manifest.replicas > 1:
            await self._replicas(job_id, job)
            return
        row: JobRow | None = await self.ctx.store.run(Store.job, job_id, ROLE)
        if row is not None and row.state == "assigned":
            key = _key(row.executor)
            if key is not None:
                self.load[key] += 1
            current = [a for a in await self._assigns(job_id) if a.message.attempt == row.attempt]
            if current:
                job.assign_env = current[-1]
                if job_id in await self.handed_off([row]):
                    job.accepted = job.assignment
            try:
                await self._await_outcome(job_id, job, row.executor, await self._lease_left(job_id))
            finally:
                if key is not None:
                    self._unload(key)
            row = None  # it has moved on since
        idle = 0
        while not job.finished.is_set():
            if row is None:  # (a new job's first round uses the row just read)
                row = await self.ctx.store.run(Store.job, job_id, ROLE)
            if row is None or row.state in TERMINAL:
                return
            if job.refusal is not None and self._candidates() <= job.rejected:
                await self._set_state(
                    job_id,
                    row.state,
                    "failed",
                    reason=f"every node that could run it failed: {job.refusal}"[:500],
                )
                log.info("job %s failed: %s", job_id.hex()[:12], job.refusal)
                return
            moving = None if row.state == "offered" else row.state
            attempt, row = row.attempt, None  # read again next round
            bid = await self._offer_round(job_id, job, from_state=moving)
            if bid is None:
                idle += 1
                await trio.sleep(backoff(self.ctx.settings.reoffer_delay, idle - 1, REOFFER_MAX, doublings=8))
                continue
            idle = 0
            try:
                if await self._assign(job_id, job, bid, attempt + 1):
                    lease_s = self._lease_of(job)
                    await self._await_outcome(job_id, job, NodeId(bid.executor), lease_s)
                else:
                    job.rejected.add(bid.executor)
            finally:
                self._unload(bid.executor)

    # --- replicas ---

    async def _replicas(self, job_id: bytes, job: _Job) -> None:
        """Run the job on `replicas` distinct nodes at once (a lane each: offer, assign, verify, as for
        one), then compare their verified receipts: the same outcome, fuel and output hashes make it
        `done`; anything else makes it `disputed`, every receipt kept as evidence."""
        k = job.manifest.replicas
        job.lanes = [_Job(job.manifest, rounds=i, round_step=k) for i in range(k)]
        row = await self.ctx.store.run(Store.job, job_id, ROLE)
        if row is None:
            return
        if row.state != "offered":
            await self._set_state(job_id, row.state, "offered")
        attempts = [row.attempt]
        async with trio.open_nursery() as nursery:
            for lane in job.lanes:
                nursery.start_soon(self._lane, job_id, job, lane, attempts)
        receipts = [lane.receipt for lane in job.lanes if lane.receipt is not None]
        row = await self.ctx.store.run(Store.job, job_id, ROLE)
        if row is None or row.state in TERMINAL or len(receipts) < k:
            return
        claims = {_claim(r.message) for r in receipts}
        first = receipts[0].message
        if len(claims) == 1:
            await self._set_state(
                job_id,
                row.state,
                "done",
                executor=str(first.executor),
                started=first.started_at / 1000,
                finished=first.finished_at / 1000,
                fuel_used=first.fuel_used,
                reason=outcome_text(first.outcome.status, first.outcome.exit_code, first.outcome.trap),
            )
            log.info("job %s done: %d replicas agree", job_id.hex()[:12], k)
        else:
            why = "replicas disagree: " + "; ".join(_describe(r) for r in receipts)
            await self._set_state(job_id, row.state, "disputed", reason=why[:500])
            log.warning("job %s disputed: %s", job_id.hex()[:12], why)
        job.finished.set()

    async def _lane(self, job_id: bytes, job: _Job, lane: _Job, attempts: list[int]) -> None:
        assert job.lanes is not None
        others = [other for other in job.lanes if other is not lane]

        def avoid() -> frozenset[bytes]:
            held = {o.holder for o in others} | {o.receipt.signer.raw for o in others if o.receipt}
            return frozenset(h for h in held if h is not None)

        idle = 0
        while lane.receipt is None:
            bid = await self._offer_round(job_id, lane, avoid)
            if bid is None:
                lane.holder = None
                idle += 1
                await trio.sleep(backoff(self.ctx.settings.reoffer_delay, idle - 1, REOFFER_MAX, doublings=8))
                continue
            idle = 0
            attempts[0] += 1
            try:
                if await self._assign(job_id, lane, bid, attempts[0], lane=True):
                    lease_s = self._lease_of(lane)
                    await self._await_outcome(job_id, lane, NodeId(bid.executor), lease_s, lane=True)
                else:
                    lane.rejected.add(bid.executor)
                    lane.holder = None
            finally:
                self._unload(bid.executor)

    def _candidates(self) -> set[bytes]:
        """The nodes a round would ask now: the connected peers, and this node if it runs its own jobs."""
        nodes = set(self.ctx.connected())
        if self.local_offer is not None and self.ctx.settings.execute_own_jobs:
            nodes.add(self.ctx.local)
        return nodes

    async def _gossip_tokens(self, cost: int) -> None:
        """Wait in line until `cost` tokens of the offer pace are there, and take them."""
        cost = min(cost, int(OFFER_BURST))
        async with self._offer_line:
            while True:
                if self._offers.allow(trio.current_time(), cost):
                    return
                await trio.sleep(max(0.0, cost - self._offers.tokens) / OFFER_RATE)

    async def _offer_round(
        self,
        job_id: bytes,
        job: _Job,
        avoid: Callable[[], frozenset[bytes]] = frozenset,
        *,
        from_state: str | None = None,
    ) -> BidView | None:
        """Offer the job (in the next set) and wait for the round's bid to take; None when none came.
        A job in `from_state` is moved to `offered` in the commit that stores its offer."""
        now = self.ctx.clock()
        expires = offer_expiry(now, job.manifest.deadline, self.ctx.settings.offer_ttl_ms, job.rounds)
        job.rounds += job.round_step
        move = None if from_state is None else self._transition(job_id, from_state, "offered")
        entry = _Joining(job_id, job, expires, move)
        self._joining.append(entry)
        self._offer_wake.set()
        try:
            await entry.done.wait()
        finally:
            if entry in self._joining:  # cancelled before an offer took it
                self._joining.remove(entry)
        if entry.error is not None:  # its manifest cannot be offered: no round will ever get it out
            row = await self.ctx.store.run(Store.job, job_id, ROLE)
            if row is not None and row.state not in TERMINAL:
                reason = f"it cannot be offered: {entry.error}"
                await self._set_state(job_id, row.state, "failed", reason=reason[:500])
                log.warning("job %s failed: %s", job_id.hex()[:12], reason)
            top = self.jobs.get(job_id, job)  # a replica lane's failure ends the whole job
            for ended in {id(x): x for x in (job, top)}.values():
                ended.finished.set()
                ended.scope.cancel()
            return None
        rnd = job.round  # opened by _offer_sets (this driver alone clears it)
        if rnd is None:  # the job finished while it waited
            return None
        expected: set[bytes] = set(self.ctx.connected()) if entry.gossiped else set()
        if self.local_offer is not None and self.ctx.settings.execute_own_jobs:
            expected.add(self.ctx.local)
        expected -= job.rejected | avoid()
        try:
            while not job.finished.is_set():
                state = window_state(
                    now=trio.current_time(),
                    opened=rnd.opened,
                    expected=frozenset(expected),
                    answered=frozenset(rnd.answered),
                    bids=len(rnd.bids),
                    settings=self.ctx.settings.window,
                )
                if state is Window.ASSIGN:
                    bid = choose_bid(
                        rnd.bids.values(),
                        self.load,
                        now=self.ctx.clock(),
                        deadline=job.manifest.deadline,
                        exclude=frozenset(job.rejected) | avoid(),
                    )
                    if bid is not None:
                        self.load[bid.executor] += 1  # at once: rounds choosing at the same time see it
                        job.holder = bid.executor
                        try:
                            await self.ctx.store.run(
                                Store.put_shared_envelope,
                                bid.bid_id,
                                "bid",
                                rnd.raw[bid.bid_id],
                                self.ctx.now_s(),
                                [job_id],
                            )
                        except BaseException:
                            self._unload(bid.executor)
                            raise
                    return bid
                if state is Window.REOFFER:
                    return None
                with trio.move_on_after(POLL * 4):
                    await rnd.wake.wait()
                rnd.wake = trio.Event()
            return None
        finally:
            job.round = None

    async def _offer_sets(self) -> None:
        """Offer the jobs waiting for a round, as many in one signed offer as fit (MAX_SET, and the
        gossip size cap). Each offer waits for its gossip tokens (OFFER_RATE, one per started 16 KiB),
        and the jobs that join meanwhile go together in the next, so a lone job goes at once and a
        sweep goes in sets. A store failure ends the market (as any store call's would)."""
        while True:
            while not self._joining:
                await self._offer_wake.wait()
                self._offer_wake = trio.Event()
            taken = self._take_set()
            if not taken:
                continue
            env = self._offer_of(taken)
            if env is None:
                continue
            gossip = self.publish is not None and bool(self.ctx.connected())
            if gossip:
                await self._gossip_tokens(message_cost(len(env.raw)))
                live = [entry for entry in taken if not entry.job.finished.is_set()]
                if len(live) < len(taken):  # some ended while the offer waited for its tokens
                    for entry in taken:
                        if entry.job.finished.is_set():
                            entry.done.set()
                    taken = live
                    env = self._offer_of(taken) if taken else None
                    if env is None:
                        continue
            moving = [e for e in taken if e.to_offered is not None]
            await self.ctx.store.atomically(  # the offer, and its jobs `offered`, in one commit
                call(
                    Store.put_shared_envelope,
                    env.message_id.raw,
                    env.kind,
                    env.raw,
                    self.ctx.now_s(),
                    [e.job_id for e in taken],
                ),
                *(e.to_offered for e in moving if e.to_offered is not None),
                durable=False,  # neither the offer nor `offered` is a promise
            )
            for entry in moving:
                self._notify(entry.job_id)
            opened = trio.current_time()
            for entry in taken:
                entry.job.round = _Round(env.message_id.raw, opened)
            if gossip and self.publish is not None:
                try:
                    self.publish(env)
                except ProtocolError as e:
                    gossip = False
                    log.warning("cannot gossip an offer of %d jobs: %s", len(taken), e)
            if self.local_offer is not None and self.ctx.settings.execute_own_jobs:
                self.local_offer(env)
            for entry in taken:
                entry.gossiped = gossip
                entry.done.set()

    def _offer_of(self, taken: list[_Joining]) -> VerifiedEnvelope[Offer] | None:
        """The signed offer of the taken jobs; a job whose manifest cannot be offered is told why (its
        driver ends it) and left out. None when no job is left."""
        try:
            return self._sign_offer(taken)
        except ProtocolError:  # one job's manifest may be at fault: it alone fails, the others go
            taken[:] = [entry for entry in taken if self._signable(entry)]
        if not taken:
            return None
        try:
            return self._sign_offer(taken)
        except ProtocolError as e:  # each goes alone, but not together (never expected): none goes
            for entry in taken:
                entry.error = e
                entry.done.set()
            return None

    def _signable(self, entry: _Joining) -> bool:
        """Whether the job can be offered alone; if not, its driver is told why (and ends it)."""
        try:
            self._sign_offer([entry])
        except ProtocolError as e:
            entry.error = e
            entry.done.set()
            return False
        return True

    def _take_set(self) -> list[_Joining]:
        """The jobs of the next offer, in the order they joined: at most MAX_SET, one round per job
        (replica lanes of one job go in different offers), within OFFER_BYTES."""
        taken: list[_Joining] = []
        rest: list[_Joining] = []
        ids: set[bytes] = set()
        size = 0
        slack = int(self.ctx.settings.window.max_wait * 1000)
        soon = self.ctx.clock() + slack
        low = high = 0
        for entry in self._joining:
            if entry.job.finished.is_set():
                entry.done.set()  # its driver sees the job finished and leaves the round
                continue
            # The offer expires with its shortest-lived job: a job whose offer must expire soon goes
            # only with jobs whose offers expire about as soon (not to cut the others' rounds short).
            lo, hi = (
                (entry.expires, entry.expires)
                if not taken
                else (min(low, entry.expires), max(high, entry.expires))
            )
            close = lo >= soon or hi - lo <= slack
            fits = (size + entry.job.size <= OFFER_BYTES and close) or not taken
            if len(taken) < MAX_SET and entry.job_id not in ids and fits:
                low, high = lo, hi
                taken.append(entry)
                ids.add(entry.job_id)
                size += entry.job.size
            else:
                rest.append(entry)
        self._joining = rest
        return taken

    def _sign_offer(self, taken: list[_Joining]) -> VerifiedEnvelope[Offer]:
        """One offer of the taken jobs (job id order). Its expiry is the earliest any of them allows,
        moved a millisecond earlier while a live offer signed here has it: no two offers of this node
        are the same message, however the same jobs come together again."""
        expires = min(e.expires for e in taken)
        while expires in self._expiries:
            expires -= 1
        self._expiries.add(expires)
        if len(self._expiries) >= self._expiries_prune_at:  # amortized: the live ones at least double
            now = self.ctx.clock()
            self._expiries = {x for x in self._expiries if x > now}
            self._expiries_prune_at = max(EXPIRIES_PRUNE_MIN, 2 * len(self._expiries))
        manifests = tuple(e.job.manifest for e in sorted(taken, key=lambda e: e.job_id))
        return sign_verified(Offer(self.ctx.network, expires, self.ctx.node, manifests), self.ctx.identity)

    async def _assign(
        self, job_id: bytes, job: _Job, bid: BidView, attempt: int, *, lane: bool = False
    ) -> bool:
        now = self.ctx.clock()
        lease = lease_expiry(now, bid, job.manifest.deadline, slack_ms=self.ctx.settings.lease_slack_ms)
        assign = Assign(
            self.ctx.network,
            Digest(job_id),
            Digest(bid.bid_id),
            self.ctx.node,
            NodeId(bid.executor),
            attempt,
            lease,
        )
        env = sign_verified(assign, self.ctx.identity)
        raw = env.raw
        changes = {"executor": str(NodeId(bid.executor)), "attempt": attempt}
        _, moved = await self.ctx.store.atomically(  # one commit: the assignment with the state naming it
            call(Store.put_envelope, env.message_id.raw, env.kind, raw, self.ctx.now_s(), job_id),
            self._transition(job_id, "offered", "assigned", **changes),
        )
        self._notify(job_id)
        job.assign_env = env
        if lane and not moved:  # the first replica made the job `assigned`; the others record theirs
            await self.ctx.store.run(
                Store.update_job, job_id, ROLE, self.ctx.now_s(), expect_state="assigned", **changes
            )
        if not await self.ctx.send_to(bid.executor, raw):
            log.info("job %s: no link to %s to assign it", job_id.hex()[:12], NodeId(bid.executor))
            if not lane:
                await self._set_state(job_id, "assigned", "offered")
            return False
        log.debug("job %s attempt %d assigned to %s", job_id.hex()[:12], attempt, NodeId(bid.executor))
        return True

    def _lease_of(self, job: _Job) -> float:
        """Seconds left of the lease of the assignment this node just made (`_assign` keeps it)."""
        assert job.assign_env is not None
        return max(0.0, (job.assign_env.message.lease_expires - self.ctx.clock()) / 1000)

    async def _lease_left(self, job_id: bytes) -> float:
        """Seconds left of the longest lease among the job's stored assignments (after a restart)."""
        rows = await self.ctx.store.run(Store.envelopes_for_job, job_id, "assign")
        if not rows:
            return 0.0
        lease = max(reopen_stored(r.raw, Assign).message.lease_expires for r in rows)
        return max(0.0, (lease - self.ctx.clock()) / 1000)

    def _unload(self, executor: bytes) -> None:
        self.load[executor] -= 1
        if self.load[executor] <= 0:
            del self.load[executor]

    async def _await_outcome(
        self, job_id: bytes, job: _Job, executor: NodeId | str | None, lease_s: float, *, lane: bool = False
    ) -> None:
        key = _key(executor)
        job.assigned_to = key
        try:
            job.outcome_failed = trio.Event()
            if job.assignment in job.released:  # given back before this wait began (just restarted)
                lease_s = 0.0
            with trio.move_on_after(lease_s):
                async with trio.open_nursery() as nursery:

                    async def stop_on(event: trio.Event) -> None:
                        await event.wait()
                        nursery.cancel_scope.cancel()

                    nursery.start_soon(stop_on, job.finished)
                    nursery.start_soon(stop_on, job.outcome_failed)
                    if key is not None:
                        nursery.start_soon(self._resend_until_accepted, job, key)
        finally:
            job.assigned_to = None
        if job.finished.is_set():
            return
        if job.completing:  # an outcome is being verified right at the end of the lease
            await job.settled.wait()
        if job.finished.is_set():
            return
        if key is not None:
            # A release saying nothing against the executor lets it bid again, once per job: an
            # executor that keeps winning and giving the job back would otherwise hold it forever.
            if job.released.get(job.assignment or b"") in RETRYABLE_RELEASES and key not in job.forgiven:
                job.forgiven.add(key)
            else:
                job.rejected.add(key)
        if lane:
            job.holder = None
            return
        row = await self.ctx.store.run(Store.job, job_id, ROLE)
        if row is not None and row.state == "assigned":
            log.info(
                "job %s: no verified result from %s in time; offering it again", job_id.hex()[:12], executor
            )
            await self._set_state(job_id, "assigned", "offered")

    # --- assignments given back ---

    def on_release(self, env: VerifiedEnvelope[Release]) -> None:
        if self._nursery is not None:
            self._nursery.start_soon(self._on_release, env)

    async def _on_release(self, env: VerifiedEnvelope[Release]) -> None:
        """An executor gives an assignment back: if it is one of ours, to that executor, and still the
        job's current one, the job is offered again now (without that executor, unless the reason
        says nothing against it)."""
        msg = env.message
        if not await self._names_our_assignment(msg):
            return
        job = self.jobs.get(msg.job_id.raw)
        if job is None:
            return
        if job.lanes is not None:
            job = next((x for x in job.lanes if x.assignment == msg.assignment_id.raw), None)
            if job is None:
                return
        job.released[msg.assignment_id.raw] = msg.reason
        log.info(
            "job %s: %s gave its assignment back (%s%s)",
            msg.job_id.hex()[:12],
            msg.executor,
            msg.reason,
            f": {msg.text}" if msg.text else "",
        )
        if msg.reason not in RETRYABLE_RELEASES:
            job.refusal = msg.text or msg.reason
        if job.assignment == msg.assignment_id.raw and job.assigned_to == msg.executor.raw:
            job.outcome_failed.set()

    async def _resend_until_accepted(self, job: _Job, executor: bytes) -> None:
        """Send the current assignment again, backing off, until its executor accepts it: a copy
        that arrived while the executor was starting (or was lost with it) would otherwise leave the
        job waiting out its lease. Executors treat copies of an assignment they hold as one."""
        settings = self.ctx.settings
        assignment, delay = job.assignment, settings.delivery_interval
        while True:
            await trio.sleep(delay)
            current = job.assign_env
            if current is None or current.message_id.raw != assignment or job.accepted == assignment:
                return
            await self.ctx.send_to(executor, current.raw)
            delay = min(settings.delivery_backoff_max, delay * 2)

    # --- answers to offers ---

    def on_answer(self, env: VerifiedEnvelope[Any]) -> None:
        """A bid or decline: each job it names whose current round is that offer's hears from it."""
        msg: Bid | Decline = env.message
        executor = msg.executor.raw
        offer_id = msg.offer_id.raw
        if isinstance(msg, Bid):
            live = msg.expires > self.ctx.clock()
            for item in msg.items:
                holder = self._in_round(item.job_id.raw, offer_id)
                if holder is None or (rnd := holder.round) is None:
                    continue
                rnd.answered.add(executor)
                if live:
                    rnd.bids[executor] = BidView(
                        env.message_id.raw, executor, item.expected_start, item.expected_finish, msg.expires
                    )
                    rnd.raw[env.message_id.raw] = env.raw
                rnd.wake.set()
            return
        why = f"{msg.reason}: {msg.text}" if msg.text else msg.reason
        for job_id in msg.job_ids:
            holder = self._in_round(job_id.raw, offer_id)
            if holder is None or (rnd := holder.round) is None:
                continue
            rnd.answered.add(executor)
            holder.declined = why
            log.debug("job %s: %s declined (%s)", job_id.hex()[:12], msg.executor, why)
            rnd.wake.set()

    def _holders(self, job_id: bytes) -> list[_Job]:
        """What runs a job under way here: the job itself, or with replicas its lanes (none if ended)."""
        job = self.jobs.get(job_id)
        return [] if job is None else [job] if job.lanes is None else job.lanes

    def _in_round(self, job_id: bytes, offer_id: bytes) -> _Job | None:
        """The job (or replica lane) whose round is open with that offer, if any."""
        holders = self._holders(job_id)
        return next((h for h in holders if h.round is not None and h.round.offer_id == offer_id), None)

    # --- outcomes ---

    def on_outcome(self, env: VerifiedEnvelope[Result]) -> None:
        """A `result`. One carrying a receipt already taken in for a job still under way is dropped at
        once: executors deliver again until acknowledged, and each copy would otherwise cost a
        signature check and store work while the first is being verified. Copies for ended jobs go
        through (they get the ack again)."""
        if self._nursery is None:
            return
        job = self.jobs.get(env.message.job_id.raw)
        if job is not None:
            key = _outcome_key(env)
            if key in job.outcomes:
                return
            job.outcomes.add(key)
        self._nursery.start_soon(self._on_outcome, env)

    async def _on_outcome(self, env: VerifiedEnvelope[Result]) -> None:
        msg = env.message
        job_id = msg.job_id.raw
        try:
            receipt_env = open_result(env)  # a receipt that does not open never will: its copies stay out
        except ProtocolError as e:
            log.warning("job %s: dropping a result from %s: %s", job_id.hex()[:12], env.signer, e)
            return
        try:
            carried = carried_outputs(msg, receipt_env.message)
        except Mismatch as e:  # the receipt may come again without them: the outputs are fetched then
            log.warning("job %s: dropping a result from %s: %s", job_id.hex()[:12], env.signer, e)
            self._forget_outcome(job_id, env)
            return
        row = await self.ctx.store.run(Store.job, job_id, ROLE)
        if row is None:
            return
        if not await self._names_our_assignment(msg):  # nothing a node that holds no assignment sends is kept
            log.info(
                "ignoring a result for job %s from %s, which holds no assignment of it",
                job_id.hex()[:12],
                msg.executor,
            )
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
        except (Mismatch, ProtocolError, FetchError) as e:
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
            current = job.assign_env
            if (
                current is not None
                and receipt_env.message.assignment_id == current.message_id
                and signer == current.message.executor.raw
            ):
                job.refusal = f"its outcome was refused: {e}"
                job.outcome_failed.set()
        finally:
            job.completing = False
            job.settled.set()

    def _forget_outcome(self, job_id: bytes, env: VerifiedEnvelope[Result]) -> None:
        """Let a later copy of this result's receipt, from its signer, in again."""
        top = self.jobs.get(job_id)
        if top is not None:
            top.outcomes.discard(_outcome_key(env))

    async def _complete(
        self,
        job_id: bytes,
        job: _Job,
        row: JobRow,
        receipt_env: VerifiedEnvelope[UsageReceipt],
        carried: dict[bytes, bytes],
    ) -> None:
        receipt = receipt_env.message
        assign_env = job.assign_env
        if assign_env is None or assign_env.message_id != receipt.assignment_id:  # an earlier attempt's
            assign_row = await self.ctx.store.run(Store.envelope, receipt.assignment_id.raw)
            if assign_row is None or assign_row.kind != "assign":
                raise Mismatch("the receipt names an assignment this node never made")
            assign_env = reopen_stored(assign_row.raw, Assign)
        check_receipt_manifest(receipt, job.manifest)
        check_receipt_assignment(receipt, assign_env.message, assign_env.message_id)
        if receipt.network != self.ctx.network:
            raise Mismatch("the receipt is for another network")
        executor = receipt.executor.raw
        outputs = outputs_of(receipt)
        small = await self._collect(executor, outputs, carried)
        recorded = call(
            Store.record_verified_receipt,
            receipt_digest=receipt_env.message_id.raw,
            job_id=job_id,
            attempt=assign_env.message.attempt,
            executor=str(receipt.executor),
            now=self.ctx.now_s(),
            blobs=[ref.root.hex() for ref in outputs],
        )
        kept = call(
            Store.put_envelope,
            receipt_env.message_id.raw,
            "receipt",
            receipt_env.raw,
            self.ctx.now_s(),
            job_id,
        )
        if job.manifest.replicas > 1:  # a lane: the job ends when every replica is in (_replicas)
            await self.ctx.store.atomically(*small, kept, recorded)
            job.receipt = receipt_env
            job.finished.set()
            self.acks.add(executor, receipt_env.message_id.raw, job_id)
            return
        outcome = receipt.outcome
        await self.ctx.store.atomically(  # one commit: the receipt, outputs and ack, with the job's end
            *small,
            kept,
            recorded,
            self._transition(
                job_id,
                row.state,
                "done",
                executor=str(receipt.executor),
                started=receipt.started_at / 1000,
                finished=receipt.finished_at / 1000,
                fuel_used=receipt.fuel_used,
                reason=outcome_text(outcome.status, outcome.exit_code, outcome.trap),
            ),
        )
        self._notify(job_id)
        job.finished.set()
        log.info(
            "job %s done on %s: %s, %d fuel",
            job_id.hex()[:12],
            receipt.executor,
            outcome_text(outcome.status, outcome.exit_code, outcome.trap),
            receipt.fuel_used,
        )
        self.acks.add(executor, receipt_env.message_id.raw, job_id)

    async def _collect(
        self, executor: bytes, outputs: Sequence[BlobRef], carried: dict[bytes, bytes]
    ) -> list[Call]:
        """Make every output of a receipt present here: those its result carried (already checked
        against their BlobRefs) are returned as store calls, to keep them in the database in the commit
        that ends the job; the others are fetched from the executor into the blob store."""
        keep: list[Call] = []
        for ref in outputs:
            root = ref.root.raw
            if root in carried:
                if not self.ctx.blobs.has(root):
                    keep.append(call(Store.put_small_blob, ref.root.hex(), carried[root]))
            else:
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
            now = trio.current_time()
            key = (signer, ack.message_id)
            if now < self._acks_resent.get(key, -math.inf) + self.ctx.settings.delivery_interval:
                return
            self._acks_resent[key] = now
            while len(self._acks_resent) > ACKS_RESENT_KEPT:
                del self._acks_resent[next(iter(self._acks_resent))]
            await self.ctx.send_to(signer, ack.raw)
            return
        row = await self.ctx.store.run(Store.receipt, receipt_id)
        if row is not None and row.delivered is not None:  # verified (never a receipt only seen)
            self.acks.add(receipt_env.signer.raw, receipt_id, row.job_id)

    # --- inclusion proofs ---

    def on_proof(self, env: VerifiedEnvelope[InclusionProof]) -> None:
        if self._nursery is not None:
            self._nursery.start_soon(self._on_proof, env)

    async def _on_proof(self, env: VerifiedEnvelope[InclusionProof]) -> None:
        """Keep an executor's proof that receipts of ours are in its log: each entry that checks out
        marks its receipt proven; the proof is kept once, linked to the jobs of those receipts."""
        proof = env.message
        try:
            head = self._heads.pop(proof.treehead, None)
            if head is not None:
                self._heads[proof.treehead] = head  # most recently used last
            else:
                head = verify(proof.treehead, TreeHead)
                self._heads[proof.treehead] = head
                if len(self._heads) > HEADS_KEPT:
                    del self._heads[next(iter(self._heads))]
            if head.signer != proof.executor or head.message.size != proof.tree_size:
                raise Mismatch("the proof's tree head is not the executor's head of that size")
            if head.message.network != self.ctx.network:
                raise Mismatch("the proof's tree head is for another network")
        except ProtocolError as e:
            log.warning("refusing an inclusion proof from %s: %s", proof.executor, e)
            return
        ids = [e.receipt_id.raw for e in proof.entries]
        rows = await self.ctx.store.run(Store.receipts_with_envelopes, ids)
        executor = str(proof.executor)
        proven: list[tuple[ReceiptRow, int]] = []
        for row, raw in rows:
            if row.executor != executor or row.delivered is None:
                continue  # not a receipt of ours from that executor: nothing to check or keep
            entry = proof.entry(Digest(row.digest))
            assert entry is not None  # the rows were asked for by the entries' receipt ids
            try:
                verify_entry_inclusion(
                    raw, entry.leaf_index, proof.tree_size, [h.raw for h in entry.path], head.message.root.raw
                )
            except ProtocolError as e:
                # Refused whole: kept, it would carry a failing entry into every bundle of ours that
                # holds that receipt. Its receipts stay unproven and are asked for again (proofreq).
                log.warning(
                    "refusing an inclusion proof from %s: receipt %s: %s",
                    proof.executor,
                    row.digest.hex()[:12],
                    e,
                )
                return
            proven.append((row, entry.leaf_index))
        if not proven:
            return
        await self.ctx.store.atomically(  # the rows' log indexes mark the receipts as proven here
            call(
                Store.put_shared_envelope,
                env.message_id.raw,
                "proof",
                env.raw,
                self.ctx.now_s(),
                sorted({row.job_id for row, _ in proven}),
            ),
            *(call(Store.set_receipt_log_index, row.digest, index, durable=False) for row, index in proven),
            durable=False,  # lost to a power cut, the proof is asked for again (`proofreq`)
        )


def _outcome_key(env: VerifiedEnvelope[Result]) -> bytes:
    """A delivered receipt, as the submitter dedupes it: its signer's result carrying those bytes (a
    node that wraps another's receipt in a result of its own does not keep the real one out)."""
    return env.signer.raw + hashlib.sha256(env.message.receipt).digest()


def new_job(manifest: JobManifest, now: float) -> dict[str, Any]:
    """The fields of Store.add_job for a job this node submits."""
    refs = [manifest.module.root, *(f.blob.root for f in manifest.inputs)]
    if manifest.stdin is not None:
        refs.append(manifest.stdin.root)
    return {
        "job_id": manifest.job_id.raw,
        "role": ROLE,
        "manifest": pack(manifest.to_wire()),
        "state": "queued",
        "submitter": str(manifest.submitter),
        "created": now,
        "deadline": manifest.deadline / 1000,
        "fuel_limit": manifest.limits.fuel,
        "blobs": [r.hex() for r in refs],
    }


def _claim(r: UsageReceipt) -> tuple[Any, ...]:
    """What replicas must agree on: the outcome, the fuel, and every output by hash."""
    return (r.outcome, r.fuel_used, r.stdout, r.stderr, r.outputs)


def _describe(env: VerifiedEnvelope[UsageReceipt]) -> str:
    r = env.message
    text = outcome_text(r.outcome.status, r.outcome.exit_code, r.outcome.trap)
    return f"{str(r.executor)[:16]} says {text}, {r.fuel_used} fuel, stdout {r.stdout.root.hex()[:12]}"


def outcome_text(status: str, exit_code: int | None, trap: str | None) -> str:
    if status == "exited":
        return f"exited {exit_code}"
    if status == "trap":
        return f"trap {trap}"
    return status


def _key(executor: NodeId | str | None) -> bytes | None:
    if executor is None:
        return None
    if isinstance(executor, NodeId):
        return executor.raw
    try:
        return NodeId.parse(executor).raw
    except ProtocolError:
        return None


def _unpack(data: bytes) -> Any:
    from e31.protocol.codec import unpack_canonical

    return unpack_canonical(data)
