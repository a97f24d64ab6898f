"""What admission costs a node per job of a sweep: `policy.admit` on one offer of 64 jobs, planned with
the jobs the node has already promised (its queue and its live bids), in three cases a sweep meets.

    .venv/bin/python tests/bench/bench_admission.py [--promised N] [--cores C] [--rounds R]

- **room**: the node can take the whole offer (deadlines far off);
- **full**: its backlog cannot meet any job of the offer (deadlines sooner than its queue drains):
  the case of every node that cannot win a sweep's offers;
- **some**: it can take some of the offer's jobs, not all.

Prints the median CPU time (process time) per offer and per offered job, over R rounds, of `admit`
and of `admit_each` (its definition: one plan per offered job; the same decisions), each round
timing both on the same input. Pure
(no I/O): the figure moves with the machine's load only as any CPU time does; compare ratios
measured in the same minutes.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import time

from e31.node.market.policy import Slot, Task, admit, admit_each

OFFER = 64


def tasks(rng: random.Random, n: int, now: int, deadline: int, tag: bytes) -> list[Task]:
    out = []
    for i in range(n):
        est = rng.randint(50, 500)
        out.append(Task(tag + i.to_bytes(4, "big"), tag, deadline, est, now, est * 10**6))
    return out


SLACK_MS = {"room": 60_000, "full": 300, "some": 8_000}
"""How long after the promised backlog drains the sweep's deadline comes: 64 jobs of 50-500 ms need
about 17.6 s of one core."""


def case(
    name: str, promised_n: int, cores: int, rng: random.Random
) -> tuple[list[Slot], list[Task], list[Task]]:
    """A sweep: the promised jobs (earlier sets of it) and the offered set share one deadline."""
    now = 1_000_000
    slots = [Slot(now + rng.randint(0, 300)) for _ in range(cores)]
    promised = tasks(rng, promised_n, now, 0, b"P")
    work = sum(t.estimate_ms for t in promised) // cores + 300  # when the promised backlog drains
    deadline = now + work + SLACK_MS[name]
    promised = [dataclasses.replace(t, deadline=deadline) for t in promised]
    return slots, promised, tasks(rng, OFFER, now, deadline, b"O")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--promised", type=int, default=300, help="jobs promised before the offer")
    parser.add_argument("--cores", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    print(f"admission of one offer of {OFFER} jobs, {args.promised} promised, {args.cores} core(s)")
    print("  case   admit (ms an offer, a job)   admit_each, its definition   ratio   accepted")
    for name in ("room", "full", "some"):
        rng = random.Random(7)
        fast: list[float] = []
        each: list[float] = []
        accepted = 0
        for _ in range(args.rounds):
            slots, promised, offered = case(name, args.promised, args.cores, rng)
            t0 = time.process_time()
            result = admit(slots, promised, offered, 1_000_000)
            t1 = time.process_time()
            admit_each(slots, promised, offered, 1_000_000)
            t2 = time.process_time()
            fast.append(t1 - t0)
            each.append(t2 - t1)
            accepted += len(result.accepted)
        a, e = statistics.median(fast) * 1000, statistics.median(each) * 1000
        print(
            f"  {name:5}  {a:8.2f} {a / OFFER:7.3f}            {e:8.2f} {e / OFFER:7.3f}"
            f"              {a / e:5.2f}x  {accepted / args.rounds:.1f} of {OFFER}"
        )


if __name__ == "__main__":
    main()
