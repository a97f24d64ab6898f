"""Probes (node/market/probe.py): a bidder the spread of a sweep's offer leaves idle gets a few of the
jobs it bid for, to learn the module; pure."""

from __future__ import annotations

from collections import Counter

from e31.node.market.probe import PROBE_IDLE_MS, PROBE_JOBS, PROBE_SWEEP_MIN, probe
from e31.node.market.rules import STRANGER_WORK_SHARE, BidView
from e31.node.market.spread import Wanted, spread
from hypothesis import given
from hypothesis import strategies as st
from test_spread import DEADLINE, NOW, offer, plan


def counts(chosen: dict[bytes, BidView]) -> Counter[bytes]:
    return Counter(b.executor for b in chosen.values())


def learned_and_not(jobs: int, *, known_ms: int = 5, budget_ms: int = 60_000) -> list[Wanted]:
    """An offer bid for by "a", which has run the module (a few ms a job), and by "b" and "c", which
    have not (each job planned at its budget: its wall limit)."""
    bids = {
        b"a": plan(b"a", jobs, each_ms=known_ms),
        b"b": plan(b"b", jobs, each_ms=budget_ms),
        b"c": plan(b"c", jobs, each_ms=budget_ms),
    }
    return offer(bids, jobs)


def test_the_spread_alone_gives_a_sweep_to_the_node_that_knows_the_module() -> None:
    wanted = learned_and_not(64)
    assert counts(spread(wanted, {}, now=NOW)) == {b"a": 64}  # what probes are for


def test_each_idle_bidder_gets_probes_the_rest_stays_where_the_spread_put_it() -> None:
    wanted = learned_and_not(64)
    chosen = spread(wanted, {}, now=NOW)
    probed = probe(wanted, chosen, {}, now=NOW)
    assert counts(probed) == {b"a": 64 - 2 * PROBE_JOBS, b"b": PROBE_JOBS, b"c": PROBE_JOBS}
    assert probed.keys() == chosen.keys()
    moved = {k for k in probed if probed[k] is not chosen[k]}
    # each probe is the bidder's own promise for that job, made by the deadline
    for key in moved:
        job = next(j for j in wanted if j.key == key)
        assert probed[key] is job.bids[probed[key].executor]
        assert probed[key].expected_finish <= job.deadline
    # the jobs each bidder promised soonest (all deadlines are one here)
    assert moved == {k.to_bytes(4, "big") for k in range(2 * PROBE_JOBS)}


def test_probes_top_up_what_is_under_way_at_a_bidder_to_probe_jobs_no_more() -> None:
    wanted = learned_and_not(64)
    chosen = spread(wanted, {}, now=NOW)
    probed = probe(wanted, chosen, {b"b": 1, b"c": PROBE_JOBS}, now=NOW)
    assert counts(probed) == {b"a": 64 - (PROBE_JOBS - 1), b"b": PROBE_JOBS - 1}
    # a bidder the spread gave one job gets the rest of its probes
    bids = {b"a": plan(b"a", 64, each_ms=5), b"b": plan(b"b", 64, each_ms=1000, backlog_ms=-900)}
    wanted = offer(bids, 64)
    chosen = spread(wanted, {}, now=NOW)
    assert counts(chosen)[b"b"] == 1
    assert counts(probe(wanted, chosen, {}, now=NOW))[b"b"] == PROBE_JOBS
    # spread evenly already: nothing moves
    even = offer({e: plan(e, 60, each_ms=100) for e in (b"a", b"b", b"c")}, 60)
    chosen = spread(even, {}, now=NOW)
    assert probe(even, chosen, {}, now=NOW) == chosen


def test_an_offer_of_few_jobs_is_no_sweep() -> None:
    wanted = learned_and_not(PROBE_SWEEP_MIN - 1)
    chosen = spread(wanted, {}, now=NOW)
    assert probe(wanted, chosen, {}, now=NOW) == chosen
    # and the executor probes take from keeps PROBE_JOBS of its own at least
    wanted = learned_and_not(PROBE_SWEEP_MIN)
    probed = probe(wanted, spread(wanted, {}, now=NOW), {}, now=NOW)
    assert counts(probed)[b"a"] >= PROBE_JOBS


