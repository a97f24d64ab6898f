"""The market's pure decisions: states, bids, the submitter's choice, the bid window, leases."""

from __future__ import annotations

import pytest
from e31.node.lifecycle import (
    EXECUTOR_TRANSITIONS,
    SUBMITTER_TRANSITIONS,
    IllegalTransition,
    check_transition,
)
from e31.node.market.rules import (
    LINK_TRUST_MS,
    STRANGER_FLOOR_CORES,
    BidPlan,
    BidView,
    DeclinePlan,
    Evidence,
    ExecutorView,
    OfferView,
    Window,
    WindowSettings,
    backoff,
    believe,
    choose_bid,
    lease_expiry,
    offer_expiry,
    plan_bid,
    run_estimate_ms,
    window_state,
)

PROFILE = b"p" * 32
NOW = 1_800_000_000_000


def offer(**kw: int | bytes) -> OfferView:
    base: dict[str, int | bytes] = {
        "profile": PROFILE,
        "fuel": 2_000_000_000,
        "memory_bytes": 1 << 20,
        "wall_ms": 60_000,
        "deadline": NOW + 3_600_000,
        "expires": NOW + 60_000,
    }
    base.update(kw)
    return OfferView(**base)  # type: ignore[arg-type]


def executor(**kw: int | bytes) -> ExecutorView:
    base: dict[str, int | bytes] = {
        "profile": PROFILE,
        "cores": 2,
        "memory_bytes": 1 << 30,
        "backlog_ms": 0,
        "queue_length": 0,
        "max_queue": 10,
        "fuel_rate": 1_000_000_000,
    }
    base.update(kw)
    return ExecutorView(**base)  # type: ignore[arg-type]


def test_states_follow_the_documented_paths() -> None:
    check_transition("submitter", "queued", "offered")
    check_transition("submitter", "offered", "assigned")
    check_transition("submitter", "assigned", "offered")  # the lease ran out: offered again
    check_transition("submitter", "offered", "done")  # a late but valid outcome is accepted
    for state in ("queued", "offered", "assigned"):
        check_transition("submitter", state, "cancelled")
    check_transition("executor", "fetching", "queued")
    check_transition("executor", "running", "done")
    check_transition("executor", "queued", "done")  # a run too short to be marked running
    for role, table in (("submitter", SUBMITTER_TRANSITIONS), ("executor", EXECUTOR_TRANSITIONS)):
        for terminal in ("done", "failed", *(("expired", "cancelled") if role == "submitter" else ())):
            assert not table[terminal]
            with pytest.raises(IllegalTransition):
                check_transition(role, terminal, "queued")
    with pytest.raises(IllegalTransition):
        check_transition("submitter", "queued", "done")
    with pytest.raises(IllegalTransition):
        check_transition("executor", "fetching", "done")


def test_the_run_estimate_is_the_wall_limit_or_the_fuel_at_the_measured_rate() -> None:
    assert run_estimate_ms(fuel=2_000_000_000, wall_ms=60_000, fuel_rate=1_000_000_000) == 2000
    assert run_estimate_ms(fuel=10**15, wall_ms=60_000, fuel_rate=1_000_000_000) == 60_000
    assert run_estimate_ms(fuel=1, wall_ms=60_000, fuel_rate=10**12) == 1
    assert run_estimate_ms(fuel=10, wall_ms=60_000, fuel_rate=0) == 10_000


def test_an_idle_executor_bids_to_start_now() -> None:
    plan = plan_bid(offer(), executor(), NOW, bid_ttl_ms=30_000)
    assert plan == BidPlan(expected_start=NOW, expected_finish=NOW + 2000, expires=NOW + 30_000)


def test_the_backlog_is_spread_over_the_cores() -> None:
    plan = plan_bid(offer(), executor(backlog_ms=8000, cores=4), NOW, bid_ttl_ms=30_000)
    assert isinstance(plan, BidPlan)
    assert plan.expected_start == NOW + 2000
    assert plan.expected_finish == NOW + 4000


