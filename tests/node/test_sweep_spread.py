"""A sweep is spread across every node that bids, through three real `e31 node run` processes on
127.0.0.1 (one core each): the submitting node runs its share, not the batch.

Before the spread (node/market/spread.py), the submitter chose each job's bid alone and its own
executor, first to answer and promising the earliest finish, took most of a batch (in a 1,000-job sweep
one node ran 724). The assertion is on how many jobs each node ran (a bounded ratio), never on time.
Each job's wall limit is 5 s, so every node can promise the whole sweep before its deadline.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_jobs_e2e import ROOT, Node, e31, linked_nodes

ECHO = ROOT / "sandbox" / "workloads" / "echo.wasm"
SWEEP = 192
"""Three full offers (MAX_SET = 64 jobs each)."""


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Node]]:
    with linked_nodes(tmp_path_factory.mktemp("spread")) as nodes:
        yield nodes


def test_a_sweep_on_three_nodes_is_spread_across_all_three(network: list[Node], tmp_path: Path) -> None:
    a = network[0]
    sweep = tmp_path / "sweep.jsonl"
    sweep.write_text("".join(json.dumps({"args": ["job", str(i)]}) + "\n" for i in range(SWEEP)))
    cli = e31(
        "submit", str(ECHO), "--batch", str(sweep), "--fuel", "10M", "--timeout", "5", data_dir=a.data_dir
    )
    assert cli.returncode == 0, cli.stderr
    bid = cli.stdout.strip().splitlines()[-1].split()[-1]
    waited = e31("wait", bid, "--timeout", "240", data_dir=a.data_dir, timeout=300.0)
    assert waited.returncode == 0, waited.stdout[-2000:] + waited.stderr[-2000:]

    docs = json.loads(e31("jobs", bid, "--json", data_dir=a.data_dir).stdout)
    assert len(docs) == SWEEP and all(d["state"] == "done" and d["succeeded"] for d in docs)
    by_node = Counter(d["executor"] for d in docs)
    ran = [by_node[n.node_id] for n in network]
    print(f"\n{SWEEP}-job sweep over 3 nodes, jobs run by a (submitting), b, c: {ran}")
    assert sum(ran) == SWEEP, f"jobs ran elsewhere: {by_node}"
    # each node runs a share, and none runs most of the sweep (choosing each job's bid alone gave
    # [148, 23, 21] on a quiet host, and up to 485 of 500 in the bench). The shares are not equal: which
    # bids are in hand when an offer's spread is made depends on timing ([91, 21, 80] seen under load)
    assert min(ran) >= SWEEP // 12, ran
    assert max(ran) <= 0.6 * SWEEP, ran
