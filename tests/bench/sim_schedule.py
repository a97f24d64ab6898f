"""A deterministic scheduling simulator over the node's own policy (e31.node.market.policy).

    .venv/bin/python tests/bench/sim_schedule.py [--seed N] [--loads 0.5,0.95,1.3] [--jobs N] [--check]

N nodes with cores, each a little faster or slower than the nominal fuel rate (which its calibration
learns); M submitters, half sending single jobs as a Poisson process, half sending sweeps (bursts of
jobs with one deadline) at the same mean fuel rate; job sizes heavy-tailed (Pareto, alpha 1.5, in
core-seconds at the nominal rate, capped at 50 s); a job's fuel budget is 1 to 1.7 times what it uses,
and its deadline is its arrival plus the offer's round trip plus 1.5 to 5 times its budget's run time at
the nominal rate (a sweep's: 1.5 times that of its largest job). Load is the fuel the offered jobs use
over the pool's capacity (at the nominal rate) in the window they arrive in.

Policies:
- fifo: every job accepted (by the node with the least work queued), run in arrival order, late or not;
- edf: the same, run earliest deadline first;
- edf+admission: a job is offered to every node, each plans it with all it promised (policy.admit) and
  the submitter takes the earliest planned finish; run earliest deadline first; expired work never
  starts;
- ours: admission as above, the queue ordered by policy.pick (fair share across submitters, bounded
  slowdown, EDF for the jobs at risk), expired work never starts, a running job is stopped at its
  deadline.

Metrics: goodput (fuel of jobs done by their deadline over capacity), the share of admitted jobs done on
time, jobs declined up front, mean and p99 slowdown per size class, and Jain's index of goodput across
submitters. Everything is drawn from one seeded random.Random: the same seed gives the same figures.
`--check` exits 1 if a floor of issue 19 is missed. tests/bench/plot_schedule.py draws the plots.
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import sys
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from itertools import count

from e31.node.market.policy import Calibration, Slot, Task, Usage, admit, expired, pick

RATE = 1_000_000_000
"""Nominal fuel per second of one core."""
PROFILE = b"p"
POLICIES = ("fifo", "edf", "edf+admission", "ours")
ROUND_TRIP_MS = 50
RETRIES = 4
"""Declined jobs offered again to a node each time one of its cores comes free."""


@dataclass(frozen=True, slots=True)
class Scenario:
    nodes: int = 8
    cores: int = 2
    submitters: int = 6
    jobs: int = 6000
    load: float = 0.95
    seed: int = 1
    size_min_s: float = 0.5
    size_max_s: float = 50.0
    alpha: float = 1.5
    sweep: tuple[int, int] = (5, 30)


@dataclass(frozen=True, slots=True)
class Job:
    key: bytes
    submitter: int
    arrival: int
    budget: int
    """Fuel budget (the manifest's limit)."""
    used: int
    """Fuel the run needs."""
    deadline: int


@dataclass
class Node:
    cores: int
    rate: int
    """True fuel per second of one core (the node learns it)."""
    cal: Calibration = field(default_factory=Calibration)
    waiting: list[tuple[Task, Job]] = field(default_factory=list)
    running: dict[bytes, tuple[Task, Job, int, int]] = field(default_factory=dict)
    """key -> (task, job, start, end)."""
    usage: Usage = field(default_factory=Usage)

    def busy_slots(self, now: int) -> list[Slot]:
        return [Slot(max(now + 1, start + task.estimate_ms)) for task, _, start, _ in self.running.values()]

    def slots(self, now: int) -> list[Slot]:
        return [*self.busy_slots(now), *(Slot(now) for _ in range(self.cores - len(self.running)))]


def pareto(rng: random.Random, sc: Scenario) -> float:
    return min(sc.size_max_s, sc.size_min_s / (1.0 - rng.random()) ** (1.0 / sc.alpha))


def workload(sc: Scenario) -> list[list[Job]]:
    """The jobs, grouped by arrival (a sweep is one group), in arrival order. Each submitter's groups
    arrive as a Poisson process over one window, whose length makes the load exactly `sc.load`."""
    rng = random.Random(sc.seed)
    drawn: list[tuple[int, float, list[float]]] = []  # (submitter, k, sizes)
    per_sub_jobs = sc.jobs // sc.submitters
    for s in range(sc.submitters):
        n = 0
        while n < per_sub_jobs:
            size_n = min(rng.randint(*sc.sweep) if s % 2 == 1 else 1, per_sub_jobs - n)
            drawn.append((s, rng.uniform(1.5, 5.0), [pareto(rng, sc) for _ in range(size_n)]))
            n += size_n
    work_s = sum(sum(sizes) for _, _, sizes in drawn)
    window_ms = 1000 * work_s / (sc.load * sc.nodes * sc.cores)
    groups: list[tuple[int, int, list[Job]]] = []
    ids = count()
    for s, k, sizes in drawn:
        arrival = int(rng.uniform(0, window_ms))
        sweep = len(sizes) > 1
        budgets = [int(size * RATE / rng.uniform(0.6, 1.0)) for size in sizes]
        batch_deadline = arrival + ROUND_TRIP_MS + int(1000 * k * 1.5 * max(budgets) / RATE)
        jobs = []
        for size, budget in zip(sizes, budgets, strict=True):
            own = arrival + ROUND_TRIP_MS + int(1000 * k * budget / RATE)
            deadline = batch_deadline if sweep else own
            jobs.append(Job(next(ids).to_bytes(8, "big"), s, arrival, budget, int(size * RATE), deadline))
        groups.append((arrival, s, jobs))
    groups.sort(key=lambda g: (g[0], g[1], g[2][0].key))
    return [g[2] for g in groups]


@dataclass
class Outcome:
    done_on_time: list[Job] = field(default_factory=list)
    late: list[Job] = field(default_factory=list)
    admitted: int = 0
    declined: int = 0
    expired_unstarted: int = 0
    stopped: int = 0
    finish: dict[bytes, int] = field(default_factory=dict)
    runtime: dict[bytes, int] = field(default_factory=dict)
    starts_after_deadline: int = 0
    horizon_ms: int = 0


def simulate(sc: Scenario, policy: str) -> Outcome:
    rng = random.Random(sc.seed * 7919 + POLICIES.index(policy))
    nodes = [Node(sc.cores, int(RATE * rng.uniform(0.8, 1.2))) for _ in range(sc.nodes)]
    out = Outcome()
    events: list[tuple[int, int, int, bytes]] = []
    """(time, kind, node, job key): kind 0 a run ends, 1 a deadline check."""
    seq = count()
    groups = workload(sc)
    arrivals = [(g[0].arrival, i) for i, g in enumerate(groups)]
    gi = 0
    admission = policy in ("edf+admission", "ours")
    last = 0

    def task_of(node: Node, job: Job, now: int) -> Task:
        est = node.cal.estimate_ms(PROFILE, job.budget, 10**12)
        return Task(job.key, job.submitter.to_bytes(2, "big"), job.deadline, est, now, job.budget)

    def dispatch(ni: int, now: int) -> None:
        node = nodes[ni]
        if admission:
            for task, job in [(t, j) for t, j in node.waiting if t in expired([t], now)]:
                node.waiting.remove((task, job))
                out.expired_unstarted += 1
        while len(node.running) < node.cores and node.waiting:
            if policy == "fifo":
                chosen = min(node.waiting, key=lambda tj: (tj[0].arrived, tj[0].key))
            elif policy in ("edf", "edf+admission"):
                chosen = min(node.waiting, key=lambda tj: (tj[0].deadline, tj[0].key))
            else:
                task = pick([t for t, _ in node.waiting], node.slots(now)[:-1], now, node.usage)
                if task is None:
                    break
                chosen = next(tj for tj in node.waiting if tj[0] is task)
            node.waiting.remove(chosen)
            task, job = chosen
            if now >= job.deadline:
                out.starts_after_deadline += 1
            end = now + max(1, job.used * 1000 // node.rate)
            node.running[job.key] = (task, job, now, end)
            node.usage.charge(task.submitter, job.budget, now)
            heapq.heappush(events, (end, 0, ni, job.key))
            if policy == "ours" and job.deadline < end:
                heapq.heappush(events, (job.deadline, 1, ni, job.key))
            if admission and node.waiting:
                nearest = min(t.deadline for t, _ in node.waiting)
                heapq.heappush(events, (nearest, 2, ni, b""))

    pending: list[Job] = []
    """Declined jobs, offered again when a core comes free."""

    def offer(group: list[Job], now: int) -> None:
        for job in sorted(group, key=lambda j: (j.deadline, j.key)):
            if not admission:
                ni = min(
                    range(len(nodes)),
                    key=lambda i: (
                        sum(t.estimate_ms for t, _ in nodes[i].waiting)
                        + sum(max(0, s + t.estimate_ms - now) for t, _, s, _ in nodes[i].running.values()),
                        i,
                    ),
                )
                out.admitted += 1
                nodes[ni].waiting.append((task_of(nodes[ni], job, now), job))
                dispatch(ni, now)
                continue
            if not place(job, range(len(nodes)), now):
                pending.append(job)

    def place(job: Job, among: Iterable[int], now: int) -> bool:
        """Offer `job` to the nodes `among`; assign it to the bid with the earliest planned finish."""
        best: tuple[int, int] | None = None
        for ni in among:
            node = nodes[ni]
            task = task_of(node, job, now)
            result = admit(node.slots(now), [t for t, _ in node.waiting], [task], now)
            if job.key in result.accepted:
                finish = result.accepted[job.key][1]
                if best is None or (finish, ni) < best:
                    best = (finish, ni)
        if best is None:
            return False
        ni = best[1]
        out.admitted += 1
        nodes[ni].waiting.append((task_of(nodes[ni], job, now), job))
        dispatch(ni, now)
        return True

    def reoffer(ni: int, now: int) -> None:
        """A core of node `ni` came free: the declined jobs still able to make their deadline are
        offered again (as a submitter's next round would), the least served submitters' first."""
        if not admission or not pending:
            return
        pending[:] = [j for j in pending if j.deadline > now + j.used * 1000 // (2 * RATE)]
        served = defaultdict(int)
        for j in out.done_on_time:
            served[j.submitter] += j.used
        pending.sort(key=lambda j: (served[j.submitter], j.deadline, j.key))
        for job in pending[:RETRIES]:
            if place(job, [ni], now):
                pending.remove(job)

    while gi < len(arrivals) or events:
        if gi < len(arrivals) and (not events or arrivals[gi][0] <= events[0][0]):
            now, index = arrivals[gi]
            gi += 1
            offer(groups[index], now)
            continue
        now, kind, ni, key = heapq.heappop(events)
        next(seq)
        node = nodes[ni]
        if kind == 2:
            dispatch(ni, now)
            continue
        entry = node.running.get(key)
        if entry is None:
            continue
        _, job, start, end = entry
        if kind == 1:  # its deadline: stopped, released
            if end > now:
                del node.running[key]
                last = max(last, now)
                out.stopped += 1
                out.late.append(job)
                node.cal = node.cal.missed()
                dispatch(ni, now)
                reoffer(ni, now)
            continue
        if end != now:
            continue
        del node.running[key]
        last = max(last, now)
        node.cal = node.cal.ran(PROFILE, job.used, end - start)
        out.finish[key] = end
        out.runtime[key] = end - start
        if end <= job.deadline:
            out.done_on_time.append(job)
        else:
            out.late.append(job)
            if admission:
                node.cal = node.cal.missed()
        dispatch(ni, now)
        reoffer(ni, now)
    # from the first arrival to the end of the last run (or of the window jobs arrived in, if later)
    first = groups[0][0].arrival if groups else 0
    out.declined = sum(len(g) for g in groups) - out.admitted  # never admitted, after every round
    out.horizon_ms = max(1, max(last, groups[-1][0].arrival if groups else 0) - first)
    return out


def metrics(sc: Scenario, out: Outcome) -> dict[str, object]:
    groups = workload(sc)
    jobs = [j for g in groups for j in g]
    capacity_fuel = sc.nodes * sc.cores * RATE * out.horizon_ms / 1000
    good = sum(j.used for j in out.done_on_time)
    per_sub = defaultdict(float)
    offered_sub = defaultdict(float)
    for j in out.done_on_time:
        per_sub[j.submitter] += j.used
    for j in jobs:
        offered_sub[j.submitter] += j.used
    shares = [per_sub[s] / offered_sub[s] for s in range(sc.submitters) if offered_sub[s]]
    jain = sum(shares) ** 2 / (len(shares) * sum(x * x for x in shares)) if any(shares) else 0.0
    sizes = sorted(j.budget for j in jobs)
    small_max, large_min = sizes[len(sizes) // 2], sizes[int(len(sizes) * 0.9)]
    by_class: dict[str, list[float]] = {"small": [], "medium": [], "large": []}
    for j in out.done_on_time + out.late:
        if j.key not in out.finish:
            continue
        slowdown = (out.finish[j.key] - j.arrival) / max(out.runtime[j.key], 1)
        cls = "small" if j.budget <= small_max else "large" if j.budget >= large_min else "medium"
        by_class[cls].append(slowdown)
    slow = {
        c: {"mean": round(sum(v) / len(v), 2), "p99": round(sorted(v)[int(0.99 * (len(v) - 1))], 2)}
        if v
        else {"mean": None, "p99": None}
        for c, v in by_class.items()
    }
    return {
        "goodput": round(good / capacity_fuel, 4),
        "on_time_of_admitted": round(len(out.done_on_time) / out.admitted, 4) if out.admitted else 1.0,
        "admitted": out.admitted,
        "declined": out.declined,
        "expired_unstarted": out.expired_unstarted,
        "stopped_at_deadline": out.stopped,
        "started_after_deadline": out.starts_after_deadline,
        "slowdown": slow,
        "jain": round(jain, 4),
    }


FLOORS_TEXT = (
    "load 1.3: ours >= 1.5x edf and >= 2x fifo goodput, jain >= 0.95; load 0.95: ours >= fifo; "
    "every load: >= 99% of admitted jobs on time"
)


def check(results: dict[float, dict[str, dict[str, object]]]) -> list[str]:
    """The floors of issue 19 that `results` misses (by load, then policy)."""
    missed = []

    def g(load: float, p: str) -> float:
        return float(results[load][p]["goodput"])  # type: ignore[arg-type]

    if 1.3 in results:
        if g(1.3, "ours") < 1.5 * g(1.3, "edf"):
            missed.append("load 1.3: goodput < 1.5x EDF's")
        if g(1.3, "ours") < 2 * g(1.3, "fifo"):
            missed.append("load 1.3: goodput < 2x FIFO's")
        if float(results[1.3]["ours"]["jain"]) < 0.95:  # type: ignore[arg-type]
            missed.append("load 1.3: Jain < 0.95")
    if 0.95 in results and g(0.95, "ours") < g(0.95, "fifo"):
        missed.append("load 0.95: goodput < FIFO's")
    for load, by in results.items():
        if float(by["ours"]["on_time_of_admitted"]) < 0.99:  # type: ignore[arg-type]
            missed.append(f"load {load}: under 99% of admitted jobs on time")
    return missed


def run(sc: Scenario, loads: list[float]) -> dict[float, dict[str, dict[str, object]]]:
    results: dict[float, dict[str, dict[str, object]]] = {}
    for load in loads:
        s = replace(sc, load=load)
        results[load] = {p: metrics(s, simulate(s, p)) for p in POLICIES}
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--loads", default="0.5,0.95,1.3")
    ap.add_argument("--jobs", type=int, default=6000)
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--submitters", type=int, default=6)
    ap.add_argument("--json", help="write the figures to this file")
    ap.add_argument("--check", action="store_true", help="exit 1 if a floor is missed")
    a = ap.parse_args()
    sc = Scenario(nodes=a.nodes, cores=a.cores, submitters=a.submitters, jobs=a.jobs, seed=a.seed)
    results = run(sc, [float(x) for x in a.loads.split(",")])
    for load, by in results.items():
        print(f"load {load}")
        for p, m in by.items():
            slow = m["slowdown"]
            assert isinstance(slow, dict)
            print(
                f"  {p:14} goodput {m['goodput']:.3f}  on time {m['on_time_of_admitted']:.3f}  "
                f"declined {m['declined']:5}  jain {m['jain']:.3f}  "
                + "  ".join(f"{c} {v['mean']}/{v['p99']}" for c, v in slow.items())
                + f"  late-starts {m['started_after_deadline']}"
            )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                {"scenario": sc.__repr__(), "results": {str(k): v for k, v in results.items()}}, f, indent=1
            )
    missed = check(results)
    for m in missed:
        print("floor missed:", m)
    if not missed:
        print("floors met:", FLOORS_TEXT)
    return 1 if a.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