def test_no_probe_past_a_deadline_or_for_a_job_at_risk_or_one_the_bidder_failed() -> None:
    # b's promises for the whole offer land after the deadline: no candidate
    late = learned_and_not(64, budget_ms=3_600_001)
    assert counts(probe(late, spread(late, {}, now=NOW), {}, now=NOW)) == {b"a": 64}
    # every job at risk: its deadline within AT_RISK runs of the earliest promise for it
    tight = [
        Wanted(
            j.key,
            NOW + 200,
            {
                b"a": BidView(b"bid-a", b"a", NOW, NOW + 100, NOW + 30_000),
                b"b": BidView(b"bid-b", b"b", NOW, NOW + 200, NOW + 30_000),
            },
        )
        for j in learned_and_not(8)
    ]
    chosen = spread(tight, {}, now=NOW)
    assert probe(tight, chosen, {}, now=NOW) == chosen
    failed = [Wanted(j.key, j.deadline, j.bids, frozenset({b"b", b"c"})) for j in learned_and_not(64)]
    assert counts(probe(failed, spread(failed, {}, now=NOW), {}, now=NOW)) == {b"a": 64}


def test_strangers_are_probed_only_within_their_share_of_the_work_under_way() -> None:
    wanted = learned_and_not(64)
    chosen = spread(wanted, {}, now=NOW, known={b"a"})
    assert counts(chosen) == {b"a": 64}
    probed = probe(wanted, chosen, {}, now=NOW, known={b"a"})
    strangers = counts(probed)[b"b"] + counts(probed)[b"c"]
    assert 0 < strangers <= STRANGER_WORK_SHARE * 64
    # known bidders are probed whatever their number
    assert counts(probe(wanted, chosen, {}, now=NOW, known={b"a", b"b", b"c"})) == counts(
        probe(wanted, chosen, {}, now=NOW)
    )


@given(
    st.integers(1, 64),
    st.lists(st.integers(1, 120_000), min_size=2, max_size=5),
    st.lists(st.integers(0, 3), min_size=5, max_size=5),
)
def test_probes_never_add_or_drop_a_job_nor_make_one_late(
    jobs: int, each: list[int], load: list[int]
) -> None:
    executors = [bytes([65 + i]) for i in range(len(each))]
    wanted = offer({e: plan(e, jobs, each_ms=ms) for e, ms in zip(executors, each, strict=True)}, jobs)
    under_way = dict(zip(executors, load, strict=False))
    chosen = spread(wanted, under_way, now=NOW)
    probed = probe(wanted, chosen, under_way, now=NOW)
    assert probed.keys() == chosen.keys()
    for job in wanted:
        if job.key in probed:
            bid = probed[job.key]
            assert job.bids[bid.executor] is bid and bid.expected_finish <= DEADLINE
    before, after = counts(chosen), counts(probed)
    for e in executors:
        if after[e] > before[e]:  # probes: up to PROBE_JOBS under way there, no more
            assert after[e] + under_way.get(e, 0) <= PROBE_JOBS
        elif after[e] < before[e]:  # taken from: keeps PROBE_JOBS at least
            assert after[e] >= PROBE_JOBS


def test_a_busy_bidder_gets_no_probes_an_idle_one_does() -> None:
    """A node whose core is promised to other work for a minute starts nothing of the offer before
    then: a probe would hold the sweep's end back that long. An idle node new to the module starts at
    once, however long it plans each job."""
    bids = {
        b"a": plan(b"a", 64, each_ms=5),
        b"busy": plan(b"busy", 64, each_ms=5, backlog_ms=60_000),
        b"new": plan(b"new", 64, each_ms=60_000),
    }
    wanted = offer(bids, 64)
    probed = probe(wanted, spread(wanted, {}, now=NOW), {}, now=NOW)
    assert counts(probed) == {b"a": 64 - PROBE_JOBS, b"new": PROBE_JOBS}
    just_idle = offer({**bids, b"busy": plan(b"busy", 64, each_ms=5, backlog_ms=PROBE_IDLE_MS)}, 64)
    assert counts(probe(just_idle, spread(just_idle, {}, now=NOW), {}, now=NOW))[b"busy"] == PROBE_JOBS
