"""`assigns` at the executor: the jobs of one bid taken in one message, stored once, each run and
receipted under the set's id; the items it cannot take answered one by one (executor.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from e31.node.store.db import Store, call
from e31.protocol.assignments import assignment_of, assignments
from e31.protocol.envelope import sign_message, verify
from e31.protocol.ids import Digest, NodeId
from e31.protocol.messages import AssignItem, AssignSet, Bid, Cancel, Release, Results, UsageReceipt
from e31.protocol.receipts import check_receipt_assignment
from market_nodes import NETWORK, Net, RealNode, start, until, wait_state, wall_ms
from test_awards import Bidder
from test_market import executor_and_peer, foreign_manifest


async def test_a_set_is_stored_once_its_jobs_run_under_its_id_and_the_rest_are_released(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    b, c = await executor_and_peer(net, nursery, tmp_path)
    named = [foreign_manifest(b, c.id, (str(i), "100")) for i in range(3)]
    b.executor.on_offer(c.offer(*named))
    bid_env = await c.only(Bid)
    stranger = foreign_manifest(b, c.id, ("9", "100"))  # in no bid of b's
    now = wall_ms()
    ran, late = sorted(named[:2], key=lambda m: m.job_id.raw), named[2]
    items = sorted(
        [
            *(AssignItem(m.job_id, 1, now + 60_000) for m in ran),
            AssignItem(late.job_id, 1, now - 1),  # its lease ran out on the way: never started
            AssignItem(stranger.job_id, 1, now + 60_000),
        ],
        key=lambda i: i.job_id.raw,
    )
    sent = AssignSet(NETWORK, bid_env.message_id, NodeId(c.id), NodeId(b.id), now + 60_000, tuple(items))
    raw = sign_message(sent, c.key)
    set_id = verify(raw).message_id
    await b.market.message(c.id, raw)
    await b.market.message(c.id, raw)  # a copy is a copy of each assignment: nothing runs twice

    for m in ran:
        await wait_state(b, m.job_id.raw, "done", role="executor")
    await until(lambda: len(c.kinds(Release)) >= 2)
    released = {env.message.job_id: env.message for env in c.kinds(Release)}
    assert set(released) == {late.job_id, stranger.job_id}
    assert {r.reason for r in released.values()} == {"unknown"}
    assert all(r.assignment_id == set_id for r in released.values())  # named by the set's id and the job
    assert await b.store.run(Store.job, stranger.job_id.raw, "executor") is None
    assert await b.store.run(Store.job, late.job_id.raw, "executor") is None

    stored = await b.store.run(Store.envelope, set_id.raw)
    assert stored is not None and stored.kind == "assigns" and stored.job_id is None  # once, shared
    for m in ran:
        (row,) = await b.store.run(Store.assignments_for_job, m.job_id.raw)
        assert row.message_id == set_id.raw

    def receipts() -> list[UsageReceipt]:
        entries = [e for env in c.kinds(Results) for e in env.message.entries]
        return [verify(e.receipt, UsageReceipt).message for e in entries]

    await until(lambda: len({r.job_id for r in receipts()}) >= 2)
    by_job = {r.job_id: r for r in receipts()}
    assert set(by_job) == {m.job_id for m in ran}
    for m in ran:
        mine = assignment_of(verify(raw), m.job_id)
        assert mine is not None
        check_receipt_assignment(by_job[m.job_id], mine)  # each receipt alone, against the set's item
    assert b.executor.scheduler.completed == 2


async def test_a_set_for_another_executor_or_with_a_lapsed_bid_is_not_taken(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    b, c = await executor_and_peer(net, nursery, tmp_path)
    jobs = sorted((foreign_manifest(b, c.id, (str(i), "100")) for i in range(2)), key=lambda m: m.job_id.raw)
    now = wall_ms()
    items = tuple(AssignItem(m.job_id, 1, now + 60_000) for m in jobs)
    elsewhere = AssignSet(NETWORK, Digest(b"\x07" * 32), NodeId(c.id), NodeId(c.id), now + 60_000, items)
    await b.market.message(c.id, sign_message(elsewhere, c.key))  # names another executor: ignored
    no_bid = AssignSet(NETWORK, Digest(b"\x07" * 32), NodeId(c.id), NodeId(b.id), now + 60_000, items)
    await b.market.message(c.id, sign_message(no_bid, c.key))  # no live bid of b's: each released
    await until(lambda: len(c.kinds(Release)) >= 2)
    assert sorted(env.message.job_id.raw for env in c.kinds(Release)) == [m.job_id.raw for m in jobs]
    assert all(env.message.reason == "unknown" for env in c.kinds(Release))
    for m in jobs:
        assert await b.store.run(Store.job, m.job_id.raw, "executor") is None


async def test_a_job_that_ends_while_its_set_is_stored_is_cancelled_at_its_executor(
    net: Net, nursery: trio.Nursery, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The set is signed with the job in it, then the job ends before the set's commit moves it to
    `assigned` (here: the move finds it in another state, as when a late result or `e31 cancel`
    came first): the set still goes out (it is one signed message for all its jobs), so the job's
    executor is sent the job's cancel right after it, and drops the job."""
    a = RealNode(net, tmp_path, "a", 1)  # submits; runs none of its own jobs (SETTINGS)
    bidder = Bidder(net, 23)
    await start(nursery, a)
    transition = a.submitter._transition

    def ends_meanwhile(job_id: bytes, old: str, new: str, **changes: Any) -> Any:
        if new != "assigned":
            return transition(job_id, old, new, **changes)
        # the move to `assigned` finds the job in another state: it moves nothing (returns False)
        return call(Store.update_job, job_id, "submitter", 0.0, expect_state="cancelled", state=new)

    monkeypatch.setattr(a.submitter, "_transition", ends_meanwhile)
    job_id = await a.submitter.submit(a.manifest(("41", "100")))
    await until(lambda: bidder.of(Cancel), 10)
    (assigned,) = bidder.of(AssignSet)
    (cancel,) = bidder.of(Cancel)
    assert [x.job_id.raw for x in assignments(assigned)] == [job_id]
    assert cancel.message.job_id.raw == job_id and cancel.signer.raw == a.id
    assert bidder.heard.index(assigned) < bidder.heard.index(cancel)
