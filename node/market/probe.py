"""Probes: a few jobs of a sweep's offer for a bidder the spread left idle, so it can learn the module.

Pure, like spread.py. An executor plans a job of a module it has run `history.LEARNED_AFTER` times
at what its runs use and take, and one of a module it has not run at its budget (with the default
limits, its wall limit or the uncalibrated 12.5 s): that is all it knows. So in a sweep of tiny jobs the node
that has run the module bids finishes hundreds of times earlier than the others, the spread (which
follows promised finishes) gives it every job, and the others never run the module, so never learn
it: one bench run gave 996 of 1,000 jobs to the node that knew the module. Bids cannot be made
comparable without telling executors what they do not know.

So when the spread of an offer (of at least `PROBE_SWEEP_MIN` jobs) leaves a bidder with fewer than
`PROBE_JOBS` (= history.LEARNED_AFTER) jobs under way, counting this submitter's jobs there before, it
takes jobs its bid named until it has that many: the latest deadlines first, then those it
promised soonest. A probe never makes a job late: the bidder promised it by its deadline (the
spread's own test); a job at risk (as the spread judges it) is never a probe; an executor probes
take from keeps more than `PROBE_JOBS` jobs of the offer; strangers stay within STRANGER_WORK_SHARE
of the jobs under way, as in the spread. What it costs is bounded: a bidder that is slow, not
unlearned, gets probes only while fewer than `PROBE_JOBS` of this submitter's jobs are under way
there, so at most that many at once, each finished by its promise. And only a bidder that is idle
gets probes: one whose bid starts a job of the offer within PROBE_IDLE_MS. A node that has not run
the module plans its jobs at their budget but can start at once; a node whose cores are promised to
other work (another submitter's jobs, its owner's) would start the probes only after that, and a
sweep that would be over in seconds would then wait for them: that node is left to the spread, and a
node whose bids win nothing then stops planning them (standing.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Container, Mapping, Sequence

from .history import LEARNED_AFTER
from .policy import AT_RISK
from .rules import STRANGER_WORK_SHARE, BidView
from .spread import Wanted

PROBE_JOBS = LEARNED_AFTER
"""Jobs under way a bidder is topped up to: the runs an executor needs to plan a module at its runs."""
PROBE_IDLE_MS = 1000
"""A bidder whose earliest promised start for the offer's jobs is later than this after the spread is
busy, not new to the module: no probes for it."""
PROBE_SWEEP_MIN = 2 * PROBE_JOBS
"""Jobs an offer's spread must give out before any is taken for a probe (an offer of a few jobs is
no sweep: it goes where the bids say)."""


def probe(
    jobs: Sequence[Wanted],
    chosen: Mapping[bytes, BidView],
    load: Mapping[bytes, int],
    *,
    now: int,
    known: Container[bytes] = frozenset(),
) -> dict[bytes, BidView]:
    """`chosen` (the spread of `jobs`, by job key) with jobs moved to each bidder it left with fewer
    than PROBE_JOBS under way, counting this submitter's jobs there before (`load`), until it has
    that many: of the jobs it bid for, the latest deadlines first, then those it promised soonest
    (the module's docstring)."""
    out = dict(chosen)
    given: Counter[bytes] = Counter(b.executor for b in out.values())
    if len(out) < PROBE_SWEEP_MIN:
        return out
    bidders = sorted({e for job in jobs for e, b in job.bids.items() if b.executor == e})
    for executor in bidders:
        room = PROBE_JOBS - load.get(executor, 0)
        if given[executor] >= room or not _idle(executor, jobs, now):
            continue
        mine = [(j, b) for j in jobs if (b := j.bids.get(executor)) is not None and b.executor == executor]
        for job, bid in sorted(mine, key=lambda jb: (-jb[0].deadline, jb[1].expected_finish, jb[0].key)):
            if given[executor] >= room:
                break
            holder = out.get(job.key)
            if (
                holder is None
                or holder.executor == executor
                or given[holder.executor] <= PROBE_JOBS
                or executor in job.exclude
                or not _in_time(bid, job, now)
                or _at_risk(job, now)
                or not _stranger_room(executor, holder.executor, load, given, known)
            ):
                continue
            out[job.key] = bid
            given[holder.executor] -= 1
            given[executor] += 1
    return out


def _idle(executor: bytes, jobs: Sequence[Wanted], now: int) -> bool:
    """Whether the bidder's bid starts one of the offer's jobs within PROBE_IDLE_MS."""
    starts = [
        b.expected_start for j in jobs if (b := j.bids.get(executor)) is not None and b.executor == executor
    ]
    return bool(starts) and min(starts) <= now + PROBE_IDLE_MS


def _in_time(bid: BidView, job: Wanted, now: int) -> bool:
    return bid.expires > now and bid.expected_finish <= job.deadline


def _at_risk(job: Wanted, now: int) -> bool:
    """As the spread judges it: the deadline is within AT_RISK runs of the earliest promise for it."""
    live = [b for e, b in job.bids.items() if b.executor == e and _in_time(b, job, now)]
    if not live:
        return True
    soonest = min(live, key=lambda b: (b.expected_finish, b.expected_start, b.executor))
    return job.deadline - now <= AT_RISK * soonest.run_ms


def _stranger_room(
    executor: bytes, holder: bytes, load: Mapping[bytes, int], given: Counter[bytes], known: Container[bytes]
) -> bool:
    """Whether moving a job from `holder` to `executor` keeps strangers within their share of the jobs
    under way, as the spread keeps them (only a move from a known executor to a stranger adds one)."""
    if executor in known or holder not in known:
        return True
    under_way = Counter(load) + given
    strangers = sum(n for e, n in under_way.items() if e not in known)
    return strangers + 1 <= STRANGER_WORK_SHARE * sum(under_way.values())
