"""The executor side of fault tolerance, with real node processes on 127.0.0.1: whole stdout and stderr
served as blobs, jobs that outlive a kill -9 of their executor or of every node, owner activity that
suspends and resumes a job, and capacity advertisements that reach every node.

Nodes run with one worker, short heartbeats and no mDNS (helpers from test_jobs_e2e). Two cases that
need a stop at an exact moment (acks that never arrive; a stop between signing a receipt and marking the
job done) run in memory on market_nodes' harness. Every wait is bounded; nothing here asserts timing.
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import trio
import wasmtime
from e31.protocol.blobs import blob_ref
from e31.protocol.envelope import verify
from e31.protocol.receipts import UsageReceipt
from e31.sandbox.job import JobSpec
from e31.sandbox.limits import Limits
from e31.sandbox.runner import run
from market_nodes import Net, RealNode, start, wait_state
from test_jobs_e2e import MONTECARLO, ROOT, Node, e31, wait_for

WORDFREQ = ROOT / "sandbox" / "workloads" / "wordfreq.wasm"
FAST = ("--capacity-interval", "0.2", "--capacity-raise-after", "0", "--idle-seconds", "0")
OWNER_AWAY = ("--only-when-idle", *FAST)
BUSY = str(os.cpu_count() or 1)
"""Owner load (in cores) that keeps a whole machine busy."""
MIB = 1 << 20
START = 180.0
"""Seconds a node may take to start (a bound, not a figure)."""
# Writes 3 MiB (a 4 KiB block 768 times) to stdout and 100 bytes to stderr.
CHATTY_WAT = """
(module
  (import "wasi_snapshot_preview1" "fd_write" (func $w (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func $out (param $fd i32) (param $len i32)
    (i32.store (i32.const 0) (i32.const 1024))
    (i32.store (i32.const 4) (local.get $len))
    (drop (call $w (local.get $fd) (i32.const 0) (i32.const 1) (i32.const 8))))
  (func (export "_start") (local $i i32)
    (loop $fill
      (i32.store8 (i32.add (i32.const 1024) (local.get $i)) (local.get $i))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $fill (i32.lt_u (local.get $i) (i32.const 4096))))
    (local.set $i (i32.const 0))
    (loop $more
      (call $out (i32.const 1) (i32.const 4096))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $more (i32.lt_u (local.get $i) (i32.const 768))))
    (call $out (i32.const 2) (i32.const 100))))
