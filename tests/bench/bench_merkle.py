"""Receipt-log speed: appends, roots, and inclusion/consistency proofs (generate + verify) at 1e5 leaves.

Run: .venv/bin/python tests/bench/bench_merkle.py [--leaves N]. Prints the median of five rounds for
each figure and exits 1 if one is below its floor.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable

from e31.protocol.merkle import MerkleLog, leaf_hash, verify_consistency, verify_inclusion

FLOORS = {
    "append": 50_000,
    "root (latest)": 20_000,
    "root (past size)": 10_000,
    "inclusion proof generate+verify": 5_000,
    "consistency proof generate+verify": 5_000,
}


def rate(work: Callable[[], int]) -> float:
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        n = work()
        rounds.append(n / (time.perf_counter() - start))
    return statistics.median(rounds)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--leaves", type=int, default=100_000)
    args = parser.parse_args()
    size = args.leaves
    entries = [b"receipt entry %08d" % i + bytes(180) for i in range(size)]
    rng = random.Random(31)

    def append() -> int:
        log = MerkleLog()
        for e in entries:
            log.append(e)
        return size

    log = MerkleLog()
    for e in entries:
        log.append(e)
    root = log.root()
    picks = [rng.randrange(size) for _ in range(5_000)]
    olds = [rng.randrange(1, size) for _ in range(5_000)]

    def root_latest() -> int:
        for _ in range(20_000):
            log.root()
        return 20_000

    def root_past() -> int:
        for old in olds:
            log.root(old)
        return len(olds)

    def inclusion() -> int:
        for i in picks:
            verify_inclusion(leaf_hash(entries[i]), i, size, log.inclusion_proof(i, size), root)
        return len(picks)

    old_roots = {old: log.root(old) for old in olds}

    def consistency() -> int:
        for old in olds:
            verify_consistency(old, size, old_roots[old], root, log.consistency_proof(old, size))
        return len(olds)

    figures = {
        "append": rate(append),
        "root (latest)": rate(root_latest),
        "root (past size)": rate(root_past),
        "inclusion proof generate+verify": rate(inclusion),
        "consistency proof generate+verify": rate(consistency),
    }
    failed = False
    print(f"Merkle log, {size} leaves of {len(entries[0])} bytes, median of 5 rounds, one core")
    for name, value in figures.items():
        floor = FLOORS[name]
        ok = value >= floor
        failed |= not ok
        print(f"  {name:36s} {value:12,.0f} /s   floor {floor:,} {'ok' if ok else 'MISSED'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
