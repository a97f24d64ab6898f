"""The fuel history (node/market/history.py): a job of a module run here often enough is planned for
what its module's runs use, with headroom, never for more than its budget; memory stays bounded."""

from __future__ import annotations

import math

import pytest
from e31.node.market.history import DECAY, HEADROOM, LEARNED_AFTER, MIN_RUNS, RUN_MS_MIN, History
from e31.node.market.policy import Calibration
from hypothesis import given
from hypothesis import strategies as st

P = b"p" * 32
M = b"m" * 32
BUDGET = 10_000_000_000
WALL_MS = 60_000
CAL = Calibration(rates={P: 20_000_000_000})

runs = st.lists(st.integers(0, 4 * BUDGET), min_size=1, max_size=40)


def test_an_unseen_or_rarely_seen_module_is_planned_at_its_budget() -> None:
    h = History()
    assert h.fuel(P, M, BUDGET) == BUDGET
    for _ in range(MIN_RUNS - 1):
        h.ran(P, M, 2_000_000)
        assert h.fuel(P, M, BUDGET) == BUDGET
    h.ran(P, M, 2_000_000)
    assert h.fuel(P, M, BUDGET) == math.ceil(2_000_000 * HEADROOM)
    # per profile and per module: another profile or module of the same bytes learns nothing from it
    assert h.fuel(b"q" * 32, M, BUDGET) == BUDGET
    assert h.fuel(P, b"n" * 32, BUDGET) == BUDGET


def test_a_default_budget_tiny_job_is_estimated_at_its_runs_not_its_wall_limit() -> None:
    h = History()
    for _ in range(MIN_RUNS):
        h.ran(P, M, 3_000_000)
    today = CAL.estimate_ms(P, BUDGET, WALL_MS)
    learned = CAL.estimate_ms(P, h.fuel(P, M, BUDGET), WALL_MS)
    assert today == 625  # 10 Gfuel at 20 Gfuel/s, times the margin 1.25
    assert learned == 1  # 6 Mfuel at 20 Gfuel/s: under a millisecond
    slow = Calibration(rates={P: 50_000_000})  # a rate learnt from short runs: the budget hits the wall limit
    assert slow.estimate_ms(P, BUDGET, WALL_MS) == WALL_MS
    assert slow.estimate_ms(P, h.fuel(P, M, BUDGET), WALL_MS) == 150


def test_a_run_heavier_than_planned_is_a_miss_and_raises_the_estimate_at_once() -> None:
    h = History()
    for _ in range(MIN_RUNS):
        assert not h.ran(P, M, 1_000_000)
    assert not h.ran(P, M, 2_000_000)  # within the headroom: no miss
    assert h.ran(P, M, 50_000_000)  # more than planned
    assert h.fuel(P, M, BUDGET) == 100_000_000
    assert not h.ran(P, M, 1_000_000)


def test_one_heavy_run_fades_over_tens_of_runs() -> None:
    h = History()
    h.ran(P, M, 100_000_000)
    for _ in range(200):
        h.ran(P, M, 1_000_000)
    assert h.fuel(P, M, BUDGET) == 2_000_000
    seen = h.seen(P, M)
    assert seen is not None and seen.runs == 201


@given(runs, st.integers(1, BUDGET))
def test_never_above_todays_estimate_never_below_the_last_run(fuels: list[int], budget: int) -> None:
    h = History()
    for used in fuels:
        h.ran(P, M, used)
    planned = h.fuel(P, M, budget)
    assert 1 <= planned <= budget
    today = CAL.estimate_ms(P, budget, WALL_MS)
    estimate = CAL.estimate_ms(P, planned, WALL_MS)
    assert estimate <= today
    if len(fuels) >= MIN_RUNS:
        assert planned >= min(budget, fuels[-1])  # the latest run, at least, fits
        assert estimate >= CAL.estimate_ms(P, min(budget, fuels[-1]), WALL_MS)
    else:
        assert planned == budget


@given(st.integers(1, BUDGET // 4), st.integers(0, 30))
def test_steady_runs_converge_to_headroom_times_their_fuel(used: int, before: int) -> None:
    h = History()
    for k in range(before):  # whatever came before, heavier or lighter
        h.ran(P, M, used * (k % 5))
    for _ in range(400):
        h.ran(P, M, used)
    assert h.fuel(P, M, BUDGET) == math.ceil(used * HEADROOM)


@given(st.lists(st.integers(0, 50), min_size=1, max_size=300), st.integers(1, 16))
def test_memory_is_bounded_and_the_least_recently_run_module_is_forgotten(
    modules: list[int], capacity: int
) -> None:
    h = History(capacity)
    for m in modules:
        h.ran(P, bytes([m]) * 32, 1_000)
        assert len(h) <= capacity
    recent = list(dict.fromkeys(reversed(modules)))[:capacity]
    assert all(h.seen(P, bytes([m]) * 32) is not None for m in recent)
    assert len(h) == len(recent)


def test_the_decay_shrinks_the_peak_by_its_share_per_run() -> None:
    h = History()
    h.ran(P, M, 1_000_000)
    h.ran(P, M, 0)
    seen = h.seen(P, M)
    assert seen is not None and seen.peak == pytest.approx(1_000_000 * DECAY)


def test_a_history_remembers_at_least_one_module() -> None:
    with pytest.raises(ValueError):
        History(0)


def test_a_modules_runs_time_bounds_its_estimate_once_timed_often_enough() -> None:
    h = History()
    for i in range(LEARNED_AFTER):
        assert h.run_ms(P, M) is None  # not yet
        h.ran(P, M, 100_000, 400 if i == 0 else 30)  # the first run compiled the module: not counted
    assert h.run_ms(P, M) == 60  # twice what its runs took
    h.ran(P, M, 100_000, 400)  # one slow run (a loaded moment) raises it at once, then fades
    assert h.run_ms(P, M) == 800
    for _ in range(200):
        h.ran(P, M, 100_000, 30)
    assert h.run_ms(P, M) == 60
    for _ in range(200):  # runs of a few ms: below RUN_MS_MIN, their differences are a busy host's noise
        h.ran(P, M, 100_000, 3)
    assert h.run_ms(P, M) == RUN_MS_MIN
    # a run whose time says nothing (paused) teaches its fuel only
    h.ran(P, M, 100_000, None)
    seen = h.seen(P, M)
    assert seen is not None and seen.runs == LEARNED_AFTER + 402 and seen.timed == LEARNED_AFTER + 400
    assert h.run_ms(P, b"n" * 32) is None and h.run_ms(b"q" * 32, M) is None


def test_a_run_longer_than_its_modules_time_allows_raises_it_at_once() -> None:
    h = History()
    for _ in range(LEARNED_AFTER):
        h.ran(P, M, 100_000, 50)
    h.ran(P, M, 100_000, 100)  # within the headroom
    assert h.run_ms(P, M) == 200
    # the same fuel, far longer (a loaded host): planned for it at once; no fuel miss
    assert not h.ran(P, M, 100_000, 500)
    assert h.run_ms(P, M) == 1000


@given(
    st.lists(st.tuples(st.integers(0, BUDGET), st.integers(0, 10**6)), min_size=LEARNED_AFTER, max_size=40)
)
def test_the_time_bound_never_falls_below_the_last_timed_run(runs: list[tuple[int, int]]) -> None:
    h = History()
    for used, took in runs:
        h.ran(P, M, used, took)
    bound = h.run_ms(P, M)
    assert bound is not None and bound >= max(1, runs[-1][1])
