"""The hand-off: from an executor's `accepted` on, a job no longer needs its submitter online.

The assigned executor's `accepted` (it holds every blob and has queued the job) is stored with the job.
An executor leaves it out for a job whose outcome goes within moments (half a second for the reference
executor): the job is then done instead. Until it comes, the assignment is sent again, backing off. A
node that comes back re-sends its assignments to the executors it can reach again (`pull`), so each
delivers its outcome at once instead of at its next backed-off retry, leases that ran out meanwhile
included: it collects what they finished before it reassigns anything (submitter._collect). An
executor can also give an assignment back (`release`): the job is offered again at once.
Reassigning a job whose executor vanished needs this node online.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio
from e31.protocol.envelope import VerifiedEnvelope
from e31.protocol.ids import NodeId
from e31.protocol.messages import Accepted, Release

from ..store.db import Store
from ..store.rows import JobRow
from .context import MarketContext
from .submitted import ROLE, Jobs, SubmittedJob, holders, names_our_assignment, stored_assigns

log = logging.getLogger("e31.submitter")

RETRYABLE_RELEASES = frozenset({"unknown", "lease", "other", "withdrawn"})
"""Release reasons that say nothing against the job or the executor (`other`: a fault of the node, such
as a full disk; `withdrawn`: this node took the assignment back, replan.py): it may bid for the job
again (once)."""


class HandOff:
    def __init__(self, ctx: MarketContext, jobs: Jobs, *, notify: Callable[[bytes], None]) -> None:
        self.ctx = ctx
        self.jobs = jobs
        self.notify = notify

    async def take_accepted(self, env: VerifiedEnvelope[Accepted]) -> None:
        msg = env.message
        if not await names_our_assignment(self.ctx, self.jobs, msg):
            return
        await self.ctx.store.run(
            Store.put_envelope, env.message_id.raw, env.kind, env.raw, self.ctx.now_s(), msg.job_id.raw
        )
        log.debug("job %s handed off to %s", msg.job_id.hex()[:12], msg.executor)
        for holder in holders(self.jobs, msg.job_id.raw):
            if holder.assignment == msg.assignment_id.raw:
                holder.accepted = holder.assignment
        self.notify(msg.job_id.raw)

    async def handed_off(self, rows: list[JobRow]) -> set[bytes]:
        """The ids of the jobs among `rows` that no longer need this node online until their result
        comes back: verified, or accepted by their current executor for the current assignment."""
        from ..store.handoff import handed_off

        if not any(r.state == "assigned" for r in rows):  # nothing to look up: no thread hop
            return {r.job_id for r in rows if r.state == "done"}
        return await self.ctx.store.run(handed_off, rows)

    async def pull(self, peer: bytes) -> None:
        """Re-send `peer` the assignments of jobs still waiting on it, so it delivers their outcomes now
        (the pull of a submitter that was away), or says it does not hold them (a `release`), also
        those whose lease ran out meanwhile (submitter._collect)."""
        executor = str(NodeId(peer))
        rows = await self.ctx.store.run(Store.jobs, role=ROLE, states=("assigned",))
        for row in rows:
            if row.executor != executor:
                continue
            current = [
                a for a in await stored_assigns(self.ctx, row.job_id) if a.message.attempt == row.attempt
            ]
            for a in current:  # (its lease may have run out while this node was away: asked all the same)
                await self.ctx.send_to(peer, a.raw)

    async def take_release(self, env: VerifiedEnvelope[Release]) -> None:
        """An executor gives an assignment back: if it is one of ours, to that executor, and still the
        job's current one, the job is offered again now (without that executor, unless the reason
        says nothing against it)."""
        msg = env.message
        if not await names_our_assignment(self.ctx, self.jobs, msg):
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
        if msg.reason == "deadline" and job.manifest.deadline <= self.ctx.clock():
            job.expired_at_executor = msg.text or msg.reason  # the job expires now (submitter._rounds)
        elif msg.reason not in RETRYABLE_RELEASES:
            job.refusal = msg.text or msg.reason
        if job.assignment == msg.assignment_id.raw and job.assigned_to == msg.executor.raw:
            job.fail_outcome()

    async def resend_until_accepted(self, job: SubmittedJob, executor: bytes) -> None:
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
