"""The scheduling simulator's smallest case (the full runs are benchmarks: docs/scheduling.md)."""

from __future__ import annotations

from sim_schedule import POLICIES, Scenario, metrics, run, simulate

SMALL = Scenario(nodes=3, cores=1, submitters=4, jobs=240, seed=5)


def test_the_smallest_case_keeps_its_promises_and_beats_fifo_under_overload() -> None:
    results = run(SMALL, [1.3])
    ours, fifo, edf = (results[1.3][p] for p in ("ours", "fifo", "edf"))
    assert ours["on_time_of_admitted"] >= 0.99  # type: ignore[operator]
    assert ours["started_after_deadline"] == 0
    assert ours["goodput"] > fifo["goodput"] and ours["goodput"] > edf["goodput"]  # type: ignore[operator]
    assert int(ours["admitted"]) + int(ours["declined"]) == SMALL.jobs  # type: ignore[call-overload]
    assert set(results[1.3]) == set(POLICIES)


def test_the_simulation_is_deterministic_from_its_seed() -> None:
    a = metrics(SMALL, simulate(SMALL, "ours"))
    b = metrics(SMALL, simulate(SMALL, "ours"))
    assert a == b