@pytest.mark.parametrize(
    ("o", "e", "reason"),
    [
        (offer(profile=b"q" * 32), executor(), "no_profile"),
        (offer(memory_bytes=1 << 31), executor(), "limits"),
        (offer(), executor(queue_length=10), "busy"),
        (offer(), executor(cores=0), "busy"),
        (offer(deadline=NOW + 1000), executor(), "deadline"),
        (offer(expires=NOW), executor(), "expired"),
    ],
)
def test_an_executor_that_cannot_serve_declines_with_the_reason(
    o: OfferView, e: ExecutorView, reason: str
) -> None:
    plan = plan_bid(o, e, NOW, bid_ttl_ms=30_000)
    assert isinstance(plan, DeclinePlan)
    assert plan.reason == reason
    assert plan.text


def bid(executor: bytes, start: int, finish: int, expires: int = NOW + 30_000) -> BidView:
    return BidView(b"bid-" + executor, executor, start, finish, expires)


def test_the_earliest_finish_wins() -> None:
    a, b = bid(b"a", NOW, NOW + 5000), bid(b"b", NOW + 1000, NOW + 3000)
    assert choose_bid([a, b], {}, now=NOW, deadline=NOW + 10_000) == b


def test_work_already_assigned_to_an_executor_counts_against_it() -> None:
    a, b = bid(b"a", NOW, NOW + 1000), bid(b"b", NOW, NOW + 1500)
    assert choose_bid([a, b], {}, now=NOW, deadline=NOW + 10_000) == a
    assert choose_bid([a, b], {b"a": 1}, now=NOW, deadline=NOW + 10_000) == b


def test_expired_late_and_excluded_bids_are_never_chosen() -> None:
    stale = bid(b"a", NOW, NOW + 1000, expires=NOW)
    late = bid(b"b", NOW, NOW + 20_000)
    failed = bid(b"c", NOW, NOW + 1000)
    assert (
        choose_bid([stale, late, failed], {}, now=NOW, deadline=NOW + 10_000, exclude=frozenset({b"c"}))
        is None
    )
    assert choose_bid([stale, late, failed], {}, now=NOW, deadline=NOW + 10_000) == failed


def test_ties_are_broken_by_start_then_executor_key() -> None:
    a, b = bid(b"b", NOW, NOW + 1000), bid(b"a", NOW, NOW + 1000)
    assert choose_bid([a, b], {}, now=NOW, deadline=NOW + 10_000) == b


def test_a_known_executor_goes_ahead_of_an_equal_stranger() -> None:
    known, stranger = bid(b"k", NOW, NOW + 1000), bid(b"a", NOW, NOW + 1000)  # b"a" < b"k"
    assert choose_bid([known, stranger], {}, now=NOW, deadline=NOW + 10_000) == stranger
    assert choose_bid([known, stranger], {}, now=NOW, deadline=NOW + 10_000, known={b"k"}) == known


def test_strangers_promising_instant_runs_get_only_a_share_while_known_executors_bid() -> None:
    known = [bid(b"k1", NOW, NOW + 5000), bid(b"k2", NOW, NOW + 6000)]
    strangers = [bid(i.to_bytes(4, "big"), NOW, NOW + 1) for i in range(1000)]
    ks = frozenset({b"k1", b"k2"})

    def choose(load: dict[bytes, int]) -> bytes | None:
        chosen = choose_bid([*strangers, *known], load, now=NOW, deadline=NOW + 10_000, known=ks)
        return None if chosen is None else chosen.executor

    assert choose({}) == b"k1"  # one job at a time: never a stranger while a known executor bids
    assert choose({b"k1": 1, b"k2": 1}) == b"k1"
    # with three jobs under way at known executors, the fourth may go to a stranger (1 in 4) ...
    assert choose({b"k1": 2, b"k2": 1}) not in ks
    # ... but no more while a stranger holds one of them
    assert choose({b"k1": 2, b"k2": 1, strangers[0].executor: 1}) in ks
    # and with no known executor bidding, strangers are all there is
    assert choose_bid(strangers, {}, now=NOW, deadline=NOW + 10_000, known=ks) is not None


def test_evidence_is_receipts_a_pinned_bootstrap_key_or_a_long_lived_link() -> None:
    assert not Evidence().known and not Evidence(link_age_ms=LINK_TRUST_MS - 1).known
    assert Evidence(receipts=1).known and Evidence(bootstrap=True).known
    assert Evidence(link_age_ms=LINK_TRUST_MS).known


