"""An executor never signs a receipt over input bytes it did not check: a copy damaged on its disk is
found before the run, quarantined and fetched again from the submitter, and the job's output is the one
the true input gives. Two job paths (real stores, blob files and sandbox workers) on the in-memory net."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import trio
from e31.node.market.inputs import inputs_unchanged
from e31.node.market.outputs import JobFailed
from e31.node.store.blobs import BlobStore
from e31.node.store.db import Store
from e31.protocol.blobs import blob_ref
from e31.protocol.envelope import verify
from e31.protocol.ids import Digest, NodeId
from e31.protocol.jobs import JobManifest, Limits
from e31.protocol.receipts import UsageReceipt
from e31.sandbox.profile import PROFILE
from market_nodes import WORKLOADS, Net, RealNode, start, wait_state, wall_ms

DATA = bytes((i * 131 + 7) % 251 for i in range(307 * 1024))


async def _stdout_of(node: RealNode, job_id: bytes) -> bytes:
    """The stdout root of the job's verified receipt, as the submitter holds it."""
    (row,) = await node.store.run(Store.receipts_for_job, job_id)
    env = await node.store.run(Store.envelope, row.message_id)
    assert env is not None
    return verify(bytes(env.raw), UsageReceipt).message.stdout.root.raw


async def test_a_damaged_input_on_the_executor_is_fetched_again_not_used(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)  # b runs a's jobs
    await start(nursery, a, b)
    stdin = blob_ref(DATA)
    a.blobs.put(DATA)
    first = dataclasses.replace(a.manifest((), workload="echo"), stdin=stdin)
    await a.submitter.submit(first)
    await wait_state(a, first.job_id.raw, "done")
    assert await _stdout_of(a, first.job_id.raw) == stdin.root.raw  # echo copies stdin to stdout

    copy = b.blobs.path(stdin.root.raw)  # the executor's cached copy: five bytes change on its disk
    damaged = bytearray(copy.read_bytes())
    damaged[200_000:200_005] = b"XXXXX"
    copy.write_bytes(bytes(damaged))
    second = dataclasses.replace(a.manifest((), workload="echo"), stdin=stdin)
    await a.submitter.submit(second)
    await wait_state(a, second.job_id.raw, "done")
    assert await _stdout_of(a, second.job_id.raw) == stdin.root.raw, "signed over the true bytes"
    assert b.blobs.read(stdin.root.raw) == DATA
    assert list((b.blobs.root / "quarantine").iterdir()), "the damaged copy is kept aside"


def test_an_input_written_during_the_run_fails_the_job_instead_of_being_signed(tmp_path: Path) -> None:
    blobs = BlobStore(tmp_path / "blobs")
    blobs.put(DATA)
    module = blob_ref((WORKLOADS / "echo.wasm").read_bytes())
    now = wall_ms()
    manifest = JobManifest(
        module=module,
        inputs=(),
        args=(),
        env=(),
        stdin=blob_ref(DATA),
        limits=Limits(10**9, 64 << 20, 30_000, 1 << 20),
        deadline=now + 60_000,
        retention_ms=60_000,
        replicas=1,
        profile=Digest(PROFILE.digest),
        submitter=NodeId(bytes(32)),
        nonce=bytes(16),
        created_at=now,
    )
    path = blobs.checked_path(blob_ref(DATA).root.raw)  # checked before the run
    inputs_unchanged(blobs, manifest)
    os.utime(path)  # the file is touched while the sandbox reads it
    with pytest.raises(JobFailed, match="changed on disk during the run"):
        inputs_unchanged(blobs, manifest)


async def test_a_job_whose_own_input_is_corrupt_on_its_submitter_fails_at_once_with_the_reason(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)  # b runs a's jobs
    await start(nursery, a, b)
    stdin = blob_ref(DATA)
    a.blobs.put(DATA)
    copy = a.blobs.path(stdin.root.raw)  # the submitter's only copy: the file was damaged on its disk
    damaged = bytearray(copy.read_bytes())
    damaged[-1] ^= 0xFF
    copy.write_bytes(bytes(damaged))
    job = dataclasses.replace(a.manifest((), workload="echo", deadline_s=600.0), stdin=stdin)
    await a.submitter.submit(job)
    # b asks a for the blob; a finds its copy corrupt, quarantines it, and ends the job now (not in 600 s)
    row = await wait_state(a, job.job_id.raw, "failed")
    assert "corrupt on this node" in row.reason and stdin.root.hex() in row.reason
    assert not a.blobs.has(stdin.root.raw)
    assert list((a.blobs.root / "quarantine").iterdir())
    assert await a.store.run(Store.receipts_for_job, job.job_id.raw) == []
