"""An executor and a `withdraw` (in-memory nodes, real store and sandbox): its submitter takes one
assignment back. A job still queued is dropped, never started, ended `cancelled` and given back with a
signed `release` (reason `withdrawn`), durably; a started job runs on and its result comes as usual; a
withdraw naming another assignment, signed by another node, or expired is ignored."""

from __future__ import annotations

from pathlib import Path

import nacl.signing
import trio
from e31.node.market.taken_back import WITHDRAWN_TEXT
from e31.node.store.db import Store
from e31.protocol.envelope import sign_message, verify
from e31.protocol.ids import Digest, NodeId
from e31.protocol.jobs import JobManifest, Limits
from e31.protocol.messages import Accepted, Assign, Bid, Release, Results, Withdraw
from market_nodes import NETWORK, Net, RealNode, start, until, wait_state, wall_ms
from test_market import Recorder, foreign_manifest


def job(b: RealNode, c: Recorder, seed: int, samples: int, *, fuel: int = 10**9) -> JobManifest:
    return foreign_manifest(
        b, c.id, (str(seed), str(samples)), limits=Limits(fuel, 64 << 20, 30_000, 1 << 20)
    )


async def bid_for(b: RealNode, c: Recorder, manifest: JobManifest) -> Digest:
    b.executor.on_offer(c.offer(manifest))
    await until(lambda: [e for e in c.kinds(Bid) if e.message.item(manifest.job_id)], 30)
    return next(e for e in c.kinds(Bid) if e.message.item(manifest.job_id)).message_id  # type: ignore[no-any-return]


def signed_assign(c: Recorder, b: RealNode, manifest: JobManifest, bid_id: Digest) -> bytes:
    msg = Assign(NETWORK, manifest.job_id, bid_id, NodeId(c.id), NodeId(b.id), 1, wall_ms() + 60_000)
    return sign_message(msg, c.key)


def withdraw(
    key: nacl.signing.SigningKey, job_id: Digest, assignment: Digest, *, expires: int | None = None
) -> bytes:
    submitter = NodeId(bytes(key.verify_key))
    when = wall_ms() + 30_000 if expires is None else expires
    return sign_message(Withdraw(NETWORK, job_id, assignment, submitter, when, "behind its promise"), key)


def releases(c: Recorder, job_id: bytes) -> list[Release]:
    return [e.message for e in c.kinds(Release) if e.message.job_id.raw == job_id]


def results_for(c: Recorder, job_id: bytes) -> list[bytes]:
    return [x.job_id.raw for e in c.kinds(Results) for x in e.message.entries if x.job_id.raw == job_id]


