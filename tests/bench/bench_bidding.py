"""What one offer of a sweep costs an executor to answer: CPU per offer, in-process, by how its bids fare.

    .venv/bin/python tests/bench/bench_bidding.py [--offers N] [--jobs J] [--rounds R]

A real executor (tests/node/market_nodes.RealNode: its store, scheduler and signing; one core) hears
N offers of J tiny jobs each from one submitter, as in a sweep, and answers each (`Bids.answer`); the
submitter's award for each bid names:
- `share`: J/6 of its jobs (a node among six), which are then assigned (`Bids.assigned`) and end at
  once: the node stays idle and bids on every offer;
- `loses`: none, while the node's core is promised to another submitter's jobs (it is busy): the
  node whose bids cannot win.
Prints the CPU (process time, which the host's other load does not add to) per offer answered, the
median of R rounds, and how many offers got a bid. Runs as it is against another checkout's code too
(`cd OTHER && .venv/bin/python PATH/TO/bench_bidding.py`): it uses only `answer`, `award`, `assigned`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio
import trio.testing

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "node"))

from e31.protocol.envelope import sign_message, verify
from e31.protocol.ids import NodeId
from e31.protocol.messages import Award, Bid
from market_nodes import NETWORK, Net, RealNode, start, wall_ms
from test_market import Recorder, foreign_manifest


async def one_round(offers: int, jobs: int, mode: str, tmp: Path) -> tuple[float, int]:
    """CPU seconds per offer answered, and the offers that got a bid."""
    net = Net()
    async with trio.open_nursery() as nursery:
        net.nursery = nursery
        b, c, other = RealNode(net, tmp, "b", 2), Recorder(net, 9), Recorder(net, 13)
        await start(nursery, b)
        bids = b.executor.bids
        deadline = wall_ms() + 3_600_000

        async def offer(submitter: Recorder, tag: str, n: int) -> float:
            manifests = [
                foreign_manifest(b, submitter.id, (tag, str(i)), deadline=deadline) for i in range(n)
            ]
            env = submitter.offer(*manifests)
            t0 = time.process_time()
            await bids.answer(env)
            return time.process_time() - t0

        async def award(submitter: Recorder, won: int) -> Bid | None:
            await trio.testing.wait_all_tasks_blocked()
            got = [e for e in submitter.got if isinstance(e.message, Bid)]
            submitter.got.clear()
            if not got:
                return None
            bid = got[-1]
            named = tuple(sorted((i.job_id for i in bid.message.items[:won]), key=lambda d: d.raw))
            msg = Award(NETWORK, bid.message_id, NodeId(submitter.id), NodeId(b.id), named)
            await b.market.message(submitter.id, sign_message(msg, submitter.key))
            promise = bids.live(bid.message_id.raw)
            if promise is not None and mode == "share":
                for job_id in named:  # assigned and ended at once: nothing queued here
                    bids.assigned(bid.message_id.raw, promise, job_id.raw)
            return verify(bid.raw, Bid).message

        if mode == "loses":  # the core is promised to another submitter's jobs, awarded, never assigned
            await offer(other, "busy", 4)
            await award(other, 4)
        cpu, bid_for = 0.0, 0
        for k in range(offers):
            cpu += await offer(c, f"o{k}", jobs)
            bid_for += await award(c, jobs // 6 if mode == "share" else 0) is not None
        nursery.cancel_scope.cancel()
    return cpu / offers, bid_for


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--offers", type=int, default=60)
    parser.add_argument("--jobs", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"{args.offers} offers of {args.jobs} tiny jobs, one submitter, one-core executor")
    for mode in ("share", "loses"):
        runs = []
        for _ in range(args.rounds):
            with tempfile.TemporaryDirectory(prefix="e31-bench-bidding-") as tmp:
                runs.append(trio.run(one_round, args.offers, args.jobs, mode, Path(tmp)))
        per_offer = statistics.median(r[0] for r in runs) * 1000
        print(
            f"  {mode:6} {per_offer:6.2f} ms CPU per offer answered; offers bid for: {[r[1] for r in runs]}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
