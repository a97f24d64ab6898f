"""The market's decisions as pure functions: job states, the executor's bid, the submitter's choice.

Nothing here reads a clock, draws a random number or touches a file: times (ms since the Unix epoch, or
trio seconds for the bid window) come in as parameters, so every rule is tested without I/O. The trio
services that act on these decisions are node/market_submitter.py and node/market_executor.py.

- A job's first check at an executor (`plan_bid`): profile, memory, room in the queue, and a finish by
  its deadline on an idle core (min(wall limit, fuel limit / measured fuel rate)); the executor then
  plans the jobs that pass with every job it has promised (policy.admit, in bidding.py).
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

from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from e31.protocol.ids import Digest
from e31.protocol.jobs import JobManifest

from .policy import AT_RISK

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


# --- the submitter's side ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BidView:
    bid_id: bytes
    executor: bytes
    expected_start: int
    expected_finish: int
    expires: int
    held_bytes: int = 0
    """Bytes of the job's blobs the executor says it holds already (its bid's `held`)."""

    @property
    def run_ms(self) -> int:
        """The run the executor promises (its finish less its start), at least MIN_ESTIMATE_MS."""
        return max(self.expected_finish - self.expected_start, MIN_ESTIMATE_MS)


def held_bytes(manifest: JobManifest, held: Sequence[Digest]) -> int:
    """Bytes of the job's blobs (module, inputs, stdin) among the roots a bid says its executor holds."""
    have = {d.raw for d in held}
    refs = {
        r.root.raw: r.size for r in (manifest.module, *(f.blob for f in manifest.inputs), manifest.stdin) if r
    }
    return sum(size for root, size in refs.items() if root in have)


def bid_rank(bid: BidView, load: int) -> tuple[int, int, bytes]:
    return (bid.expected_finish + load * bid.run_ms, bid.expected_start, bid.executor)


def choose_bid(
    bids: Iterable[BidView],
    load: Mapping[bytes, int],
    *,
    now: int,
    deadline: int,
    exclude: frozenset[bytes] = frozenset(),
    known: Container[bytes] = frozenset(),
) -> BidView | None:
    """The best live bid that finishes by the deadline, or None: the earliest finish, counting `load`,
    the jobs this submitter has assigned to each executor and not yet seen finish, unless the job is
    at risk (the scheduling policy's rule; then the promised finish alone); `exclude`: executors that
    failed this job;
    `known`: executors with evidence behind them (`Evidence.known`). A known executor's bid goes ahead
    of an equal one from a stranger; and while a known executor bids, a stranger gets the job only if
    strangers would then hold at most STRANGER_WORK_SHARE of this submitter's jobs under way (so any
    number of throwaway keys promising instant runs cannot take the work over, and a new executor
    still gets some, to earn its first receipts)."""
    live = [
        b for b in bids if b.expires > now and b.expected_finish <= deadline and b.executor not in exclude
    ]
    if any(b.executor in known for b in live):
        strangers = sum(n for e, n in load.items() if e not in known)
        if strangers + 1 > STRANGER_WORK_SHARE * (sum(load.values()) + 1):
            live = [b for b in live if b.executor in known]
    if not live:
        return None
    soonest = min(live, key=lambda b: (b.expected_finish, b.expected_start, b.executor))
    duration = soonest.run_ms
    # At risk (policy.at_risk: its deadline within AT_RISK times its run): the executor's queue runs
    # it ahead of the jobs there with slack (policy.pick), so the jobs this submitter has under way
    # there do not delay it as a queue of theirs would: the earliest finish it is promised wins.
    urgent = deadline - now <= AT_RISK * duration

    def rank(b: BidView) -> tuple[int, int, bool, int, bytes]:
        finish, start, _ = bid_rank(b, 0 if urgent else load.get(b.executor, 0))
        # all else equal: the executor that holds more of the job's bytes (no fetch), then by key
        return (finish, start, b.executor not in known, -b.held_bytes, b.executor)

    return min(live, key=rank)


# --- what a node believes of its peers' adverts -------------------------------------------------------

STRANGER_WORK_SHARE = 0.25
"""At most this share of a submitter's jobs under way goes to strangers while known executors bid."""
STRANGER_SHARE = 0.2
"""At most this share of the capacity a node believes in comes from keys with no evidence behind them."""
STRANGER_FLOOR_CORES = 4
"""Cores believed of strangers in all when no known key advertises any."""
LINK_TRUST_MS = 10 * 60 * 1000
"""A link up this long to a key is evidence of it (a throwaway key is rarely kept that long)."""


@dataclass(frozen=True, slots=True)
class Evidence:
    """What this node has seen of a key, beyond what the key says of itself."""

    receipts: int = 0
    """Receipts from it that this node verified (as their job's submitter)."""
    link_age_ms: int = 0
    """How long its current link to this node has been up (0: none)."""
    bootstrap: bool = False
    """The operator named it (a bootstrap peer with its identity pinned)."""

    @property
    def known(self) -> bool:
        return self.receipts > 0 or self.bootstrap or self.link_age_ms >= LINK_TRUST_MS


@dataclass(frozen=True, slots=True)
class Believed:
    """The network's capacity as this node believes it, from its peers' adverts (rules.believe)."""

    cores: int
    memory_bytes: int
    known_cores: int
    """Advertised by keys with evidence behind them, believed whole."""
    stranger_cores: int
    """Believed of strangers in all: their claims, capped (STRANGER_SHARE, STRANGER_FLOOR_CORES)."""
    claimed_by_strangers: int
    strangers: int
    """Keys without evidence whose adverts are counted (each at most its share)."""


def believe(adverts: Iterable[tuple[int, int, bool]]) -> Believed:
    """Sum peers' adverts ((cores, memory_bytes, known) each): known keys' adverts are believed whole;
    strangers' together only up to STRANGER_SHARE of the total believed, in cores and in memory
    (STRANGER_FLOOR_CORES, their memory scaled alike, when no known key advertises), so any number of
    unknown keys cannot dominate."""
    known_cores = known_memory = claimed = claimed_memory = strangers = 0
    for cores, memory, known in adverts:
        if known:
            known_cores, known_memory = known_cores + cores, known_memory + memory
        else:
            claimed, claimed_memory, strangers = claimed + cores, claimed_memory + memory, strangers + 1
    share = STRANGER_SHARE / (1 - STRANGER_SHARE)
    cap = int(known_cores * share) if known_cores else STRANGER_FLOOR_CORES
    ratio = min(1.0, cap / claimed) if claimed else 0.0
    stranger_cores, stranger_memory = int(claimed * ratio), int(claimed_memory * ratio)
    if known_cores:  # and their memory at most the same share of the known keys'
        stranger_memory = min(stranger_memory, int(known_memory * share))
    return Believed(
        cores=known_cores + stranger_cores,
        memory_bytes=known_memory + stranger_memory,
        known_cores=known_cores,
        stranger_cores=stranger_cores,
        claimed_by_strangers=claimed,
        strangers=strangers,
    )


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
