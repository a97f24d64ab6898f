"""The meter through the real job path (stores, sandbox workers, on the in-memory net): the executor
signs a version 2 receipt whose meter records the time it spent fetching the job's blobs and the time
the run was paused for the machine's owner; neither is in the billed compute time."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from e31.node.market.transfer import BlobTransfer
from e31.node.store.db import Store
from e31.protocol.blobs import BlobRef
from e31.protocol.envelope import reopen_stored
from e31.protocol.receipts import METER_SLACK_MS, UsageReceipt, meter_overrun_ms
from market_nodes import Net, RealNode, start, wait_state

FETCH_DELAY = 0.3
PAUSE = 0.5


async def receipt_of(node: RealNode, job_id: bytes) -> UsageReceipt:
    (row,) = await node.store.run(Store.receipts_for_job, job_id)
    stored = await node.store.run(Store.envelope, row.message_id)
    assert stored is not None
    return reopen_stored(stored.raw, UsageReceipt).message


async def test_the_receipt_meters_the_fetch_and_the_pause_and_bills_neither(
    net: Net, nursery: trio.Nursery, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    await start(nursery, a, b)
    real_fetch = BlobTransfer.fetch

    async def slow_fetch(self: BlobTransfer, peer: bytes, ref: BlobRef) -> None:
        await trio.sleep(FETCH_DELAY)  # a slow link to the submitter
        await real_fetch(self, peer, ref)

    monkeypatch.setattr(BlobTransfer, "fetch", slow_fetch)
    scheduler = b.executor.scheduler
    real_start = scheduler.execute

    async def pause_once_started(*args: object, **kw: object) -> object:
        on_start = kw.get("on_start")

        def started(at: int) -> object:
            nursery.start_soon(owner_returns)
            return on_start(at) if callable(on_start) else None

        kw["on_start"] = started
        return await real_start(*args, **kw)  # type: ignore[arg-type]

    async def owner_returns() -> None:
        scheduler.suspend()
        await trio.sleep(PAUSE)
        scheduler.resume()

    monkeypatch.setattr(scheduler, "execute", pause_once_started)
    job_id = await a.submitter.submit(a.manifest(("1", "30000000"), deadline_s=120))
    await wait_state(a, job_id, "done", 60)
    r = await receipt_of(a, job_id)
    assert r.version == 2 and r.meter is not None and r.executor.raw == b.id
    assert r.meter.fetch_ms >= FETCH_DELAY * 1000 * 0.9
    assert PAUSE * 1000 * 0.9 <= r.meter.paused_ms <= r.finished_at - r.started_at
    # the billed compute is the guest's own time: the pause is not in it (an auditor notes nothing)
    assert meter_overrun_ms(r) <= METER_SLACK_MS
