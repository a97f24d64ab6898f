"""Plots of the scheduling simulator's results (docs/scheduling.md).

    .venv/bin/pip install -e '.[bench]'
    .venv/bin/python tests/bench/plot_schedule.py [--seed N] [--jobs N] [--out docs/img]

Runs tests/bench/sim_schedule.py at loads 0.5, 0.95 and 1.3 for every policy and writes
schedule-goodput.png (goodput and the share of admitted jobs on time, by load) and schedule-slowdown.png
(mean and p99 slowdown by size class at load 1.3), plus schedule-results.json with every figure.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from sim_schedule import FLOORS_TEXT, POLICIES, Scenario, check, run

LOADS = [0.5, 0.95, 1.3]
COLORS = {"fifo": "#999999", "edf": "#e69f00", "edf+admission": "#56b4e9", "ours": "#009e73"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=6000)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[2] / "docs" / "img"))
    a = ap.parse_args()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    sc = Scenario(jobs=a.jobs, seed=a.seed)
    results = run(sc, LOADS)
    (out / "schedule-results.json").write_text(
        json.dumps({"scenario": repr(sc), "results": {str(k): v for k, v in results.items()}}, indent=1)
        + "\n"
    )

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    width = 0.2
    for i, p in enumerate(POLICIES):
        xs = [j + (i - 1.5) * width for j in range(len(LOADS))]
        ax1.bar(xs, [float(results[load][p]["goodput"]) for load in LOADS], width, label=p, color=COLORS[p])  # type: ignore[arg-type]
        ax2.bar(
            xs,
            [100 * float(results[load][p]["on_time_of_admitted"]) for load in LOADS],  # type: ignore[arg-type]
            width,
            label=p,
            color=COLORS[p],
        )
    for ax, title in ((ax1, "goodput (on-time fuel / capacity)"), (ax2, "admitted jobs done on time (%)")):
        ax.set_xticks(range(len(LOADS)), [f"load {x}" for x in LOADS])
        ax.set_title(title)
    ax2.set_ylim(0, 105)
    ax1.legend(loc="upper left", fontsize=8)
    fig.suptitle(
        f"{sc.nodes} nodes x {sc.cores} cores, {sc.submitters} submitters, {sc.jobs} jobs, seed {sc.seed}"
    )
    fig.tight_layout()
    fig.savefig(out / "schedule-goodput.png", dpi=100)

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    classes = ["small", "medium", "large"]
    for ax, stat in zip(axes, ("mean", "p99"), strict=True):
        for i, p in enumerate(POLICIES):
            slow = results[1.3][p]["slowdown"]
            assert isinstance(slow, dict)
            xs = [j + (i - 1.5) * width for j in range(len(classes))]
            ax.bar(xs, [slow[c][stat] or 0 for c in classes], width, label=p, color=COLORS[p])
        ax.set_xticks(range(len(classes)), classes)
        ax.set_yscale("log")
        ax.set_title(f"{stat} slowdown at load 1.3, by job size")
    axes[0].legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "schedule-slowdown.png", dpi=100)

    missed = check(results)
    print("floors missed:" if missed else f"floors met: {FLOORS_TEXT}", *missed)
    for load in LOADS:
        print(load, {p: results[load][p]["goodput"] for p in POLICIES})
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
