"""The submitter re-plans a job whose executor fell behind its promise (the rule itself: behind.py).

While a job's driver waits for the outcome of an assignment it made on a bid (Submitter._await_outcome),
`watch` sleeps until that bid's promised finish and its grace have passed (behind.check_at). If the
assignment is then still the job's current one, with no outcome being verified, its lease holding and
room left before the deadline to run the job elsewhere, it sends the executor one signed `withdraw`.
An executor that has not started the job gives it back (`release`, reason `withdrawn`): the wait ends
and the job is offered again at once, the executor not held to blame (handoff.py). One that has
started it ignores the withdraw: the wait goes on as before, until the result or the lease's end.

Not re-planned: replica lanes, and an assignment a restarted submitter collects (the promise of its
bid is not kept across a restart).
"""

from __future__ import annotations

import logging

import trio
from e31.protocol.envelope import sign_message
from e31.protocol.messages import Withdraw

from .behind import check_at, is_behind
from .context import MarketContext
from .submitted import SubmittedJob

log = logging.getLogger("e31.submitter")


async def watch(ctx: MarketContext, job: SubmittedJob, executor: bytes) -> None:
    """Withdraw the job's current assignment from `executor` once it is behind its promise (once)."""
    env, promise = job.assign_env, job.promise
    if env is None or promise is None:
        return
    deadline, lease = job.manifest.deadline, env.message.lease_expires
    at = check_at(promise, deadline)
    if at is None or at >= lease:  # no room to move it by then, or its lease ends first anyway
        return
    await trio.sleep(max(0.0, (at - ctx.clock()) / 1000))
    now = ctx.clock()
    if job.assign_env is not env or job.completing or job.finished.is_set() or now >= lease:
        return
    if not is_behind(now, promise, deadline):
        return
    late = now - promise.expected_finish
    text = f"no result {late} ms after the finish its executor promised: offered to the network again"
    log.info(
        "job %s: %s is behind its promise by %d ms; withdrawing it",
        env.message.job_id.hex()[:12],
        env.message.executor,
        late,
    )
    msg = Withdraw(ctx.network, env.message.job_id, env.message_id, ctx.node, lease, text)
    await ctx.send_to(executor, sign_message(msg, ctx.identity))
