"""The executor's side of the market: run assigned jobs, deliver signed outcomes.

- An offer (from gossip, or from this node's own submitter) gets a signed `bid` or `decline`
  (bidding.py); the bid is kept until it lapses, so an `assign` naming it can be matched to the exact
  manifest.
- An `assign` for one of our bids, signed by the job's submitter and inside its lease, becomes an
  executor job row (`fetching`): the module, inputs and stdin are fetched from the submitter by
  hash (transfer.py), then the job waits in the scheduler's queue (`queued`), runs (`running`),
  and ends `done` with a signed `receipt`, or `failed` when it could not be run.
- Delivery: the receipt goes to the submitter in a `results` carrier until its `ack` comes, then the
  receipt is logged and proved (delivery.py).

The job's seed (WASI random_get) is its 32-byte job id, so a re-run anywhere reproduces the run.
The run's outputs are checked and stored as blobs (outputs.py). The run's directory is created only by
a run that needs it (a long stream or files in /output): a tiny job creates no file or directory before
its outputs are stored as blobs.

Restarts: jobs `fetching`, `queued` or `running` at a stop are resumed with the same assignment while
its lease holds (a running one is run again from the start: the same outcome and fuel, one receipt),
unless that attempt's receipt was already signed (then the job is only marked done and delivered);
a job whose lease ran out is given back. While the node is suspended for its owner, the jobs that
could no longer meet their deadline are stopped and given back (held.py; a `release`, reason
`deadline`).

Withdrawal: a `cancel` from a job's submitter (`e31 cancel`, or the job is done with another attempt's
result) stops the job here unless its run is over, and ends it `cancelled` with no result or release;
an assignment of it being stored or fetched meanwhile is never started (held.py remembers it). A job
whose run was over keeps its receipt and stops delivering it. A `withdraw` takes one assignment back:
a job held under it with no worker yet is given back (`release`, reason `withdrawn`: taken_back.py).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any, cast

import trio
from e31.protocol.assignments import Assignment, assignments, reopen_assignment
from e31.protocol.blobs import BlobRef
from e31.protocol.codec import pack, unpack_canonical
from e31.protocol.envelope import VerifiedEnvelope, reopen_stored, sign_message
from e31.protocol.errors import InvalidMessage
from e31.protocol.ids import NodeId
from e31.protocol.jobs import JobManifest
from e31.protocol.messages import Accepted, Assign, AssignSet, Cancel, Offer, ProofRequest, Release, Withdraw
from e31.protocol.receipts import Ack, UsageReceipt
from e31.protocol.results import outputs_of
from e31.sandbox.errors import SandboxError
from e31.sandbox.job import JobSpec
from e31.sandbox.limits import Limits as SandboxLimits
from e31.sandbox.limits import RunResult

from ..errors import StoreError
from ..nursery import TaskSlot
from ..store.blobs import BlobCorrupt, BlobError
from ..store.db import Store, call
from . import meter
from .bidding import BidCapacity, Bids, Promise, clip
from .context import MarketContext, transition
from .delivery import Delivery, OnAcked, Prover, retention_ms
from .held import Held, HeldJobs
from .inputs import blob_refs, inputs_unchanged
from .later import Later, Pending
from .module_bytes import ModuleBytes
from .outputs import JobFailed, StoredOutputs, store_outputs
from .policy import Task
from .scheduler import JobExpired, JobInfo, JobLate, Scheduler
from .taken_back import WITHDRAWN_TEXT, give_back_withdrawn, take_back
from .transfer import BlobTransfer, FetchError
from .trash import Trash

log = logging.getLogger("e31.executor")

ROLE = "executor"
RUNNING_MARK_DELAY = 0.1
"""Seconds after a run starts before the job is recorded `running`; a run that ends sooner (a tiny job) is
recorded once, from queued to done, saving a store write. `e31 jobs` shows a job queued that long."""
ACCEPT_DELAY = 0.5
"""Seconds between queueing a job and telling its submitter (`accepted`), skipped when the job ends first.
Well under the submitter's first re-send of an unaccepted assignment (MarketSettings.delivery_interval,
2 s), so the wait costs no extra message; a tiny job's result arrives instead."""
STORE_IN_SLOT_MAX = 1 << 20
"""A run's outputs up to this size in all are stored in the thread that waited for it, while its worker
is still reserved (a millisecond or so); larger ones in a hop of their own once the worker is free."""
LEASE_LOST_TEXT = "the node stopped while holding the job and its lease ran out"
GIVE_BACK_TEXT = "the machine's owner needs it back and the job would miss its deadline here"
EXPIRED_TEXT = "its deadline passed before it could start here: it was never started"
LATE_TEXT = "it was still running here at its deadline: it was stopped"


