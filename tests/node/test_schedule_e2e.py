"""The queue keeps its promises, through real `e31 node run` processes on 127.0.0.1: one executor with
`--cores 1` and two submit-only nodes (`--cores 0`) beside it.

- Overload: six jobs of about 2.4 s (sized by fuel from the executor's own calibrated rate) with a 7 s
  deadline, offered at once. Every job ends done by its deadline, or expired/failed with a reason; the
  executor starts no job after its deadline (read from its store through its API), and signs no
  receipt for a job it never started.
- Two submitters offering at once get interleaved service: neither waits behind the other's whole batch
  (asserted on the executor's start order).

The machine is shared and slow: the tests assert these invariants, never timings.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from test_jobs_e2e import MONTECARLO, Node, wait_for

ENDED = ("done", "failed", "expired", "cancelled", "disputed")


@pytest.fixture(scope="module")
def trio_of_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Node, Node, Node]]:
    tmp = tmp_path_factory.mktemp("sched")
    nodes: list[Node] = []
    try:
        x = Node(tmp / "x")  # --cores 1 (the helper's default)
        nodes.append(x)
        for name in ("s1", "s2"):
            nodes.append(Node(tmp / name, "--bootstrap", x.address, "--cores", "0"))
        s1, s2 = nodes[1], nodes[2]
        for s in (s1, s2):
            wait_for(f"{s.data_dir.name} to link to the executor", lambda s=s: x.node_id in s.connected())
        yield x, s1, s2
    finally:
        for node in nodes:
            node.stop()


def post(node: Node, samples: int, fuel: int, deadline_s: float, seed: int) -> str:
    body = {
        "module": str(MONTECARLO),
        "args": [str(seed), str(samples)],
        "limits": {"fuel": fuel},
        "deadline": int((time.time() + deadline_s) * 1000),
    }
    job_id: str = node.api.post("/v1/jobs", body)["job_id"]
    return job_id


def ended(node: Node, job_id: str) -> dict[str, Any] | None:
    doc: dict[str, Any] = node.api.get(f"/v1/jobs/{job_id}")
    return doc if doc["state"] in ENDED else None


def calibrate(x: Node, s: Node) -> float:
    """Run one job on the executor so it measures its fuel rate; the fuel per sample of montecarlo."""
    samples = 20_000_000
    job_id = post(s, samples, 10**11, 600, seed=1)
    doc = wait_for("the calibration job", lambda: ended(s, job_id), 180)
    assert doc["state"] == "done", doc
    return float(doc["fuel_used"]) / samples


def executor_rows(x: Node, ids: list[str]) -> list[dict[str, Any]]:
    return [j for j in x.api.get("/v1/jobs?role=executor") if j["job_id"] in ids]


def test_the_six_job_overload_ends_every_job_on_time_or_with_a_reason(
    trio_of_nodes: tuple[Node, Node, Node],
) -> None:
    x, s1, _ = trio_of_nodes
    per_sample = calibrate(x, s1)
    # the rate the executor measured from that run: fuel over the time the run held its core
    (run,) = [j for j in x.api.get("/v1/jobs?role=executor") if j["state"] == "done"]
    rate = run["fuel_used"] / max(run["finished"] - run["started"], 0.001)
    fuel = int(2.4 * rate)
    samples = int(fuel / per_sample)
    with ThreadPoolExecutor(6) as pool:
        ids = list(pool.map(lambda i: post(s1, samples, int(fuel * 1.1), 7.0, seed=100 + i), range(6)))
    docs = [wait_for(f"job {j[:12]} to end", lambda j=j: ended(s1, j), 180) for j in ids]

    for doc in docs:
        if doc["state"] == "done":
            assert doc["succeeded"] and doc["finished"] <= doc["deadline"], doc
        else:
            assert doc["state"] in ("expired", "failed") and doc["reason"], doc
    # the executor never started a job after its deadline, and metered only what it started
    for row in executor_rows(x, ids):
        if row["started"] is not None:
            assert row["started"] <= row["deadline"], row
        if row["state"] == "done":
            assert row["started"] is not None and row["fuel_used"]
        else:
            assert row["state"] in ("failed", "cancelled") and row["reason"], row
            assert "receipt" not in row, row
    done = sum(d["state"] == "done" for d in docs)
    refused = [d for d in docs if d["state"] != "done"]
    print(f"\nsix-job overload: {done} done on time, {len(refused)} ended with a reason:")
    for d in refused:
        print(f"  {d['state']}: {d['reason']}")


def test_two_submitters_offering_at_once_are_served_in_turn(
    trio_of_nodes: tuple[Node, Node, Node], tmp_path: Path
) -> None:
    """Two submitters of equal standing: new ones, since the executor's fair order counts each
    submitter's fuel of the last minutes (a half-life of 10 min): s1, with the runs of the test before
    on its account, is rightly served after all eight of a new submitter's jobs."""
    x, s1, _ = trio_of_nodes
    per_sample = calibrate(x, s1)
    fresh: list[Node] = []
    try:
        for name in ("s3", "s4"):
            fresh.append(Node(tmp_path / name, "--bootstrap", x.address, "--cores", "0"))
        for s in fresh:
            wait_for(f"{s.data_dir.name} to link to the executor", lambda s=s: x.node_id in s.connected())
        serve_two(x, fresh[0], fresh[1], per_sample)
    finally:
        for node in fresh:
            node.stop()


def serve_two(x: Node, s1: Node, s2: Node, per_sample: float) -> None:
    samples = int(4_000_000_000 / per_sample)  # a few tenths of a second each

    def batch(s: Node, seed: int) -> list[str]:
        return [post(s, samples, 10**10, 600, seed=seed + i) for i in range(8)]

    with ThreadPoolExecutor(2) as pool:
        a, b = pool.map(batch, (s1, s2), (1000, 2000))
    for s, ids in ((s1, a), (s2, b)):
        for j in ids:
            doc = wait_for(f"job {j[:12]} to end", lambda s=s, j=j: ended(s, j), 300)
            assert doc["state"] == "done", doc
    rows = sorted(executor_rows(x, a + b), key=lambda r: (r["started"], r["job_id"]))
    order = "".join("A" if r["job_id"] in a else "B" for r in rows)
    print(f"\nstart order on the executor: {order}")
    assert len(order) == 16
    # neither submitter waited behind the other's whole batch: each started a job before the other's last
    assert order.index("A") < order.rindex("B") and order.index("B") < order.rindex("A"), order
