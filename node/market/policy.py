"""The scheduling policy: which jobs a node promises, in what order it runs them, how fast it believes it is.

Pure: no trio, no I/O, no clock read; times (ms) come in as parameters. The executor's queue
(scheduler.py), its bids (bidding.py) and the scheduling simulator (tests/bench/sim_schedule.py) all
decide through these functions; docs/scheduling.md explains them and shows what they do under load.

- **Estimates.** A job may hold a core for its fuel budget at the node's calibrated rate for its
  execution profile, times a safety margin, and never longer than its wall limit (`Calibration`).
  The rate is learned from the node's own runs (fuel over the run's elapsed time); the margin rises
  at once when a run took longer than estimated or a promise was missed, and decays slowly otherwise.
- **Admission** (`admit`). An offer's jobs are planned together with every job the node has already
  promised: the plan is earliest-deadline-first over the node's cores, each running job holding its
  core until its estimated end. The offered jobs are taken in deadline order; each is accepted only if
  it finishes by its deadline and no job that was on time in the plan becomes late. The others are
  declined (`deadline`).
- **Order** (`pick`). Among the waiting jobs, the next to start is the first in fair order whose start
  now keeps every other job on time in the EDF plan of the rest; when none does, the earliest deadline
  goes first (EDF among the jobs at risk). Fair order: a job that has waited past `SLOWDOWN_BOUND`
  times its estimate goes ahead of those that have not (aging bounds the slowdown of small jobs); then
  the submitter with the least usage per weight (fuel, decayed with a half-life: `Usage`), then the
  job that has waited longest for its size, then the smaller job, then arrival.
- **Expired work** (`expired`): a job whose deadline has passed never starts.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

SLOWDOWN_BOUND = 4.0
"""A job that has waited this many times its own estimate goes ahead of fair order (aging)."""
HALF_LIFE_MS = 10 * 60 * 1000
"""Usage (fuel) counts half after this long: recent use weighs most, old use fades."""
PICK_CANDIDATES = 32
"""Jobs in fair order tried before falling back to EDF (each try plans the rest: O(n log n))."""
MARGIN_START = 1.25
MARGIN_MIN = 1.1
MARGIN_MAX = 8.0
MARGIN_DECAY = 0.98
"""Per run on time, the margin moves this much of the way back toward what the runs show."""
MISS_STEP = 1.25
"""A missed promise multiplies the margin by this."""
RATE_WEIGHT = 0.25
"""Weight of one run in the fuel rate's moving average."""
MIN_SAMPLE_MS = 20
"""Runs shorter than this say too little about the rate."""
DEFAULT_RATE = 1_000_000_000
"""Fuel per second one core burns before the node has measured a profile (order of magnitude here)."""


@dataclass(frozen=True, slots=True)
class Task:
    """A job as the policy sees it."""

    key: bytes
    """Its job id (the last tie-break: the order is a total one)."""
    submitter: bytes
    deadline: int
    estimate_ms: int
    """How long it may hold a core (Calibration.estimate_ms)."""
    arrived: int = 0
    """When it entered the queue (ms)."""
    fuel: int = 0
    """Its fuel budget: what running it charges its submitter's usage."""


@dataclass(frozen=True, slots=True)
class Slot:
    """A core: free from `free_at` on (now, or the estimated end of the job holding it)."""

    free_at: int


# --- calibration ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Calibration:
    """The node's measured fuel rate per execution profile and its safety margin."""

    rates: Mapping[bytes, int] = field(default_factory=dict)
    margin: float = MARGIN_START
    default_rate: int = DEFAULT_RATE

    def rate(self, profile: bytes) -> int:
        return self.rates.get(profile, self.default_rate)

    def estimate_ms(self, profile: bytes, fuel: int, wall_ms: int) -> int:
        """How long a job may hold a core: its fuel budget at the calibrated rate, times the margin,
        never past its wall limit (at least 1 ms)."""
        by_fuel = math.ceil(fuel * 1000 * self.margin / max(self.rate(profile), 1))
        return max(1, min(wall_ms, by_fuel))

    def ran(self, profile: bytes, fuel_used: int, elapsed_ms: int) -> Calibration:
        """Learn from one run: `elapsed_ms` is the time it held its core (not paused). The rate moves
        toward fuel over time; the margin rises at once to cover a run slower than the rate said,
        and otherwise decays slowly toward what the runs show (never under MARGIN_MIN)."""
        if elapsed_ms < MIN_SAMPLE_MS or fuel_used <= 0:
            return self
        old = self.rate(profile)
        sample = fuel_used * 1000 // elapsed_ms
        predicted = fuel_used * 1000 / old
        ratio = elapsed_ms / max(predicted, 1.0)  # > 1: slower than believed
        if ratio * 1.05 > self.margin:
            margin = min(MARGIN_MAX, ratio * 1.05)
        else:
            margin = max(MARGIN_MIN, self.margin * MARGIN_DECAY + ratio * 1.05 * (1 - MARGIN_DECAY))
        rate = max(1, round(old * (1 - RATE_WEIGHT) + sample * RATE_WEIGHT))
        if profile not in self.rates:
            rate = max(1, sample)  # the first measurement replaces the guess
        return replace(self, rates={**self.rates, profile: rate}, margin=margin)

    def missed(self) -> Calibration:
        """A promise was missed (a job ran past its promised finish): be more careful."""
        return replace(self, margin=min(MARGIN_MAX, self.margin * MISS_STEP))


