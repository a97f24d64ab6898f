"""A bid's finish counts the time to fetch the job's blobs the executor does not hold (fetch_estimate.py),
so a node that holds a job's model bids an earlier finish and wins it from an otherwise equal node:
the arithmetic, the measured rate, and real job paths (market_nodes.RealNode: real stores, blob
stores, transfers and sandbox) whose bids are read off the wire."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path

import trio
from e31.node.market.fetch_estimate import (
    ASSUMED_RATE,
    COUNTED_MIN_BYTES,
    MEASURED_MIN_BYTES,
    MIN_RATE,
    FetchRate,
    blob_sizes,
    fetch_shares,
    with_fetches,
)
from e31.node.market.policy import Task
from e31.protocol.blobs import blob_ref
from e31.protocol.ids import Digest, NodeId
from e31.protocol.jobs import FileRef, JobManifest, Limits
from e31.protocol.messages import Bid
from e31.sandbox.profile import PROFILE
from market_nodes import Net, RealNode, start, wait_state
from test_held_blobs import record_bids

MODEL = Path(__file__).resolve().parents[2] / "sandbox" / "workloads" / "models" / "kjv.bin"


def with_inputs(manifest: JobManifest, **inputs: bytes) -> JobManifest:
    return dataclasses.replace(
        manifest, inputs=tuple(FileRef(name, blob_ref(data)) for name, data in inputs.items())
    )


def manifest_of(
    module: bytes, *inputs: bytes, nonce: int = 0, deadline: int = 2_000_000_000_000
) -> JobManifest:
    return JobManifest(
        module=blob_ref(module),
        inputs=tuple(FileRef(f"in{i}", blob_ref(data)) for i, data in enumerate(inputs)),
        args=(),
        env=(),
        stdin=None,
        limits=Limits(10**9, 64 << 20, 30_000, 1 << 20),
        deadline=deadline,
        retention_ms=60_000,
        replicas=1,
        profile=Digest(PROFILE.digest),
        submitter=NodeId(b"a" * 32),
        nonce=nonce.to_bytes(16, "big"),
        created_at=1_900_000_000_000,
    )


def ms(nbytes: float) -> int:
    return math.ceil(nbytes * 1000 / ASSUMED_RATE)


def test_a_lone_job_bears_the_fetch_of_each_blob_it_lacks_once() -> None:
    module, model, small = b"\x00asm\x01\x00\x00\x00", b"m" * 3_000_000, b"small"
    job = manifest_of(module, model, model, small)  # the model named twice is one blob
    key = job.job_id.raw
    assert blob_sizes(job) == {blob_ref(d).root.raw: len(d) for d in (module, model, small)}
    held = {blob_ref(model).root.raw}
    rate = FetchRate()
    assert rate.rate == ASSUMED_RATE and rate.measured == 0
    assert fetch_shares([job], lambda root: True, rate, cores=1) == {key: 0}
    # the module and the small input are under COUNTED_MIN_BYTES: a round trip or two, not counted
    assert fetch_shares([job], held.__contains__, rate, cores=1) == {key: 0}
    every = fetch_shares([job], lambda root: False, rate, cores=4)[key]
    assert every == ms(len(model))
    big = b"b" * COUNTED_MIN_BYTES
    both = manifest_of(module, model, big)
    assert fetch_shares([both], held.__contains__, rate, cores=1) == {both.job_id.raw: ms(len(big))}


def test_jobs_sharing_a_blob_share_its_fetch_once_per_core() -> None:
    model, other = b"m" * 2_500_000, b"o" * 1_250_000
    jobs = [manifest_of(b"\x00asm", model, nonce=i) for i in range(6)] + [manifest_of(b"\x00asm", other)]
    module_root = jobs[0].module.root.raw
    lacks = {blob_ref(model).root.raw, blob_ref(other).root.raw}

    def has(root: bytes) -> bool:
        return root == module_root or root not in lacks

    rate = FetchRate()
    one_core = fetch_shares(jobs, has, rate, cores=1)
    # six jobs one after another on one core: each bears a sixth of the model's 2 s; the lone one all 1 s
    assert [one_core[j.job_id.raw] for j in jobs] == [ms(2_500_000 / 6)] * 6 + [1000]
    two_cores = fetch_shares(jobs, has, rate, cores=2)
    assert [two_cores[j.job_id.raw] for j in jobs] == [ms(2_500_000 / 3)] * 6 + [1000]
    tasks = [Task(j.job_id.raw, b"s", j.deadline, 5000) for j in jobs]
    charged = with_fetches(tasks, jobs, has, rate, cores=1)
    assert [t.estimate_ms for t in charged] == [5000 + one_core[t.key] for t in tasks]
    assert [(t.key, t.deadline) for t in charged] == [(t.key, t.deadline) for t in tasks]


def test_the_rate_is_measured_from_large_fetches_only() -> None:
    rate = FetchRate()
    rate.observe(MEASURED_MIN_BYTES - 1, 100.0)  # mostly round trips: says nothing of the bandwidth
    rate.observe(10_000_000, 0.0)
    assert rate.rate == ASSUMED_RATE and rate.measured == 0
    rate.observe(10_000_000, 0.1)
    assert rate.rate == 100_000_000 and rate.measured == 1  # the first measurement replaces the guess
    rate.observe(10_000_000, 1.0)
    assert 10_000_000 < rate.rate < 100_000_000 and rate.measured == 2  # then a moving average
    rate.observe(MEASURED_MIN_BYTES, 10**9)
    assert rate.rate >= MIN_RATE


async def test_the_node_holding_the_model_bids_earlier_and_wins(
    nursery: trio.Nursery, net: Net, node: Callable[[str, int], RealNode]
) -> None:
    # the holder's key sorts after the other's, so neither the key nor a tie decides for it
    submitter, other, holder = node("submitter", 1), node("other", 2), node("holder", 3)
    if holder.id < other.id:
        other, holder = holder, other
    model = MODEL.read_bytes()
    submitter.blobs.put(model)
    holder.blobs.put(model)  # as if a job of the same batch had brought it earlier
    bids = record_bids(net, submitter.id)
    await start(nursery, submitter, other, holder)
    job = with_inputs(submitter.manifest(("1", "1000")), **{"model.bin": model})
    await submitter.submitter.submit(job)
    row = await wait_state(submitter, job.job_id.raw, "done")
    assert row.executor == str(NodeId(holder.id))
    by = {b.executor.raw: b for b in bids if b.item(job.job_id) is not None}
    assert set(by) == {other.id, holder.id}

    def held_for(b: Bid) -> int:
        item = b.item(job.job_id)
        assert item is not None
        return item.expected_finish - item.expected_start

    # the same run estimate on both (neither has run a job), the other's plus the model's fetch
    module = job.module.size
    extra = math.ceil((module + len(model)) * 1000 / ASSUMED_RATE) - math.ceil(module * 1000 / ASSUMED_RATE)
    assert held_for(by[other.id]) - held_for(by[holder.id]) == extra
    assert by[holder.id].held == (blob_ref(model).root,)
    assert holder.transfer.rate.measured == 0  # it fetched only the small module


async def test_a_fetch_of_the_model_is_measured(
    nursery: trio.Nursery, net: Net, node: Callable[[str, int], RealNode]
) -> None:
    submitter, executor = node("submitter", 1), node("executor", 2)
    model = MODEL.read_bytes()
    submitter.blobs.put(model)
    await start(nursery, submitter, executor)
    job = with_inputs(submitter.manifest(("1", "1000")), **{"model.bin": model})
    await submitter.submitter.submit(job)
    await wait_state(submitter, job.job_id.raw, "done")
    assert executor.blobs.has(blob_ref(model).root.raw)
    assert executor.transfer.rate.measured == 1 and executor.transfer.rate.rate >= MIN_RATE
