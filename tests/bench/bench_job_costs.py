"""What one tiny job costs, counted: messages, signatures, hops, tasks, store calls, commits, fsyncs, logs.

    .venv/bin/python tests/bench/bench_job_costs.py [--jobs N] [--by-task] [--executors K]

Runs a submitting node and an executing node (K with --executors, each bidding on every offer) in one
process (the market harness of tests/node/market_nodes.py: real stores, blob stores, sandbox pool and
signatures; messages handed over in memory), first N jobs one after another, then N at once (each its
own submit), then N as one batch (a sweep: `submit_batch`, its jobs offered in sets), and prints per job
how many times each costly operation happened. "log lines" are the records written at the node's default
level (info); "fsyncs" count the WAL's and the watermark's (two per watermark write); "trio tasks"
include the one the in-memory harness starts per message, which a real link does not (peering hands a
message on inline); "trio task steps" count every time a task runs (each wake-up costs the scheduler),
with --by-task also by the task's coroutine. "CPU ms" is this process's CPU time per job (all nodes,
not their sandbox workers): unlike the counts it moves with the host's load. The counts do not drift
with the host's load, so they show what a change to the job path saved (docs/benchmarks.md, "Jobs at
scale").
Not counted: gossip (offers reach the executor in memory), the HTTP API, and the receipt log and its
proofs (the harness has none).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import logging
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import nacl.signing
import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "node"))

import e31.protocol.envelope as envelope  # noqa: E402
import market_nodes as harness  # noqa: E402
from e31.node.store import watermark  # noqa: E402
from e31.node.store.async_store import AsyncStore  # noqa: E402
from e31.node.store.db import Store  # noqa: E402

COUNTS: collections.Counter[str] = collections.Counter()


def _instrument() -> None:
    """Count the operations (wrapping the functions that do them)."""
    check = envelope.signature_ok_trusted

    def counted_check(*args: Any) -> bool:
        COUNTS["signature checks"] += 1
        return check(*args)

    envelope.signature_ok_trusted = counted_check  # type: ignore[assignment]
    sign = nacl.signing.SigningKey.sign

    def counted_sign(self: nacl.signing.SigningKey, *args: Any, **kwargs: Any) -> Any:
        COUNTS["signatures made"] += 1
        return sign(self, *args, **kwargs)

    nacl.signing.SigningKey.sign = counted_sign  # type: ignore[method-assign]
    hop = trio.to_thread.run_sync

    async def counted_hop(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        COUNTS["thread hops"] += 1
        return await hop(fn, *args, **kwargs)

    trio.to_thread.run_sync = counted_hop  # type: ignore[assignment]
    transaction = Store.transaction

    @contextlib.contextmanager
    def counted_transaction(self: Store, *, durable: bool = True) -> Iterator[Any]:
        if not self._depth:
            COUNTS["commits"] += 1
        with transaction(self, durable=durable) as c:
            yield c

    Store.transaction = counted_transaction  # type: ignore[method-assign]
    open_group = AsyncStore._open_group

    def counted_open_group(self: AsyncStore) -> Any:  # short writes of a burst: one commit
        COUNTS["commits"] += 1
        return open_group(self)

    AsyncStore._open_group = counted_open_group  # type: ignore[method-assign]
    fsync = Store._fsync

    def counted_fsync(self: Store) -> None:
        COUNTS["fsyncs"] += 1
        fsync(self)

    Store._fsync = counted_fsync  # type: ignore[method-assign]
    write_mark = watermark.write

    def counted_write_mark(path: Path, mark: watermark.Mark) -> None:  # temp file and directory
        COUNTS["fsyncs"] += 2
        write_mark(path, mark)

    watermark.write = counted_write_mark
    run = AsyncStore.run

    async def counted_run(self: AsyncStore, method: Any, *args: Any, **kwargs: Any) -> Any:
        COUNTS["store calls"] += 1
        return await run(self, method, *args, **kwargs)

    AsyncStore.run = counted_run  # type: ignore[method-assign]
    sender = harness.Net.sender

    def counted_sender(self: harness.Net, me: bytes) -> Callable[[bytes, bytes], Awaitable[bool]]:
        inner = sender(self, me)

        async def send(peer: bytes, raw: bytes) -> bool:
            COUNTS["direct messages"] += 1
            COUNTS[f"  {envelope.claimed_kind(raw)}"] += 1
            result: bool = await inner(peer, raw)
            return result

        return send

    harness.Net.sender = counted_sender  # type: ignore[method-assign]

    class CountLines(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            COUNTS["log lines"] += 1

    logging.getLogger().addHandler(CountLines(logging.INFO))
    logging.getLogger("e31").setLevel(logging.INFO)  # the node's default level (node/logs.py)


STEPS: collections.Counter[str] = collections.Counter()
"""Task steps by the task's coroutine (with --by-task)."""


