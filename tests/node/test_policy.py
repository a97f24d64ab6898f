"""The scheduling policy's properties (node/market/policy.py): admission never promises an infeasible set,
the order keeps every promise, EDF among the jobs at risk, fair share converging to the weights,
aging, expired work, calibration."""

from __future__ import annotations

import heapq

from e31.node.market.policy import (
    MARGIN_MIN,
    Calibration,
    Slot,
    Task,
    Usage,
    admit,
    admit_each,
    all_on_time,
    edf_key,
    expired,
    fair_key,
    fluid_finish,
    late,
    pick,
    plan,
)
from hypothesis import given, settings
from hypothesis import strategies as st

NOW = 1_000_000


@st.composite
def tasks(draw: st.DrawFn, n: int = 12, prefix: bytes = b"t") -> list[Task]:
    count = draw(st.integers(0, n))
    out = []
    for i in range(count):
        est = draw(st.integers(1, 5000))
        slack = draw(st.integers(-2000, 20000))
        sub = draw(st.sampled_from([b"a", b"b", b"c"]))
        out.append(Task(prefix + bytes([i]), sub, NOW + est + slack, est, NOW - draw(st.integers(0, 9000))))
    return out


slots_st = st.lists(st.integers(NOW, NOW + 4000).map(Slot), min_size=1, max_size=3)


@given(slots_st, tasks(prefix=b"p"), tasks(prefix=b"o"))
@settings(max_examples=300, deadline=None)
def test_admission_never_promises_an_infeasible_set(
    slots: list[Slot], promised: list[Task], offered: list[Task]
) -> None:
    before = late(promised, plan(slots, promised, NOW))
    result = admit(slots, promised, offered, NOW)
    accepted = [t for t in offered if t.key in result.accepted]
    after = plan(slots, [*promised, *accepted], NOW)
    assert late([*promised, *accepted], after) <= before  # nobody on time made late, no accepted job late
    assert set(result.accepted) | set(result.declined) == {t.key for t in offered}
    for t in accepted:
        assert result.accepted[t.key] == after[t.key] and after[t.key][1] <= t.deadline


def sweep_tasks(prefix: bytes) -> st.SearchStrategy[list[Task]]:
    """Jobs of a sweep: many sharing one of a few deadlines (where admission's shortcuts matter)."""
    job = st.tuples(st.integers(1, 3000), st.sampled_from([4000, 9000, 15000, 30000]))
    return st.lists(job, max_size=24).map(
        lambda jobs: [Task(prefix + bytes([i]), b"s", NOW + d, e, NOW) for i, (e, d) in enumerate(jobs)]
    )


@given(slots_st, tasks(prefix=b"p") | sweep_tasks(b"p"), tasks(prefix=b"o") | sweep_tasks(b"o"))
@settings(max_examples=500, deadline=None)
def test_admission_decides_as_planning_each_job_in_turn(
    slots: list[Slot], promised: list[Task], offered: list[Task]
) -> None:
    """`admit`'s shortcuts (the fluid bound, one plan for the whole offer) change no decision and no
    planned time of its definition, `admit_each`."""
    fast, each = admit(slots, promised, offered, NOW), admit_each(slots, promised, offered, NOW)
    assert (fast.accepted, set(fast.declined), fast.promised) == (
        each.accepted,
        set(each.declined),
        each.promised,
    )


def test_fluid_finish_fills_the_earliest_free_cores_first() -> None:
    assert fluid_finish([0], 10) == 10
    assert fluid_finish([0, 0], 10) == 5
    assert fluid_finish([0, 100], 10) == 10  # the second core is free only after the work is done
    assert fluid_finish([0, 4], 10) == 7
    assert fluid_finish([], 10) == 10


def run_all(cores: int, waiting: list[Task], usage: Usage) -> dict[bytes, int]:
    """Start the tasks one by one as `pick` chooses, on `cores` cores, each running exactly its
    estimate: the finish of each."""
    free = [NOW] * cores
    waiting = list(waiting)
    finish: dict[bytes, int] = {}
    running: list[tuple[int, bytes]] = []
    while waiting:
        now = heapq.heappop(free)
        busy = [Slot(f) for f in free]
        task = pick(waiting, busy, now, usage)
        if task is None:
            break
        waiting.remove(task)
        finish[task.key] = now + task.estimate_ms
        usage.charge(task.submitter, task.estimate_ms, now)
        heapq.heappush(free, now + task.estimate_ms)
        running.append((finish[task.key], task.key))
    return finish