class Executor:
    def __init__(
        self,
        ctx: MarketContext,
        *,
        transfer: BlobTransfer,
        scheduler: Scheduler,
        held: HeldJobs,
        runs_dir: Path,
        profile: bytes,
        memory_bytes: int,
        capacity: BidCapacity | None = None,
        on_acked: OnAcked | None = None,
        prover: Prover | None = None,
    ) -> None:
        self.ctx = ctx
        self.transfer = transfer
        self.scheduler = scheduler
        self.runs_dir = runs_dir
        self.bids = Bids(
            ctx,
            scheduler=scheduler,
            profile=profile,
            memory_bytes=memory_bytes,
            capacity=capacity,
            held_tasks=self._held_tasks,
            fetch_rate=transfer.rate,
        )
        self._trash = Trash()
        """Run directories moved aside, deleted at the delivery loop's next turn (trash.py)."""
        self.modules = ModuleBytes(ctx.blobs)
        self.delivery = Delivery(
            ctx,
            on_acked=on_acked,
            prover=prover,
            tidy=self._trash.tidy,
            busy=lambda ids: bool(self._active - ids),
        )
        self._active: set[bytes] = set()
        self._held = held
        self._tasks = TaskSlot()
        self._accepts, self._marks = Later(ACCEPT_DELAY), Later(RUNNING_MARK_DELAY)
        """A job's `accepted` and its `running` mark, each made a moment after it began if it is still
        going then (later.py): a tiny job, over by then, costs neither a task nor a timer."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with self._tasks.open() as nursery:
            await nursery.start(self.scheduler.run)
            nursery.start_soon(self._accepts.run, nursery)
            nursery.start_soon(self._marks.run, nursery)
            for row in await self.ctx.store.run(
                Store.jobs, role=ROLE, states=("fetching", "queued", "running")
            ):
                nursery.start_soon(self._resume, row.job_id)
            await nursery.start(self.delivery.run)
            task_status.started()

    def on_link_up(self, peer: bytes) -> None:
        self.delivery.link_up(peer)

    # --- offers ---

    def on_offer(self, env: VerifiedEnvelope[Offer]) -> None:
        nursery = self._tasks.nursery
        if nursery is not None and self.bids.first_hearing(env):
            nursery.start_soon(self.bids.answer, env)

    # --- assignments ---

    def on_assign(self, env: VerifiedEnvelope[Assign] | VerifiedEnvelope[AssignSet]) -> None:
        """An `assign`, or an `assigns` set of several jobs of one bid: taken in one task."""
        if (nursery := self._tasks.nursery) is not None:
            nursery.start_soon(self._on_assign, env)

    async def _on_assign(self, env: VerifiedEnvelope[Assign] | VerifiedEnvelope[AssignSet]) -> None:
        """Take the jobs an assignment (or a set) gives this node under a live bid of its own: stored
        in one commit (the envelope once, each job's row), then each run in a task of its own. A job
        whose bid lapsed, whose lease ran out, or that this node does not hold is answered on its own
        (`_redeliver`)."""
        given = assignments(env)
        if given[0].executor != self.ctx.node:
            return
        promise = self.bids.live(given[0].bid_id.raw)
        taking: list[tuple[Assignment, JobManifest]] = []
        answer: list[Assignment] = []
        now_ms = self.ctx.clock()
        for a in given:  # (no await until the jobs taken are stored)
            job_id = a.job_id.raw
            if self._held.was_withdrawn(job_id, a.submitter.raw):
                continue
            manifest = None if promise is None else promise.jobs.get(job_id)
            if manifest is None or a.lease_expires <= now_ms:  # never started now; asked again, it is
                answer.append(a)  # answered (after the jobs taken are stored and started)
            elif a.submitter != manifest.submitter:
                log.info("ignoring an assignment that does not match our bid")
            else:
                taking.append((a, manifest))
        runs = await self._take(env, promise, taking) if taking and promise is not None else []
        if runs and (nursery := self._tasks.nursery) is not None:
            for run in runs[1:]:
                nursery.start_soon(run)
        for a in answer:
            await self._redeliver(a)
        if runs and self._tasks.nursery is not None:
            await runs[0]()  # (the first in this task)

    async def _take(
        self,
        env: VerifiedEnvelope[Assign] | VerifiedEnvelope[AssignSet],
        promise: Promise,
        taking: list[tuple[Assignment, JobManifest]],
    ) -> list[Callable[[], Awaitable[None]]]:
        """Store the jobs of an assignment (or set) taken under our live bid `promise` in one commit
        (the envelope once); returns the runs of those new here, to start."""
        now = self.ctx.now_s()
        offer = promise.offer
        job_ids = [a.job_id.raw for a, _ in taking]
        kept = (
            call(Store.put_envelope, env.message_id.raw, env.kind, env.raw, now, job_ids[0])
            if isinstance(env.message, Assign)
            else call(Store.put_shared_envelope, env.message_id.raw, env.kind, env.raw, now, job_ids)
        )
        # a job whose blobs are all here already (a sweep's module) is queued at once: no fetch to wait for
        # (each blob looked at once for the set: a sweep's jobs share their module)
        roots = {ref.root.raw for _, m in taking for ref in blob_refs(m)}
        held = {root: self.ctx.blobs.has(root) for root in roots}
        fetched = [all(held[ref.root.raw] for ref in blob_refs(m)) for _, m in taking]
        _, _, *added = await self.ctx.store.atomically(
            kept,
            call(Store.put_shared_envelope, offer.message_id.raw, "offer", offer.raw, now, job_ids),
            *(
                call(
                    Store.add_job,
                    job_id=a.job_id.raw,
                    role=ROLE,
                    manifest=pack(manifest.to_wire()),
                    state="queued" if here else "fetching",
                    submitter=str(manifest.submitter),
                    created=now,
                    deadline=manifest.deadline / 1000,
                    fuel_limit=manifest.limits.fuel,
                    executor=str(self.ctx.node),
                    attempt=a.attempt,
                    durable=False,
                )
                for (a, manifest), here in zip(taking, fetched, strict=True)
            ),
            # Not synced: nothing is promised yet. A power cut may take the jobs back; their submitter
            # sends the assignment again and hears `release` (unknown). The promise is `accepted`, made
            # after a sync (_accepted), or the result, whose commit is synced.
            durable=False,
        )
        runs: list[Callable[[], Awaitable[None]]] = []
        for (a, manifest), here, new in zip(taking, fetched, added, strict=True):
            if not new:
                self.delivery.now()  # a repeated assignment: make sure the outcome goes out again
                continue
            self.bids.assigned(a.bid_id.raw, promise, a.job_id.raw)
            runs.append(partial(self._execute, a.job_id.raw, manifest, a, fetched=here))
        return runs

    async def _redeliver(self, assign: Assignment) -> None:
        """An assignment sent again, with no live bid of ours behind it. Held here: its submitter is
        back and asks for the outcome, so `accepted` goes again for a job queued or running, unacknowledged
        receipts are delivered now (not at the next retry), and a job that failed here is released
        again (the first release may not have reached it). Not held (this node restarted between its bid
        and storing the assignment, or the bid had lapsed): released at once, so the submitter need not
        wait out the lease. A lease that ran out changes none of this: a submitter back from a stop
        asks what became of its assignments before it reassigns them (submitter._collect)."""
        job = await self.ctx.store.run(Store.job, assign.job_id.raw, ROLE)
        if job is None or job.attempt != assign.attempt:
            log.info("releasing an assignment of job %s this node does not hold", assign.job_id.hex()[:12])
            await self._release(assign, "unknown", "this node holds no bid or job for that assignment")
            return
        if job.state == "failed" or job.reason == WITHDRAWN_TEXT:  # (the first release may have been lost)
            await self._release(assign, _release_reason(job.reason), job.reason or "it failed here")
            return
        held = self._held.get(assign.job_id.raw)
        if job.state in ("queued", "running") and held is not None:
            await self._accepted(assign, held)  # its submitter may have missed the first
        now = self.ctx.now_s()
        for row in await self.ctx.store.run(Store.receipts_for_job, assign.job_id.raw):
            if row.delivered is None:
                await self.ctx.store.run(Store.receipt_delivery_failed, row.digest, now)
        self.delivery.now()

    async def _resume(self, job_id: bytes) -> None:
        """Finish a job that was interrupted by a restart, if its lease still holds."""
        row = await self.ctx.store.run(Store.job, job_id, ROLE)
        env = await self._own_assign(job_id)
        if row is None or env is None:
            return
        if await self._signed_before_stop(job_id, env.attempt):
            return
        manifest = JobManifest.from_wire(unpack_canonical(row.manifest))
        if env.lease_expires <= self.ctx.clock():
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
        self.delivery.now()
        return True

    async def _execute(
        self, job_id: bytes, manifest: JobManifest, assign: Assignment, *, fetched: bool = False
    ) -> None:
        if job_id in self._active:
            return
        submitter = manifest.submitter.raw
        if self._held.was_withdrawn(job_id, submitter):  # while its assignment was being stored
            await self._end_withdrawn(job_id, submitter)
            return
        self._active.add(job_id)
        work = self.runs_dir / job_id.hex()
        lim = manifest.limits
        estimate = self.scheduler.estimate_ms(
            manifest.profile.raw, lim.fuel, lim.wall_ms, manifest.module.root.raw
        )
        held = self._held.hold(
            job_id,
            Held(trio.CancelScope(), manifest.deadline, estimate, submitter=submitter, fuel=lim.fuel),
            assign.assignment_id.raw,
        )
        try:
            with held.scope:
                await self._run(job_id, manifest, assign, work, held, fetched)
            if held.withdrawn:
                await self._end_withdrawn(job_id, submitter)
            elif held.moved:
                await give_back_withdrawn(self.ctx, job_id, assign)
            elif held.handed_back:
                row = await self.ctx.store.run(Store.job, job_id, ROLE)
                await self._fail(job_id, row.state if row else "queued", GIVE_BACK_TEXT, reason="deadline")
        except StoreError as e:  # (a full disk): this job stops here, the node and its other jobs go on
            await self._give_back_unstored(job_id, assign, held, e)
        finally:
            self._active.discard(job_id)
            self._held.pop(job_id, None)
            self._trash.discard(work)

    async def _give_back_unstored(
        self, job_id: bytes, assign: Assignment, held: Held, error: StoreError
    ) -> None:
        """A job whose state could not be stored (a full disk): one whose run had not ended is given back
        at once (`release`, reason `other`: a fault of this node, not of the job; recorded `failed` if
        the store takes it), so its submitter offers it again now instead of waiting out the lease. An
        ended run's outcome is kept."""
        why = f"its state cannot be stored here: {error}"
        log.warning("job %s: %s", job_id.hex()[:12], why)
        if not (held.ran or held.ending or held.withdrawn):
            held.ending = True  # no `accepted` after the release
            with contextlib.suppress(StoreError):
                await self.ctx.store.run(
                    Store.update_job, job_id, ROLE, self.ctx.now_s(), state="failed", reason=why[:500]
                )
            await self._release(assign, "other", why)

    def _held_tasks(self) -> list[Task]:
        """The jobs held here that have not started, as the policy sees them (for bids: held.py)."""
        return self._held.waiting(self.scheduler.promised(), self.ctx.clock())

    async def give_back_late(self) -> int:
        """Hand back every job held here that would now miss its deadline (held.py)."""
        return await self._held.give_back_late()

    async def _run(
        self,
        job_id: bytes,
        manifest: JobManifest,
        assign: Assignment,
        work: Path,
        held: Held,
        fetched: bool,
    ) -> None:
        try:
            fetch_ms = 0  # the meter: time spent fetching, never billed
            if not fetched:  # (stored as queued when every blob was here already)
                began = self.ctx.clock()
                await self._fetch_inputs(manifest)
                fetch_ms = self.ctx.clock() - began
                await self._set_state(job_id, "fetching", "queued")
            self._accepts.add(
                partial(self._accepted, assign, held), still=partial(self._still_held, job_id, held)
            )
            estimate = held.estimate_ms

            marked = trio.Event()
            marking: list[Pending] = []

            def started(at: int) -> None:
                held.started = True
                marking.append(self._marks.add(partial(self._mark_running, job_id, at, held, marked)))

            blobs = self.ctx.blobs

            def then(result: RunResult) -> StoredOutputs | None:
                held.ran = True  # the run is over: giving the job back now would waste it
                inputs_unchanged(blobs, manifest)
                if result.stdout_bytes + result.stderr_bytes + result.output_bytes > STORE_IN_SLOT_MAX:
                    return None  # stored below, once the worker is free for the next job
                return store_outputs(blobs, work, result)

            for attempt in (1, 2):
                try:
                    record = (
                        await self.scheduler.execute(  # the spec is read, small outputs stored in its threads
                            partial(self._prepare, manifest, work),
                            work / "output",
                            estimate_ms=estimate,
                            job=JobInfo.of(manifest),
                            on_start=started,
                            streams_dir=work / "streams",
                            then=then,
                        )
                    )
                    break
                except BlobCorrupt as e:  # quarantined by the check: the submitter has the bytes
                    if attempt == 2 or manifest.submitter.raw == self.ctx.node.raw:
                        raise
                    log.warning("job %s: %s; fetching it again", job_id.hex()[:12], e)
                    began = self.ctx.clock()
                    await self._fetch_inputs(manifest)
                    fetch_ms += self.ctx.clock() - began
            held.ran = True
            if [p for p in marking if not p.withdraw()]:  # else not marked running: queued to done
                await marked.wait()  # a `running` being written is in the store before `done` can be
            else:
                await trio.lowlevel.checkpoint_if_cancelled()
            stored = cast("StoredOutputs | None", record.after)
            if stored is None:
                stored = await trio.to_thread.run_sync(store_outputs, blobs, work, record.result)
            receipt = meter.receipt(
                network=self.ctx.network,
                executor=self.ctx.node,
                identity=self.ctx.identity,
                manifest=manifest,
                assign=assign,
                record=record,
                fetch_ms=fetch_ms,
                stdout=stored.stdout,
                stderr=stored.stderr,
                outputs=stored.outputs,
            )
        except (JobExpired, JobLate) as e:  # no receipt: the meter records nothing for it
            held.ending = True
            row = await self.ctx.store.run(Store.job, job_id, ROLE)
            why = EXPIRED_TEXT if isinstance(e, JobExpired) else LATE_TEXT
            log.info("job %s given back: %s", job_id.hex()[:12], why)
            await self._fail(job_id, row.state if row else "queued", why, reason="deadline")
            return
        except (JobFailed, FetchError, SandboxError, BlobError, OSError, InvalidMessage) as e:
            held.ending = True
            row = await self.ctx.store.run(Store.job, job_id, ROLE)
            await self._fail(job_id, row.state if row else "fetching", str(e))
            return
        held.ending = True
        await self._finish(
            job_id, manifest, assign, receipt, stored.small, state="running" if held.running else "queued"
        )

    def _still_held(self, job_id: bytes, held: Held) -> bool:
        """Whether the job is held here and not ending (once not, never again): an `accepted` for it,
        asked for ACCEPT_DELAY after it was queued, is still to be sent. So a short job costs no
        `accepted` at all (its result tells the submitter more), and none comes after the job's end."""
        return self._held.get(job_id) is held and not (held.handed_back or held.ending)

    async def _accepted(self, assign: Assignment, held: Held) -> None:
        """Tell the submitter this node holds the job's data and has queued it: the hand-off, a promise
        made only once the job's rows are on disk (they are stored without a sync), and only while the
        job is still held and not ending, checked again after that sync: an `accepted` never follows
        the job's result or release (their sends begin after `ending` is set)."""

        job_id = assign.job_id.raw
        if not self._still_held(job_id, held):
            return
        await self.ctx.store.flush()
        if self._still_held(job_id, held):  # no await between this check and the send's turn on the link
            msg = Accepted(self.ctx.network, assign.job_id, assign.assignment_id, self.ctx.node)
            await self.ctx.send_to(assign.submitter.raw, sign_message(msg, self.ctx.identity))

    async def _fetch_inputs(self, manifest: JobManifest) -> None:
        peer = manifest.submitter.raw
        for ref in blob_refs(manifest):
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
                module=self.modules.read(manifest.module.root.raw),  # one read and hash per module
                args=manifest.args,
                env=tuple((e.name, e.value) for e in manifest.env),
                stdin=None if manifest.stdin is None else blobs.checked_path(manifest.stdin.root.raw),
                inputs={f.name: blobs.checked_path(f.blob.root.raw) for f in manifest.inputs},
                limits=limits,
                seed=manifest.job_id.raw,
            )
        except SandboxError as e:
            raise JobFailed(f"the sandbox refuses the job: {e}") from None

    async def _mark_running(self, job_id: bytes, at: int, held: Held, marked: trio.Event) -> None:
        """Record that the job runs, RUNNING_MARK_DELAY after it started (`_marks`), unless its run has
        ended by then (withdrawn): a tiny job goes from queued to done in one write."""
        try:
            await self._set_state(job_id, "queued", "running", started=at / 1000)
            held.running = True
        finally:
            marked.set()

    async def _finish(
        self,
        job_id: bytes,
        manifest: JobManifest,
        assign: Assignment,
        receipt: VerifiedEnvelope[UsageReceipt],
        small: tuple[tuple[BlobRef, bytes], ...],
        *,
        state: str,
    ) -> None:
        """Keep the outcome and deliver it (delivery.finish: with those of jobs ending close by, in one
        commit and one `results` carrier, each receipt signed alone, with the small outputs). `state` is
        the job's state until then: running, or queued for a run too short to be marked."""
        now = self.ctx.now_s()
        available = self.ctx.clock() + retention_ms(self.ctx.settings, manifest)
        job_hex = job_id.hex()
        owner = f"result:{job_hex}"
        msg = receipt.message
        receipt_id = receipt.message_id.raw
        outcome = (  # kept whole or not at all, in one commit with those of jobs ending with it
            call(Store.put_envelope, receipt_id, "receipt", receipt.raw, now, job_id),
            *(call(Store.put_small_blob, ref.root.hex(), data) for ref, data in small),
            *(call(Store.ref_blob, ref.root.hex(), owner, available / 1000) for ref in outputs_of(msg)),
            call(
                Store.put_result,
                job_id=job_id,
                attempt=assign.attempt,
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
                attempt=assign.attempt,
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
        await self.delivery.finish(outcome, receipt, available, small)
        log.debug(  # per job: nothing at the default level
            "job %s ran: %s, %d fuel, %d ms compute, %d ms queued",
            job_hex[:12],
            msg.outcome.status,
            msg.fuel_used,
            msg.compute_ms,
            msg.waited_ms,
        )

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

    async def _own_assign(self, job_id: bytes) -> Assignment | None:
        """This node's latest assignment of the job (a node that is also the submitter stores every
        assignment of its own jobs, those of other executors included)."""
        rows = await self.ctx.store.run(Store.assignments_for_job, job_id)
        stored = (reopen_assignment(r.raw, job_id) for r in rows)
        mine = [a for a in stored if a is not None and a.executor == self.ctx.node]
        return max(mine, key=lambda a: a.attempt) if mine else None

    async def _release(self, assign: Assignment, reason: str, why: str) -> None:
        msg = Release(self.ctx.network, assign.job_id, assign.assignment_id, self.ctx.node, reason, clip(why))
        await self.ctx.send_to(assign.submitter.raw, sign_message(msg, self.ctx.identity))

    async def _set_state(self, job_id: bytes, old: str, new: str, **changes: Any) -> None:
        method, args, kwargs = transition(ROLE, job_id, old, new, self.ctx.now_s(), **changes)
        await self.ctx.store.run(method, *args, **kwargs)

    def on_ack(self, env: VerifiedEnvelope[Ack]) -> None:
        if (nursery := self._tasks.nursery) is not None:
            nursery.start_soon(self.delivery.take_ack, env)

    # --- cancel ---

    def on_cancel(self, env: VerifiedEnvelope[Cancel]) -> None:
        if (nursery := self._tasks.nursery) is not None:
            nursery.start_soon(self._on_cancel, env)

    async def _on_cancel(self, env: VerifiedEnvelope[Cancel]) -> None:
        """The submitter withdrew a job (`e31 cancel`, or it is done with another attempt's result):
        a job held here is stopped unless its run is over (held.py), and ended by its own task; one
        not held is ended here."""
        msg = env.message
        job_id, submitter = msg.job_id.raw, msg.submitter.raw
        if self._held.withdraw(job_id, submitter) is None:
            await self._end_withdrawn(job_id, submitter)

    async def _end_withdrawn(self, job_id: bytes, submitter: bytes) -> None:
        """End a withdrawn job here: `cancelled` if it had not finished, with no result or release; if
        it had (its result may have gone already), its receipt is not delivered again (its submitter
        does not take it: docs/protocol.md, `cancel`)."""
        for _ in range(3):  # a run may move the state on meanwhile
            row = await self.ctx.store.run(Store.job, job_id, ROLE)
            if row is None or row.submitter != str(NodeId(submitter)) or row.state in ("failed", "cancelled"):
                return
            if row.state == "done":
                await self.delivery.withdrawn(job_id)
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

    def on_withdraw(self, env: VerifiedEnvelope[Withdraw]) -> None:
        """One assignment taken back: a job held under it with no worker yet is stopped (taken_back.py)."""
        take_back(self._held, env, self.ctx.clock(), lambda key: not self.scheduler.hold_back(key))

    def on_proof_request(self, peer: bytes, env: VerifiedEnvelope[ProofRequest]) -> None:
        msg = env.message
        if (
            msg.executor == self.ctx.node
            and msg.expires > self.ctx.clock()
            and self._tasks.nursery is not None
        ):
            self.delivery.prove(peer, msg.receipt_id.raw, None)


def _release_reason(why: str | None) -> str:
    """The release reason of a job that failed here, from the reason recorded when it did."""
    late = dict.fromkeys((GIVE_BACK_TEXT, EXPIRED_TEXT, LATE_TEXT), "deadline")
    return {**late, LEASE_LOST_TEXT: "lease", WITHDRAWN_TEXT: "withdrawn"}.get(why or "", "failed")
