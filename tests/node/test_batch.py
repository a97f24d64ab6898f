"""Batches: the JSON Lines file, the batch table, and a 1,000-job batch of tiny jobs over three real
node processes (rate printed, never asserted)."""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e31.node.cli import batch_file
from e31.node.cli.main import CliError
from e31.node.cli.submit import add_arguments, batch_body
from e31.node.store import batches as batch
from e31.node.store.db import Store
from test_jobs_e2e import ROOT, Node, e31, linked_nodes

ECHO = ROOT / "sandbox" / "workloads" / "echo.wasm"
SWEEP = 1000


def test_lines_are_objects_with_the_per_job_fields() -> None:
    text = '{"args": ["1"]}\n\n{"env": {"K": "v"}, "stdin": "in.txt"}\n{}\n'
    jobs = batch_file.parse_lines(text, "f.jsonl")
    assert jobs == [{"args": ["1"]}, {"env": [["K", "v"]], "stdin": "in.txt"}, {}]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "f.jsonl: no jobs"),
        ('{"args": []}\n[1]\n', "f.jsonl:2: each line is a JSON object"),
        ('{"args": [}\n', "f.jsonl:1: not JSON"),
        ('{"module": "x.wasm"}\n', "f.jsonl:1: unknown field(s) module"),
    ],
)
def test_bad_lines_say_where_and_why(text: str, message: str) -> None:
    with pytest.raises(batch_file.BatchError) as e:
        batch_file.parse_lines(text, "f.jsonl")
    assert str(e.value).startswith(message)


def test_a_batch_and_its_jobs_are_stored_in_one_go_under_an_id_no_job_id_can_look_like(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "db")
    try:
        jobs = [_job(i) for i in range(5)]
        ids = [j["job_id"] for j in jobs]
        bid = batch.store_batch(store, jobs, 1.5)
        assert batch.is_batch_id(bid) and not batch.is_batch_id(bid[6:]) and bid == batch.batch_id(ids)
        row = batch.get_batch(store, bid)
        assert row is not None and row.job_ids == tuple(ids) and row.created == 1.5
        stored = store.jobs(role="submitter")
        assert [r.job_id for r in stored] == ids and {r.state for r in stored} == {"queued"}
        assert batch.store_batch(store, jobs, 2.0) == bid  # the same jobs again: nothing new
        again = batch.get_batch(store, bid)
        assert again is not None and again.job_ids == tuple(ids)
        assert len(store.jobs()) == 5
        assert batch.get_batch(store, "batch-0000000000000000") is None
    finally:
        store.close()


def test_a_batch_reads_only_its_own_jobs_in_order_and_counts_the_unfinished(tmp_path: Path) -> None:
    with Store(tmp_path / "db") as store:
        for i in range(10, 20):  # history: jobs of no batch, or of another batch
            store.add_job(**_job(i))
        other = batch.store_batch(store, [_job(i) for i in range(20, 23)], 1.0)
        jobs = [_job(i) for i in (3, 1, 2)]
        bid = batch.store_batch(store, jobs, 1.0)
        assert [r.job_id for r in batch.batch_jobs(store, bid)] == [j["job_id"] for j in jobs]
        assert batch.batch_unfinished(store, bid) == 3 and batch.batch_unfinished(store, other) == 3
        store.update_job(bytes([1]) * 32, "submitter", 2.0, state="done")
        store.update_job(bytes([2]) * 32, "submitter", 2.0, state="disputed")
        assert batch.batch_unfinished(store, bid) == 1
        assert [r.state for r in batch.batch_jobs(store, bid)] == ["queued", "done", "disputed"]
        assert batch.batch_unfinished(store, other) == 3


def _job(i: int) -> dict[str, Any]:
    return {
        "job_id": bytes([i]) * 32,
        "role": "submitter",
        "manifest": b"m",
        "state": "queued",
        "submitter": "e31n",
        "created": 1.0 + i,
        "deadline": 100.0,
        "fuel_limit": 10,
        "blobs": ["ab" * 32],
    }


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_the_cli_takes_relative_paths_from_the_batch_file_and_refuses_per_job_flags(tmp_path: Path) -> None:
    (tmp_path / "jobs.jsonl").write_text(
        json.dumps({"inputs": {"data": "d/1.txt"}, "stdin": "in.txt"})
        + "\n"
        + json.dumps({"inputs": [{"name": "x", "path": "/abs/x"}], "args": ["a"]})
        + "\n"
    )
    body = batch_body(_args("m.wasm", "--batch", str(tmp_path / "jobs.jsonl"), "--fuel", "5M"), 1000.0)
    assert body["limits"] == {"fuel": 5_000_000}
    assert body["jobs"] == [
        {"inputs": [{"name": "data", "path": str(tmp_path / "d/1.txt")}], "stdin": str(tmp_path / "in.txt")},
        {"inputs": [{"name": "x", "path": "/abs/x"}], "args": ["a"]},
    ]
    with pytest.raises(CliError, match="--arg: with --batch"):
        batch_body(_args("m.wasm", "--batch", str(tmp_path / "jobs.jsonl"), "--arg", "1"), 1000.0)
    with pytest.raises(CliError, match=r"missing\.jsonl"):
        batch_body(_args("m.wasm", "--batch", str(tmp_path / "missing.jsonl")), 1000.0)


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Node]]:
    with linked_nodes(tmp_path_factory.mktemp("net")) as nodes:
        yield nodes


def test_a_thousand_job_batch_over_three_nodes_completes(network: list[Node], tmp_path: Path) -> None:
    a = network[0]
    sweep = tmp_path / "sweep.jsonl"
    sweep.write_text("".join(json.dumps({"args": ["job", str(i)]}) + "\n" for i in range(SWEEP)))
    t0 = time.monotonic()
    cli = e31(
        "submit", str(ECHO), "--batch", str(sweep), "--fuel", "10M", "--timeout", "5", data_dir=a.data_dir
    )
    assert cli.returncode == 0, cli.stderr
    last = cli.stdout.strip().splitlines()[-1]
    assert last.startswith(f"submitted {SWEEP} jobs as batch batch-")
    bid = last.split()[-1]
    submitted = time.monotonic() - t0

    waited = e31("wait", bid, "--timeout", "240", data_dir=a.data_dir, timeout=300.0)
    elapsed = time.monotonic() - t0
    assert waited.returncode == 0, waited.stdout[-2000:] + waited.stderr[-2000:]
    assert f"batch {bid}: {SWEEP} jobs, {SWEEP} succeeded (1000 done)" in waited.stdout

    listed = e31("jobs", bid, "--json", data_dir=a.data_dir)
    docs = json.loads(listed.stdout)
    assert len(docs) == SWEEP and all(d["state"] == "done" and d["succeeded"] for d in docs)
    assert sorted(int(d["args"][1]) for d in docs) == list(range(SWEEP))
    by_node = Counter(d["executor"] for d in docs)
    assert set(by_node) <= {n.node_id for n in network}
    assert len(by_node) >= 2, f"every job ran on one node: {by_node}"
    print(
        f"\n{SWEEP}-job batch over 3 nodes: submitted in {submitted:.1f} s, all verified in {elapsed:.1f} s "
        f"({SWEEP / elapsed:.1f} jobs/s); by node: {sorted(by_node.values(), reverse=True)}"
    )
    table = e31("jobs", bid, data_dir=a.data_dir)
    assert table.stdout.strip().splitlines()[-1] == f"{SWEEP} jobs: {SWEEP} done"
