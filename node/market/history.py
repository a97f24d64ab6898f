"""What a job of a module this node has run before will use: what its module's recent runs used and took.

Pure: no trio, no I/O, no clock. A job's fuel budget is an upper bound its submitter chose, and the
default one (10 Gfuel, docs/submitting.md) is thousands of times what a small job burns; planned at
its budget, such a job holds a core for its whole wall limit in every plan. So the executor keeps,
per execution profile and module (the manifest's module blob root), a decayed maximum of the fuel
the module's recent runs used here, and plans a job of a module that has run at least `MIN_RUNS`
times for `HEADROOM` times that, never more than its budget (`History.fuel`). A module not seen
that often, or forgotten, is planned at its budget, as before.

It also keeps a decayed maximum of the time the module's runs held a core here (not paused), and a
module timed `MIN_RUNS` times is planned for at most `HEADROOM` times that, and no less than
`RUN_MS_MIN` by it (`History.run_ms`). The
fuel alone cannot say it: the calibrated rate is fuel over a run's time, and a tiny run's time is
mostly its fixed cost (the first run of a module here compiles it), so a rate learned from such
runs is far too low and the fuel's estimate far too long (0.5-3.7 s for runs of a few ms). The first
run's time is not counted (its compile's, done once: later runs load the compiled module), so a
module is timed from its second run on: `LEARNED_AFTER` runs teach both.

The decayed maximum (`peak`): each run sets it to the larger of the run's fuel and `DECAY` times the
peak before. So a run heavier than the peak raises the estimate at once (a miss teaches at once, as
the margin does), while one heavy run among light ones fades only over tens of runs. The table is
an LRU of `MODULES_MAX` entries: memory is bounded whatever modules peers send.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field

MIN_RUNS = 3
"""Runs (timed runs) of a module before its learned fuel (time) is trusted."""
LEARNED_AFTER = MIN_RUNS + 1
"""Runs of a module that teach both its fuel and its time (the first run's time is not counted)."""
HEADROOM = 2.0
"""A job of a known module is planned for this many times its module's peak, at most its budget."""
DECAY = 0.95
"""Per run, the peak shrinks to this share of itself unless the run used more."""
RUN_MS_MIN = 50
"""The time bound is never below this (ms): under it, what separates two nodes' run times of a tiny
module is the noise of a busy host (runs of 3 ms took up to 30 here), and bids promising those
differences would split a sweep unevenly among nodes equally idle."""
MODULES_MAX = 1024
"""Modules (per profile) remembered; the least recently run is forgotten first."""


@dataclass(slots=True)
class Seen:
    runs: int
    peak: float
    """The decayed maximum of the fuel its runs used."""
    timed: int = 0
    """Runs whose time taught `peak_ms` (a paused run's time says nothing)."""
    peak_ms: float = 0.0
    """The decayed maximum of the time its timed runs held a core (ms)."""


@dataclass(slots=True)
class History:
    """Fuel used and time taken by the recent runs of each (profile, module), an LRU of `capacity`
    entries."""

    capacity: int = MODULES_MAX
    _seen: OrderedDict[tuple[bytes, bytes], Seen] = field(default_factory=OrderedDict)

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ValueError("a history remembers at least one module")

    def __len__(self) -> int:
        return len(self._seen)

    def seen(self, profile: bytes, module: bytes) -> Seen | None:
        return self._seen.get((profile, module))

    def fuel(self, profile: bytes, module: bytes, budget: int) -> int:
        """The fuel to plan a job of `module` for: its budget, or, once the module has run here
        `MIN_RUNS` times, `HEADROOM` times its peak if that is less (at least 1)."""
        seen = self._seen.get((profile, module))
        if seen is None or seen.runs < MIN_RUNS:
            return budget
        return max(1, min(budget, math.ceil(seen.peak * HEADROOM)))

    def run_ms(self, profile: bytes, module: bytes) -> int | None:
        """The longest a job of `module` is planned to hold a core, from its runs' time: `HEADROOM`
        times its timed peak once `MIN_RUNS` runs were timed (at least RUN_MS_MIN); None before."""
        seen = self._seen.get((profile, module))
        if seen is None or seen.timed < MIN_RUNS:
            return None
        return max(RUN_MS_MIN, math.ceil(seen.peak_ms * HEADROOM))

    def ran(self, profile: bytes, module: bytes, fuel_used: int, elapsed_ms: int | None = None) -> bool:
        """Learn from one run of `module` that used `fuel_used` (for a run whose count is not known, a
        bound the caller chooses: the scheduler's is the budget after a wall-clock stop, what the time
        run could burn after a stop at the deadline) and held a core `elapsed_ms` (None: not known, or
        not telling, as for a paused run; the first run's is not counted). True when the run used more
        fuel than the history planned it for (a miss: the peak is raised to it at once; a run longer
        than its time allowed raises its time's peak at once too, and is no miss: a run of a few
        milliseconds may take twice as long on a busy host)."""
        key = (profile, module)
        used = max(0, fuel_used)
        seen = self._seen.get(key)
        if seen is None:
            seen = self._seen[key] = Seen(0, float(used))
            while len(self._seen) > self.capacity:
                self._seen.popitem(last=False)
        missed = seen.runs >= MIN_RUNS and used > seen.peak * HEADROOM
        seen.runs += 1
        seen.peak = max(float(used), seen.peak * DECAY)
        if elapsed_ms is not None and seen.runs > 1:  # (the first run's time is its compile's)
            took = float(max(0, elapsed_ms))
            seen.timed += 1
            seen.peak_ms = max(took, seen.peak_ms * DECAY)
        self._seen.move_to_end(key)
        return missed
