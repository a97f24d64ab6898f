"""The submitter re-plans a job whose executor fell behind its promise (in-memory nodes, real stores and
sandbox): once the promised finish and its grace have passed with no result, the executor having
accepted the job and another node being linked, it sends one signed `withdraw`; an executor still
holding the job queued gives it back (`release`, reason `withdrawn`) and the job runs elsewhere; one
already running it ignores the withdraw and its result is taken."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import trio
from e31.node.market.adverts import PeerCapacity
from e31.node.market.policy import Calibration
from e31.node.market.taken_back import WITHDRAWN_TEXT
from e31.protocol.envelope import VerifiedEnvelope, verify
from e31.protocol.ids import NodeId
from e31.protocol.jobs import Limits
from e31.protocol.messages import Assign, Release, Withdraw
from e31.sandbox.profile import PROFILE
from market_nodes import SETTINGS, Net, RealNode, start, until, wait_state

LONG_LEASE = replace(SETTINGS, lease_slack_ms=60_000)
"""A lease far past the promise: the job is moved by the withdraw, not by its lease running out."""


class Watch:
    """Records what reaches `node` (assignments, withdraws) and what `submitter` hears back (releases);
    with `suspend_on_assign`, the node's owner comes back just as the first assignment arrives, so the
    job waits in its queue."""

    def __init__(self, net: Net, node: RealNode, submitter: RealNode, *, suspend_on_assign: bool) -> None:
        self.assigns: list[VerifiedEnvelope[Assign]] = []
        self.withdraws: list[VerifiedEnvelope[Withdraw]] = []
        self.releases: list[Release] = []
        deliver, deliver_a = net.handlers[node.id], net.handlers[submitter.id]

        async def to_node(peer: bytes, raw: bytes) -> None:
            env = verify(raw)
            if isinstance(env.message, Assign):
                if suspend_on_assign and not self.assigns:
                    node.path.scheduler.suspend()
                self.assigns.append(env)
            elif isinstance(env.message, Withdraw):
                self.withdraws.append(env)
            await deliver(peer, raw)

        async def to_submitter(peer: bytes, raw: bytes) -> None:
            env = verify(raw)
            if peer == node.id and isinstance(env.message, Release):
                self.releases.append(env.message)
            await deliver_a(peer, raw)

        net.handlers[node.id] = to_node
        net.handlers[submitter.id] = to_submitter


async def test_a_queued_job_of_an_executor_behind_its_promise_is_moved_and_runs_elsewhere(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    a.ctx.settings = LONG_LEASE
    watch = Watch(net, b, a, suspend_on_assign=True)
    await start(nursery, a, b)
    job = replace(a.manifest(("31", "1000"), deadline_s=120), limits=Limits(10**8, 64 << 20, 30_000, 1 << 20))
    job_id = await a.submitter.submit(job)
    await wait_state(b, job_id, "queued", role="executor")
    (assign,) = watch.assigns
    assert b.path.scheduler.suspended  # the owner is back: b keeps the job queued past its promise
    c = RealNode(net, tmp_path, "c", 3)  # an idle node comes up
    await start(nursery, c)
    row = await wait_state(a, job_id, "done", 60)
    assert row.executor == str(NodeId(c.id)) and row.attempt == 2
    (withdraw,) = watch.withdraws  # sent once, by the job's submitter, naming b's assignment
    assert withdraw.signer == NodeId(a.id)
    assert withdraw.message.assignment_id == assign.message_id
    assert withdraw.message.expires == assign.message.lease_expires
    assert [(r.reason, r.text) for r in watch.releases] == [("withdrawn", WITHDRAWN_TEXT)]
    moved = await wait_state(b, job_id, "cancelled", role="executor")
    assert moved.reason == WITHDRAWN_TEXT and moved.started is None
    assert b.path.scheduler.completed == 0 and c.path.scheduler.completed == 1


async def test_a_withdraw_a_running_executor_ignores_leaves_the_job_to_finish_there(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    # b believes itself far faster than it is: its bid promises a finish long before the run can end
    b.path.scheduler.calibration = Calibration(rates={PROFILE.digest: 10**12})
    a.ctx.settings = LONG_LEASE
    watch = Watch(net, b, a, suspend_on_assign=False)
    c = RealNode(net, tmp_path, "c", 3)  # a node to move the job to (it bids later than b promises)
    await start(nursery, a, b, c)
    # a run of 6e10 fuel (3 s or more), promised in about 80 ms: behind it a second later
    job = replace(
        a.manifest(("32", "100000000000"), deadline_s=120),
        limits=Limits(6 * 10**10, 64 << 20, 30_000, 1 << 20),
    )
    job_id = await a.submitter.submit(job)
    await until(lambda: watch.withdraws, 30)
    row = await wait_state(a, job_id, "done", 60)
    assert row.executor == str(NodeId(b.id)) and row.attempt == 1
    assert len(watch.withdraws) == 1 and watch.releases == []
    assert (await wait_state(b, job_id, "done", role="executor")).started is not None
    assert c.path.scheduler.completed == 0


async def test_a_node_that_runs_no_jobs_is_no_place_to_move_a_job_to(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    """A submit-only node declines every offer (`policy`): the submitter does not count it among the
    nodes a job behind its promise could be moved to, so it never withdraws a job to send it nowhere;
    nor a node whose capacity advert says it has no core free."""
    a, b, d = (RealNode(net, tmp_path, name, seed) for name, seed in (("a", 1), ("b", 2), ("d", 4)))
    d.config = replace(d.config, cores=0)
    d.path = d.build(d.ctx.settings)
    net.handlers[d.id], net.offer_sinks[d.id] = d.path.market.message, d.path.executor.on_offer
    await start(nursery, a, b)
    await nursery.start(d.path.market.run)
    job_id = await a.submitter.submit(a.manifest(("33", "1000"), deadline_s=120))
    await wait_state(a, job_id, "done", 60)
    await until(lambda: d.id in a.submitter.offers.runs_nothing, 30)  # its decline may come after b's bid
    assert a.submitter.offers.runs_nothing.keys() == {d.id}
    manifest = a.manifest(("34", "1000"), deadline_s=120)
    assert a.submitter._movable(manifest) == {b.id}
    # nor one whose live capacity advert offers no free core (its owner is back, say)
    now = a.ctx.clock()
    a.path.capacity.peers[b.id] = PeerCapacity(0, 1 << 30, 0, 1, now + 60_000)
    assert a.submitter._movable(manifest) == set()
    a.path.capacity.peers[b.id] = PeerCapacity(1, 1 << 30, 0, 1, now + 60_000)
    assert a.submitter._movable(manifest) == {b.id}
