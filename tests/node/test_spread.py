"""The submitter's spread of an offer's jobs across its bidders (node/market/spread.py): pure."""

from __future__ import annotations

from collections import Counter

from e31.node.market.rules import BidView, choose_bid
from e31.node.market.spread import AWARD_MIN, Wanted, awards, finish_times, spread

NOW = 1_800_000_000_000
DEADLINE = NOW + 3_600_000


def plan(executor: bytes, jobs: int, *, each_ms: int, cores: int = 1, backlog_ms: int = 0) -> list[BidView]:
    """The items of one executor's bid for an offer of `jobs` jobs planned together, as its admission
    plans them: job k starts when a core frees after the backlog and the k jobs before it."""
    items = []
    for k in range(jobs):
        start = NOW + backlog_ms + (k // cores) * each_ms
        items.append(BidView(b"bid-" + executor, executor, start, start + each_ms, NOW + 30_000))
    return items


def offer(bids: dict[bytes, list[BidView]], jobs: int, *, deadline: int = DEADLINE) -> list[Wanted]:
    keys = [k.to_bytes(4, "big") for k in range(jobs)]
    return [Wanted(key, deadline, {e: items[i] for e, items in bids.items()}) for i, key in enumerate(keys)]


def counts(chosen: dict[bytes, BidView]) -> Counter[bytes]:
    return Counter(b.executor for b in chosen.values())


def test_equal_bidders_share_a_batch_equally_whoever_promised_each_job_first() -> None:
    # node "a" (this submitter's own executor, say) promises every job a little earlier than the
    # others: alone, each job would go to it (rules.choose_bid); spread, the batch is shared
    bids = {
        b"a": plan(b"a", 60, each_ms=100),
        b"b": plan(b"b", 60, each_ms=100, backlog_ms=5),
        b"c": plan(b"c", 60, each_ms=100, backlog_ms=10),
    }
    chosen = spread(offer(bids, 60), {}, now=NOW)
    assert len(chosen) == 60
    assert counts(chosen) == {b"a": 20, b"b": 20, b"c": 20}
    # the batch ends when the last bidder finishes its share: a third of the time one node would take
    assert max(finish_times(offer(bids, 60), chosen).values()) <= NOW + 10 + 20 * 100


def test_the_batch_is_split_in_proportion_to_the_promised_rates() -> None:
    bids = {
        b"fast": plan(b"fast", 90, each_ms=100, cores=2),
        b"slow": plan(b"slow", 90, each_ms=100),
    }
    chosen = spread(offer(bids, 90), {}, now=NOW)
    assert counts(chosen) == {b"fast": 60, b"slow": 30}
    ends = finish_times(offer(bids, 90), chosen)
    assert ends[b"fast"] == ends[b"slow"] == NOW + 30 * 100


def test_the_batch_ends_no_later_than_with_each_job_choosing_alone() -> None:
    # a greedy over the bidders' promised finishes: the batch ends by the earliest of the makespans
    # the bids allow, at most one job's run after the best balance
    for a_ms, b_ms, c_ms, jobs in [(100, 100, 100, 50), (70, 130, 250, 64), (10, 500, 500, 33)]:
        bids = {
            b"a": plan(b"a", jobs, each_ms=a_ms),
            b"b": plan(b"b", jobs, each_ms=b_ms),
            b"c": plan(b"c", jobs, each_ms=c_ms),
        }
        wanted = offer(bids, jobs)
        ends = finish_times(wanted, spread(wanted, {}, now=NOW))
        all_on_a = NOW + jobs * a_ms
        assert max(ends.values()) <= all_on_a
        best = min(max(n * a_ms, (jobs - n) * b_ms) for n in range(jobs + 1))  # two of them, at best
        assert max(ends.values()) <= NOW + best + max(a_ms, b_ms, c_ms)


def test_a_bid_that_would_miss_the_deadline_is_never_taken() -> None:
    bids = {b"a": plan(b"a", 10, each_ms=100), b"b": plan(b"b", 10, each_ms=1000)}
    deadline = NOW + 2500  # b can finish two of them in time (its items 0 and 1), a all ten
    chosen = spread(offer(bids, 10, deadline=deadline), {}, now=NOW)
    assert len(chosen) == 10
    assert all(b.expected_finish <= deadline for b in chosen.values())
    assert counts(chosen)[b"b"] <= 2


def test_expired_and_excluded_bids_are_never_taken() -> None:
    stale = [BidView(b"bid-a", b"a", NOW, NOW + 100, NOW) for _ in range(4)]
    bids = {b"a": stale, b"b": plan(b"b", 4, each_ms=100), b"c": plan(b"c", 4, each_ms=100)}
    wanted = offer(bids, 4)
    wanted[0] = Wanted(wanted[0].key, wanted[0].deadline, wanted[0].bids, frozenset({b"b", b"c"}))
    chosen = spread(wanted, {}, now=NOW)
    assert wanted[0].key not in chosen  # its only other bidder failed it: it waits for another round
    assert set(counts(chosen)) == {b"b", b"c"}
    assert len(chosen) == 3


def test_strangers_get_only_their_share_while_a_known_executor_bids() -> None:
    bids = {b"k": plan(b"k", 40, each_ms=1000), b"s": plan(b"s", 40, each_ms=1)}
    chosen = spread(offer(bids, 40), {}, now=NOW, known={b"k"})
    assert 0 < counts(chosen)[b"s"] <= 0.25 * 40 + 1
    # with no evidence on either, the faster takes the jobs it finishes first
    assert counts(spread(offer(bids, 40), {}, now=NOW))[b"s"] == 40


def test_a_job_at_risk_takes_the_earliest_finish_promised_for_it() -> None:
    # a plans the offer's second job first (its queue's order); b has two cores
    items = {
        b"a": [
            BidView(b"bid-a", b"a", NOW + 100, NOW + 200, NOW + 30_000),
            BidView(b"bid-a", b"a", NOW, NOW + 100, NOW + 30_000),
        ],
        b"b": [
            BidView(b"bid-b", b"b", NOW, NOW + 150, NOW + 30_000),
            BidView(b"bid-b", b"b", NOW, NOW + 160, NOW + 30_000),
        ],
    }
    first = (0).to_bytes(4, "big")
    # due in 200 ms (at risk: within twice its run), the first job goes where its own promise is
    # earliest, b (150 ms; a promised it for 200)
    assert spread(offer(items, 2, deadline=NOW + 200), {}, now=NOW)[first].executor == b"b"
    # with slack, to a, which finishes one job of the offer by 100 ms
    assert spread(offer(items, 2, deadline=NOW + 10_000), {}, now=NOW)[first].executor == b"a"


def test_the_spread_is_the_same_whatever_the_order_of_jobs_and_bids() -> None:
    bids = {
        b"a": plan(b"a", 30, each_ms=70),
        b"b": plan(b"b", 30, each_ms=90, cores=2),
        b"c": plan(b"c", 30, each_ms=200),
    }
    wanted = offer(bids, 30)
    shuffled = [Wanted(w.key, w.deadline, dict(reversed(list(w.bids.items())))) for w in reversed(wanted)]
    assert spread(wanted, {}, now=NOW) == spread(shuffled, {}, now=NOW)


def test_a_stream_of_one_job_offers_spreads_by_the_jobs_under_way_as_choose_bid_does() -> None:
    # one job per offer, every bidder idle: "a" (the submitter's own executor, say) promises the
    # earliest finish each time, since its bid needs no network. Its plan may not show the assignments
    # still on their way, so the jobs this submitter has under way at each executor count as in
    # rules.choose_bid: with 2 already at "a", the next goes elsewhere, and the choice is choose_bid's
    load: Counter[bytes] = Counter()
    for _ in range(9):
        bids = {
            e: plan(e, 1, each_ms=100, backlog_ms=skew)[0] for e, skew in ((b"a", 0), (b"b", 5), (b"c", 9))
        }
        wanted = offer({e: [b] for e, b in bids.items()}, 1)
        chosen = spread(wanted, load, now=NOW)
        alone = choose_bid(bids.values(), load, now=NOW, deadline=DEADLINE)
        assert alone is not None and chosen[wanted[0].key] == alone
        load[alone.executor] += 1
    assert load == {b"a": 3, b"b": 3, b"c": 3}


def test_bidders_left_with_named_jobs_they_were_not_given_are_told_what_they_won() -> None:
    bids = {
        b"a": plan(b"a", 12, each_ms=100),
        b"b": plan(b"b", 12, each_ms=100, backlog_ms=5),
        b"c": plan(b"c", 12, each_ms=100, backlog_ms=10_000),  # far behind: wins nothing
    }
    wanted = offer(bids, 12)
    chosen = spread(wanted, {}, now=NOW)
    told = awards(wanted, chosen)
    assert set(told) == {b"bid-a", b"bid-b", b"bid-c"}
    for bid_id, (executor, won) in told.items():
        assert bid_id == b"bid-" + executor
        assert won == sorted(k for k, b in chosen.items() if b.executor == executor)
    assert told[b"bid-c"] == (b"c", [])
    assert len(told[b"bid-a"][1]) + len(told[b"bid-b"][1]) == 12
    # a bid that won all it named, or all but fewer than AWARD_MIN, is not told
    two = {b"a": plan(b"a", AWARD_MIN + 1, each_ms=100), b"b": plan(b"b", AWARD_MIN + 1, each_ms=10_000)}
    wanted = offer(two, AWARD_MIN + 1)
    chosen = spread(wanted, {}, now=NOW)
    assert counts(chosen) == {b"a": AWARD_MIN + 1}
    assert awards(wanted, chosen) == {b"bid-b": (b"b", [])}
