"""A submitter that comes back collects before it reassigns (issue 22), with real node processes on
127.0.0.1: the submitter is stopped right after hand-off, its executors finish the jobs while it is
away, their leases run out, and it starts again. It must take in the results they hold, not offer the
jobs again: no job runs twice (counted from the executors' own stores), and every receipt ends
acknowledged. And in memory: a result whose outputs cannot be fetched at once waits, it is not refused.

Leases are made short for the test (E31_TEST_MARKET_TIMING: a lease slack of 1 s), and so is the
returning submitter's wait for an executor that is gone; every wait here is on state, bounded.
"""

from __future__ import annotations

import signal
import sqlite3
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from e31.protocol.assignments import assignments
from e31.protocol.envelope import verify
from test_jobs_e2e import MONTECARLO, Node, wait_for

TIMING = "lease_slack_ms=1000,collect_wait=20,delivery_interval=15"
"""Short leases, and executors that retry a delivery only every 15 s (as after a long absence, when
their backed-off retries are far apart). Before a returning submitter collected, this test failed:
it offered every job again at once, and each ran a second time (attempt 2)."""

FAST = ("--capacity-interval", "0.2", "--capacity-raise-after", "0", "--idle-seconds", "0")
JOBS = 11


def rows(node: Node, sql: str, *params: object) -> list[tuple[Any, ...]]:
    with sqlite3.connect(f"file:{node.data_dir / 'node.sqlite'}?mode=ro", uri=True, timeout=30) as db:
        return db.execute(sql, params).fetchall()


def receipts(node: Node, jobs: set[str]) -> list[tuple[str, int, bool]]:
    """(job id, attempt, acknowledged) of each receipt this executor signed for one of `jobs`."""
    found = rows(node, "SELECT job_id, attempt, delivered FROM receipts WHERE executor = ?", node.node_id)
    return [(bytes(j).hex(), a, d is not None) for j, a, d in found if bytes(j).hex() in jobs]


def leases(node: Node) -> list[int]:
    """The lease expiry (ms) of every assignment the node signed."""
    raws = rows(node, "SELECT raw FROM envelopes WHERE kind IN ('assign', 'assigns')")
    return [a.lease_expires for (raw,) in raws for a in assignments(verify(bytes(raw)))]


def executor_state(node: Node, job: str) -> str | None:
    for row in node.api.get("/v1/jobs?role=executor"):
        if row["job_id"] == job:
            state: str = row["state"]
            return state
    return None


@pytest.fixture
def nodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Node]]:
    """`a` submits and runs nothing (an owner at work for good); `b` and `c` run its jobs."""
    monkeypatch.setenv("E31_TEST_MARKET_TIMING", TIMING)
    busy = tmp_path / "busy"
    busy.write_text("8")
    made: dict[str, Node] = {}
    try:
        monkeypatch.setenv("E31_TEST_OWNER_LOAD_FILE", str(busy))
        made["a"] = Node(tmp_path / "a", "--only-when-idle", *FAST)
        monkeypatch.delenv("E31_TEST_OWNER_LOAD_FILE")
        for name in "bc":
            made[name] = Node(tmp_path / name, *FAST, "--bootstrap", made["a"].address)
        for node in made.values():
            others = {n.node_id for n in made.values() if n is not node}
            wait_for(f"{node.data_dir.name} to link", lambda n=node, o=others: n.connected() >= o)
        yield made
    finally:
        for node in made.values():
            node.stop()


def test_a_submitter_back_after_its_leases_ran_out_collects_and_runs_nothing_twice(
    nodes: dict[str, Node], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, executors = nodes["a"], [nodes["b"], nodes["c"]]
    jobs = [
        a.api.post(
            "/v1/jobs",
            {
                "module": str(MONTECARLO),
                "args": [str(seed), "4000000"],
                "limits": {"fuel": 1_000_000_000, "timeout": 10},
            },
        )["job_id"]
        for seed in range(JOBS)
    ]

    def held() -> bool:  # every job handed off: an executor holds it
        return all(any(executor_state(e, j) is not None for e in executors) for j in jobs)

    wait_for("every job to be handed off", held, deadline=90)
    a.proc.send_signal(signal.SIGTERM)
    a.proc.wait(timeout=60)
    states = dict(rows(a, "SELECT job_id, state FROM jobs WHERE role = 'submitter'"))
    finished_before = {j for j in jobs if states.get(bytes.fromhex(j)) == "done"}

    def all_run() -> bool:
        return all(any(executor_state(e, j) == "done" for e in executors) for j in jobs)

    wait_for("the executors to finish every job while the submitter is away", all_run, deadline=120)
    last_lease = max(leases(a))
    wait_for("every lease to run out", lambda: time.time() * 1000 > last_lease + 500, deadline=120)
    away = set(jobs) - finished_before
    assert away, "every job was done before the submitter stopped: nothing to collect"

    monkeypatch.setenv("E31_TEST_OWNER_LOAD_FILE", str(tmp_path / "busy"))
    nodes["a"] = a = Node(a.data_dir, "--only-when-idle", *FAST)  # (same data dir: the same node)

    def done() -> list[dict[str, Any]] | None:
        docs = [a.api.get(f"/v1/jobs/{j}") for j in jobs]
        return docs if all(d["state"] == "done" for d in docs) else None

    docs = wait_for("the returning submitter to collect every job", done, deadline=120)
    assert all(d["succeeded"] and d["attempt"] == 1 for d in docs), [
        (d["job_id"][:8], d["state"], d["attempt"]) for d in docs
    ]
    signed = Counter((j, n) for e in executors for j, n, _ in receipts(e, set(jobs)))
    assert set(signed) == {(j, 1) for j in jobs}, signed  # one run each, the first assignment's
    assert max(signed.values()) == 1, signed

    def acknowledged() -> bool:
        return all(acked for e in executors for _, _, acked in receipts(e, set(jobs)))

    wait_for("every receipt to be acknowledged", acknowledged, deadline=60)


async def test_a_result_whose_outputs_cannot_be_fetched_for_now_waits_and_the_job_runs_once(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    """In memory (market_nodes): the result that carried the outputs is lost, and when the next one
    comes (it carries none) the link to the executor is gone at the moment the submitter asks for
    them. That says nothing against the outcome: the job waits for the next delivery and is done with
    its first run, not failed nor offered again (the chaos run caught a finished job run twice so)."""
    from e31.node.store.db import Store
    from e31.protocol.envelope import verify as open_env
    from market_nodes import Net, RealNode, start, wait_state

    net = Net()
    net.nursery = nursery
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    to_a = net.handlers[a.id]
    results: list[int] = []

    async def lose_the_first_result(peer: bytes, raw: bytes) -> None:
        if open_env(raw).kind == "results":
            results.append(len(results))
            if len(results) == 1:
                return
        await to_a(peer, raw)

    net.handlers[a.id] = lose_the_first_result
    link_down_for: list[int] = []
    send = a.ctx.peer_send
    assert send is not None

    async def no_link_for_the_first_fetch(peer: bytes, raw: bytes) -> bool:
        if open_env(raw).kind == "blobreq" and not link_down_for:
            link_down_for.append(1)
            return False
        return await send(peer, raw)

    a.ctx.peer_send = no_link_for_the_first_fetch
    await start(nursery, a, b)
    job_id = await a.submitter.submit(a.manifest(("4", "1000")))
    row = await wait_state(a, job_id, "done")
    assert link_down_for and len(results) >= 3  # lost, failed to fetch, taken
    assert row.attempt == 1
    signed = await b.store.run(Store.receipts_for_job, job_id)
    assert [r.attempt for r in signed] == [1]
