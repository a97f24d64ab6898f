"""The submitter re-plans a job whose executor fell behind its promise (the rule itself: behind.py).

While a job's driver waits for the outcome of an assignment it made on a bid (Submitter._await_outcome),
`watch` sleeps until that bid's promised finish and its grace have passed (behind.check_at). It then
sends the executor one signed `withdraw` as soon as all of these hold, looking again every CHECK_S
while the deadline leaves room to run the job elsewhere (behind.is_behind):

- the assignment is still the job's current one, no outcome of it is being verified, its lease holds;
- its executor has `accepted` it: the job waits in that executor's queue (one still fetching its blobs
  is left to its lease: moving it would only fetch them again elsewhere);
- another node this submitter could offer the job to is linked: not that executor, nor one that held
  the job before (it keeps its record of the job and does not bid for it again), nor one that said it
  runs no jobs (a `policy` decline: offering.py), nor one whose live capacity advert says it has no
  core free or too little memory for the job (`could_take`). With nobody else to run it, it is better
  left where it is: the executor it leaves does not bid for it again.

An executor that has not started the job gives it back (`release`, reason `withdrawn`): the wait ends
and the job is offered again at once, the executor not held to blame (handoff.py). One that has
started it ignores the withdraw: the wait goes on as before, until the result or the lease's end.

Not re-planned: replica lanes, and an assignment a restarted submitter collects (the promise of its
bid is not kept across a restart).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

import trio
from e31.protocol.envelope import sign_message
from e31.protocol.jobs import JobManifest
from e31.protocol.messages import Withdraw

from .adverts import PeerCapacity
from .behind import check_at, is_behind, last_useful
from .context import MarketContext
from .submitted import SubmittedJob

log = logging.getLogger("e31.submitter")

CHECK_S = 0.5
"""Seconds between looks, once the job is behind, for the hand-off or another node to move it to."""


def could_take(advert: PeerCapacity | None, manifest: JobManifest, now: int) -> bool:
    """Whether a node could take the job, as far as its capacity advert says: no live advert says
    nothing against it; one that offers no core, or less memory than the job may use, rules it out."""
    if advert is None or advert.expires <= now:
        return True
    return advert.cores >= 1 and advert.memory_bytes >= manifest.limits.memory_bytes


async def watch(
    ctx: MarketContext, job: SubmittedJob, executor: bytes, candidates: Callable[[], Iterable[bytes]]
) -> None:
    """Withdraw the job's current assignment from `executor` once it is behind its promise (once).
    `candidates`: the nodes a new round of offers would ask now."""
    env, promise = job.assign_env, job.promise
    if env is None or promise is None:
        return
    deadline, lease = job.manifest.deadline, env.message.lease_expires
    at = check_at(promise, deadline)
    if at is None or at >= lease:  # no room to move it by then, or its lease ends first anyway
        return
    await trio.sleep(max(0.0, (at - ctx.clock()) / 1000))
    while (now := ctx.clock()) <= min(last_useful(promise, deadline), lease - 1):
        if job.assign_env is not env or job.completing or job.finished.is_set():
            return
        others = set(candidates()) - job.rejected - job.forgiven - {executor}
        if job.accepted == env.message_id.raw and others and is_behind(now, promise, deadline):
            late = now - promise.expected_finish
            text = f"no result {late} ms after the finish its executor promised: offered to the network again"
            msg = Withdraw(ctx.network, env.message.job_id, env.message_id, ctx.node, lease, text)
            if await ctx.send_to(executor, sign_message(msg, ctx.identity)):
                log.info(
                    "job %s: %s is behind its promise by %d ms; withdrawn",
                    env.message.job_id.hex()[:12],
                    env.message.executor,
                    late,
                )
                return
            # no link to it now: looked at again, and sent once there is one
        await trio.sleep(CHECK_S)
