"""The submitter's side of fault tolerance, through real node processes on 127.0.0.1: hand-off and a
submitter that goes away after it and comes back to every result; a deadline too short to meet ending
`expired` with its reason; `e31 cancel`; replicas.

The node processes, their flags and the helpers are those of test_jobs_e2e.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_jobs_e2e import MONTECARLO, ROOT, Node, e31, wait_for

ECHO = ROOT / "sandbox" / "workloads" / "echo.wasm"
TERMINAL = ("done", "failed", "expired", "cancelled", "disputed")
LONG = {"module": str(MONTECARLO), "args": ["5", "2000000000"], "limits": {"fuel": 400_000_000_000}}
"""A job that runs for minutes: cancelled or outlived in these tests, never awaited."""


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Node]]:
    tmp = tmp_path_factory.mktemp("pair")
    nodes: list[Node] = []
    try:
        nodes.append(Node(tmp / "a"))
        nodes.append(Node(tmp / "b", "--bootstrap", nodes[0].address))
        wait_for("the link", lambda: nodes[0].connected() == {nodes[1].node_id})
        yield nodes
    finally:
        for node in nodes:
            node.stop()


def job(node: Node, job_id: str) -> dict[str, Any]:
    doc: dict[str, Any] = node.api.get(f"/v1/jobs/{job_id}")
    return doc


def ended(node: Node, job_id: str) -> dict[str, Any] | None:
    doc = job(node, job_id)
    return doc if doc["state"] in TERMINAL else None


def test_a_deadline_too_short_to_meet_ends_expired_with_its_reason(pair: list[Node]) -> None:
    a = pair[0]
    cli = e31(
        "submit", str(MONTECARLO), "--fuel", "400G", "--deadline", "3s", "--", "1", "9", data_dir=a.data_dir
    )
    assert cli.returncode == 0, cli.stderr
    job_id = cli.stdout.split()[-1]
    doc = wait_for("the job to expire", lambda: ended(a, job_id))
    assert doc["state"] == "expired"
    assert "deadline passed" in doc["reason"] and "deadline:" in doc["reason"], doc["reason"]
    assert not doc["succeeded"] and not doc["handed_off"]
    waited = e31("wait", job_id, "--timeout", "5", data_dir=a.data_dir)
    assert waited.returncode == 1 and "expired" in waited.stdout


def test_cancel_withdraws_a_running_job_and_its_executor_stops_it(pair: list[Node]) -> None:
    a = pair[0]
    job_id = a.api.post("/v1/jobs", LONG)["job_id"]
    assigned = wait_for("the job to be handed off", lambda: job(a, job_id)["handed_off"] or None)
    assert assigned
    executor = next(n for n in pair if n.node_id == job(a, job_id)["executor"])
    wait_for("the job to run", lambda: _executed(executor, job_id) == "running")

    cancelled = e31("cancel", job_id[:12], "--reason", "not needed", data_dir=a.data_dir)
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.strip() == f"cancelled job {job_id}"
    doc = job(a, job_id)
    assert doc["state"] == "cancelled" and doc["reason"] == "cancelled by its submitter: not needed"
    wait_for("the executor to stop the job", lambda: _executed(executor, job_id) not in ("running", "queued"))

    again = e31("cancel", job_id, data_dir=a.data_dir)
    assert again.returncode == 0 and again.stdout.strip() == f"job {job_id} had already ended: cancelled"
    unknown = e31("cancel", "0" * 64, data_dir=a.data_dir)
    assert unknown.returncode == 1 and "no job" in unknown.stderr and "Traceback" not in unknown.stderr
    listed = e31("jobs", job_id, data_dir=a.data_dir)
    assert "cancelled" in listed.stdout and "HANDOFF" in listed.stdout


def _executed(node: Node, job_id: str) -> str | None:
    for j in node.api.get("/v1/jobs?role=executor"):
        if j["job_id"] == job_id:
            state: str = j["state"]
            return state
    return None


def test_a_submitter_stopped_after_hand_off_gets_every_result_when_back(tmp_path: Path) -> None:
    """Jobs handed off (`e31 submit --wait-handoff`), the submitter stopped while they run and
    started again once they have finished: every result reaches it, verified."""
    a = Node(tmp_path / "a")
    b = None
    try:
        b = Node(tmp_path / "b", "--bootstrap", a.address)
        wait_for("the link", lambda: a.connected() == {b.node_id})
        lines = "".join(json.dumps({"args": [str(seed), "40000000"]}) + "\n" for seed in range(6))
        (tmp_path / "sweep.jsonl").write_text(lines)
        cli = e31(
            "submit",
            str(MONTECARLO),
            "--batch",
            str(tmp_path / "sweep.jsonl"),
            "--fuel",
            "50G",
            "--wait-handoff",
            "--handoff-timeout",
            "60",
            data_dir=a.data_dir,
        )
        assert cli.returncode == 0, cli.stdout + cli.stderr
        assert "safe to stop this node" in cli.stdout
        batch = cli.stdout.split()[-1]
        ids = [j["job_id"] for j in a.api.get(f"/v1/batches/{batch}?brief=1")["jobs"]]
        remote = [j for j in ids if job(a, j)["executor"] == b.node_id]
        assert remote, "no job went to the other node"
        a.stop()
        assert a.proc.returncode == 0
        wait_for(
            "the executor to finish while the submitter is away",
            lambda: all(_executed(b, j) == "done" for j in remote),
            deadline=60.0,
        )
        a = Node(tmp_path / "a")
        waited = e31("wait", batch, "--timeout", "60", data_dir=a.data_dir)
        assert waited.returncode == 0, waited.stdout + waited.stderr
        docs = [job(a, j) for j in ids]
        assert all(d["state"] == "done" and d["succeeded"] for d in docs)
        assert {d["executor"] for d in docs if d["job_id"] in remote} == {b.node_id}
    finally:
        a.stop()
        if b is not None:
            b.stop()


def test_replicas_on_distinct_nodes_agree(pair: list[Node]) -> None:
    a, b = pair
    cli = e31(
        "submit", str(MONTECARLO), "--replicas", "2", "--fuel", "5G", "--", "3", "100000", data_dir=a.data_dir
    )
    assert cli.returncode == 0, cli.stderr
    job_id = cli.stdout.split()[-1]
    doc = wait_for("the replicas to agree", lambda: ended(a, job_id))
    assert doc["state"] == "done" and doc["succeeded"], doc
    ran = {n.node_id: _executed(n, job_id) for n in pair}
    assert ran == {a.node_id: "done", b.node_id: "done"}  # once on each node


def test_a_lying_executor_among_replicas_makes_the_job_disputed(
    pair: list[Node], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = pair
    with monkeypatch.context() as mp:
        mp.setenv("E31_TEST_CORRUPT_OUTPUT", "1")  # this node claims one fuel more than it used
        liar = Node(tmp_path / "liar", "--bootstrap", a.address)
    try:
        wait_for("the liar to link", lambda: liar.connected() == {a.node_id, b.node_id})
        wait_for("the others to see it", lambda: liar.node_id in a.connected())
        job_id = a.api.post("/v1/jobs", {"module": str(MONTECARLO), "args": ["4", "100000"], "replicas": 3})[
            "job_id"
        ]
        doc = wait_for("the replicas to be compared", lambda: ended(a, job_id))
        assert doc["state"] == "disputed" and not doc["succeeded"], doc
        assert doc["reason"].startswith("replicas disagree: ") and liar.node_id[:16] in doc["reason"]
        waited = e31("wait", job_id, "--timeout", "5", data_dir=a.data_dir)
        assert waited.returncode == 1 and "disputed" in waited.stdout

        # Every signed receipt is kept as evidence; an auditor with the bundle sees the dispute.
        bundle = tmp_path / "evidence.e31b"
        exported = e31("receipts", "export", "--job", job_id, "--out", str(bundle), data_dir=a.data_dir)
        assert exported.returncode == 0, exported.stderr
        audit = e31("audit", str(bundle), "--json")
        report = json.loads(audit.stdout)
        assert audit.returncode == 1 and not report["sound"]
        disputes = [f for f in report["problems"] if f["check"] == "dispute"]
        assert disputes and all(f["job"] == job_id for f in disputes), report["problems"]
        assert any(liar.node_id in (f["node"], f["what"]) or liar.node_id in f["what"] for f in disputes)
    finally:
        liar.stop()
