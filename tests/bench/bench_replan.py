"""How soon a job queued at an executor that fell behind its promise is done elsewhere (re-planning).

    .venv/bin/python tests/bench/bench_replan.py [--rounds R]

Each round runs tests/node/test_replan_e2e.py's scenario with real `e31 node run` processes on
127.0.0.1, in a fresh directory: a job queued at x behind a long job; x's owner comes back (x
suspends, and stays suspended); y joins; the submitter withdraws the job past its promise and y runs
it. From the job's receipts bundle (its signed offer, both assignments and y's receipt) it prints, in
seconds from the job's creation: when it was done (y's receipt's `finished_at`), when the lease of
its first assignment ended (the earliest a submitter that does not re-plan would have offered it
again, x's owner still being at work), and its deadline. Wall-clock figures: they move with the
host's load; quote them with it (`uptime`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "node"))

from e31.node.audit.bundle import read_bundle  # noqa: E402
from e31.protocol.envelope import verify  # noqa: E402
from e31.protocol.messages import Assign, Offer, UsageReceipt  # noqa: E402
from test_replan_e2e import Node, audited, fall_behind_and_move  # noqa: E402


def one_round(tmp: Path) -> tuple[float, float, float]:
    """(done, first lease's end, deadline), in seconds from the job's creation."""
    nodes: list[Node] = []
    try:
        moved = fall_behind_and_move(tmp, nodes)
        if moved.doc["state"] != "done" or moved.doc["attempt"] != 2:
            raise SystemExit(f"the job was not moved and done: {moved.doc}")
        out = tmp / "moved.e31"
        if not audited(moved.s, moved.job, out)["sound"]:
            raise SystemExit("the audit of the moved job's receipts found problems")
    finally:
        for node in nodes:
            node.stop()
    envs = [verify(raw) for raw in read_bundle(out).envelopes]
    job_id = bytes.fromhex(moved.job)
    manifest = next(
        m for e in envs if isinstance(e.message, Offer) for m in e.message.manifests if m.job_id.raw == job_id
    )
    first = next(e.message for e in envs if isinstance(e.message, Assign) and e.message.attempt == 1)
    receipt = next(e.message for e in envs if isinstance(e.message, UsageReceipt))
    t0 = manifest.created_at
    return (
        (receipt.finished_at - t0) / 1000,
        (first.lease_expires - t0) / 1000,
        (manifest.deadline - t0) / 1000,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for i in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="e31-replan-") as tmp:
            done, lease, deadline = one_round(Path(tmp))
        rows.append((done, lease, deadline))
        print(
            f"round {i + 1}: done at {done:.1f} s; first lease's end {lease:.1f} s; deadline {deadline:.1f} s"
        )
    done_m = statistics.median(r[0] for r in rows)
    lease_m = statistics.median(r[1] for r in rows)
    print(f"median over {len(rows)}: done at {done_m:.1f} s, first lease's end at {lease_m:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
