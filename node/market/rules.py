"""The market's decisions as pure functions: job states, the executor's bid, the submitter's choice.

Nothing here reads a clock, draws a random number or touches a file: times (ms since the Unix epoch, or
trio seconds for the bid window) come in as parameters, so every rule is tested without I/O. The trio
services that act on these decisions are node/market_submitter.py and node/market_executor.py.

- A bid's finish estimate: the executor's backlog (the estimated run time of every job it holds, spread
  over its cores) plus this job's estimate, min(wall limit, fuel limit / measured fuel rate).
- The submitter ranks bids by estimated finish, adding for each executor the jobs it has itself assigned
  there and not yet seen finish (a bid made before those assignments does not count them), so a burst
  of offers spreads over the network instead of piling onto the first idle node.
- A job with replicas ends `done` only when every replica's verified receipt claims the same outcome,
  fuel and output hashes; otherwise `disputed`.
- A job withdrawn by its submitter (`e31 cancel`) ends `cancelled` from any state before an end, on
  both sides.
- A valid outcome of an earlier attempt that arrives after its lease ran out is still accepted
  (offered -> done): the work was done and verified.
- The bid window closes as soon as every peer expected to answer has answered (bid or decline), or when
  `window` seconds have passed with at least one bid in hand; with no bid after `max_wait`, the job is
  offered again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

DEFAULT_FUEL_RATE = 1_000_000_000
"""Fuel per second one core burns before the node has measured its own rate (order of magnitude here)."""
MIN_ESTIMATE_MS = 1


# --- the executor's side -----------------------------------------------------------------------------


def run_estimate_ms(fuel: int, wall_ms: int, fuel_rate: int) -> int:
    """How long a job may hold a core: its wall limit, or sooner if its fuel runs out first."""
    by_fuel = -(-fuel * 1000 // max(fuel_rate, 1))
    return max(MIN_ESTIMATE_MS, min(wall_ms, by_fuel))


@dataclass(frozen=True, slots=True)
class ExecutorView:
    """What an executor knows about itself when an offer arrives."""

    profile: bytes
    cores: int
    memory_bytes: int
    backlog_ms: int
    """Estimated run time of every job it holds (queued or running), summed."""
    queue_length: int
    max_queue: int
    fuel_rate: int


@dataclass(frozen=True, slots=True)
class OfferView:
    """The parts of an offer the bid decision looks at."""

    profile: bytes
    fuel: int
    memory_bytes: int
    wall_ms: int
    deadline: int
    expires: int


@dataclass(frozen=True, slots=True)
class BidPlan:
    expected_start: int
    expected_finish: int
    expires: int


@dataclass(frozen=True, slots=True)
class DeclinePlan:
    reason: str
    text: str
    expires: int


def plan_bid(offer: OfferView, me: ExecutorView, now: int, *, bid_ttl_ms: int) -> BidPlan | DeclinePlan:
    """Bid (with start and finish estimates) or decline (with one of the protocol's reasons)."""
    expires = now + bid_ttl_ms
    if offer.expires <= now:
        return DeclinePlan("expired", "the offer has expired", expires)
    if offer.profile != me.profile:
        return DeclinePlan("no_profile", "this node runs another execution profile", expires)
    if me.cores < 1:
        return DeclinePlan("busy", "this node offers no cores now", expires)
    if offer.memory_bytes > me.memory_bytes:
        return DeclinePlan(
            "limits",
            f"the job may use {offer.memory_bytes} bytes of memory, this node offers {me.memory_bytes}",
            expires,
        )
    if me.queue_length >= me.max_queue:
        return DeclinePlan("busy", f"{me.queue_length} jobs already queued", expires)
    start = now + me.backlog_ms // me.cores
    finish = start + run_estimate_ms(offer.fuel, offer.wall_ms, me.fuel_rate)
    if finish > offer.deadline:
        return DeclinePlan(
            "deadline", f"expected to finish {finish - offer.deadline} ms after the deadline", expires
        )
    return BidPlan(start, finish, min(expires, offer.deadline))


def measured_fuel_rate(previous: int, fuel_used: int, compute_ms: int, weight: float = 0.2) -> int:
    """Update the fuel-per-core-second estimate with one finished run (runs under 5 ms say too little)."""
    if compute_ms < 5 or fuel_used <= 0:
        return previous
    sample = fuel_used * 1000 // compute_ms
    return max(1, round(previous * (1 - weight) + sample * weight))


# --- the submitter's side ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BidView:
    bid_id: bytes
    executor: bytes
    expected_start: int
    expected_finish: int
    expires: int


def bid_rank(bid: BidView, load: int) -> tuple[int, int, bytes]:
    duration = max(bid.expected_finish - bid.expected_start, MIN_ESTIMATE_MS)
    return (bid.expected_finish + load * duration, bid.expected_start, bid.executor)


def choose_bid(
    bids: Iterable[BidView],
    load: Mapping[bytes, int],
    *,
    now: int,
    deadline: int,
    exclude: frozenset[bytes] = frozenset(),
) -> BidView | None:
    """The best live bid that finishes by the deadline, or None. `load`: jobs this submitter has
    assigned to each executor and not yet seen finish; `exclude`: executors that failed this job."""
    live = [
        b for b in bids if b.expires > now and b.expected_finish <= deadline and b.executor not in exclude
    ]
    if not live:
        return None
    return min(live, key=lambda b: bid_rank(b, load.get(b.executor, 0)))


class Window(Enum):
    WAIT = "wait"
    ASSIGN = "assign"
    REOFFER = "reoffer"


@dataclass(frozen=True, slots=True)
class WindowSettings:
    window: float = 1.0
    """Seconds to wait for slow answers once at least one bid is in hand."""
    max_wait: float = 10.0
    """Seconds without any bid after which the job is offered again."""


def window_state(
    *,
    now: float,
    opened: float,
    expected: frozenset[bytes],
    answered: frozenset[bytes],
    bids: int,
    settings: WindowSettings,
) -> Window:
    """Whether to assign now, keep waiting, or give up on this round of the offer."""
    waited = now - opened
    if bids and expected <= answered:
        return Window.ASSIGN
    if bids and waited >= settings.window:
        return Window.ASSIGN
    if not bids and waited >= settings.max_wait:
        return Window.REOFFER
    if not bids and expected and expected <= answered:
        return Window.REOFFER
    return Window.WAIT


def lease_expiry(now: int, bid: BidView, deadline: int, *, slack_ms: int) -> int:
    """How long the executor may hold the job: its own finish estimate plus slack, doubled for the
    run itself, and never past the deadline."""
    duration = max(bid.expected_finish - now, MIN_ESTIMATE_MS)
    return min(deadline, now + 2 * duration + slack_ms)


def backoff(base: float, tries: int, cap: float, *, doublings: int) -> float:
    """Seconds to wait before try `tries` + 1 of something that failed `tries` times: `base`, doubled
    per try up to `doublings` times, and never more than `cap`."""
    return min(cap, base * 2.0 ** min(tries, doublings))


def offer_expiry(now: int, deadline: int, ttl_ms: int, round_number: int) -> int:
    """The expiry of round `round_number` (from 0) of a job's offer. Rounds never share an expiry, so
    each is a new message (an identical one would be dropped as a duplicate by gossip and executors)."""
    return min(deadline - round_number, now + ttl_ms)