async def test_a_queued_job_withdrawn_never_starts_and_is_released_durably(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    b, c = RealNode(net, tmp_path, "b", 2), Recorder(net, 9)
    manifest = job(b, c, 1, 1000)
    job_id = manifest.job_id.raw
    async with trio.open_nursery() as first_run:
        await start(first_run, b)
        bid_id = await bid_for(b, c, manifest)
        b.path.scheduler.suspend()  # the owner is back: the queue holds still, the job waits in it
        raw = signed_assign(c, b, manifest, bid_id)
        assignment = verify(raw).message_id
        await b.market.message(c.id, raw)
        await wait_state(b, job_id, "queued", role="executor")
        await until(lambda: c.kinds(Accepted), 30)  # queued and handed off: `accepted` means only that
        await b.market.message(c.id, withdraw(c.key, manifest.job_id, assignment))
        await until(lambda: releases(c, job_id), 30)
        (release,) = releases(c, job_id)
        assert (release.reason, release.text, release.assignment_id) == (
            "withdrawn",
            WITHDRAWN_TEXT,
            assignment,
        )
        row = await wait_state(b, job_id, "cancelled", role="executor")
        assert row.reason == WITHDRAWN_TEXT and row.started is None
        # the owner leaves: the queue moves again, and a later job runs while the withdrawn one never does
        b.path.scheduler.resume()
        other = job(b, c, 2, 1000)
        await b.market.message(c.id, signed_assign(c, b, other, await bid_for(b, c, other)))
        await wait_state(b, other.job_id.raw, "done", role="executor")
        assert b.path.scheduler.completed == 1
        assert await b.store.run(Store.receipts_for_job, job_id) == []  # nothing metered
        first_run.cancel_scope.cancel()
    # Restarted: the job is not taken up again, and a copy of its assignment gets the same release.
    restarted = b.build(b.ctx.settings)
    net.handlers[b.id] = restarted.market.message
    await nursery.start(restarted.market.run)
    await restarted.market.message(c.id, raw)
    await until(lambda: len(releases(c, job_id)) == 2, 30)
    assert [r.reason for r in releases(c, job_id)] == ["withdrawn", "withdrawn"]
    assert (await b.store.run(Store.job, job_id, "executor")).state == "cancelled"  # type: ignore[union-attr]
    assert restarted.scheduler.completed == 0 and results_for(c, job_id) == []


async def test_a_withdraw_that_comes_before_its_assignment_is_stored_still_stops_the_job(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    b, c = RealNode(net, tmp_path, "b", 2), Recorder(net, 9)
    await start(nursery, b)
    manifest = job(b, c, 3, 1000)
    raw = signed_assign(c, b, manifest, await bid_for(b, c, manifest))
    await b.market.message(c.id, withdraw(c.key, manifest.job_id, verify(raw).message_id))
    await b.market.message(c.id, raw)
    await until(lambda: releases(c, manifest.job_id.raw), 30)
    assert [r.reason for r in releases(c, manifest.job_id.raw)] == ["withdrawn"]
    await wait_state(b, manifest.job_id.raw, "cancelled", role="executor")
    assert b.path.scheduler.completed == 0 and c.kinds(Accepted) == []


async def test_a_started_job_ignores_a_withdraw_and_delivers_its_result(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    b, c = RealNode(net, tmp_path, "b", 2), Recorder(net, 9)
    await start(nursery, b)
    # long enough to be recorded `running` (executor.RUNNING_MARK_DELAY after its start) before it ends
    manifest = job(b, c, 4, 100_000_000, fuel=3 * 10**10)
    job_id = manifest.job_id.raw
    raw = signed_assign(c, b, manifest, await bid_for(b, c, manifest))
    await b.market.message(c.id, raw)
    await wait_state(b, job_id, "running", role="executor")
    await b.market.message(c.id, withdraw(c.key, manifest.job_id, verify(raw).message_id))
    await wait_state(b, job_id, "done", 60, role="executor")
    await until(lambda: results_for(c, job_id), 30)
    assert releases(c, job_id) == []
    assert len(await b.store.run(Store.receipts_for_job, job_id)) == 1


async def test_a_withdraw_of_another_assignment_by_another_node_or_expired_is_ignored(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    b, c = RealNode(net, tmp_path, "b", 2), Recorder(net, 9)
    stranger = Recorder(net, 10)
    await start(nursery, b)
    manifest = job(b, c, 5, 1000)
    job_id = manifest.job_id.raw
    bid_id = await bid_for(b, c, manifest)
    b.path.scheduler.suspend()
    raw = signed_assign(c, b, manifest, bid_id)
    assignment = verify(raw).message_id
    await b.market.message(c.id, raw)
    await wait_state(b, job_id, "queued", role="executor")
    older = Digest(bytes(32))  # an assignment this node never held
    await b.market.message(c.id, withdraw(c.key, manifest.job_id, older))
    await b.market.message(stranger.id, withdraw(stranger.key, manifest.job_id, assignment))
    await b.market.message(c.id, withdraw(c.key, manifest.job_id, assignment, expires=wall_ms() - 1))
    await until(lambda: c.kinds(Accepted), 30)  # (the withdraws were taken before the hand-off was sent)
    b.path.scheduler.resume()
    await wait_state(b, job_id, "done", role="executor")
    await until(lambda: results_for(c, job_id), 30)
    assert releases(c, job_id) == [] and stranger.got == []
