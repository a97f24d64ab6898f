"""Re-planning through real `e31 node run` processes on 127.0.0.1: an executor falls behind its promise
and the submitter moves the queued job to another node.

`s` submits and runs nothing (`--cores 0`); `x` has one core and runs only while its (synthetic) owner
is away. A long job holds x's core, and the job under test is queued behind it, promised for after the
long job's estimated end. Then x's owner comes back: x suspends, and the queued job waits past its
promise. A second executor `y` joins. The submitter, with no result by the promised finish and its
grace, withdraws the assignment; x gives the job back (`release`, reason `withdrawn`) without ever
starting it, and y runs it: the job ends `done`, before its deadline, and its receipts pass `e31 audit`.
Every wait is on state; nothing here is timed.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from e31.node.market.taken_back import WITHDRAWN_TEXT
from test_jobs_e2e import MONTECARLO, Node, e31, wait_for

OWNER_AWAY = (
    "--only-when-idle",
    "--capacity-interval",
    "0.2",
    "--capacity-raise-after",
    "0",
    "--idle-seconds",
    "0",
)
BUSY = "64"
"""Owner load, in cores, that keeps any machine busy (capped at its core count)."""
START = 120.0
"""Seconds a node may take to start on a loaded host (a bound, not a figure)."""


def post(node: Node, args: list[str], limits: dict[str, int], deadline_s: float) -> str:
    body = {
        "module": str(MONTECARLO),
        "args": args,
        "limits": limits,
        "deadline": int((time.time() + deadline_s) * 1000),
    }
    job_id: str = node.api.post("/v1/jobs", body)["job_id"]
    return job_id


def executor_row(node: Node, job_id: str) -> dict[str, Any] | None:
    return next((j for j in node.api.get("/v1/jobs?role=executor") if j["job_id"] == job_id), None)


def in_state(node: Node, job_id: str, state: str) -> dict[str, Any] | None:
    row = executor_row(node, job_id)
    return row if row is not None and row["state"] == state else None


def test_a_job_queued_at_an_executor_that_falls_behind_is_moved_and_done_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    load = tmp_path / "owner-load"
    load.write_text("0")
    nodes: list[Node] = []
    try:
        monkeypatch.setenv("E31_TEST_OWNER_LOAD_FILE", str(load))
        x = Node(tmp_path / "x", *OWNER_AWAY, start_deadline=START)
        nodes.append(x)
        monkeypatch.delenv("E31_TEST_OWNER_LOAD_FILE")  # the others: an owner who never works
        s = Node(tmp_path / "s", "--bootstrap", x.address, "--cores", "0", start_deadline=START)
        nodes.append(s)
        wait_for("s to link to x", lambda: x.node_id in s.connected(), START)

        def offered() -> dict[str, Any]:
            doc: dict[str, Any] = x.api.get("/v1/status")["offered"]
            return doc

        wait_for("x to see its owner away", lambda: offered()["state"] == "available")
        # A long job holds x's one core (its bid's estimate is capped by its 8 s wall limit).
        long = post(s, ["1", "1000000000000"], {"fuel": 100_000_000_000, "timeout": 8}, 600)
        wait_for("the long job to run on x", lambda: in_state(x, long, "running"), START)
        # The job under test: queued behind it, promised for after the long job's estimated end.
        job = post(s, ["2", "1000000"], {"fuel": 2_000_000_000, "timeout": 10}, 90)
        queued = wait_for("the job to be queued on x", lambda: in_state(x, job, "queued"), START)
        assert queued["started"] is None
        load.write_text(BUSY)  # x's owner is back: x suspends, and the job waits past its promise
        wait_for("x to give way to its owner", lambda: offered()["suspended"])
        y = Node(tmp_path / "y", "--bootstrap", s.address, start_deadline=START)
        nodes.append(y)
        wait_for("y to link to s", lambda: y.node_id in s.connected(), START)

        def ended() -> dict[str, Any] | None:
            doc: dict[str, Any] = s.api.get(f"/v1/jobs/{job}")
            return doc if doc["state"] in ("done", "failed", "expired", "cancelled") else None

        doc = wait_for("the job to end", ended, 180)
        assert doc["state"] == "done" and doc["succeeded"], doc
        assert doc["executor"] == y.node_id and doc["attempt"] == 2, doc
        assert doc["finished"] <= doc["deadline"], doc
        # x gave it back unstarted, because its submitter withdrew it: not for its deadline or lease
        moved = in_state(x, job, "cancelled")
        assert moved is not None and moved["reason"] == WITHDRAWN_TEXT and moved["started"] is None, moved
        assert "withdrawing it" in s.log.read_text()

        out = tmp_path / "moved.e31"

        def audited() -> dict[str, Any] | None:
            """The audit of the job's receipts bundle, once it holds the submitter's acknowledgement."""
            args = ("receipts", "export", "--job", job, "--out", str(out), "--with-blobs", "--overwrite")
            export = e31(*args, data_dir=s.data_dir)
            assert export.returncode == 0, export.stderr
            audit = e31("audit", str(out), "--reexecute", "--json", data_dir=s.data_dir)
            assert audit.returncode == 0, audit.stdout + audit.stderr
            report: dict[str, Any] = json.loads(audit.stdout)
            return report if report["acks"] >= 1 else None

        report = wait_for("the job's receipt to be acknowledged", audited, START)
        assert report["sound"] and report["receipts"] == 1 and report["reexecuted"] == 1, report
    finally:
        for node in nodes:
            node.stop()
