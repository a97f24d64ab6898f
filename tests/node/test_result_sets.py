"""Results travel in `results` carriers: an executor gathers the results of jobs that end close
together into one signed message (delivery.py), and a submitter takes each entry on its own, so a bad
entry does not keep the good ones out (outcomes.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import trio
from e31.node.store.db import Store
from e31.protocol.envelope import sign_message, sign_verified, verify
from e31.protocol.ids import Digest, NodeId, sha256
from e31.protocol.messages import BY_ENTRY, MAX_RESULTS, Results, UsageReceipt
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
    net: Net, nursery: trio.Nursery, tmp_path: Path
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
    await start(nursery, a, b)
    job_id = await a.submitter.submit(a.manifest(("5", "1000")))
    row = await wait_state(a, job_id, "done")
    assert tampered and len(tampered[0].entries) >= 3
    assert row.reason == "exited 0"
    receipts = await a.store.run(Store.receipts_for_job, job_id)
    assert len(receipts) == 1 and receipts[0].delivered is not None
    assert not await a.store.run(Store.job, sha256(b"a job nobody assigned").raw, "submitter")


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
    delivery.busy = lambda ids: True  # other jobs are held: results wait for each other (5 ms at most)
    for i in range(MAX_RESULTS + 2):  # all in one turn: more than one carrier holds
        delivery.queue(_receipt(b, a, i, template), 0)
    await until(lambda: sum(len(c.entries) for c in carriers) == MAX_RESULTS + 2)
    assert sorted(len(c.entries) for c in carriers) == [2, MAX_RESULTS]
    carriers.clear()
    delivery.busy = lambda ids: False  # nothing else held here: a result goes at once, alone
    delivery.queue(_receipt(b, a, 1000, template), 0)
    await until(lambda: carriers)
    assert [len(c.entries) for c in carriers] == [1]
