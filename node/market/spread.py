"""How a submitter spreads the jobs of one offer across every executor that bid: pure, like rules.py.

A sweep goes out as offers of many jobs (offering.py), and each executor that can take some of them
answers with one bid whose items are its plan for them all: the k-th of its items finishes about when
k jobs of the offer are done there. Choosing each job's bid alone (rules.choose_bid) lets the node
whose bid came first, or that promises the earliest finish for every item, take the whole set. The
spread instead assigns the offer's jobs together, in deadline order (then job id), each to the bidder
that would finish it earliest counting the jobs of this offer already given to it: an executor given
n jobs finishes the next one by its (n+1)-th earliest promised finish. So a batch lands on the bidders
in proportion to the rate they promise, and the last of its jobs finishes as early as the bids allow.

Each assignment stays within the executor's own promise for that job (its item's finish is by the
deadline, or it is no candidate), so the spread never makes a job late that a single choice would have
kept on time. The rules of `choose_bid` hold here too: a job at risk (policy.at_risk) takes the
earliest finish promised for it; an executor that failed a job is not given it again; strangers get at
most STRANGER_WORK_SHARE of the jobs under way while a known executor bids; equal estimates go to the
bid from a known executor, then to the one holding more of the job's bytes, then by key. This node's
own executor is a bidder like any other: its preference is only its queue's share (MarketSettings.own_share).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass

from .policy import AT_RISK
from .rules import STRANGER_WORK_SHARE, BidView


@dataclass(frozen=True, slots=True)
class Wanted:
    """One job of an offer, with the bids for it in hand (by executor)."""

    key: bytes
    deadline: int
    bids: Mapping[bytes, BidView]
    exclude: frozenset[bytes] = frozenset()
    """Executors that failed this job: never given it again."""


def spread(
    jobs: Sequence[Wanted],
    load: Mapping[bytes, int],
    *,
    now: int,
    known: Container[bytes] = frozenset(),
) -> dict[bytes, BidView]:
    """The bid each job of an offer takes (by job key; a job with no live bid that meets its deadline
    is left out). `load`: this submitter's jobs under way at each executor before this offer, counted
    as rules.choose_bid counts them (a bid's plan may not show an assignment still on its way, and a
    stream of one-job offers then spreads as choose_bid spreads it), and for the strangers' share."""
    live: dict[bytes, list[BidView]] = {}
    finishes: dict[bytes, list[int]] = {}
    for job in jobs:
        ok = [
            b
            for e, b in job.bids.items()
            if b.executor == e and b.expires > now and b.expected_finish <= job.deadline
        ]
        live[job.key] = [b for b in ok if b.executor not in job.exclude]
        for b in ok:
            finishes.setdefault(b.executor, []).append(b.expected_finish)
    for times in finishes.values():
        times.sort()
    given: Counter[bytes] = Counter()
    chosen: dict[bytes, BidView] = {}
    for job in sorted(jobs, key=lambda j: (j.deadline, j.key)):
        bids = live[job.key]
        if any(b.executor in known for b in bids):
            under_way = Counter(load) + given
            strangers = sum(n for e, n in under_way.items() if e not in known)
            if strangers + 1 > STRANGER_WORK_SHARE * (sum(under_way.values()) + 1):
                bids = [b for b in bids if b.executor in known]
        if not bids:
            continue
        soonest = min(bids, key=lambda b: (b.expected_finish, b.expected_start, b.executor))
        urgent = job.deadline - now <= AT_RISK * soonest.run_ms

        bid = min(
            bids,
            key=lambda b: _rank(
                b, finishes[b.executor], given[b.executor], load.get(b.executor, 0), urgent, known
            ),
        )
        chosen[job.key] = bid
        given[bid.executor] += 1
    return chosen


def _rank(
    bid: BidView, finishes: Sequence[int], given: int, load: int, urgent: bool, known: Container[bytes]
) -> tuple[int, bool, int, bytes]:
    """A bid's place for the next job: when its executor would finish it, counting the `given` jobs
    of this offer already assigned there and, as rules.choose_bid does, one run of this job for each
    of the `load` jobs this submitter had under way there before the offer (its promise for this job
    alone when the job is at risk); then known before stranger, more of the job's bytes held, by key."""
    if urgent:
        return (bid.expected_finish, bid.executor not in known, -bid.held_bytes, bid.executor)
    estimate = bid.expected_finish if given >= len(finishes) else finishes[given]
    return (estimate + load * bid.run_ms, bid.executor not in known, -bid.held_bytes, bid.executor)


def finish_times(jobs: Sequence[Wanted], chosen: Mapping[bytes, BidView]) -> dict[bytes, int]:
    """When each executor would finish the jobs `chosen` gives it, by its bids: its n-th earliest
    promised finish for the n jobs (what `spread` balances; for tests and the bench)."""
    finishes: dict[bytes, list[int]] = {}
    for job in jobs:
        for e, b in job.bids.items():
            if b.executor == e:
                finishes.setdefault(e, []).append(b.expected_finish)
    count = Counter(b.executor for b in chosen.values())
    return {e: sorted(finishes[e])[n - 1] for e, n in count.items()}


AWARD_MIN = 4
"""Jobs a bid named but was not given, at least, for its bidder to be told so with an `award`: fewer
hold little room at the executor, and lapse there by its own timers (bidding.UNCHOSEN_MS) soon enough."""


def awards(jobs: Sequence[Wanted], chosen: Mapping[bytes, BidView]) -> dict[bytes, tuple[bytes, list[bytes]]]:
    """For each bid of the offer that named at least AWARD_MIN jobs it was not given by `chosen` (the
    spread): its executor and the jobs it was given, in key order (possibly none), by bid id."""
    named: Counter[bytes] = Counter()
    bidder: dict[bytes, bytes] = {}
    for job in jobs:
        for e, b in job.bids.items():
            if b.executor == e:
                named[b.bid_id] += 1
                bidder[b.bid_id] = e
    given: dict[bytes, list[bytes]] = {}
    for key, b in chosen.items():
        given.setdefault(b.bid_id, []).append(key)
    return {
        bid_id: (bidder[bid_id], sorted(given.get(bid_id, ())))
        for bid_id, n in named.items()
        if n - len(given.get(bid_id, ())) >= AWARD_MIN
    }
