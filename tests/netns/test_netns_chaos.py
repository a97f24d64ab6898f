"""The chaos run's short version (chaos.py; the full one is tests/bench/bench_chaos.py): 30 jobs over
five hosts, two of them behind NAT, under a seeded schedule of kill -9 (the submitter's included),
pulled links and partitions; then every invariant is checked from the nodes' stores and their
exported receipts, and every bundle passes `e31 audit`."""

from __future__ import annotations

from pathlib import Path

from chaos import Chaos, ChaosConfig
from harness import Topology


def test_a_short_chaos_run_loses_nothing_and_runs_no_finished_job_again(
    nat_topology: Topology, tmp_path: Path
) -> None:
    config = ChaosConfig(seed=7, jobs=30, faults=10, public=2, homes=2, hold=(0.5, 2.0), settle=150)
    chaos = Chaos(nat_topology, tmp_path, config)
    try:
        report = chaos.run()
    finally:
        for node in chaos.nodes:
            node.kill()
    print("\n" + report.summary())
    assert report.hosts >= 5 and len(report.faults) == config.faults
    assert report.states.get("done", 0) >= 1
    assert not report.lost, report.lost
    assert not report.overlap, report.overlap
    assert not report.rerun_after_submitter_restart, report.rerun_after_submitter_restart
    assert not report.unacknowledged, report.unacknowledged
    assert not report.acks_lost, report.acks_lost
    assert not report.audit_failures, report.audit_failures