# --- usage and fair share ------------------------------------------------------------------------------


@dataclass(slots=True)
class Usage:
    """Fuel run per submitter, decayed with a half-life (the times passed in, never read)."""

    half_life_ms: int = HALF_LIFE_MS
    _used: dict[bytes, tuple[float, int]] = field(default_factory=dict)

    def value(self, submitter: bytes, now: int) -> float:
        used, at = self._used.get(submitter, (0.0, now))
        decay: float = 0.5 ** (max(0, now - at) / self.half_life_ms)
        return used * decay

    def charge(self, submitter: bytes, fuel: int, now: int) -> None:
        """Add `fuel` (negative: a correction, as when a run used less than its budget; never below 0)."""
        self._used[submitter] = (max(0.0, self.value(submitter, now) + fuel), now)

    def forget_below(self, now: int, floor: float = 1.0) -> None:
        """Drop submitters whose usage has faded to nothing (bounds the table)."""
        self._used = {s: (u, at) for s, (u, at) in self._used.items() if self.value(s, now) >= floor}


# --- planning ------------------------------------------------------------------------------------------


def edf_key(task: Task) -> tuple[int, int, bytes]:
    return (task.deadline, task.estimate_ms, task.key)


def plan(slots: Sequence[Slot], tasks: Iterable[Task], now: int) -> dict[bytes, tuple[int, int]]:
    """(start, finish) of each task when they run earliest deadline first, each on the core free soonest,
    from `now` on. With no core, nothing is planned."""
    cores = [max(now, s.free_at) for s in slots]
    if not cores:
        return {}
    heapq.heapify(cores)
    out: dict[bytes, tuple[int, int]] = {}
    for task in sorted(tasks, key=edf_key):
        start = heapq.heappop(cores)
        finish = start + task.estimate_ms
        out[task.key] = (start, finish)
        heapq.heappush(cores, finish)
    return out


def all_on_time(slots: Sequence[Slot], tasks: Sequence[Task], now: int) -> bool:
    """Whether every plan that puts each task, in any order, on the core free soonest (as `plan` does,
    and as `pick` plans with any one task started first on the free core) finishes every task by its
    deadline, by a bound that needs no plan: a task started when the soonest core frees at `s` finds
    every core busy until `s` at least, so `s` is at most (the cores' free times summed, plus the work
    of the tasks before it) over the cores, and it ends at most `e_max` later. So when (free times +
    all the work) / cores + the largest estimate is no later than the earliest deadline, none is late."""
    if not slots or not tasks:
        return not tasks
    cores = len(slots)
    free = sum(max(now, s.free_at) for s in slots)
    work = sum(t.estimate_ms for t in tasks)
    longest = max(t.estimate_ms for t in tasks)
    return free + work + cores * longest <= cores * min(t.deadline for t in tasks)


def late(tasks: Iterable[Task], planned: Mapping[bytes, tuple[int, int]]) -> frozenset[bytes]:
    """The tasks the plan finishes after their deadline (or does not plan at all)."""
    return frozenset(t.key for t in tasks if t.key not in planned or planned[t.key][1] > t.deadline)


@dataclass(frozen=True, slots=True)
class Admitted:
    accepted: dict[bytes, tuple[int, int]]
    """Accepted task -> its planned (start, finish)."""
    declined: dict[bytes, int]
    """Declined task -> ms it would have finished after its deadline (0: it would make another late)."""
    promised: int = 0
    """Tasks planned: those promised before and those accepted now."""