class CountTasks(trio.abc.Instrument):
    def __init__(self, by_task: bool) -> None:
        self.by_task = by_task

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        COUNTS["trio tasks"] += 1

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        COUNTS["trio task steps"] += 1
        if self.by_task:
            STEPS[task.coro.cr_code.co_qualname if hasattr(task.coro, "cr_code") else task.name] += 1


async def _measure(jobs: int, by_task: bool, executors: int) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    trio.lowlevel.add_instrument(CountTasks(by_task))
    async with trio.open_nursery() as nursery:
        net = harness.Net()
        net.nursery = nursery
        tmp = Path(tempfile.mkdtemp(prefix="e31-costs-"))
        a = harness.RealNode(net, tmp, "a", 1)
        others = [harness.RealNode(net, tmp, f"x{i}", 2 + i) for i in range(executors)]
        await harness.start(nursery, a, *others)
        await harness.wait_state(a, await a.submitter.submit(a.manifest(("0", "1000"))), "done")  # warm-up
        await trio.sleep(1.0)
        seed = 1
        for mode in ("one at a time", "all at once", "one batch"):
            COUNTS.clear()
            STEPS.clear()
            cpu0 = time.process_time()
            if mode == "one at a time":
                for _ in range(jobs):
                    job = await a.submitter.submit(a.manifest((str(seed), "1000"), deadline_s=3600))
                    seed += 1
                    await harness.wait_state(a, job, "done", 120)
            elif mode == "all at once":
                ids = []
                for _ in range(jobs):
                    ids.append(await a.submitter.submit(a.manifest((str(seed), "1000"), deadline_s=3600)))
                    seed += 1
                for job in ids:
                    await harness.wait_state(a, job, "done", 300)
            else:  # a sweep: POST /v1/batches, its jobs offered in sets
                batch = [a.manifest((str(seed + i), "1000"), deadline_s=3600) for i in range(jobs)]
                seed += jobs
                await a.submitter.submit_batch(batch)
                for m in batch:
                    await harness.wait_state(a, m.job_id.raw, "done", 300)
            await trio.sleep(1.0)  # the acknowledgements' proofs (batched) are part of the job
            COUNTS["CPU ms, all nodes (this process)"] += (time.process_time() - cpu0) * 1000
            out[mode] = {k: v / jobs for k, v in COUNTS.items()}
            if by_task:
                out[mode].update({f"  step: {k}": v / jobs for k, v in STEPS.most_common(25)})
        nursery.cancel_scope.cancel()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=50, help="jobs in each of the two runs")
    parser.add_argument("--by-task", action="store_true", help="also count task steps by coroutine")
    parser.add_argument("--executors", type=int, default=1, help="executing nodes, each bidding (default 1)")
    args = parser.parse_args()
    if not 1 <= args.executors <= 64:
        parser.error("--executors is 1 to 64")
    # production intervals: the harness re-sends every 0.2 s, which would count its own retries
    harness.SETTINGS = dataclasses.replace(harness.SETTINGS, delivery_interval=2.0)
    _instrument()
    results = trio.run(_measure, args.jobs, args.by_task, args.executors)
    modes = list(results)
    totals = sorted(k for k in {k for r in results.values() for k in r} if not k.startswith(" "))
    kinds = sorted(k for k in {k for r in results.values() for k in r} if k.startswith("  ") and ":" not in k)
    steps = sorted(
        (k for k in {k for r in results.values() for k in r} if k.startswith("  step: ")),
        key=lambda k: -results[modes[-1]].get(k, 0.0),
    )
    subs = {"direct messages": kinds, "trio task steps": steps}
    names = [n for t in totals for n in [t, *subs.get(t, [])]]
    print(
        f"per tiny job (montecarlo 1,000 samples), the submitter and {args.executors} executor(s) together, "
        f"{args.jobs} jobs each"
    )
    print(f"  {'':40}" + "".join(f"{m:>16}" for m in modes))
    for name in names:
        digits = 2 if name.startswith("CPU") else 1
        print(f"  {name[:40]:40}" + "".join(f"{results[m].get(name, 0.0):16.{digits}f}" for m in modes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
