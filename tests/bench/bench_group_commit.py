"""Durable writes through AsyncStore with group commit: 4,000 one-row durable writes by 40 concurrent
tasks, median writes/s of 3 runs (each sync also advances the store watermark, store/watermark.py).

Run: .venv/bin/python tests/bench/bench_group_commit.py
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import trio
from e31.node.store.async_store import AsyncStore
from e31.node.store.db import Store, call


async def run(path: Path, n: int = 4000, tasks: int = 40) -> float:
    db = AsyncStore(Store(path))

    async def worker(k: int) -> None:
        for i in range(n // tasks):
            await db.atomically(call(Store.mark_seen, (k * n + i).to_bytes(8, "big"), 1e12), durable=True)

    t = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for k in range(tasks):
            nursery.start_soon(worker, k)
    dt = time.perf_counter() - t
    await db.aclose()
    return n / dt


rates = []
for _ in range(3):
    with tempfile.TemporaryDirectory(dir="/var/tmp") as d:
        rates.append(trio.run(run, Path(d) / "s.sqlite"))
print(f"{statistics.median(rates):.0f}")
