"""Re-planning through real `e31 node run` processes on 127.0.0.1: an executor falls behind its promise
and the submitter moves the queued job to another node.

`s` submits and runs nothing (`--cores 0`); `x` has one core and runs only while its (synthetic) owner
is away. A long job holds x's core, and the job under test is queued behind it, promised for after the
long job's estimated end. Then x's owner comes back: x suspends, and the queued job waits past its
promise. A second executor `y` joins. The submitter, with no result by the promised finish and its
grace, withdraws the assignment; x gives the job back (`release`, reason `withdrawn`) without ever
starting it, and y runs it: the job ends `done`, before its deadline, and its receipts pass `e31 audit`.
Every wait is on state; nothing here is timed. tests/bench/bench_replan.py runs the same scenario and
prints its figures.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from e31.node.market.taken_back import WITHDRAWN_TEXT
from test_jobs_e2e import MONTECARLO, Node, e31, wait_for

OWNER_LOAD_ENV = "E31_TEST_OWNER_LOAD_FILE"
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
DEADLINE_S = 300.0
"""The moved job's deadline, from its submission: far past the bounds a slow start of y may take
(START), so x never gives the job back for its deadline before it is withdrawn."""


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


@contextmanager
def owner_load(path: Path | None) -> Iterator[None]:
    """Nodes started inside see the owner load written in `path` (None: an owner who never works)."""
    before = os.environ.pop(OWNER_LOAD_ENV, None)
    if path is not None:
        os.environ[OWNER_LOAD_ENV] = str(path)
    try:
        yield
    finally:
        os.environ.pop(OWNER_LOAD_ENV, None)
        if before is not None:
            os.environ[OWNER_LOAD_ENV] = before


@dataclass
class Moved:
    """The scenario's nodes and the job it moved."""

    s: Node
    x: Node
    y: Node
    job: str
    doc: dict[str, Any]
    """The submitter's view of the job once it ended."""


def fall_behind_and_move(tmp: Path, nodes: list[Node]) -> Moved:
    """Run the scenario (the module's docstring) in `tmp`; the nodes started are appended to `nodes`
    (the caller stops them). Returns once the job has ended at the submitter."""
    load = tmp / "owner-load"
    load.write_text("0")
    with owner_load(load):
        x = Node(tmp / "x", *OWNER_AWAY, start_deadline=START)
    nodes.append(x)
    with owner_load(None):
        s = Node(tmp / "s", "--bootstrap", x.address, "--cores", "0", start_deadline=START)
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
    job = post(s, ["2", "1000000"], {"fuel": 2_000_000_000, "timeout": 10}, DEADLINE_S)
    queued = wait_for("the job to be queued on x", lambda: in_state(x, job, "queued"), START)
    assert queued["started"] is None
    load.write_text(BUSY)  # x's owner is back: x suspends, and the job waits past its promise
    wait_for("x to give way to its owner", lambda: offered()["suspended"])
    with owner_load(None):
        y = Node(tmp / "y", "--bootstrap", s.address, start_deadline=START)
    nodes.append(y)
    wait_for("y to link to s", lambda: y.node_id in s.connected(), START)

    def ended() -> dict[str, Any] | None:
        doc: dict[str, Any] = s.api.get(f"/v1/jobs/{job}")
        return doc if doc["state"] in ("done", "failed", "expired", "cancelled") else None

    return Moved(s, x, y, job, wait_for("the job to end", ended, 180))


def audited(s: Node, job: str, out: Path) -> dict[str, Any]:
    """The `e31 audit --reexecute` report of the job's receipts bundle (with its blobs), once the bundle
    holds the submitter's acknowledgement."""

    def report() -> dict[str, Any] | None:
        args = ("receipts", "export", "--job", job, "--out", str(out), "--with-blobs", "--overwrite")
        export = e31(*args, data_dir=s.data_dir)
        assert export.returncode == 0, export.stderr
        audit = e31("audit", str(out), "--reexecute", "--json", data_dir=s.data_dir)
        assert audit.returncode == 0, audit.stdout + audit.stderr
        doc: dict[str, Any] = json.loads(audit.stdout)
        return doc if doc["acks"] >= 1 else None

    found: dict[str, Any] = wait_for("the job's receipt to be acknowledged", report, START)
    return found


def test_a_job_queued_at_an_executor_that_falls_behind_is_moved_and_done_elsewhere(tmp_path: Path) -> None:
    nodes: list[Node] = []
    try:
        moved = fall_behind_and_move(tmp_path, nodes)
        doc, x, y, s = moved.doc, moved.x, moved.y, moved.s
        assert doc["state"] == "done" and doc["succeeded"], doc
        assert doc["executor"] == y.node_id and doc["attempt"] == 2, doc
        assert doc["finished"] <= doc["deadline"], doc
        # x gave it back unstarted, because its submitter withdrew it: not for its deadline or lease
        given_back = in_state(x, moved.job, "cancelled")
        assert given_back is not None and given_back["started"] is None, given_back
        assert given_back["reason"] == WITHDRAWN_TEXT, given_back
        assert "withdrawing it" in s.log.read_text()
        report = audited(s, moved.job, tmp_path / "moved.e31")
        assert report["sound"] and report["receipts"] == 1 and report["reexecuted"] == 1, report
    finally:
        for node in nodes:
            node.stop()