@given(st.integers(1, 3), tasks(n=14, prefix=b"o"))
@settings(max_examples=300, deadline=None)
def test_jobs_admitted_together_are_all_run_by_their_deadlines_in_the_policys_order(
    cores: int, offered: list[Task]
) -> None:
    slots = [Slot(NOW)] * cores
    result = admit(slots, [], offered, NOW)
    accepted = [t for t in offered if t.key in result.accepted]
    usage = Usage()
    usage.charge(b"a", 10**9, NOW)  # some history, so fair order differs from EDF's
    finish = run_all(cores, accepted, usage)
    assert set(finish) == {t.key for t in accepted}
    for t in accepted:
        assert finish[t.key] <= t.deadline


@given(slots_st, tasks(n=10))
@settings(max_examples=300, deadline=None)
def test_the_pick_never_makes_an_on_time_job_late_and_falls_back_to_edf(
    busy: list[Slot], waiting: list[Task]
) -> None:
    usage = Usage()
    usage.charge(b"b", 5000, NOW)
    task = pick(waiting, busy, NOW, usage)
    live = [t for t in waiting if t.deadline > NOW]
    if not live:
        assert task is None
        return
    assert task is not None and task.deadline > NOW
    base = late(live, plan([Slot(NOW), *busy], live, now=NOW))
    rest = [t for t in live if t is not task]
    after = late(rest, plan([Slot(NOW + task.estimate_ms), *busy], rest, NOW))
    edf_first = min(live, key=edf_key)
    # either the pick keeps every job that was on time on time, or it is EDF's own first job
    assert (
        after <= base and (NOW + task.estimate_ms <= task.deadline or task.key in base)
    ) or task is edf_first


def pick_by_definition(
    waiting: list[Task], busy: list[Slot], now: int, usage: Usage, weights: dict[bytes, float]
) -> Task | None:
    """policy.pick as its docstring defines it, with a plan for every candidate and no shortcut."""
    live = [t for t in waiting if t.deadline > now]
    if not live:
        return None
    by_edf = min(live, key=edf_key)
    base_late = late(live, plan([Slot(now), *busy], live, now))
    for task in sorted(live, key=lambda t: fair_key(t, now, usage, weights))[:32]:
        if task is by_edf:
            return task
        finish = now + task.estimate_ms
        rest = [t for t in live if t is not task]
        rest_late = late(rest, plan([Slot(finish), *busy], rest, now))
        if rest_late <= base_late and (finish <= task.deadline or task.key in base_late):
            return task
    return by_edf


@given(
    slots_st,
    tasks(n=16) | sweep_tasks(b"s"),
    st.dictionaries(st.sampled_from([b"a", b"b", b"c", b"s"]), st.floats(0.1, 10.0), max_size=3),
)
@settings(max_examples=500, deadline=None)
def test_the_pick_without_a_plan_picks_as_with_one(
    busy: list[Slot], waiting: list[Task], weights: dict[bytes, float]
) -> None:
    """The shortcuts of `pick` (the fair order's first is EDF's own, or the bound of `all_on_time`
    says no plan can be late; each submitter's share found once) change no pick of its definition."""
    usage = Usage()
    usage.charge(b"b", 5000, NOW)
    usage.charge(b"c", 900, NOW - 50_000)
    assert pick(waiting, busy, NOW, usage, weights) is pick_by_definition(waiting, busy, NOW, usage, weights)


@given(slots_st, tasks(n=16) | sweep_tasks(b"s"))
@settings(max_examples=500, deadline=None)
def test_all_on_time_holds_only_where_no_order_of_the_plan_is_late(
    busy: list[Slot], waiting: list[Task]
) -> None:
    live = [t for t in waiting if t.deadline > NOW]
    slots = [Slot(NOW), *busy]
    if not all_on_time(slots, live, NOW):
        return
    assert not late(live, plan(slots, live, NOW))
    for first in live:  # any task started first on the free core: the rest still on time
        rest = [t for t in live if t is not first]
        assert NOW + first.estimate_ms <= first.deadline
        assert not late(rest, plan([Slot(NOW + first.estimate_ms), *busy], rest, NOW))


def test_all_on_time_on_a_sweep_with_slack_and_without() -> None:
    sweep = [Task(bytes([i]), b"s", NOW + 10_000, 100, NOW) for i in range(40)]
    assert all_on_time([Slot(NOW)], sweep, NOW)  # 4 s of work, 10 s to do it
    assert not all_on_time([Slot(NOW)], sweep * 3, NOW)  # 12 s of work
    assert all_on_time([Slot(NOW), Slot(NOW + 500)], sweep * 2, NOW)  # 8 s on two cores


