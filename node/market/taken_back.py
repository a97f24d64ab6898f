"""Assignments their submitter takes back (`withdraw`), on the executor's side.

A submitter withdraws an assignment when its executor fell behind its promise (docs/scheduling.md,
"Re-planning"). The executor stops a job held under that assignment only if it has no worker yet
(held.py, `take_back`: checked and stopped with no await between, so a started job is never given
up), then ends it `cancelled` with WITHDRAWN_TEXT (durable: a copy of the assignment after a restart
is answered the same way) and gives it back with a `release`, reason `withdrawn`. A started job, an
unknown or older assignment, or an expired withdraw: ignored, nothing sent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from e31.protocol.envelope import VerifiedEnvelope, sign_message
from e31.protocol.messages import Assign, Release, Withdraw

from ..store.db import Store
from .context import MarketContext
from .held import HeldJobs

log = logging.getLogger("e31.executor")

ROLE = "executor"
WITHDRAWN_TEXT = "withdrawn by its submitter before it started here: it was never started"


def take_back(
    held: HeldJobs, env: VerifiedEnvelope[Withdraw], now: int, has_worker: Callable[[bytes], bool]
) -> bool:
    """Act on a live withdraw at once (no await): True if a job was stopped before it started."""
    msg = env.message
    if msg.expires <= now:
        return False
    job_id = msg.job_id.raw
    if not held.take_back(
        job_id, msg.assignment_id.raw, msg.submitter.raw, has_worker=has_worker, expires=msg.expires
    ):
        return False
    log.info("job %s: its submitter took the assignment back before it started", job_id.hex()[:12])
    return True


async def give_back_withdrawn(ctx: MarketContext, job_id: bytes, assign: VerifiedEnvelope[Assign]) -> None:
    """End a job whose assignment was taken back before it started (`cancelled`, WITHDRAWN_TEXT) and
    release it (reason `withdrawn`), so its submitter offers it elsewhere at once."""
    for _ in range(3):  # (the state may move from fetching to queued meanwhile)
        row = await ctx.store.run(Store.job, job_id, ROLE)
        if row is None or row.state not in ("fetching", "queued"):
            return
        if await ctx.store.run(
            Store.update_job,
            job_id,
            ROLE,
            ctx.now_s(),
            expect_state=row.state,
            state="cancelled",
            reason=WITHDRAWN_TEXT,
        ):
            msg = Release(
                ctx.network, assign.message.job_id, assign.message_id, ctx.node, "withdrawn", WITHDRAWN_TEXT
            )
            await ctx.send_to(assign.message.submitter.raw, sign_message(msg, ctx.identity))
            return
