"""Results travel in `results` carriers: an executor gathers the results of jobs that end close
together into one signed message (delivery.py), and a submitter takes each entry on its own, so a bad
entry does not keep the good ones out (outcomes.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import trio
from e31.node.market import outcomes
from e31.node.store.db import Store
from e31.protocol.envelope import sign_message, sign_verified, verify
from e31.protocol.ids import Digest, NodeId, sha256
from e31.protocol.messages import BY_ENTRY, MAX_RESULTS, Result, Results, UsageReceipt
from e31.protocol.results import make_results
from market_nodes import Net, RealNode, start, until, wait_state


def carriers_to(net: Net, node: bytes) -> list[Results]:
    """Record every `results` carrier sent to `node` (and let it through)."""
    seen: list[Results] = []
    deliver = net.handlers[node]

    async def handler(peer: bytes, raw: bytes) -> None:
        env = verify(raw)
        if isinstance(env.message, Results):
            seen.append(env.message)
        await deliver(peer, raw)

    net.handlers[node] = handler
    return seen


async def test_the_jobs_of_a_sweep_come_back_in_carriers_and_each_ends_done(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    carriers = carriers_to(net, a.id)
    await start(nursery, a, b)
    jobs = [await a.submitter.submit(a.manifest(("7", str(1000 + i)))) for i in range(6)]
    for job_id in jobs:
        await wait_state(a, job_id, "done")
    delivered = {e.job_id.raw for c in carriers for e in c.entries}
    assert delivered >= set(jobs), "every job's receipt came in a `results` carrier"
    for c in carriers:
        assert 1 <= len(c.entries) <= MAX_RESULTS
        assert [BY_ENTRY(e) for e in c.entries] == sorted(BY_ENTRY(e) for e in c.entries)


async def test_a_bad_entry_of_a_carrier_does_not_keep_the_good_one_out(
    net: Net, nursery: trio.Nursery, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    keys = {a.id: a.key, b.id: b.key}
    deliver = net.handlers[a.id]
    tampered: list[Results] = []

    async def handler(peer: bytes, raw: bytes) -> None:
        env = verify(raw)
        if isinstance(env.message, Results) and not tampered:
            carrier = env.message
            good = carrier.entries[0]
            other_job = dataclasses.replace(good, job_id=sha256(b"a job nobody assigned"))
            garbage = dataclasses.replace(good, assignment_id=Digest(b"\x00" * 32), receipt=b"\x01\x02")
            entries = tuple(sorted({*carrier.entries, other_job, garbage}, key=BY_ENTRY))
            carrier = dataclasses.replace(carrier, entries=entries)
            tampered.append(carrier)
            raw = sign_message(carrier, keys[env.signer.raw])  # signed by the executor as before
        await deliver(peer, raw)

    net.handlers[a.id] = handler
    verified = verifications(monkeypatch)
    await start(nursery, a, b)
    job_id = await a.submitter.submit(a.manifest(("5", "1000")))
    row = await wait_state(a, job_id, "done")
    assert tampered and len(tampered[0].entries) >= 3
    assert verified and {r.job_id.raw for r in verified} == {job_id}, "only the good entry is verified"
    assert all(r.assignment_id != Digest(b"\x00" * 32) for r in verified)
    assert row.reason == "exited 0"
    receipts = await a.store.run(Store.receipts_for_job, job_id)
    assert len(receipts) == 1 and receipts[0].delivered is not None
    assert not await a.store.run(Store.job, sha256(b"a job nobody assigned").raw, "submitter")


def verifications(monkeypatch: pytest.MonkeyPatch) -> list[Result]:
    """Record every result whose receipt the submitter verifies (outcomes.check_result)."""
    seen: list[Result] = []
    check = outcomes.check_result

    def counted(result: Result, signer: NodeId) -> Any:
        seen.append(result)
        return check(result, signer)

    monkeypatch.setattr(outcomes, "check_result", counted)
    return seen


class OutcomeTasks(trio.abc.Instrument):
    """Count the tasks started to take results in (those of outcomes.py)."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        if task.name.startswith(outcomes.__name__ + "."):
            self.names.append(task.name)


