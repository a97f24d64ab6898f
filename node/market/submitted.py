"""What the submitter keeps in memory for each job under way, and the reads its parts share.

A `SubmittedJob` lives while the job's driver runs (submitter.Submitter): its open round of answers
(`Round`), its place in the line for the next offer (`Joining`), its current assignment as signed here,
and with replicas one lane (a SubmittedJob of its own) per replica. The submitter, the offer line
(offering.py), the hand-off (handoff.py) and the outcomes (outcomes.py) all read the one `Jobs` table.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio
from e31.protocol.assignments import ASSIGN_KINDS, Assignment, reopen_assignment
from e31.protocol.codec import pack
from e31.protocol.envelope import VerifiedEnvelope, sign_verified
from e31.protocol.errors import ProtocolError
from e31.protocol.ids import Digest, NodeId
from e31.protocol.jobs import JobManifest
from e31.protocol.messages import Accepted, Cancel, Release, Result
from e31.protocol.receipts import UsageReceipt

from ..store.db import Call, Store
from ..store.rows import JobRow
from .behind import Promise
from .context import MarketContext, transition
from .rules import BidView

log = logging.getLogger("e31.submitter")

ROLE = "submitter"
CANCEL_TTL_MS = 3600 * 1000
"""How long a cancel of a job whose deadline has passed stays live (on gossip, and at executors)."""


@dataclass(eq=False)
class Round:
    offer_id: bytes
    opened: float
    bids: dict[bytes, BidView] = field(default_factory=dict)
    answered: set[bytes] = field(default_factory=set)
    raw: dict[bytes, bytes] = field(default_factory=dict)
    """The signed bids by message id (the chosen one is stored with the job)."""
    wake: trio.Event = field(default_factory=trio.Event)
    expected: frozenset[bytes] | None = None
    """The bidders its job waits to hear from (None until it starts to wait)."""

    def heard(self, had_bids: bool) -> None:
        """An answer was taken in: wake the job's wait only if the answer may end it (the round's
        first bid, which shortens the wait to the bid window, or the last answer expected), so a
        job of an offer that N nodes answer wakes once or twice, not N times (rules.window_state)."""
        expected = self.expected
        if expected is None or (self.bids and not had_bids) or expected <= self.answered:
            self.wake.set()


@dataclass(eq=False)
class Joining:
    """A job waiting for the next offer (the OfferLine takes it, signs and sends the offer, opens the
    job's round and sets `done`)."""

    job_id: bytes
    job: SubmittedJob
    expires: int
    """The latest expiry this round of the job allows (market_rules.offer_expiry)."""
    to_offered: Call | None = None
    """The store call moving the job to `offered`, made in the commit that stores the offer (None: the
    job is there already)."""
    done: trio.Event = field(default_factory=trio.Event)
    gossiped: bool = False
    error: Exception | None = None


@dataclass(eq=False)
class SubmittedJob:
    manifest: JobManifest
    round: Round | None = None
    finished: trio.Event = field(default_factory=trio.Event)
    rejected: set[bytes] = field(default_factory=set)
    """Executors whose assignment failed (lease ran out, or their outcome failed verification)."""
    outcome_failed: trio.Event = field(default_factory=trio.Event)
    waiting: trio.CancelScope | None = None
    """The scope of the current wait for an outcome (Submitter._await_outcome), which `fail_outcome`
    and `finish` end: no task per job waits for an event."""
    completing: bool = False
    rounds: int = 0
    round_step: int = 1
    """Rounds of one job's replica lanes interleave (lane i uses i, i + K, ...): no two offers are equal."""
    assigned_to: bytes | None = None
    assign: Assignment | None = None
    """The current assignment as this node signed it (alone or in a set): re-sent until its executor
    accepts it, and an outcome for it needs no store read and no re-verify."""
    accepted: bytes | None = None
    """The assignment (message id) its executor has accepted."""
    promise: Promise | None = None
    """What the bid of the current assignment promised for the job (replan.py watches it)."""
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
    expired_at_executor: str | None = None
    """Its executor gave it back (`release`, reason `deadline`) once its deadline had passed there: why
    (it explains the expiry, and is held against no executor)."""
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    """The driver's scope: a cancel stops the driver through it."""
    lanes: list[SubmittedJob] | None = None
    """With replicas: one lane (a SubmittedJob of its own) per replica, each with its own executor."""
    holder: bytes | None = None
    """A lane's executor, from the moment its bid is chosen (other lanes avoid it)."""
    receipt: VerifiedEnvelope[UsageReceipt] | None = None
    """A lane's verified receipt."""
    outcomes: set[bytes] = field(default_factory=set)
    """The receipts taken in for this job, by signer and SHA-256 of their bytes (outcomes.outcome_key):
    results from that signer carrying one of them again are dropped."""

    def fail_outcome(self) -> None:
        """The current assignment's outcome failed (refused, or the job given back): end the wait."""
        self.outcome_failed.set()
        if self.waiting is not None:
            self.waiting.cancel()

    def finish(self) -> None:
        """The job (or this replica lane) has ended: set `finished` and end its wait for bids or for
        an outcome."""
        self.finished.set()
        if self.round is not None:
            self.round.wake.set()
        if self.waiting is not None:
            self.waiting.cancel()

    @functools.cached_property
    def size(self) -> int:
        """The manifest's encoded size (what it adds to an offer)."""
        return len(pack(self.manifest.to_wire()))

    @property
    def assignment(self) -> bytes | None:
        """The current assignment's id (the message id of the `assign` or `assigns` that carried it)."""
        return None if self.assign is None else self.assign.assignment_id.raw


Jobs = dict[bytes, SubmittedJob]
"""The jobs under way here, by job id."""


def submitted_transition(ctx: MarketContext, job_id: bytes, old: str, new: str, **changes: Any) -> Call:
    """`transition` of one of our submitted jobs (whoever runs it notifies waiters after)."""
    return transition(ROLE, job_id, old, new, ctx.now_s(), **changes)


async def set_submitted_state(
    ctx: MarketContext, notify: Callable[[bytes], None], job_id: bytes, old: str, new: str, **changes: Any
) -> bool:
    """Move one of our submitted jobs from `old` to `new` (compare-and-set), then wake its waiters."""
    method, args, kwargs = submitted_transition(ctx, job_id, old, new, **changes)
    ok: bool = await ctx.store.run(method, *args, **kwargs)
    notify(job_id)
    return ok


def holders(jobs: Jobs, job_id: bytes) -> list[SubmittedJob]:
    """What runs a job under way here: the job itself, or with replicas its lanes (none if ended)."""
    job = jobs.get(job_id)
    return [] if job is None else [job] if job.lanes is None else job.lanes


def in_round(jobs: Jobs, job_id: bytes, offer_id: bytes) -> SubmittedJob | None:
    """The job (or replica lane) whose round is open with that offer, if any."""
    lanes = holders(jobs, job_id)
    return next((h for h in lanes if h.round is not None and h.round.offer_id == offer_id), None)


async def names_our_assignment(ctx: MarketContext, jobs: Jobs, msg: Accepted | Release | Result) -> bool:
    """Whether an executor's message names an assignment this node made, of that job, to it."""
    assign = next(
        (
            h.assign  # one in flight, as signed here
            for h in holders(jobs, msg.job_id.raw)
            if h.assign is not None and h.assign.assignment_id == msg.assignment_id
        ),
        None,
    )
    if assign is None:
        stored = await ctx.store.run(Store.envelope, msg.assignment_id.raw)
        if stored is None or stored.kind not in ASSIGN_KINDS:
            return False
        assign = reopen_assignment(stored.raw, msg.job_id)
    if assign is None or assign.executor != msg.executor:
        log.info("ignoring a %s from %s that does not match its assignment", msg.KIND, msg.executor)
        return False
    return True


async def stored_assignments(ctx: MarketContext, job_id: bytes) -> list[Assignment]:
    """The job's assignments this node stored (made here, alone or in sets), oldest first."""
    rows = await ctx.store.run(Store.assignments_for_job, job_id)
    found = (reopen_assignment(r.raw, job_id) for r in rows)
    return sorted((a for a in found if a is not None), key=lambda a: a.attempt)


async def signed_cancel(
    ctx: MarketContext, job_id: bytes, deadline_ms: int, reason: str, text: str = ""
) -> VerifiedEnvelope[Cancel]:
    """Sign a `cancel` of one of our jobs and keep it with the job (a later result of a withdrawn
    assignment is answered with it again: outcomes.py)."""
    expires = max(deadline_ms, ctx.clock() + CANCEL_TTL_MS)
    env = sign_verified(Cancel(ctx.network, Digest(job_id), ctx.node, expires, reason, text), ctx.identity)
    await ctx.store.run(Store.put_envelope, env.message_id.raw, env.kind, env.raw, ctx.now_s(), job_id)
    return env


async def cancel_at(ctx: MarketContext, job_id: bytes, deadline_ms: int, executor: bytes) -> None:
    """Tell an executor that an ended job it was sent is not to run: the job's stored cancel (that of
    `e31 cancel`), or a new one, reason `done` (a job that ended while its assignment set was being
    stored went out in the set: assigning.py)."""
    stored = await ctx.store.run(Store.envelopes_for_job, job_id, "cancel")
    if stored:
        raw = stored[-1].raw
    else:
        raw = (
            await signed_cancel(ctx, job_id, deadline_ms, "done", "the job ended before it was assigned")
        ).raw
    await ctx.send_to(executor, raw)


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


def stored_row(fields: dict[str, Any]) -> JobRow:
    """The row Store.add_job stores for a new job from `fields` (new_job's)."""
    f = fields
    return JobRow(
        job_id=f["job_id"], role=ROLE, manifest=f["manifest"], state=f["state"], submitter=f["submitter"],
        executor=None, attempt=0, created=f["created"], deadline=f["deadline"], updated=f["created"],
        started=None, finished=None, fuel_limit=f["fuel_limit"], fuel_used=None, reason=None,
    )  # fmt: skip


def executor_key(executor: NodeId | str | None) -> bytes | None:
    if executor is None:
        return None
    if isinstance(executor, NodeId):
        return executor.raw
    try:
        return NodeId.parse(executor).raw
    except ProtocolError:
        return None
