"""The submitter's side of the market: offer a job, collect answers, assign it, wait for its outcome.

Each job the node submitted and has not finished has one driver task, which runs rounds:

    offer (signed, gossiped, and shown to this node's own executor: offering.py)
      -> answers arrive (bids and declines, direct messages) -> the window decides (rules.py)
      -> assign (signed, with a lease) to the chosen bid -> wait for a verified outcome until the lease
    ends; a lease that runs out, a refused assignment or an outcome that fails verification starts a
    new round without that executor; the deadline ends it all (`expired`).

The parts a driver waits on have modules of their own, each given the shared table of jobs under way
(submitted.py): the hand-off and assignments given back (handoff.py), outcomes, their receipts checked
and acknowledged, and replicas judged (outcomes.py), and inclusion proofs of acknowledged receipts
(inclusion.py).

Cancel (`e31 cancel`): a signed `cancel` goes to the assigned executor and out on gossip, the job ends
`cancelled` and its driver stops; an outcome arriving later is not taken, and its executor is sent
the cancel again (outcomes.py). A job done with an earlier attempt's late result has its other
assignments withdrawn the same way (reason `done`). An assignment whose executor falls behind its
promise is taken back with a `withdraw` and the job offered again (replan.py).
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import trio
from e31.protocol.envelope import VerifiedEnvelope
from e31.protocol.errors import ProtocolError
from e31.protocol.ids import NodeId
from e31.protocol.jobs import JobManifest
from e31.protocol.messages import Accepted, InclusionProof, Release, Results

from ..errors import StoreError, UsageError
from ..lifecycle import TERMINAL
from ..nursery import TaskSlot
from ..store.db import Call, Store
from ..store.rows import JobRow
from .acks import Acknowledger
from .admission import Admission
from .adverts import PeerCapacity, TrackRecord
from .assigning import AssignSets
from .behind import Promise
from .context import MarketContext
from .handoff import RETRYABLE_RELEASES, HandOff
from .inclusion import InclusionProofs
from .later import At, Later
from .linkups import LinkUps
from .offering import Choice, LocalOffer, OfferLine, Publish
from .outcomes import Arrived, Outcomes
from .replan import could_take, watch, watch_from
from .room import RoomWaits, for_room
from .rules import BidView, Window, backoff, lease_expiry, offer_expiry, window_state
from .submitted import (
    ROLE,
    Jobs,
    Joining,
    SubmittedJob,
    cancel_at,
    executor_key,
    new_job,
    set_submitted_state,
    signed_cancel,
    stored_assignments,
    stored_row,
    submitted_transition,
)
from .transfer import BlobTransfer

log = logging.getLogger("e31.submitter")

POLL = 0.05
IN_FLIGHT = 128
"""Jobs this node offers or has assigned at once; the rest of a sweep waits `queued`, its deadline
running. Outcomes are verified here one blob fetch at a time, so a node that put thousands of jobs out
at once would let leases run out before it got to their results, and offer them all again."""
ADMIT_STEP = 16
"""Waiting jobs are admitted this many at a time (node/admission.py), so they share an offer."""
REOFFER_MAX = 8.0
"""Seconds between rounds at most: the delay after a round without a bid doubles up to this."""


class UnknownJob(UsageError, LookupError):
    """No job with this id was submitted from this node."""


class Submitter:
    def __init__(
        self,
        ctx: MarketContext,
        *,
        transfer: BlobTransfer,
        publish: Publish | None = None,
        local_offer: LocalOffer | None = None,
        track: TrackRecord | None = None,
        adverts: Mapping[bytes, PeerCapacity] | None = None,
    ) -> None:
        self.ctx = ctx
        self.adverts = {} if adverts is None else adverts  # peers' capacity adverts (adverts.py), live
        self.track = track or TrackRecord(ctx.clock)
        """Evidence about executors (adverts.py): receipts verified from them rank their bids first."""
        self.transfer = transfer
        self.publish = publish
        self.jobs: Jobs = {}
        self.load: Counter[bytes] = Counter()
        self.room = RoomWaits()
        self._tasks = TaskSlot()
        self.acks = Acknowledger(ctx)
        self._in_flight = Admission(IN_FLIGHT, ADMIT_STEP)
        self._resends, self._watches = Later(ctx.settings.delivery_interval), At()
        """An assignment's re-sends, and the look at whether its executor fell behind, each started
        when due (later.py): a job whose outcome comes first costs no task for them."""
        self._assigning = AssignSets(ctx)
        """The jobs one bid wins at the same moment are assigned in one signed set and one commit."""
        self.changed = trio.Event()
        self._job_changed: dict[bytes, trio.Event] = {}
        """Set (and replaced) whenever a job's state changes: `e31 wait` long-polls on it."""
        self.offers = OfferLine(ctx, self.jobs, publish=publish, local_offer=local_offer, notify=self._notify)
        self.handoff = HandOff(ctx, self.jobs, notify=self._notify)
        self.outcomes = Outcomes(
            ctx, self.jobs, transfer=transfer, acks=self.acks, notify=self._notify, track=self.track
        )
        self.proofs = InclusionProofs(ctx)
        self.link_ups = LinkUps(self._link_up)
        """Peers whose link came up, waiting for their pull and proof requests (linkups.py)."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        rows = await self.ctx.store.run(Store.jobs, role=ROLE)
        unacked = await self.ctx.store.run(Store.verified_unacked)
        async with self._tasks.open() as nursery:
            nursery.start_soon(self.offers.run)
            nursery.start_soon(self.offers.send_awards)
            nursery.start_soon(self.acks.run)
            self._resends.delay = self.ctx.settings.delivery_interval  # (as set when the node starts)
            nursery.start_soon(self._resends.run, nursery)
            nursery.start_soon(self._watches.run, nursery)
            await nursery.start(self.link_ups.run)
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
                elif row.state == "done" and (key := executor_key(row.executor)) is not None:
                    self.track.verified(key)  # its receipt was verified here
            task_status.started()
            await trio.sleep_forever()

    # --- submitting ---

    async def submit(self, manifest: JobManifest) -> bytes:
        """Record a new job (its blobs already stored) and start offering it; returns the job id."""
        job_id = manifest.job_id.raw
        fields = new_job(manifest, self.ctx.now_s())
        added = await self.ctx.store.run(Store.add_job, **fields)
        if added and job_id not in self.jobs:
            self._drive_job(job_id, manifest, stored_row(fields))
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
                self._start(row, fresh=True)
        return bid

    def _start(self, row: JobRow, *, fresh: bool = False) -> None:
        try:
            manifest = JobManifest.from_wire(_unpack(row.manifest))
        except ProtocolError as e:
            log.error("stored job %s has an unreadable manifest: %s", row.job_id.hex(), e)
            return
        self._drive_job(row.job_id, manifest, row if fresh else None)

    def _drive_job(self, job_id: bytes, manifest: JobManifest, fresh: JobRow | None = None) -> None:
        """Start the job's driver; `fresh` is the job's row as this node has just stored it, new: only
        its driver (or a withdrawal, which ends the driver) changes it, so the driver need not read it."""
        nursery = self._tasks.nursery
        if nursery is None:  # stopping (or not started): the stored job is driven at the next start
            return
        job = SubmittedJob(manifest)
        self.jobs[job_id] = job
        nursery.start_soon(self._drive, job_id, job, fresh)

    def _transition(self, job_id: bytes, old: str, new: str, **changes: Any) -> Call:
        return submitted_transition(self.ctx, job_id, old, new, **changes)

    async def _set_state(self, job_id: bytes, old: str, new: str, **changes: Any) -> bool:
        return await set_submitted_state(self.ctx, self._notify, job_id, old, new, **changes)

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

    async def _drive(self, job_id: bytes, job: SubmittedJob, fresh: JobRow | None = None) -> None:
        try:
            with job.scope:
                await self._rounds(job_id, job, fresh)
        except StoreError as e:  # (a full disk): this job waits, the node and its other jobs go on
            log.warning(
                "job %s: its state cannot be stored: %s; it is taken up again at the next start",
                job_id.hex()[:12],
                e,
            )
        finally:
            self.jobs.pop(job_id, None)

    # --- cancel ---

    async def cancel(self, job_id: bytes, text: str = "") -> tuple[str, bool]:
        """Withdraw a job: sign a `cancel`, end the job `cancelled`, tell its executor and the network.
        Returns the job's state afterwards and whether this call withdrew it (a job that had already
        ended keeps its state)."""
        reason = "cancelled by its submitter" + (f": {text}" if text else "")
        return await self._withdraw(job_id, "cancelled", reason, text)

    async def _withdraw(self, job_id: bytes, state: str, reason: str, text: str) -> tuple[str, bool]:
        while True:
            row = await self.ctx.store.run(Store.job, job_id, ROLE)
            if row is None:
                raise UnknownJob(job_id.hex())
            if row.state in TERMINAL:
                return row.state, False
            env = await signed_cancel(self.ctx, job_id, int(row.deadline * 1000), "withdrawn", text)
            raw = env.raw
            if await self._set_state(job_id, row.state, state, reason=reason[:500]):
                break
        job = self.jobs.get(job_id)
        if job is not None:
            job.finish()
            job.scope.cancel()
        log.info("job %s %s: %s", job_id.hex()[:12], state, reason)
        if self.publish is not None:
            try:
                self.publish(env)
            except ProtocolError as e:
                log.warning("cannot gossip the cancel of job %s: %s", job_id.hex()[:12], e)
        for executor in {a.executor.raw for a in await stored_assignments(self.ctx, job_id)}:
            await self.ctx.send_to(executor, raw)
        return state, True

    def on_corrupt_blob(self, root: bytes, why: str) -> None:
        """A blob of this node's was found corrupt (and quarantined) when a peer asked for it
        (transfer.py): no peer can get it from here, so this node's unfinished jobs that need it fail
        now, with the reason, instead of at their deadlines."""
        if (nursery := self._tasks.nursery) is None:
            return
        for job_id, job in list(self.jobs.items()):
            m = job.manifest
            needed = [m.module, *(f.blob for f in m.inputs), *(() if m.stdin is None else (m.stdin,))]
            if any(ref.root.raw == root for ref in needed):
                reason = f"a blob it needs is corrupt on this node and cannot be sent: {why}; submit it again"
                nursery.start_soon(self._withdraw, job_id, "failed", reason, "a blob it needs is corrupt")

    def on_link_up(self, peer: bytes) -> None:
        """A peer is reachable (again): re-send it the assignments of jobs still waiting on it, so it
        delivers their outcomes now (the pull of a submitter that was away), and ask it for the
        inclusion proofs of its receipts that this node acknowledged but holds no proof of. Queued
        once per peer, and dropped if its link goes down first (linkups.py)."""
        self.link_ups.up(peer)

    def on_link_down(self, peer: bytes) -> None:
        self.link_ups.down(peer)

    async def _link_up(self, peer: bytes) -> None:
        await self.handoff.pull(peer)
        await self.proofs.ask(peer)

    async def _rounds(self, job_id: bytes, job: SubmittedJob, fresh: JobRow | None = None) -> None:
        deadline_ms = job.manifest.deadline
        with trio.move_on_after(max(0.0, (deadline_ms - self.ctx.clock()) / 1000)):
            async with self._in_flight:
                await self._attempts(job_id, job, fresh)
            return
        row = await self.ctx.store.run(Store.job, job_id, ROLE)
        if row is not None and row.state not in TERMINAL and not job.completing:
            why = "the deadline passed before a verified result arrived"
            if job.expired_at_executor is not None:
                why += f"; its executor gave it back: {job.expired_at_executor}"
            elif row.attempt == 0 and job.declined is not None:
                why += f"; no node would take it ({job.declined})"
            elif row.attempt == 0:
                why += "; no node bid for it"
            await self._set_state(job_id, row.state, "expired", reason=why[:500])
            log.info("job %s expired", job_id.hex()[:12])

    async def _attempts(self, job_id: bytes, job: SubmittedJob, fresh: JobRow | None = None) -> None:
        """Offer and assign the job round after round until it ends (the deadline is the caller's)."""
        if job.manifest.replicas > 1:
            await self._replicas(job_id, job)
            return
        row = fresh if fresh is not None else await self.ctx.store.run(Store.job, job_id, ROLE)
        if row is not None and row.state == "assigned":
            key = executor_key(row.executor)
            if key is not None:
                self.load[key] += 1
            current = [a for a in await stored_assignments(self.ctx, job_id) if a.attempt == row.attempt]
            if current:
                job.assign = current[-1]
                if job_id in await self.handed_off([row]):
                    job.accepted = job.assignment
            try:
                lease_s = await self._lease_left(job_id)
                await self._await_outcome(job_id, job, row.executor, lease_s, collect=True)
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
            won = await self._offer_round(job_id, job, from_state=moving)
            if won is None:
                if job.finished.is_set():  # it ended while offered: no wait for another round
                    return
                idle += 1
                delay = backoff(self.ctx.settings.reoffer_delay, idle - 1, REOFFER_MAX, doublings=8)
                # woken sooner if room frees (room.py)
                await self.room.wait(delay) if for_room(job.declined) else await trio.sleep(delay)
                continue
            idle = 0
            bid = won[0]
            try:
                if await self._assign(job_id, job, won, attempt + 1):
                    lease_s = self._lease_of(job)
                    await self._await_outcome(job_id, job, NodeId(bid.executor), lease_s)
                else:
                    job.rejected.add(bid.executor)
            finally:
                self._unload(bid.executor)

    # --- replicas ---

    async def _replicas(self, job_id: bytes, job: SubmittedJob) -> None:
        """Run the job on `replicas` distinct nodes at once (a lane each: offer, assign, verify, as for
        one), then have their verified receipts judged (outcomes.py)."""
        k = job.manifest.replicas
        job.lanes = [SubmittedJob(job.manifest, rounds=i, round_step=k) for i in range(k)]
        row = await self.ctx.store.run(Store.job, job_id, ROLE)
        if row is None:
            return
        if row.state != "offered":
            await self._set_state(job_id, row.state, "offered")
        attempts = [row.attempt]
        async with trio.open_nursery() as nursery:
            for lane in job.lanes:
                nursery.start_soon(self._lane, job_id, job, lane, attempts)
        await self.outcomes.judge_replicas(job_id, job)

    async def _lane(self, job_id: bytes, job: SubmittedJob, lane: SubmittedJob, attempts: list[int]) -> None:
        assert job.lanes is not None
        others = [other for other in job.lanes if other is not lane]

        def avoid() -> frozenset[bytes]:
            held = {o.holder for o in others} | {o.receipt.signer.raw for o in others if o.receipt}
            return frozenset(h for h in held if h is not None)

        idle = 0
        while lane.receipt is None:
            won = await self._offer_round(job_id, lane, avoid)
            if won is None:
                lane.holder = None
                idle += 1
                await trio.sleep(backoff(self.ctx.settings.reoffer_delay, idle - 1, REOFFER_MAX, doublings=8))
                continue
            idle = 0
            bid = won[0]
            attempts[0] += 1
            try:
                if await self._assign(job_id, lane, won, attempts[0], lane=True):
                    lease_s = self._lease_of(lane)
                    await self._await_outcome(job_id, lane, NodeId(bid.executor), lease_s, lane=True)
                else:
                    lane.rejected.add(bid.executor)
                    lane.holder = None
            finally:
                self._unload(bid.executor)

    def _movable(self, manifest: JobManifest) -> set[bytes]:
        """The nodes a job could be moved to now (replan.py): those a round would ask that run jobs."""
        nodes, now = self._candidates() - self.offers.runs_nothing.keys(), self.ctx.clock()
        return {n for n in nodes if could_take(self.adverts.get(n), manifest, now)}

    def _candidates(self) -> set[bytes]:
        """The nodes a round would ask now: the connected peers, and this node if it runs its own jobs."""
        nodes = set(self.ctx.connected())
        if self.offers.local:
            nodes.add(self.ctx.local)
        return nodes

    async def _offer_round(
        self,
        job_id: bytes,
        job: SubmittedJob,
        avoid: Callable[[], frozenset[bytes]] = frozenset,
        *,
        from_state: str | None = None,
    ) -> tuple[BidView, bytes] | None:
        """Offer the job (in the next set) and wait for the round's bid to take, with its signed bytes
        (stored with the assignment, in its commit: `_assign`); None when none came. A job in
        `from_state` is moved to `offered` in the commit that stores its offer."""
        now = self.ctx.clock()
        expires = offer_expiry(now, job.manifest.deadline, self.ctx.settings.offer_ttl_ms, job.rounds)
        job.rounds += job.round_step
        move = None if from_state is None else self._transition(job_id, from_state, "offered")
        entry = Joining(job_id, job, expires, move)
        self.offers.join(entry)
        try:
            await entry.done.wait()
        finally:
            self.offers.leave(entry)  # (if cancelled before an offer took it)
        if entry.error is not None:  # its manifest cannot be offered: no round will ever get it out
            row = await self.ctx.store.run(Store.job, job_id, ROLE)
            if row is not None and row.state not in TERMINAL:
                reason = f"it cannot be offered: {entry.error}"
                await self._set_state(job_id, row.state, "failed", reason=reason[:500])
                log.warning("job %s failed: %s", job_id.hex()[:12], reason)
            top = self.jobs.get(job_id, job)  # a replica lane's failure ends the whole job
            for ended in {id(x): x for x in (job, top)}.values():
                ended.finish()
                ended.scope.cancel()
            return None
        rnd = job.round  # opened by the offer line (this driver alone clears it)
        if rnd is None:  # the job finished while it waited
            return None
        expected: set[bytes] = set(self.ctx.connected()) if entry.gossiped else set()
        if self.offers.local:
            expected.add(self.ctx.local)
        expected -= job.rejected | avoid()
        rnd.expected = frozenset(expected)
        window = self.ctx.settings.window
        try:
            while not job.finished.is_set():
                state = window_state(
                    now=trio.current_time(),
                    opened=rnd.opened,
                    expected=rnd.expected,
                    answered=frozenset(rnd.answered),
                    bids=len(rnd.bids),
                    settings=window,
                )
                if state is Window.ASSIGN:
                    choice = Choice(frozenset(job.rejected) | avoid(), self.load, self.track)
                    bid = self.offers.choose(job_id, job, choice)  # the offer's spread (spread.py)
                    if bid is None:
                        return None
                    self.load[bid.executor] += 1  # at once: rounds choosing at the same time see it
                    job.holder = bid.executor
                    return bid, rnd.raw[bid.bid_id]
                if state is Window.REOFFER:
                    return None
                # until an answer that may end the wait (Round.heard), the job's end, or the time is up
                with trio.move_on_at(rnd.opened + (window.window if rnd.bids else window.max_wait) + 1e-3):
                    await rnd.wake.wait()
                rnd.wake = trio.Event()
            return None
        finally:
            job.round = None
            self.offers.forget(rnd.offer_id, job_id)

    async def _assign(
        self,
        job_id: bytes,
        job: SubmittedJob,
        won: tuple[BidView, bytes],
        attempt: int,
        *,
        lane: bool = False,
    ) -> bool:
        bid, bid_raw = won
        lease = lease_expiry(
            self.ctx.clock(), bid, job.manifest.deadline, slack_ms=self.ctx.settings.lease_slack_ms
        )
        changes = {"executor": str(NodeId(bid.executor)), "attempt": attempt}
        # one signed set and one commit for the jobs this bid wins at once (assigning.py): the bid
        # taken, the set, and each job's state naming it
        done = await self._assigning.assign(
            bid_id=bid.bid_id,
            executor=bid.executor,
            bid_raw=bid_raw,
            job_id=job_id,
            attempt=attempt,
            lease_expires=lease,
            calls=(self._transition(job_id, "offered", "assigned", **changes),),
            wanted=lambda: not job.finished.is_set(),
        )
        if done.assignment is None:  # it ended while its set was gathered: it was left out
            return False
        (moved,) = done.results
        self._notify(job_id)
        job.assign, job.promise = done.assignment, Promise(bid.expected_start, bid.expected_finish)
        if lane and not moved:  # the first replica made the job `assigned`; the others record theirs
            await self.ctx.store.run(
                Store.update_job, job_id, ROLE, self.ctx.now_s(), expect_state="assigned", **changes
            )
        if job.finished.is_set() or (not lane and not moved):  # it ended meanwhile (an earlier attempt's
            if done.sent:  # result completed it) and went out in its set: its executor drops it
                await cancel_at(self.ctx, job_id, job.manifest.deadline, bid.executor)
            return False
        if not done.sent:
            log.info("job %s: no link to %s to assign it", job_id.hex()[:12], NodeId(bid.executor))
            if not lane:
                await self._set_state(job_id, "assigned", "offered")
            return False
        log.debug("job %s attempt %d assigned to %s", job_id.hex()[:12], attempt, NodeId(bid.executor))
        return True

    def _lease_of(self, job: SubmittedJob) -> float:
        """Seconds left of the lease of the assignment this node just made (`_assign` keeps it)."""
        assert job.assign is not None
        return max(0.0, (job.assign.lease_expires - self.ctx.clock()) / 1000)

    async def _lease_left(self, job_id: bytes) -> float:
        """Seconds left of the longest lease among the job's stored assignments (after a restart)."""
        lease = max((a.lease_expires for a in await stored_assignments(self.ctx, job_id)), default=None)
        return 0.0 if lease is None else max(0.0, (lease - self.ctx.clock()) / 1000)

    async def _collect(
        self, job: SubmittedJob, key: bytes | None, lease_s: float, scope: trio.CancelScope
    ) -> None:
        """A returning submitter collects before it reassigns: the assignment it made before it
        stopped may have been run meanwhile, its lease run out while this node was away. Its executor
        is sent the assignment again when their link comes up (handoff.pull) and answers with the
        outcome it holds, a `release` (it never had the job, or gave it up) or `accepted` (still
        running it). So the wait ends (`scope` cancelled, and the job is offered again) only when the
        executor is gone: no link to it within `collect_wait` seconds, at the start or after a drop,
        and never before the lease has run out. While it is linked the wait is bounded too: by what is
        left of the lease, or else by the job's own run time and `collect_wait` more."""
        wait = self.ctx.settings.collect_wait
        start = trio.current_time()
        lease_end = start + lease_s
        bound = start + max(lease_s, job.manifest.limits.wall_ms / 1000 + wait)

        def linked() -> bool:
            return key is not None and key in self.ctx.connected()

        why = "gave no outcome in time"
        gone_at: float | None = None  # when the executor counts as gone, while there is no link to it
        while (now := trio.current_time()) < bound:
            if linked():
                gone_at = None
            elif gone_at is None:
                gone_at = max(lease_end, now + wait)
            elif now >= gone_at:
                why = f"was not reachable within {wait:g} s"
                break
            await trio.sleep(POLL * 4)
        log.info("job %s: its executor %s; offering it again", job.manifest.job_id.hex()[:12], why)
        scope.cancel()

    def _unload(self, executor: bytes) -> None:
        self.load[executor] -= 1
        if self.load[executor] <= 0:
            del self.load[executor]
        self.room.freed()  # (a job declined for want of room is offered again: room.py)

    async def _await_outcome(
        self,
        job_id: bytes,
        job: SubmittedJob,
        executor: NodeId | str | None,
        lease_s: float,
        *,
        lane: bool = False,
        collect: bool = False,
    ) -> None:
        """Wait for the outcome of the job's current assignment until its lease ends, or with `collect`
        (this node just restarted) for as long as its executor may still deliver it (`_collect`)."""
        key = executor_key(executor)
        job.assigned_to = key
        try:
            job.outcome_failed = trio.Event()
            given_back = job.assignment in job.released  # before this wait began (just restarted)
            if given_back:
                lease_s = 0.0
            with trio.move_on_after(math.inf if collect and not given_back else lease_s) as waiting:
                job.waiting = waiting  # job.fail_outcome() and job.finish() cancel it: no task waits
                if job.finished.is_set():
                    waiting.cancel()
                if key is not None:  # sent again if not accepted by then (handoff.py): no task till then
                    self._resends.add(
                        partial(self.handoff.resend_until_accepted, job, key, waiting),
                        still=partial(self.handoff.unaccepted, job, waiting),
                    )
                if collect and not given_back:
                    await self._collect(job, key, lease_s, waiting)
                else:
                    if key is not None and not lane and not given_back:  # behind its promise: replan.py
                        watching = partial(watch, self.ctx, job, key, partial(self._movable, job.manifest))
                        if (at := watch_from(self.ctx, job)) is not None:
                            self._watches.add(at, watching, still=lambda: job.waiting is waiting)
                    await trio.sleep_forever()
        finally:
            job.assigned_to = None
            job.waiting = None
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

    # --- messages, each handled in a task of the submitter's own ---

    def on_answer(self, env: VerifiedEnvelope[Any]) -> None:
        """A bid or decline for one of this node's offers."""
        self.offers.on_answer(env)

    def on_accepted(self, env: VerifiedEnvelope[Accepted]) -> None:
        if (nursery := self._tasks.nursery) is not None:
            nursery.start_soon(self.handoff.take_accepted, env)

    def on_release(self, env: VerifiedEnvelope[Release]) -> None:
        if (nursery := self._tasks.nursery) is not None:
            nursery.start_soon(self.handoff.take_release, env)

    def on_outcome(self, env: Arrived) -> None:
        if (nursery := self._tasks.nursery) is not None and self.outcomes.admit(env):
            nursery.start_soon(self.outcomes.take, env)

    def on_results(self, env: VerifiedEnvelope[Results]) -> None:
        """A carrier of results: taken in one task, each entry on its own (outcomes.py)."""
        if (nursery := self._tasks.nursery) is not None:
            self.outcomes.take_carrier_soon(nursery, env)

    def on_proof(self, env: VerifiedEnvelope[InclusionProof]) -> None:
        if (nursery := self._tasks.nursery) is not None:
            nursery.start_soon(self.proofs.take, env)

    async def handed_off(self, rows: list[JobRow]) -> set[bytes]:
        """The ids of the jobs among `rows` that no longer need this node online (handoff.py)."""
        return await self.handoff.handed_off(rows)


def _unpack(data: bytes) -> Any:
    from e31.protocol.codec import unpack_canonical

    return unpack_canonical(data)