"""


class Network:
    """Five nodes: `a` submits and never runs jobs (its owner is busy for good: only-when-idle with a
    synthetic full load), b..e run them (a synthetic owner who never works, so the test machine's own
    load cannot change what they offer). Nodes can be killed and started again on their data dirs."""

    def __init__(self, tmp: Path, load_file: Path) -> None:
        self.tmp = tmp
        self.load_file = load_file
        self.nodes: dict[str, Node] = {}

    def start(self, name: str) -> Node:
        args: tuple[str, ...] = FAST
        if name == "a":
            args = OWNER_AWAY
        elif "a" in self.nodes:
            args = (*FAST, "--bootstrap", self.nodes["a"].address)
        load = self.load_file if name == "a" else self.tmp / "no-owner-load"
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("E31_TEST_OWNER_LOAD_FILE", str(load))
            # five nodes starting at once on a loaded 2-core machine can take well over 30 s
            node = self.nodes[name] = Node(self.tmp / name, *args, start_deadline=START)
        return node

    def start_all(self, names: str) -> None:
        """Start `a` first (the others bootstrap from it), then the rest at once."""
        if "a" in names:
            self.start("a")
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(self.start, [n for n in names if n != "a"]))

    def linked(self) -> None:
        for node in self.nodes.values():
            others = {n.node_id for n in self.nodes.values() if n is not node}
            wait_for(f"{node.data_dir.name} to link", lambda n=node, o=others: n.connected() == o)

    def executors(self) -> list[Node]:
        return [n for name, n in sorted(self.nodes.items()) if name != "a"]


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Network]:
    tmp = tmp_path_factory.mktemp("faults")
    load = tmp / "owner-load"
    load.write_text(BUSY)
    network = Network(tmp, load)
    try:
        network.start_all("abcde")
        network.linked()
        yield network
    finally:
        for node in network.nodes.values():
            node.stop()


@pytest.fixture
def network(net: Network) -> list[Node]:
    return [net.nodes[name] for name in "abcde"]


def ended(node: Node, job: str) -> dict[str, Any] | None:
    doc: dict[str, Any] = node.api.get(f"/v1/jobs/{job}")
    return doc if doc["state"] in ("done", "failed", "expired") else None


def results(node: Node, job: str, out: Path) -> tuple[UsageReceipt, bytes, bytes]:
    written = e31("results", job, "--out", str(out), data_dir=node.data_dir)
    assert written.returncode == 0, written.stderr
    receipt = verify((out / "receipt").read_bytes(), UsageReceipt).message
    stdout, stderr = (out / "stdout").read_bytes(), (out / "stderr").read_bytes()
    assert (receipt.stdout, receipt.stderr) == (blob_ref(stdout), blob_ref(stderr))
    return receipt, stdout, stderr


def test_a_job_writing_3_mib_of_stdout_and_some_stderr_is_done_and_verified(
    network: list[Node], tmp_path: Path
) -> None:
    module = tmp_path / "chatty.wasm"
    module.write_bytes(wasmtime.wat2wasm(CHATTY_WAT))
    a = network[0]
    job = a.api.post("/v1/jobs", {"module": str(module)})["job_id"]
    doc = wait_for("the chatty job", lambda: ended(a, job), deadline=60.0)
    assert doc["state"] == "done" and doc["succeeded"], doc
    receipt, stdout, stderr = results(a, job, tmp_path / "out")
    block = bytes(i % 256 for i in range(4096))
    assert stdout == block * 768 and stderr == block[:100]
    assert receipt.stdout.size == 3 * MIB and receipt.outcome.status == "exited"


def test_wordfreq_across_the_network(network: list[Node], tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat and the dog and the bird\n" * 50)
    a = network[0]
    jobs = [
        a.api.post(
            "/v1/jobs",
            {"module": str(WORDFREQ), "args": [str(n)], "inputs": [{"name": "c.txt", "path": str(corpus)}]},
        )["job_id"]
        for n in (1, 2, 3, 4, 5, 6)
    ]
    docs = [wait_for("a wordfreq job", lambda j=j: ended(a, j), deadline=60.0) for j in jobs]
    assert all(d["state"] == "done" and d["succeeded"] for d in docs), docs
    assert {d["executor"] for d in docs} <= {n.node_id for n in network}
    for i, job in enumerate(jobs):
        _, stdout, stderr = results(a, job, tmp_path / f"out{i}")
        assert stdout.splitlines()[0] == b"150 the"
        assert len(stdout.splitlines()) == min(i + 1, 5)
        assert stderr.strip() == b"files 1 words 400 distinct 5"


def test_capacity_advertisements_reach_every_node(network: list[Node]) -> None:
    ids = {n.node_id for n in network}

    def table(node: Node) -> dict[str, Any] | None:
        peers: dict[str, Any] = node.api.get("/v1/status")["peer_capacity"]
        return peers if set(peers) == ids - {node.node_id} else None

    for node in network:
        peers = wait_for(f"{node.data_dir.name} to hear every advertisement", lambda n=node: table(n))
        for other, ad in peers.items():
            assert ad["cores"] == (0 if other == network[0].node_id else 1), (node.data_dir.name, other, ad)
            assert ad["memory_bytes"] > 0 or other == network[0].node_id
    a = network[0].api.get("/v1/status")["offered"]
    assert (a["cores"], a["state"], a["only_when_idle"], a["suspended"]) == (0, "owner-busy", True, True)
    shown = e31("node", "status", "--data-dir", str(network[0].data_dir))
    assert shown.returncode == 0, shown.stderr
    assert "owner-busy, only when idle, jobs suspended" in shown.stdout
    assert re.search(r"^peers offer: +4 cores on 4 of 4 advertising$", shown.stdout, re.MULTILINE)


def test_an_offer_reaches_every_node_of_the_five(network: list[Node]) -> None:
    def offers(node: Node) -> int:
        counters: dict[str, int] = node.api.get("/v1/status")["gossip"]
        return counters.get("delivered_offer", 0)

    submitter, others = network[1], [n for n in network if n is not network[1]]
    before = {n.node_id: offers(n) for n in others}
    job = submitter.api.post("/v1/jobs", {"module": str(MONTECARLO), "args": ["5", "1000"]})["job_id"]
    for node in others:
        wait_for(f"{node.data_dir.name} to hear the offer", lambda n=node: offers(n) > before[n.node_id])
    wait_for("the job", lambda: ended(submitter, job))


def executor_row(node: Node, job: str) -> dict[str, Any] | None:
    rows: list[dict[str, Any]] = node.api.get("/v1/jobs?role=executor")
    return next((r for r in rows if r["job_id"] == job), None)


def receipts(node: Node) -> list[tuple[str, int, str]]:
    """(job id, attempt, executor) of every receipt this node signed, from its store."""
    with sqlite3.connect(f"file:{node.data_dir / 'node.sqlite'}?mode=ro", uri=True) as db:
        rows = db.execute(
            "SELECT job_id, attempt, executor FROM receipts WHERE executor = ?", (node.node_id,)
        ).fetchall()
    return [(bytes(j).hex(), a, e) for j, a, e in rows]


def expected_fuel(job: str, args: list[str], fuel: int) -> int:
    """The fuel the job burns anywhere: its seed is its id."""
    spec = JobSpec(
        MONTECARLO.read_bytes(),
        args=tuple(args),
        limits=Limits(fuel=fuel, wall_seconds=120),
        seed=bytes.fromhex(job),
    )
    return run(spec).fuel_used


def executor_states(node: Node) -> dict[str, str]:
    """The state of every job this node holds as an executor (one API call)."""
    return {r["job_id"]: r["state"] for r in node.api.get("/v1/jobs?role=executor")}


def test_every_node_killed_and_restarted_mid_sweep_loses_no_job(net: Network) -> None:
    """Kill -9 every node while the sweep runs, start them all again: every job ends done, nothing ran
    twice over. The kill must come mid-sweep: each job runs for seconds (two rounds over the four
    executors), and the wait for one to run asks each executor once per look. (It used to look 64
    times per turn, for jobs of a second: on a loaded machine a turn outlasted the whole sweep, and
    the test timed out waiting for a job to run, or killed a sweep that was over.) The time limit is
    far above the run so a loaded machine cannot turn a run into a timeout, and the nodes may take
    minutes to start again, all five at once, on a loaded machine (it was 30 s)."""
    a = net.nodes["a"]
    jobs = [
        a.api.post(
            "/v1/jobs",
            {
                "module": str(MONTECARLO),
                "args": [str(seed), "200000000"],
                "limits": {"fuel": 40_000_000_000, "timeout": 600},
            },
        )["job_id"]
        for seed in range(8)
    ]

    def running() -> bool:
        return any(
            state == "running" and job in jobs
            for n in net.executors()
            for job, state in executor_states(n).items()
        )

    wait_for("a job to run", running, deadline=120.0)
    for node in net.nodes.values():
        node.proc.send_signal(signal.SIGKILL)
        node.proc.wait(timeout=30)
    with sqlite3.connect(f"file:{a.data_dir / 'node.sqlite'}?mode=ro", uri=True) as db:
        done = {bytes(j).hex() for (j,) in db.execute("SELECT job_id FROM jobs WHERE state = 'done'")}
    assert set(jobs) - done, "the sweep was over before the kill"
    net.start_all("abcde")
    docs = [wait_for(f"job {j[:8]}", lambda j=j: ended(a, j), deadline=180.0) for j in jobs]
    assert all(d["state"] == "done" and d["succeeded"] for d in docs), docs
    # No executor signed two receipts for one attempt of a job: nothing ran twice over.
    signed = Counter(r for n in net.executors() for r in receipts(n) if r[0] in jobs)
    assert signed and max(signed.values()) == 1, signed
    assert {j for j, _, _ in signed} == set(jobs)


def test_an_executor_killed_mid_job_and_the_job_finishes_elsewhere(net: Network) -> None:
    a = net.nodes["a"]
    args = ["77", "100000000"]
    job = a.api.post(
        "/v1/jobs",
        {"module": str(MONTECARLO), "args": args, "limits": {"fuel": 20_000_000_000, "timeout": 4}},
    )["job_id"]

    def runner() -> Node | None:
        for node in net.executors():
            row = executor_row(node, job)
            if row is not None and row["state"] == "running":
                return node
        return None

    victim = wait_for("the job to run", runner)
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait(timeout=30)
    # (it waits out the victim's lease: twice the victim's own estimate of the run plus 30 s, and on a
    # loaded machine that estimate is long; the bound is far above it)
    doc = wait_for("the job to finish elsewhere", lambda: ended(a, job), deadline=360.0)
    assert doc["state"] == "done" and doc["succeeded"], doc
    assert doc["executor"] != victim.node_id and doc["attempt"] > 1
    assert doc["receipt"]["fuel_used"] == expected_fuel(job, args, 20_000_000_000)
    name = victim.data_dir.name
    net.start(name)  # back, for the tests after this one


def test_owner_activity_suspends_and_resumes_a_job_with_identical_fuel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    load = tmp_path / "owner-load"
    load.write_text("0")
    monkeypatch.setenv("E31_TEST_OWNER_LOAD_FILE", str(load))
    node = Node(tmp_path / "solo", *OWNER_AWAY)
    try:

        def offered() -> dict[str, Any]:
            doc: dict[str, Any] = node.api.get("/v1/status")["offered"]
            return doc

        wait_for("the owner to be seen away", lambda: offered()["state"] == "available")
        args = ["5", "200000000"]
        fuel = 30_000_000_000
        job = node.api.post(
            "/v1/jobs", {"module": str(MONTECARLO), "args": args, "limits": {"fuel": fuel, "timeout": 60}}
        )["job_id"]
        wait_for("the job to run", lambda: (executor_row(node, job) or {}).get("state") == "running")
        load.write_text(BUSY)
        wait_for("the node to give way", lambda: offered()["suspended"])
        assert offered()["state"] == "owner-busy" and offered()["cores"] == 0
        time.sleep(1.0)
        assert executor_row(node, job)["state"] == "running"  # type: ignore[index]
        load.write_text("0")
        doc = wait_for("the job to end", lambda: ended(node, job), deadline=60.0)
        assert doc["state"] == "done" and doc["succeeded"], doc
        assert not offered()["suspended"]
        assert doc["receipt"]["fuel_used"] == expected_fuel(job, args, fuel)

        # A job that cannot make its deadline once the owner is back is handed back, not kept.
        late = node.api.post(
            "/v1/jobs",
            {
                "module": str(MONTECARLO),
                "args": ["6", "400000000"],
                "limits": {"fuel": 60_000_000_000, "timeout": 10},
                "deadline": int(time.time() * 1000) + 15_000,
            },
        )["job_id"]
        wait_for("the late job to run", lambda: (executor_row(node, late) or {}).get("state") == "running")
        load.write_text(BUSY)

        def handed_back() -> dict[str, Any] | None:
            row = executor_row(node, late)
            return row if row is not None and row["state"] == "failed" else None

        row = wait_for("the late job to be handed back", handed_back)
        assert "owner" in row["reason"] and "deadline" in row["reason"]
    finally:
        node.stop()


async def test_an_unacknowledged_receipt_is_retried_until_its_retention_ends(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    """In memory (market_nodes): the submitter's acks never reach the executor, which keeps
    delivering until the outputs' retention is over, then stops; the receipt stays unacknowledged."""
    from dataclasses import replace

    from e31.node.store.db import Store

    net = Net()  # (this module's `net` fixture is its network of processes)
    net.nursery = nursery
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    deliveries: list[bytes] = []
    to_b, to_a = net.handlers[b.id], net.handlers[a.id]

    async def drop_acks(peer: bytes, raw: bytes) -> None:
        if verify(raw).kind != "ack":
            await to_b(peer, raw)

    async def count_receipts(peer: bytes, raw: bytes) -> None:
        env = verify(raw)
        if env.kind == "results":
            deliveries.extend(entry.receipt for entry in env.message.entries)
        await to_a(peer, raw)

    net.handlers[b.id], net.handlers[a.id] = drop_acks, count_receipts
    await start(nursery, a, b)
    manifest = replace(a.manifest(("9", "1000")), retention_ms=2_000)
    job_id = await a.submitter.submit(manifest)
    await wait_state(a, job_id, "done")
    for _ in range(300):  # at most 30 s
        if not await b.store.run(Store.receipts_due, time.time() + 10**6):
            break
        await trio.sleep(0.1)
    assert not await b.store.run(Store.receipts_due, time.time() + 10**6), "delivery never stopped"
    (row,) = await b.store.run(Store.receipts_for_job, job_id)
    assert row.delivered is None and row.delivery_tries >= 1
    assert len(deliveries) >= 2 and len(set(deliveries)) == 1, "the same receipt, delivered again"


async def test_a_receipt_signed_just_before_a_stop_is_not_run_again(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    """The node stopped after storing the receipt but before marking the job done: on resume the job is
    marked done from its receipt and delivered, and no second receipt is signed."""
    from e31.node.store.db import Store

    net = Net()  # (this module's `net` fixture is its network of processes)
    net.nursery = nursery
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    await start(nursery, a, b)
    job_id = await a.submitter.submit(a.manifest(("3", "1000")))
    await wait_state(a, job_id, "done")
    (before,) = await b.store.run(Store.receipts_for_job, job_id)
    await b.store.run(Store.update_job, job_id, "executor", time.time(), state="running", finished=None)
    await b.executor._resume(job_id)
    row = await b.store.run(Store.job, job_id, "executor")
    assert row is not None and row.state == "done" and row.fuel_used
    # the same one receipt (its delivery and log fields may have moved on as the ack came in)
    after = await b.store.run(Store.receipts_for_job, job_id)
    assert [(r.digest, r.attempt) for r in after] == [(before.digest, before.attempt)]
