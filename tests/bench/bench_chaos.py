"""The chaos run, full size: a sweep of several hundred jobs over hosts in network namespaces (some
behind NAT) while a seeded schedule of faults kills -9 nodes (the submitter among them) and starts
them again, pulls links and partitions the network; then the invariant check of tests/netns/chaos.py
over every node's store and exported receipts, and `e31 audit` of every node's bundle.

Run as root (network namespaces), from the repository:

    sudo .venv/bin/python tests/bench/bench_chaos.py --seed 1 --jobs 300 --faults 100

It prints the report (one JSON object) and exits 1 when an invariant failed. Figures go to
docs/benchmarks.md with the date, the machine's load and the command.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "netns"))

from chaos import Chaos, ChaosConfig
from harness import Topology, sweep_stale, unsupported_reason


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--faults", type=int, default=100)
    parser.add_argument("--public", type=int, default=2, help="executors on the public segment")
    parser.add_argument("--homes", type=int, default=2, help="home networks behind NAT")
    parser.add_argument("--per-home", type=int, default=1, help="executors in each home")
    parser.add_argument("--samples", type=int, default=5_000_000, help="Monte Carlo samples per job")
    parser.add_argument(
        "--settle", type=float, default=600.0, help="seconds at most to finish after the faults"
    )
    parser.add_argument("--keep", action="store_true", help="keep the data dirs and logs (printed)")
    args = parser.parse_args()
    reason = unsupported_reason(nat=True)
    if reason is not None:
        print(f"bench_chaos: {reason}", file=sys.stderr)
        return 2
    sweep_stale()
    config = ChaosConfig(
        seed=args.seed,
        jobs=args.jobs,
        faults=args.faults,
        public=args.public,
        homes=args.homes,
        per_home=args.per_home,
        samples=args.samples,
        settle=args.settle,
    )
    tmp = Path(tempfile.mkdtemp(prefix="e31-chaos-"))
    load = os.getloadavg()
    t0 = time.monotonic()
    with Topology() as topo:
        chaos = Chaos(topo, tmp, config, log=lambda s: print(s, file=sys.stderr))
        try:
            report = chaos.run()
        finally:
            for node in chaos.nodes:
                node.kill()
    elapsed = time.monotonic() - t0
    print(report.summary())
    print(
        f"bench_chaos: {report.hosts} hosts, {len(report.faults)} faults {report.fault_counts}, "
        f"{len(chaos.jobs)} jobs {report.states}, {report.reruns} run twice (after a lease), "
        f"lost {len(report.lost)}, re-run after a submitter restart "
        f"{len(report.rerun_after_submitter_restart)}, audit failures {len(report.audit_failures)}; "
        f"{elapsed:.0f} s; load average at start {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}",
        file=sys.stderr,
    )
    if args.keep:
        print(f"bench_chaos: data dirs and logs in {tmp}", file=sys.stderr)
    else:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return 0 if report.sound else 1


if __name__ == "__main__":
    sys.exit(main())