def test_any_number_of_strangers_adverts_cannot_dominate_what_a_node_believes() -> None:
    known = [(8, 16 << 30, True), (4, 8 << 30, True)]
    strangers = [(0xFFFF, 1 << 50, False)] * 1000
    view = believe([*known, *strangers])
    assert view.known_cores == 12 and view.strangers == 1000 and view.claimed_by_strangers == 1000 * 0xFFFF
    assert view.stranger_cores == 3 and view.cores == 15  # at most a fifth of what is believed
    assert view.memory_bytes <= (24 << 30) * 5 // 4
    # a modest stranger within the share is believed whole
    assert believe([*known, (2, 1 << 30, False)]).cores == 14
    # with no known key, strangers' claims count only up to a floor
    assert believe(strangers).cores == STRANGER_FLOOR_CORES
    assert believe([]).cores == 0


SETTINGS = WindowSettings(window=1.0, max_wait=10.0)


def state(waited: float, expected: set[bytes], answered: set[bytes], bids: int) -> Window:
    return window_state(
        now=100.0 + waited,
        opened=100.0,
        expected=frozenset(expected),
        answered=frozenset(answered),
        bids=bids,
        settings=SETTINGS,
    )


def test_the_window_closes_as_soon_as_everyone_answered() -> None:
    assert state(0.01, {b"a", b"b"}, {b"a", b"b"}, bids=1) is Window.ASSIGN
    assert state(0.01, {b"a", b"b"}, {b"a"}, bids=1) is Window.WAIT


def test_a_slow_peer_holds_the_window_only_for_a_short_while() -> None:
    assert state(0.99, {b"a", b"b"}, {b"a"}, bids=1) is Window.WAIT
    assert state(1.0, {b"a", b"b"}, {b"a"}, bids=1) is Window.ASSIGN


def test_no_bid_means_waiting_then_offering_again() -> None:
    assert state(5.0, {b"a"}, set(), bids=0) is Window.WAIT
    assert state(10.0, {b"a"}, set(), bids=0) is Window.REOFFER
    assert state(0.1, {b"a", b"b"}, {b"a", b"b"}, bids=0) is Window.REOFFER  # everyone declined
    assert state(5.0, set(), set(), bids=0) is Window.WAIT  # nobody to ask yet


def test_leases_cover_twice_the_estimate_plus_slack_but_end_by_the_deadline() -> None:
    b = bid(b"a", NOW, NOW + 4000)
    assert lease_expiry(NOW, b, NOW + 3_600_000, slack_ms=30_000) == NOW + 38_000
    assert lease_expiry(NOW, b, NOW + 10_000, slack_ms=30_000) == NOW + 10_000
    assert offer_expiry(NOW, NOW + 3_600_000, 60_000, 0) == NOW + 60_000
    rounds = {offer_expiry(NOW, NOW + 10_000, 60_000, r) for r in range(5)}
    assert len(rounds) == 5 and max(rounds) == NOW + 10_000  # each round is a distinct message


def test_backoff_doubles_per_try_up_to_its_doublings_and_its_cap() -> None:
    assert [backoff(0.2, tries, 60.0, doublings=8) for tries in (0, 1, 2, 3)] == [0.2, 0.4, 0.8, 1.6]
    assert backoff(0.2, 9, 60.0, doublings=8) == backoff(0.2, 8, 60.0, doublings=8) == 51.2
    assert backoff(1.0, 20, 8.0, doublings=12) == 8.0


def test_a_job_at_risk_takes_the_earliest_promised_finish_whatever_the_load() -> None:
    """The executor runs a job at risk ahead of the jobs there with slack (policy.pick), so this
    submitter's jobs under way there do not count against its bid: the fair-order policy's rule."""
    a, b = bid(b"a", NOW, NOW + 1000), bid(b"b", NOW, NOW + 1500)
    load = {b"a": 1}
    assert choose_bid([a, b], load, now=NOW, deadline=NOW + 10_000) == b  # slack: the load counts
    assert choose_bid([a, b], load, now=NOW, deadline=NOW + 1_800) == a  # within twice its run: at risk