async def _foreign_carriers(a: RealNode, b: RealNode) -> list[bytes]:
    """`results` carriers signed by `b`, full of well-signed receipts for jobs `a` never submitted."""
    job_id = await a.submitter.submit(a.manifest(("5", "1000")))
    await wait_state(a, job_id, "done")
    (stored,) = await a.store.run(Store.envelopes_for_job, job_id, "receipt")
    template = verify(stored.raw, UsageReceipt).message
    delivered = [(_receipt(b, a, i, template), 0, ()) for i in range(MAX_RESULTS)]
    carriers = make_results(a.config.network, NodeId(b.id), delivered)
    assert [len(c.entries) for c in carriers] == [MAX_RESULTS]
    return [sign_message(c, b.key) for c in carriers]


async def test_a_carrier_naming_jobs_never_submitted_costs_no_verification_and_one_task(
    net: Net, nursery: trio.Nursery, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    await start(nursery, a, b)
    (raw,) = await _foreign_carriers(a, b)
    verified = verifications(monkeypatch)
    tasks = OutcomeTasks()
    trio.lowlevel.add_instrument(tasks)
    try:
        await net.handlers[a.id](b.id, raw)
        await until(lambda: tasks.names and not a.submitter.outcomes._held)
    finally:
        trio.lowlevel.remove_instrument(tasks)
    assert verified == [], "no receipt of a job this node never submitted is verified"
    assert len(tasks.names) == 1, f"one task for the carrier, none per entry: {tasks.names}"
    for i in range(MAX_RESULTS):
        assert await a.store.run(Store.job, sha256(b"job %d" % i).raw, "submitter") is None


async def test_carriers_of_one_peer_are_taken_two_at_a_time_and_a_few_held(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    await start(nursery, a, b)
    (raw,) = await _foreign_carriers(a, b)
    env = verify(raw)
    taker = a.submitter.outcomes
    take, now, most = taker.take_carrier, [0], [0]

    async def counted(env: Any) -> None:
        now[0] += 1
        most[0] = max(most[0], now[0])
        try:
            await take(env)
        finally:
            now[0] -= 1

    taker.take_carrier = counted  # type: ignore[method-assign]
    tasks = OutcomeTasks()
    trio.lowlevel.add_instrument(tasks)
    try:
        async with trio.open_nursery() as takes:
            for _ in range(outcomes.CARRIERS_HELD_PER_PEER + 3):  # in one turn: none has ended yet
                taker.take_carrier_soon(takes, env)
            assert taker._held == {b.id: outcomes.CARRIERS_HELD_PER_PEER}
    finally:
        trio.lowlevel.remove_instrument(tasks)
    assert len(tasks.names) == outcomes.CARRIERS_HELD_PER_PEER, "the carriers beyond the bound are dropped"
    assert most[0] == outcomes.TAKES_PER_PEER, "the others wait their turn"
    assert taker._held == {} and taker._turns == {}


def _receipt(executor: RealNode, submitter: RealNode, i: int, template: UsageReceipt) -> Any:
    changed = dataclasses.replace(
        template,
        job_id=sha256(b"job %d" % i),
        assignment_id=sha256(b"assignment %d" % i),
        submitter=NodeId(submitter.id),
        executor=NodeId(executor.id),
    )
    return sign_verified(changed, executor.key)


async def test_results_that_end_while_other_jobs_are_held_share_a_carrier(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    carriers = carriers_to(net, a.id)
    await start(nursery, a, b)
    job_id = await a.submitter.submit(a.manifest(("5", "1000")))
    await wait_state(a, job_id, "done")
    (stored,) = await a.store.run(Store.envelopes_for_job, job_id, "receipt")
    template = verify(stored.raw, UsageReceipt).message
    carriers.clear()
    delivery = b.executor.delivery
    delivery.busy = lambda ids: True  # other jobs are held: results wait for each other (20 ms at most)
    async with trio.open_nursery() as jobs:  # all end at once: more than one carrier holds
        for i in range(MAX_RESULTS + 2):
            jobs.start_soon(delivery.finish, (), _receipt(b, a, i, template), 0)
    assert sorted(len(c.entries) for c in carriers) == [2, MAX_RESULTS]
    carriers.clear()
    delivery.busy = lambda ids: False  # nothing else held here: a result goes at once, alone
    await delivery.finish((), _receipt(b, a, 1000, template), 0)
    await until(lambda: carriers)
    assert [len(c.entries) for c in carriers] == [1]


async def test_the_outcomes_of_jobs_ending_together_commit_together_and_one_that_cannot_alone(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    from e31.node.errors import StoreError
    from e31.node.store.db import call

    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    carriers = carriers_to(net, a.id)
    await start(nursery, a, b)
    job_id = await a.submitter.submit(a.manifest(("5", "1000")))
    await wait_state(a, job_id, "done")
    (stored,) = await a.store.run(Store.envelopes_for_job, job_id, "receipt")
    template = verify(stored.raw, UsageReceipt).message
    carriers.clear()
    commits: list[int] = []
    atomically = b.store.atomically

    async def counted(*calls: Any, durable: bool = True) -> Any:
        commits.append(len(calls))
        return await atomically(*calls, durable=durable)

    def refuse(store: Store) -> None:
        raise StoreError("this outcome cannot be stored")

    b.store.atomically = counted  # type: ignore[method-assign]
    delivery = b.executor.delivery
    delivery.busy = lambda ids: True
    receipts = [_receipt(b, a, i, template) for i in range(3)]
    kv = [call(Store.kv_set, f"outcome {i}", b"kept") for i in range(3)]
    errors: list[Exception] = []

    async def finish(i: int) -> None:
        calls = (kv[i], call(refuse)) if i == 1 else (kv[i],)
        try:
            await delivery.finish(calls, receipts[i], 0)
        except StoreError as e:
            errors.append(e)

    async with trio.open_nursery() as jobs:
        for i in range(3):
            jobs.start_soon(finish, i)
    assert commits[0] == 4, "one commit for the three outcomes first"
    assert len(errors) == 1 and "cannot be stored" in str(errors[0])
    assert await b.store.run(Store.kv_get, "outcome 0") == b"kept"
    assert await b.store.run(Store.kv_get, "outcome 1") is None
    assert await b.store.run(Store.kv_get, "outcome 2") == b"kept"
    await until(lambda: carriers)
    sent = {e.receipt for c in carriers for e in c.entries}
    assert sent == {receipts[0].raw, receipts[2].raw}, "the outcome not stored is not sent"


async def test_the_entries_of_a_carrier_end_their_jobs_in_one_pass(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    """A carrier whose receipts need nothing more (each job under way, its assignment held, its outputs
    carried) ends all its jobs in the carrier's own task: one read of their rows, one shared commit,
    no task and no read per entry (outcomes.Outcomes._take_together)."""
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    carriers = carriers_to(net, a.id)
    await start(nursery, a, b)
    await wait_state(a, await a.submitter.submit(a.manifest(("7", "1999"))), "done")  # fetches the empty
    carriers.clear()  # stderr's blob, which every later job's receipt names
    b.executor.delivery.busy = lambda ids: True  # results wait for each other: they share carriers
    taker = a.submitter.outcomes
    alone: list[bytes] = []
    passes: list[int] = []
    take_opened, take_together = taker._take_opened, taker._take_together

    async def counted_alone(env: Any, opened: Any) -> None:
        alone.append(env.message.job_id.raw)
        await take_opened(env, opened)

    async def counted_pass(opened: Any, nursery: trio.Nursery) -> None:
        passes.append(len(opened))
        await take_together(opened, nursery)

    taker._take_opened = counted_alone  # type: ignore[method-assign]
    taker._take_together = counted_pass  # type: ignore[method-assign]
    tasks = OutcomeTasks()
    trio.lowlevel.add_instrument(tasks)
    try:
        batch = [a.manifest(("7", str(2000 + i)), deadline_s=600) for i in range(8)]
        await a.submitter.submit_batch(batch)
        rows = [await wait_state(a, m.job_id.raw, "done") for m in batch]
    finally:
        trio.lowlevel.remove_instrument(tasks)
    assert all(row.reason == "exited 0" for row in rows)
    for m in batch:
        (receipt,) = await a.store.run(Store.receipts_for_job, m.job_id.raw)
        assert receipt.delivered is not None, "each receipt is recorded verified"
    shared = [c for c in carriers if len(c.entries) > 1]
    assert shared, f"results shared a carrier: {[len(c.entries) for c in carriers]}"
    assert sorted(passes) == sorted(len(c.entries) for c in shared), "each such carrier's jobs in one pass"
    assert len(alone) == len(carriers) - len(shared), "only a carrier of one takes its entry alone, and"
    # no entry of a shared carrier leaves the pass (each would be taken alone, in a task of its own)
    assert len(tasks.names) == len(carriers), f"one task per carrier, none per entry: {tasks.names}"


async def test_a_job_of_a_carrier_whose_end_cannot_be_stored_leaves_the_others_ended(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    """One job's writes fail in the shared commit of a carrier's pass: committed again alone, it fails
    alone; every other job of the pass still ends, and the StoreError is raised after them."""
    from e31.node.errors import StoreError
    from e31.node.store.db import call

    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    carriers = carriers_to(net, a.id)
    await start(nursery, a, b)
    await wait_state(a, await a.submitter.submit(a.manifest(("7", "2999"))), "done")
    carriers.clear()
    b.executor.delivery.busy = lambda ids: True
    taker = a.submitter.outcomes
    batch = [a.manifest(("7", str(3000 + i)), deadline_s=600) for i in range(6)]
    refused = min(m.job_id.raw for m in batch)  # first of its set in the carrier (BY_ENTRY order)
    ending, take_carrier = taker._ending, taker.take_carrier
    raised: list[StoreError] = []

    def refuse(store: Store) -> None:
        raise StoreError("this job's end cannot be stored")

    def failing_ending(job_id: bytes, *args: Any) -> Any:
        calls = ending(job_id, *args)
        return (*calls, call(refuse)) if job_id == refused else calls

    async def caught(env: Any) -> None:
        try:
            await take_carrier(env)
        except* StoreError as group:
            raised.extend(e for e in group.exceptions if isinstance(e, StoreError))

    taker._ending = failing_ending  # type: ignore[method-assign]
    taker.take_carrier = caught  # type: ignore[method-assign]
    await a.submitter.submit_batch(batch)
    for m in batch:
        if m.job_id.raw != refused:
            assert (await wait_state(a, m.job_id.raw, "done")).reason == "exited 0"
    await until(lambda: raised)
    (carrier,) = [c for c in carriers if any(e.job_id.raw == refused for e in c.entries)]
    assert len(carrier.entries) > 1, "the refused job was taken with others"
    assert [str(e) for e in raised] == ["this job's end cannot be stored"]
    row = await a.store.run(Store.job, refused, "submitter")
    assert row is not None and row.state not in ("done", "failed"), "its end was not stored"
    assert not await a.store.run(Store.receipts_for_job, refused), "nor its receipt"
    others = [m.job_id.raw for m in batch if m.job_id.raw != refused]

    async def acked() -> bool:  # each other job ended here in full: its receipt acknowledged to b
        rows = [r for job in others for r in await b.store.run(Store.receipts_for_job, job)]
        return len(rows) == len(others) and all(r.delivered is not None for r in rows)

    for _ in range(200):
        if await acked():
            break
        await trio.sleep(0.05)
    assert await acked(), "every other job of the pass ended, its receipt acknowledged"
