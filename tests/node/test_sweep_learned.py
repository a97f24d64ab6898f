"""Sweeps of a module that only one node has run before still spread across every node that bids,
through three real `e31 node run` processes on 127.0.0.1 (one core each).

A node that has run a module a few times plans its jobs at what they use and take
(node/market/history.py), while a node that has not plans them at their budget (with the default
limits, 12.5 s each before it has calibrated itself, its 60 s wall limit after): the first node's
bids promise finishes hundreds of times earlier, and the spread, following them alone, gave it
every job of each offer, so the others never ran the module and never learned it (one bench run
gave 996 of 1,000 jobs to the node that knew the module). The spread's probes (node/market/probe.py)
give each bidder with fewer than PROBE_JOBS of this submitter's jobs under way that many, to learn
from. Here node a runs the module alone first; b and c join; then batches of one offer each are
swept one after another. The assertions are on how many jobs each node ran, never on time.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from e31.node.market.history import LEARNED_AFTER
from e31.node.market.probe import PROBE_JOBS
from test_jobs_e2e import ROOT, Node, e31, linked_nodes

ECHO = ROOT / "sandbox" / "workloads" / "echo.wasm"
WARM_UP = LEARNED_AFTER
"""Runs of the module at node a before the others join."""
BATCH = 64
"""One full offer (MAX_SET): a, idle, can bid for all of it."""
BATCHES = 3


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Node]]:
    """Node a runs the module WARM_UP times alone, then b and c join (and have run nothing)."""

    def warm(a: Node) -> None:
        for i in range(WARM_UP):
            cli = e31("submit", str(ECHO), "--", "warm", str(i), data_dir=a.data_dir)
            assert cli.returncode == 0, cli.stderr
            job = cli.stdout.strip().splitlines()[-1].split()[-1]
            waited = e31("wait", job, "--timeout", "60", data_dir=a.data_dir, timeout=90.0)
            assert waited.returncode == 0, waited.stdout + waited.stderr
        ran = json.loads(e31("jobs", "--json", data_dir=a.data_dir).stdout)
        assert [d["executor"] for d in ran] == [a.node_id] * WARM_UP

    with linked_nodes(tmp_path_factory.mktemp("learned"), first=warm) as nodes:
        yield nodes


def sweep(a: Node, tmp_path: Path, batch: int) -> list[dict[str, object]]:
    """One batch of BATCH jobs of the module, with the default limits (10 Gfuel, 60 s wall) and
    deadline (an hour): what most submitters leave. Returns its jobs once all have ended."""
    lines = tmp_path / f"batch{batch}.jsonl"
    lines.write_text("".join(json.dumps({"args": ["job", str(batch), str(i)]}) + "\n" for i in range(BATCH)))
    cli = e31("submit", str(ECHO), "--batch", str(lines), data_dir=a.data_dir)
    assert cli.returncode == 0, cli.stderr
    bid = cli.stdout.strip().splitlines()[-1].split()[-1]
    waited = e31("wait", bid, "--timeout", "240", data_dir=a.data_dir, timeout=300.0)
    assert waited.returncode == 0, waited.stdout[-2000:] + waited.stderr[-2000:]
    docs: list[dict[str, object]] = json.loads(e31("jobs", bid, "--json", data_dir=a.data_dir).stdout)
    assert len(docs) == BATCH and all(d["state"] == "done" and d["succeeded"] for d in docs)
    return docs


def test_sweeps_of_a_module_one_node_knows_reach_the_nodes_that_do_not(
    network: list[Node], tmp_path: Path
) -> None:
    a = network[0]
    ran: list[list[int]] = []
    for batch in range(BATCHES):
        by_node = Counter(d["executor"] for d in sweep(a, tmp_path, batch))
        ran.append([by_node[n.node_id] for n in network])
        assert sum(ran[-1]) == BATCH, f"jobs ran elsewhere: {by_node}"
    print(f"\n{BATCHES} batches of {BATCH}, a having run the module {WARM_UP} times: a, b, c ran {ran}")
    # b and c get jobs to learn the module from (in the first batch, unless their bids came after the
    # spread was made), though a's bids promise far earlier finishes (without probes: [[64, 0, 0],
    # [64, 0, 0], [64, 0, 0]])
    assert all(sum(r[i] for r in ran) >= PROBE_JOBS for i in (1, 2)), ran
    # once they have learned it, their bids compete with a's: the later batches are shared
    later = [sum(r[i] for r in ran[1:]) for i in range(3)]
    assert later[1] + later[2] >= BATCH * (BATCHES - 1) // 4, ran
