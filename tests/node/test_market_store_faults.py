"""A store write that fails (a full disk) ends the one job it was for, never the node: the role's other
and later jobs go on. Two job paths (real stores and sandbox workers) on the in-memory net."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio
from e31.node.market.executor import Executor
from e31.node.market.submitter import Submitter
from e31.node.store.connection import DiskFull
from e31.node.store.db import Store
from market_nodes import Net, RealNode, start, wait_state


async def test_an_executor_job_whose_state_cannot_be_stored_does_not_stop_the_node(
    net: Net, nursery: trio.Nursery, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first run any executor starts hits the fault, whichever of the two jobs it is (the order
    in which an executor takes up a set's assignments is not fixed). The other job goes on, and the
    job hit is given back at once (a `release`, reason `other`), so it runs on the other executor
    instead of waiting out its lease and deadline."""
    a = RealNode(net, tmp_path, "a", 1)
    b, c = RealNode(net, tmp_path, "b", 2), RealNode(net, tmp_path, "c", 3)
    await start(nursery, a, b, c)
    real_run, failed = Executor._run, []

    async def full_once(self: Executor, job_id: bytes, *args: object) -> None:
        if not failed:
            failed.append(job_id)
            raise DiskFull(f"{tmp_path}: the disk is full")
        await real_run(self, job_id, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(Executor, "_run", full_once)
    first = await a.submitter.submit(a.manifest(("1", "1000")))
    later = await a.submitter.submit(a.manifest(("2", "1000")))
    for job_id in (first, later):
        await wait_state(a, job_id, "done")  # both ran: the executors' markets still run
    (hit,) = failed
    row = await a.job(hit)
    assert row.attempt >= 2, row  # assigned again after the release, to the other executor
    given_back = [await n.store.run(Store.job, hit, "executor") for n in (b, c)]
    assert any(r is not None and r.state == "failed" and "cannot be stored" in r.reason for r in given_back)


async def test_a_submitted_job_whose_state_cannot_be_stored_does_not_stop_the_node(
    net: Net, nursery: trio.Nursery, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    await start(nursery, a, b)
    real_rounds, failed = Submitter._rounds, []

    async def full_once(self: Submitter, job_id: bytes, *args: object) -> None:
        if not failed:
            failed.append(job_id)
            raise DiskFull(f"{tmp_path}: the disk is full")
        await real_rounds(self, job_id, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(Submitter, "_rounds", full_once)
    first = await a.submitter.submit(a.manifest(("1", "1000")))
    later = await a.submitter.submit(a.manifest(("2", "1000")))
    await wait_state(a, later, "done")
    assert failed == [first] and (await a.job(first)).state == "queued"  # taken up again at a start