def test_edf_among_jobs_at_risk_and_fair_order_when_there_is_slack() -> None:
    usage = Usage()
    usage.charge(b"heavy", 10**12, NOW)  # heavy has used a lot: fair order puts "light" first
    heavy = Task(b"h", b"heavy", NOW + 1000, 900, NOW)
    light = Task(b"l", b"light", NOW + 10_000, 900, NOW)
    # only one core, heavy's job would be late behind light's: it is at risk and goes first (EDF)
    assert pick([heavy, light], [], NOW, usage) is heavy
    # with slack for both, the light submitter goes first
    relaxed = Task(b"h", b"heavy", NOW + 5000, 900, NOW)
    assert pick([relaxed, light], [], NOW, usage) is light
    # among several at risk, the earliest deadline first
    tight = [
        Task(bytes([i]), b"heavy" if i % 2 else b"light", NOW + 1000 * (i + 1), 1000, NOW) for i in range(4)
    ]
    assert pick(list(reversed(tight)), [], NOW, usage) is tight[0]


def test_an_expired_job_is_never_picked() -> None:
    gone = Task(b"x", b"a", NOW, 10, NOW - 50)
    assert expired([gone], NOW) == [gone]
    assert pick([gone], [], NOW, Usage()) is None
    fresh = Task(b"y", b"a", NOW + 100, 10, NOW)
    assert pick([gone, fresh], [], NOW, Usage()) is fresh


@given(st.floats(0.25, 4.0), st.integers(1, 3))
@settings(max_examples=30, deadline=None)
def test_fair_share_converges_to_the_weights(ratio: float, cores: int) -> None:
    """Two submitters with endless backlogs of equal jobs and loose deadlines: the fuel each gets
    approaches its weight's share."""
    weights = {b"a": ratio, b"b": 1.0}
    usage = Usage(half_life_ms=10**12)
    got = {b"a": 0, b"b": 0}
    free = [NOW] * cores
    for n in range(600):
        now = heapq.heappop(free)
        waiting = [
            Task(f"{s.decode()}{n}-{i}".encode(), s, now + 10**9, 100, now)
            for s in (b"a", b"b")
            for i in range(3)
        ]
        task = pick(waiting, [Slot(f) for f in free], now, usage, weights)
        assert task is not None
        usage.charge(task.submitter, 100, now)
        got[task.submitter] += 100
        heapq.heappush(free, now + 100)
    share = got[b"a"] / (got[b"a"] + got[b"b"])
    assert abs(share - ratio / (ratio + 1)) < 0.02


def test_aging_bounds_a_small_jobs_wait_behind_a_favoured_submitters_big_jobs() -> None:
    usage = Usage()
    usage.charge(b"busy", 10**9, NOW)  # the small job's submitter has used more: it is not favoured
    small = Task(b"s", b"busy", NOW + 10**9, 100, NOW)
    waited = 0
    now = NOW
    for i in range(100):
        bigs = [Task(b"b%d" % i, b"idle", NOW + 10**9, 1000, now)]
        task = pick([small, *bigs], [], now, usage)
        assert task is not None
        if task is small:
            break
        now += task.estimate_ms
        waited = now - NOW
    else:
        raise AssertionError("the small job never ran")
    assert waited <= 4.0 * small.estimate_ms + 1000


def test_usage_decays_with_its_half_life() -> None:
    usage = Usage(half_life_ms=1000)
    usage.charge(b"a", 800, 0)
    assert usage.value(b"a", 1000) == 400
    assert usage.value(b"a", 2000) == 200
    usage.forget_below(10**6, floor=1.0)
    assert usage.value(b"a", 10**6) == 0


def test_calibration_learns_the_rate_and_a_margin_from_slow_runs() -> None:
    profile = b"p" * 32
    cal = Calibration(default_rate=1_000_000_000)
    assert cal.estimate_ms(profile, 2_000_000_000, 10**9) == 2500  # the start margin, 1.25
    for _ in range(20):
        cal = cal.ran(profile, 4_000_000_000, 2000)  # 2 Gfuel/s
    assert abs(cal.rate(profile) - 2_000_000_000) < 10_000_000
    steady = cal.margin
    assert MARGIN_MIN <= steady < 1.25
    slow = cal.ran(profile, 4_000_000_000, 4000)  # one run twice as slow as the rate says
    assert slow.margin >= 2.0
    assert cal.missed().margin > cal.margin
    assert cal.estimate_ms(profile, 10**12, 500) == 500  # never past the wall limit
    assert cal.ran(profile, 10, 1) is cal  # too short to say anything
