"""Jobs end to end through real node processes on 127.0.0.1: submit, offer, bid, assign, fetch, run,
receipt, verification, acknowledgement, results; a restart of the submitter mid-job; and submissions
the node must refuse.

Three `e31 node run` processes (port 0, no mDNS, one worker each, short heartbeats) bootstrap from the
first; jobs go in through the first node's local API and the CLI. Figures (jobs/s, submit-to-done
latency) are printed, never asserted. Nodes see no owner load unless a test sets E31_TEST_OWNER_LOAD_FILE
itself: on a 2-core machine, sibling nodes and tests would otherwise count as the owner working and the
nodes would offer no cores.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from e31.protocol.blobs import blob_ref
from e31.protocol.envelope import verify
from e31.protocol.messages import InclusionProof
from e31.protocol.receipts import UsageReceipt
from node_process import DEADLINE, READY, NodeProcess, e31, wait_for

# other tests import these from here
__all__ = [
    "DEADLINE",
    "MONTECARLO",
    "READY",
    "ROOT",
    "Node",
    "e31",
    "submit",
    "wait_for",
]

ROOT = Path(__file__).resolve().parents[2]
MONTECARLO = ROOT / "sandbox" / "workloads" / "montecarlo.wasm"
SWEEP = 30


class Node(NodeProcess):
    """A node of these tests: heartbeats every 0.5 s (links found dead soon), one core."""

    def __init__(self, data_dir: Path, *args: str, start_deadline: float = DEADLINE) -> None:
        super().__init__(data_dir, "--heartbeat", "0.5", "--cores", "1", *args, start_deadline=start_deadline)


@contextmanager
def linked_nodes(tmp: Path, first: Callable[[Node], object] | None = None) -> Iterator[list[Node]]:
    """Three nodes, b and c bootstrapped from a (after `first(a)`, if given), each linked to the other
    two; stopped on exit."""
    nodes: list[Node] = []
    try:
        nodes.append(Node(tmp / "a"))
        if first is not None:
            first(nodes[0])
        for name in "bc":
            nodes.append(Node(tmp / name, "--bootstrap", nodes[0].address))
        for node in nodes:
            others = {n.node_id for n in nodes if n is not node}
            wait_for(
                f"{node.data_dir.name} to link to the others", lambda n=node, o=others: n.connected() == o
            )
        yield nodes
    finally:
        for node in nodes:
            node.stop()


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Node]]:
    with linked_nodes(tmp_path_factory.mktemp("net")) as nodes:
        yield nodes


def submit(node: Node, seed: int, samples: int) -> str:
    answer = node.api.post("/v1/jobs", {"module": str(MONTECARLO), "args": [str(seed), str(samples)]})
    job_id: str = answer["job_id"]
    return job_id


def test_a_sweep_over_three_nodes_is_done_verified_and_acknowledged(
    network: list[Node], tmp_path: Path
) -> None:
    a = network[0]
    t0 = time.monotonic()
    ids = [submit(a, seed, 3_000_000) for seed in range(SWEEP - 1)]
    cli = e31(
        "submit",
        str(MONTECARLO),
        "--deadline",
        "10m",
        "--fuel",
        "5G",
        "--",
        "999",
        "3000000",
        data_dir=a.data_dir,
    )
    assert cli.returncode == 0, cli.stderr
    ids.append(cli.stdout.strip().splitlines()[-1].split()[-1])
    submitted = time.monotonic() - t0

    waited = e31("wait", *ids, "--timeout", "90", data_dir=a.data_dir)
    elapsed = time.monotonic() - t0
    assert waited.returncode == 0, waited.stdout + waited.stderr
    docs = [a.api.get(f"/v1/jobs/{j}") for j in ids]
    assert all(d["state"] == "done" and d["succeeded"] for d in docs)
    executors = Counter(d["executor"] for d in docs)
    assert set(executors) <= {n.node_id for n in network}
    assert len(executors) >= 2, f"every job ran on one node: {executors}"
    latencies = sorted(d["updated"] - d["created"] for d in docs)
    print(
        f"\n{SWEEP} jobs over 3 nodes: submitted in {submitted:.2f} s, all done in {elapsed:.2f} s "
        f"({SWEEP / elapsed:.1f} jobs/s); submit-to-done median {latencies[len(latencies) // 2]:.2f} s, "
        f"max {latencies[-1]:.2f} s; by node: {sorted(executors.values(), reverse=True)}"
    )

    # Each executor ran exactly the jobs the submitter says it did, and holds their acknowledgements.
    for node in network:
        ran = [j for j in node.api.get("/v1/jobs?role=executor") if j["job_id"] in ids]
        assert len(ran) == executors.get(node.node_id, 0)
        assert all(j["state"] == "done" for j in ran)

    listed = e31("jobs", "--json", data_dir=a.data_dir)
    assert listed.returncode == 0
    assert {j["job_id"] for j in json.loads(listed.stdout)} >= set(ids)
    table = e31("jobs", data_dir=a.data_dir)
    assert table.returncode == 0 and "done" in table.stdout and "exited 0" in table.stdout

    # The results of a job that ran elsewhere: stdout, stderr and the receipt, all consistent.
    remote = next(j for j, d in zip(ids, docs, strict=True) if d["executor"] != a.node_id)
    out = tmp_path / "results"
    written = e31("results", remote[:10], "--out", str(out), data_dir=a.data_dir)
    assert written.returncode == 0, written.stderr
    stdout = (out / "stdout").read_bytes()
    assert stdout.startswith(b"samples 3000000\n") and b"pi 3.14" in stdout
    receipt = verify((out / "receipt").read_bytes(), UsageReceipt)
    assert receipt.message.job_id.hex() == remote
    assert receipt.message.stdout == blob_ref(stdout)
    assert receipt.message.stderr == blob_ref((out / "stderr").read_bytes())
    assert str(receipt.signer) == docs[ids.index(remote)]["executor"]
    assert receipt.message.outcome.status == "exited" and receipt.message.fuel_used > 0
    # Its stdout came in the result and is kept in the database; bytes altered there are refused.
    import sqlite3

    with sqlite3.connect(a.data_dir / "node.sqlite") as db:
        changed = db.execute(
            "UPDATE small_blobs SET data = ? WHERE blob_hash = ?",
            (b"forged", receipt.message.stdout.root.hex()),
        ).rowcount
    assert changed == 1
    refused = e31("results", remote[:10], "--out", str(tmp_path / "again"), data_dir=a.data_dir)
    assert refused.returncode != 0 and "does not match its hash" in refused.stderr
    assert "Traceback" not in refused.stderr

    # The same job run again anywhere gives the same output: the seed is the job, not the machine.
    seeds = Counter(d["args"][0] for d in docs)
    assert len(seeds) == SWEEP


def test_the_submitter_keeps_inclusion_proofs_from_remote_executors(network: list[Node]) -> None:
    a = network[0]
    job = submit(a, 7, 1000)
    wait_for("the job", lambda: a.api.get(f"/v1/jobs/{job}")["state"] == "done")

    def proofs() -> list[Any]:
        store_path = a.data_dir / "node.sqlite"
        import sqlite3

        with sqlite3.connect(f"file:{store_path}?mode=ro", uri=True) as db:
            rows = db.execute(  # a proof may place the receipts of several jobs: it is linked to each
                "SELECT e.raw FROM envelopes e JOIN envelope_jobs l ON l.message_id = e.message_id "
                "WHERE e.kind = 'proof' AND l.job_id = ?",
                (bytes.fromhex(job),),
            ).fetchall()
        return [verify(bytes(r[0]), InclusionProof) for r in rows]

    found = wait_for("an inclusion proof", proofs)
    doc = a.api.get(f"/v1/jobs/{job}")
    assert [e.receipt_id.hex() for e in found[0].message.entries] == [doc["receipt"]["id"]]
    assert str(found[0].message.executor) == doc["executor"]


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (["/nonexistent/module.wasm"], "no such file"),
        (["{text}"], "not a WebAssembly binary"),
        (["{module}", "--memory", "1000"], "memory 1000 is outside"),
        (["{module}", "--fuel", "0"], "fuel 0 is outside"),
        (["{module}", "--deadline", "2020-01-01T00:00:00Z"], "in the past"),
        (["{module}", "--input", "/nonexistent/input.txt"], "input"),
    ],
)
def test_bad_submissions_are_refused_with_one_clear_line(
    network: list[Node], tmp_path: Path, args: list[str], expect: str
) -> None:
    text = tmp_path / "not.wasm"
    text.write_text("(module)")
    argv = [a.format(module=MONTECARLO, text=text) for a in args]
    before = len(network[0].api.get("/v1/jobs"))
    done = e31("submit", *argv, data_dir=network[0].data_dir)
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("e31: error:"), done.stderr
    assert expect in lines[0]
    assert len(network[0].api.get("/v1/jobs")) == before


def test_job_commands_fail_with_one_line_for_unknown_jobs_and_absent_nodes(
    network: list[Node], tmp_path: Path
) -> None:
    for argv, code in (
        (["wait", "ab" * 32], 1),
        (["results", "ab" * 32, "--out", str(tmp_path)], 1),
        (["wait", "zz"], 2),  # not an id at all: a usage error
    ):
        done = e31(*argv, data_dir=network[0].data_dir)
        assert done.returncode == code
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    absent = e31("jobs", data_dir=tmp_path / "nothing")
    assert absent.returncode == 1 and "no node is running" in absent.stderr


def test_deadlines_are_durations_or_times() -> None:
    from e31.node.cli.main import CliError
    from e31.node.cli.submit import parse_deadline

    now = 1_800_000_000.0
    assert parse_deadline("90s", now) == 1_800_000_090_000
    assert parse_deadline("10m", now) == 1_800_000_600_000
    assert parse_deadline("2h", now) == 1_800_007_200_000
    assert parse_deadline("1.5d", now) == 1_800_129_600_000
    assert parse_deadline("45", now) == 1_800_000_045_000
    assert parse_deadline("2027-01-15T08:00:00Z", now) == 1_800_000_000_000
    assert parse_deadline("2027-01-15T09:00:00+01:00", now) == 1_800_000_000_000
    with pytest.raises(CliError, match="not a duration"):
        parse_deadline("tomorrow", now)


def test_submit_sends_absolute_paths_and_guest_arguments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from e31.node.cli.main import build_parser
    from e31.node.cli.submit import request_body

    monkeypatch.chdir(tmp_path)
    (tmp_path / "a=b.txt").write_text("x")
    argv = [
        "submit",
        "job.wasm",
        "--input",
        "data.txt",
        "--input",
        "in/x.txt=other.txt",
        "--input",
        "a=b.txt",
        "--env",
        "K=V=W",
        "--arg",
        "first",
        "--fuel",
        "5G",
        "--memory",
        "64MiB",
        "--timeout",
        "2.5",
    ]
    args = build_parser(argv).parse_args(argv)
    args.passthrough = ["--flag", "last"]
    body = request_body(args, 0.0)
    assert body["module"] == str(tmp_path / "job.wasm")
    assert body["inputs"] == [
        {"name": "data.txt", "path": str(tmp_path / "data.txt")},
        {"name": "in/x.txt", "path": str(tmp_path / "other.txt")},
        {"name": "a=b.txt", "path": str(tmp_path / "a=b.txt")},
    ]
    assert body["args"] == ["first", "--flag", "last"]
    assert body["env"] == [["K", "V=W"]]
    assert body["limits"] == {"fuel": 5_000_000_000, "memory": 64 << 20, "timeout": 2.5}
    assert body["deadline"] is None and body["stdin"] is None


def test_the_progress_line() -> None:
    from e31.node.cli.wait import progress_line

    assert progress_line(3, 10, 1.5, width=10) == "[###.......] 3/10  2.00 jobs/s  ETA 4s"
    assert progress_line(0, 4, 0.0, width=4) == "[....] 0/4  0.00 jobs/s  ETA ?"


def test_a_job_survives_a_restart_of_its_submitter(tmp_path: Path) -> None:
    """Stop the submitting node while its job runs, start it again: the job still ends done, whether it
    ran here (resumed from the store) or on the peer (delivered once the link is back)."""
    a = Node(tmp_path / "a")
    b = None
    try:
        b = Node(tmp_path / "b", "--bootstrap", a.address)
        wait_for("the link", lambda: a.connected() == {b.node_id})
        job = a.api.post(
            "/v1/jobs",
            {"module": str(MONTECARLO), "args": ["11", "300000000"], "limits": {"fuel": 100_000_000_000}},
        )["job_id"]
        wait_for("the job to be assigned", lambda: a.api.get(f"/v1/jobs/{job}")["state"] == "assigned")
        a.stop()
        assert a.proc.returncode == 0
        a = Node(tmp_path / "a")
        doc = wait_for("the job to end", lambda: _ended(a, job), deadline=60.0)
        assert doc["state"] == "done" and doc["succeeded"], doc
    finally:
        a.stop()
        if b is not None:
            b.stop()


def _ended(node: Node, job: str) -> dict[str, Any] | None:
    doc: dict[str, Any] = node.api.get(f"/v1/jobs/{job}")
    return doc if doc["state"] in ("done", "failed", "expired") else None
