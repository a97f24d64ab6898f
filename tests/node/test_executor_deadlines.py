"""An executor keeps its promises (in-memory nodes, real store and sandbox): an offer is planned with
every job promised here, a job whose deadline passes before it starts never starts, a job still running
at its deadline is stopped, and both are given back at once with a signed `release` (reason
`deadline`), with no receipt: the meter records nothing for them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import trio
from e31.node.market.bidding import SUBMIT_ONLY_TEXT
from e31.node.market.executor import EXPIRED_TEXT, LATE_TEXT
from e31.node.market.policy import Calibration
from e31.node.store.db import Store
from e31.protocol.envelope import sign_message
from e31.protocol.ids import Digest, NodeId
from e31.protocol.jobs import JobManifest, Limits
from e31.protocol.messages import Assign, Bid, Decline, Release
from e31.sandbox.profile import PROFILE
from market_nodes import NETWORK, Net, RealNode, until, wait_state, wall_ms
from test_market import Recorder, executor_and_peer, foreign_manifest


def job(b: RealNode, c: Recorder, seed: int, samples: int, *, fuel: int, deadline_ms: int) -> JobManifest:
    return foreign_manifest(
        b,
        c.id,
        (str(seed), str(samples)),
        limits=Limits(fuel, 64 << 20, 30_000, 1 << 20),
        deadline=wall_ms() + deadline_ms,
    )


async def assign(b: RealNode, c: Recorder, manifest: JobManifest, bid_id: Digest) -> bytes:
    msg = Assign(
        NETWORK,
        manifest.job_id,
        bid_id,
        NodeId(c.id),
        NodeId(b.id),
        1,
        min(manifest.deadline, wall_ms() + 30_000),
    )
    env = sign_message(msg, c.key)
    await b.market.message(c.id, env)
    return manifest.job_id.raw


async def released(c: Recorder, job_id: bytes) -> Release:
    await until(lambda: [e for e in c.kinds(Release) if e.message.job_id.raw == job_id], 30)
    (env,) = [e for e in c.kinds(Release) if e.message.job_id.raw == job_id]
    return env.message  # type: ignore[no-any-return]


async def test_an_offer_is_planned_with_every_job_promised_here(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    """Six jobs of 2.5 s (at the calibrated rate and margin) with a 7 s deadline on one core: two are
    promised, four declined `deadline`; a later offer finds the two promised and is declined too."""
    b, c = await executor_and_peer(net, nursery, tmp_path)
    b.path.scheduler.calibration = Calibration(rates={PROFILE.digest: 10**9}, margin=1.25)
    six = [job(b, c, i, 100, fuel=2 * 10**9, deadline_ms=7000) for i in range(6)]
    b.executor.on_offer(c.offer(*six))
    bid = (await c.only(Bid)).message
    decline = (await c.only(Decline)).message
    assert len(bid.items) == 2 and len(decline.job_ids) == 4 and decline.reason == "deadline"
    assert {i.job_id for i in bid.items} | set(decline.job_ids) == {m.job_id for m in six}
    first, second = sorted(bid.items, key=lambda i: i.expected_start)
    assert second.expected_start >= first.expected_finish  # one core: one after the other
    assert all(i.expected_finish <= m.deadline for i in bid.items for m in six if m.job_id == i.job_id)
    later = job(b, c, 9, 100, fuel=2 * 10**9, deadline_ms=7000)
    b.executor.on_offer(c.offer(later))
    await until(lambda: len(c.kinds(Decline)) == 2)
    assert c.kinds(Decline)[1].message.job_ids == (later.job_id,)
    assert len(c.kinds(Bid)) == 1


async def test_a_job_whose_deadline_passes_before_it_starts_never_starts_and_is_released(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    b, c = await executor_and_peer(net, nursery, tmp_path)
    manifest = job(b, c, 1, 1000, fuel=10**8, deadline_ms=1500)
    b.executor.on_offer(c.offer(manifest))
    bid = await c.only(Bid)
    b.path.scheduler.suspend()  # the owner is back: the queue holds still
    job_id = await assign(b, c, manifest, bid.message_id)
    release = await released(c, job_id)
    assert (release.reason, release.text) == ("deadline", EXPIRED_TEXT)
    assert wall_ms() >= manifest.deadline
    row = await wait_state(b, job_id, "failed", 10, role="executor")
    assert row.started is None and row.reason == EXPIRED_TEXT
    assert await b.store.run(Store.receipts_for_job, job_id) == []  # nothing metered
    assert b.path.scheduler.expired == 1 and b.path.scheduler.completed == 0


async def test_a_job_still_running_at_its_deadline_is_stopped_and_released(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    b, c = await executor_and_peer(net, nursery, tmp_path)
    # a node that believes itself far faster than it is: it promises a job it cannot finish in time
    b.path.scheduler.calibration = Calibration(rates={PROFILE.digest: 10**14})
    manifest = job(b, c, 2, 2_000_000_000, fuel=10**12, deadline_ms=2000)
    b.executor.on_offer(c.offer(manifest))
    bid = await c.only(Bid)
    job_id = await assign(b, c, manifest, bid.message_id)
    release = await released(c, job_id)
    assert (release.reason, release.text) == ("deadline", LATE_TEXT)
    assert wall_ms() >= manifest.deadline
    await wait_state(b, job_id, "failed", 10, role="executor")
    assert await b.store.run(Store.receipts_for_job, job_id) == []
    assert b.path.scheduler.stopped_late == 1
    assert b.path.scheduler.calibration.margin > Calibration().margin  # it learned from the miss


async def test_a_submit_only_node_declines_every_offer_and_runs_nothing(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    b = RealNode(net, tmp_path, "b", 2)
    b.config = replace(b.config, cores=0)
    b.path = b.build(b.ctx.settings)
    c = Recorder(net, 9)
    await nursery.start(b.path.market.run)
    asked: list[str] = []
    real_run = b.store.run

    async def run(method: Any, *args: Any, **kwargs: Any) -> Any:
        asked.append(method.__name__)
        return await real_run(method, *args, **kwargs)

    b.store.run = run  # type: ignore[method-assign]
    manifests = [job(b, c, seed, 100, fuel=10**8, deadline_ms=60_000) for seed in (3, 4, 5)]
    b.path.executor.on_offer(c.offer(*manifests))
    decline = (await c.only(Decline)).message
    assert (decline.reason, decline.text) == ("policy", SUBMIT_ONLY_TEXT)
    assert decline.job_ids == tuple(sorted((m.job_id for m in manifests), key=lambda d: d.raw))  # one for all
    assert c.kinds(Bid) == [] and b.path.scheduler.worker_pids() == []
    assert "jobs_held" not in asked and b.path.executor.bids._promises == {}  # answered unplanned, no bid