def admit(slots: Sequence[Slot], promised: Sequence[Task], offered: Sequence[Task], now: int) -> Admitted:
    """Plan `offered` with every job already `promised`: accept, in deadline order, each that finishes
    by its deadline without making late any job that was on time; decline the rest.

    The decisions are those of `admit_each` (one plan per offered job), reached with fewer plans.
    When no promised job is late, an offered job is declined with no plan if even the fluid bound
    (`fluid_finish`) of its work, that of every promised job due no later and that of the offered
    jobs accepted before it (all of them planned before any job due later) ends past its deadline:
    the last of them would be late. So a node whose backlog cannot meet an offer answers it for the
    price of one plan and a sort. The others are first planned together, once, and accepted all at
    once when that plan makes nothing late (removing jobs from a list schedule of independent jobs
    never delays the others, so each would have been accepted in turn); only otherwise is each
    planned in turn."""
    base = plan(slots, promised, now)
    before = late(promised, base)
    offered = sorted(offered, key=edf_key)
    if not offered:
        return Admitted({}, {}, len(promised))
    free = sorted(max(now, s.free_at) for s in slots)
    queue = sorted(promised, key=edf_key)
    deadlines = [t.deadline for t in queue]
    prefix = list(itertools.accumulate((t.estimate_ms for t in queue), initial=0))

    def past_bound(task: Task, accepted_ms: int) -> int:
        """How far the fluid bound ends past the task's deadline (0: it does not; it is only a
        bound while no promised job is late)."""
        if before or not free:
            return 0
        work = prefix[bisect.bisect_right(deadlines, task.deadline)] + accepted_ms + task.estimate_ms
        return max(0, math.ceil(fluid_finish(free, work)) - task.deadline)

    declined = {t.key: over for t in offered if (over := past_bound(t, 0))}
    kept = [t for t in offered if t.key not in declined]
    together = [*promised, *kept]
    planned = plan(slots, together, now)
    if late(together, planned) <= before:
        return Admitted({t.key: planned[t.key] for t in kept}, declined, len(together))
    chosen, accepted_ms = list(promised), 0
    accepted: list[Task] = []
    for task in kept:
        if over := past_bound(task, accepted_ms):
            declined[task.key] = over
            continue
        trial = [*chosen, task]
        planned = plan(slots, trial, now)
        now_late = late(trial, planned)
        if task.key in now_late or not now_late <= before:
            declined[task.key] = max(0, planned.get(task.key, (0, task.deadline))[1] - task.deadline)
            continue
        chosen.append(task)
        accepted.append(task)
        accepted_ms += task.estimate_ms
    final = plan(slots, chosen, now)
    return Admitted({t.key: final[t.key] for t in accepted}, declined, len(chosen))


def fluid_finish(free: Sequence[int], work: int) -> float:
    """The earliest `work` ms of jobs could all be done on cores free from the times `free` (sorted),
    were they divisible at will (water-filling): a lower bound on the last finish of any plan of them."""
    total = 0
    for k, at in enumerate(free):  # k: the cores filled so far, each up to the level
        if k and (total + work) / k <= at:
            return (total + work) / k
        total += at
    return (total + work) / max(1, len(free))


def admit_each(
    slots: Sequence[Slot],
    promised: Sequence[Task],
    offered: Sequence[Task],
    now: int,
    before: frozenset[bytes] | None = None,
) -> Admitted:
    """`admit` by its definition: each offered job, in deadline order, planned with the promised and
    the accepted ones (one plan per job). `before`: the promised jobs already late, if known."""
    chosen = list(promised)
    if before is None:
        before = late(chosen, plan(slots, chosen, now))
    accepted: list[Task] = []
    declined: dict[bytes, int] = {}
    for task in sorted(offered, key=edf_key):
        trial = [*chosen, task]
        planned = plan(slots, trial, now)
        now_late = late(trial, planned)
        if task.key in now_late or not now_late <= before:
            finish = planned.get(task.key, (0, task.deadline))[1]
            declined[task.key] = max(0, finish - task.deadline)
            continue
        chosen.append(task)
        accepted.append(task)
    final = plan(slots, chosen, now)
    return Admitted({t.key: final[t.key] for t in accepted}, declined, len(chosen))


# --- order ---------------------------------------------------------------------------------------------

AT_RISK = 2.0
"""A job is at risk when its deadline is at most this many times its estimate away."""
UNMEASURED = Calibration()
"""The estimates of a node that knows nothing of the executor (a submitter ordering its own line)."""


def at_risk(task: Task, now: int) -> bool:
    return task.deadline - now <= AT_RISK * task.estimate_ms


def offer_key(
    task: Task, now: int, usage: Usage, weights: Mapping[bytes, float] | None = None
) -> tuple[bool, int, tuple[bool, float, float, int, int]]:
    """The order in which a submitter offers its own waiting jobs (`task.submitter`: the group of jobs
    submitted together): the jobs at risk first, earliest deadline first; then fair order across the
    groups (`fair_key`: aged jobs, least usage per weight, smaller job, arrival). No job id: a stable
    sort keeps the line's order among equals."""
    if at_risk(task, now):
        return (False, task.deadline, (False, 0.0, 0.0, task.estimate_ms, task.arrived))
    return (True, 0, fair_key(task, now, usage, weights or {})[:-1])


def expired(tasks: Iterable[Task], now: int) -> list[Task]:
    """The tasks whose deadline has passed: they must never start."""
    return [t for t in tasks if t.deadline <= now]


def aged(task: Task, now: int, bound: float = SLOWDOWN_BOUND) -> bool:
    """Whether the task has waited past `bound` times its own estimate."""
    return now - task.arrived >= bound * task.estimate_ms


def fair_key(
    task: Task,
    now: int,
    usage: Usage,
    weights: Mapping[bytes, float],
    *,
    bound: float = SLOWDOWN_BOUND,
    share: float | None = None,
) -> tuple[bool, float, float, int, int, bytes]:
    """Fair order: aged jobs first, then the least usage per weight, then (aged) the longest-waiting
    relative to its size, then the smaller job, then arrival. `share`: the submitter's usage per weight
    at `now`, if the caller has it (`share_of`)."""
    slowdown = (now - task.arrived + task.estimate_ms) / task.estimate_ms
    is_aged = aged(task, now, bound)
    return (
        not is_aged,
        share_of(task.submitter, now, usage, weights) if share is None else share,
        -slowdown if is_aged else 0.0,
        task.estimate_ms,
        task.arrived,
        task.key,
    )


def share_of(submitter: bytes, now: int, usage: Usage, weights: Mapping[bytes, float]) -> float:
    """The submitter's usage per weight at `now`: what fair order ranks it by."""
    return usage.value(submitter, now) / max(weights.get(submitter, 1.0), 1e-9)


def pick(
    waiting: Sequence[Task],
    busy: Sequence[Slot],
    now: int,
    usage: Usage,
    weights: Mapping[bytes, float] | None = None,
    *,
    bound: float = SLOWDOWN_BOUND,
) -> Task | None:
    """The next task to start on a core free now. `busy`: the other cores, each free at its running
    job's estimated end. Expired tasks are never picked (`expired` finds them).

    The first task in fair order whose start now leaves every other task that was on time still on
    time (in the EDF plan of the rest); if none does, the earliest deadline: EDF among the tasks at
    risk."""
    live = [t for t in waiting if t.deadline > now]
    if not live:
        return None
    weights = weights or {}
    by_edf = min(live, key=edf_key)
    if len(live) == 1:
        return by_edf

    # each submitter's share found once (a full queue is 64 jobs a core, most of one submitter, and
    # `pick` runs once per job started)
    shares = {s: share_of(s, now, usage, weights) for s in {t.submitter for t in live}}

    def order(t: Task) -> tuple[bool, float, float, int, int, bytes]:
        return fair_key(t, now, usage, weights, bound=bound, share=shares[t.submitter])

    first = min(live, key=order)  # (the first of the fair order below: its keys end with the task's key)
    if first is by_edf or all_on_time([Slot(now), *busy], live, now):
        return first  # no plan needed: the loop below would take it at once
    base_late = late(live, plan([Slot(now), *busy], live, now))
    fair = sorted(live, key=order)
    for task in fair[:PICK_CANDIDATES]:
        if task is by_edf:
            return task  # EDF's own choice keeps the EDF plan as it is
        finish = now + task.estimate_ms
        rest = [t for t in live if t is not task]
        rest_late = late(rest, plan([Slot(finish), *busy], rest, now))
        if rest_late <= base_late and (finish <= task.deadline or task.key in base_late):
            return task
    return by_edf
