"""What a Python job costs: the CPython WASI interpreter's compile, cache load and start, the per-job
overhead with a warm cache, and a sweep of many small Python jobs through a real node.

    .venv/bin/python tests/bench/bench_python_jobs.py [--sweep 1000] [--repeat 5] [--parts sandbox,pool,node]

Needs the interpreter (pip install 'e31-node[python]'). Four parts, each printed as it ends:
1. the sandbox in this process: a cold compile of the 26 MB interpreter; a compiled-module cache miss
   (compile and store), then a disk hit in a fresh cache (what a new worker process pays); an empty
   script's run (the interpreter's start: fuel, seconds, peak linear memory) and the guest example
   wc.py's;
2. a worker pool with a warm cache: one empty-script job from start_job to its result, repeated (the
   executor's per-job cost beyond the guest's own run);
3. one real `e31 node run` (a network of one: it submits and executes): a first Python job (its
   worker compiles the interpreter), then warm ones one at a time, submit to done;
4. a batch of --sweep small Python jobs (`e31 submit --python --batch`) on that node: time to done,
   jobs/s, the node's and its workers' peak RSS, all bounded by a deadline.
Figures go to docs/benchmarks.md ("Python jobs") with the date, the machine's load and this command.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "node"))

from e31.node.cli.python_runtime import interpreter  # noqa: E402
from e31.sandbox.cache import ModuleCache  # noqa: E402
from e31.sandbox.job import JobSpec  # noqa: E402
from e31.sandbox.limits import Limits, Status  # noqa: E402
from e31.sandbox.pool import WorkerPool  # noqa: E402
from e31.sandbox.runner import compile_module, default_engine, run  # noqa: E402
from test_jobs_e2e import Node, e31, wait_for  # noqa: E402

WC = ROOT / "sandbox" / "workloads" / "guests" / "python" / "wc.py"
LIMITS = Limits(fuel=5_000_000_000, memory_bytes=256 << 20, wall_seconds=120.0, max_output_bytes=1 << 20)
SWEEP_DEADLINE = 1800.0
CACHE_LOAD_FLOOR = 0.100
"""Seconds: the compiled interpreter loads from the cache (a disk hit) within this (issue 21)."""
WARM_JOB_FLOOR = 1.0
"""Seconds: a warm Python job (interpreter compiled and cached) starts within this; the figure checked
is submit to done, which is longer."""
MISSED: list[str] = []


def floor(name: str, value: float, limit: float) -> str:
    if value < limit:
        return "floor met"
    MISSED.append(name)
    return "floor MISSED"


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def rss_kib(pid: int) -> int:
    """Peak resident set (VmHWM) of a process, in KiB; 0 if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and of its children it has reaped, in seconds; 0 if it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def tree_cpu(pid: int) -> float:
    """CPU seconds of a node and its live workers (which run jobs for the node's whole life)."""
    return cpu_seconds(pid) + sum(cpu_seconds(c) for c in children(pid))


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def sandbox_part(module: bytes, tmp: Path, repeat: int) -> None:
    engine = default_engine()
    t = time.perf_counter()
    compile_module(engine, module)
    cold = time.perf_counter() - t
    cache_dir = tmp / "cache"
    t = time.perf_counter()
    ModuleCache(cache_dir).get(engine, module)
    miss = time.perf_counter() - t
    loads, cpu = [], []
    digest = hashlib.sha256(module).digest()  # as a worker has it: its job spec hashed the module
    for _ in range(repeat):
        fresh = ModuleCache(cache_dir)
        t, c = time.perf_counter(), time.process_time()
        compiled = fresh.get(engine, module, digest)
        loads.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
        assert fresh.stats.disk_hits == 1
    entry = next(cache_dir.glob("*.cwasm")).stat().st_size
    print(f"compile (cold, no cache): {cold:.2f} s")
    print(f"cache miss (compile + store {entry / 2**20:.0f} MiB entry): {miss:.2f} s")
    print(
        f"cache disk hit (fresh cache, tag checked, deserialized): median {median(loads) * 1000:.0f} ms "
        f"of {repeat} (min {min(loads) * 1000:.0f}, max {max(loads) * 1000:.0f}); CPU median "
        f"{median(cpu) * 1000:.0f} ms; < {CACHE_LOAD_FLOOR * 1000:.0f} ms: "
        f"{floor('cache load', median(loads), CACHE_LOAD_FLOOR)}"
    )

    empty = tmp / "empty.py"
    empty.write_text("")
    data = tmp / "input.txt"
    data.write_bytes((ROOT / "README.md").read_bytes())
    for name, script, inputs in (
        ("empty script (interpreter start)", empty, {}),
        ("wc.py over README.md", WC, {"input.txt": data}),
    ):
        spec = JobSpec(
            module=module,
            args=(f"/input/{script.name}",),
            inputs={script.name: script, **inputs},
            limits=LIMITS,
        )
        walls, fuels, memory = [], set(), 0
        for _ in range(repeat):
            t = time.perf_counter()
            r = run(spec, engine=engine, module=compiled)
            walls.append(time.perf_counter() - t)
            assert r.status is Status.EXITED and r.exit_code == 0, (r.status, r.stderr)
            fuels.add(r.fuel_used)
            memory = r.peak_memory_bytes
        assert len(fuels) == 1, f"fuel differed between runs: {fuels}"
        print(
            f"{name}: fuel {fuels.pop():,}, median {median(walls) * 1000:.0f} ms of {repeat}, "
            f"peak linear memory {memory / 2**20:.1f} MiB"
        )


def pool_part(module: bytes, tmp: Path, repeat: int) -> None:
    empty = tmp / "empty.py"
    spec = JobSpec(module=module, args=("/input/empty.py",), inputs={"empty.py": empty}, limits=LIMITS)
    with WorkerPool(1, tmp / "cache") as pool:
        t = time.perf_counter()
        pool.start_job(spec).wait()
        first = time.perf_counter() - t
        walls = []
        for _ in range(repeat):
            t = time.perf_counter()
            r = pool.start_job(spec).wait()
            walls.append(time.perf_counter() - t)
            assert r.status is Status.EXITED
        workers = pool.worker_pids()
        peak = max((rss_kib(p) for p in workers), default=0)
    print(
        f"worker pool, empty script: first job in a new worker (disk hit) {first * 1000:.0f} ms; "
        f"warm median {median(walls) * 1000:.0f} ms of {repeat} (run {r.wall_seconds * 1000:.0f} ms of it); "
        f"worker peak RSS {peak / 1024:.0f} MiB"
    )


def job_doc(node: Node, job: str) -> dict[str, object]:
    doc: dict[str, object] = node.api.get(f"/v1/jobs/{job}")
    return doc


def submit_python(node: Node, script: Path) -> str:
    done = e31("submit", "--python", str(script), "--deadline", "1h", data_dir=node.data_dir)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().splitlines()[-1].split()[-1]


def node_part(tmp: Path, repeat: int, sweep: int) -> None:
    empty = tmp / "empty.py"
    quiet = tmp / "owner-load"
    quiet.write_text("")
    os.environ["E31_TEST_OWNER_LOAD_FILE"] = str(quiet)
    # (Node runs `--cores 1`; a slow start on a loaded machine is waited for, not left running)
    node = Node(
        tmp / "node",
        "--capacity-interval",
        "0.2",
        "--capacity-raise-after",
        "0",
        "--idle-seconds",
        "0",
        start_deadline=600.0,
    )
    try:
        t = time.perf_counter()
        first = submit_python(node, empty)
        wait_for("the first job", lambda: job_doc(node, first)["state"] == "done", 600)
        print(
            f"node, first Python job (submit checks + compiles, its worker compiles): "
            f"{time.perf_counter() - t:.1f} s submit to done"
        )
        latencies = []
        for _ in range(repeat):
            # the same request the CLI sends, straight to the API: the CLI's own start is not the job's
            t = time.perf_counter()
            answer = node.api.post(
                "/v1/jobs",
                {
                    "module": str(interpreter()),
                    "inputs": [{"name": "empty.py", "path": str(empty)}],
                    "args": ["/input/empty.py"],
                },
            )
            job = answer["job_id"]
            wait_for("a warm job", lambda j=job: job_doc(node, j)["state"] == "done", 120)
            latencies.append(time.perf_counter() - t)
        print(
            f"node, warm Python job (empty script), submit to done: median {median(latencies):.2f} s "
            f"of {repeat} (min {min(latencies):.2f}, max {max(latencies):.2f}); < {WARM_JOB_FLOOR:.0f} s: "
            f"{floor('warm job', median(latencies), WARM_JOB_FLOOR)}"
        )

        lines = tmp / "sweep.jsonl"
        lines.write_text("".join(json.dumps({"args": [str(i)]}) + "\n" for i in range(sweep)))
        script = tmp / "square.py"
        script.write_text("import sys\nn = int(sys.argv[1])\nprint(n, n * n)\n")
        t, cpu = time.perf_counter(), tree_cpu(node.proc.pid)
        done = e31(
            "submit",
            "--python",
            str(script),
            "--batch",
            str(lines),
            "--deadline",
            "2h",
            data_dir=node.data_dir,
        )
        assert done.returncode == 0, done.stderr
        batch = done.stdout.strip().splitlines()[-1].split()[-1]
        submitted = time.perf_counter() - t
        peak = {"node": 0, "workers": 0}

        def finished() -> bool:
            peak["node"] = max(peak["node"], rss_kib(node.proc.pid))
            peak["workers"] = max([peak["workers"], *(rss_kib(p) for p in children(node.proc.pid))])
            jobs = node.api.get(f"/v1/batches/{batch}?brief=1")["jobs"]
            return all(j["state"] in ("done", "failed", "expired", "cancelled") for j in jobs)

        wait_for(f"the sweep of {sweep}", finished, SWEEP_DEADLINE)
        elapsed = time.perf_counter() - t
        cpu = tree_cpu(node.proc.pid) - cpu
        jobs = node.api.get(f"/v1/batches/{batch}?brief=1")["jobs"]
        states: dict[str, int] = {}
        for j in jobs:
            states[j["state"]] = states.get(j["state"], 0) + 1
        print(
            f"sweep of {sweep} Python jobs (one batch, one node offering one core): submitted in "
            f"{submitted:.1f} s, all ended in {elapsed:.0f} s ({sweep / elapsed:.1f} jobs/s); "
            f"states {states}; peak RSS node {peak['node'] / 1024:.0f} MiB, "
            f"a worker {peak['workers'] / 1024:.0f} MiB; CPU of the node and its workers "
            f"{cpu:.0f} s ({cpu / sweep * 1000:.0f} ms a job)"
        )
    finally:
        node.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", type=int, default=1000, help="jobs in the sweep (default 1000)")
    parser.add_argument("--repeat", type=int, default=5, help="repetitions of each timed step (default 5)")
    parser.add_argument(
        "--parts", default="sandbox,pool,node", help="which parts to run, of sandbox,pool,node (default all)"
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)  # a discarded cache entry says so
    module = interpreter().read_bytes()
    print(
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; load average {os.getloadavg()[0]:.1f} "
        f"on {os.cpu_count()} cores; interpreter {len(module):,} bytes"
    )
    with tempfile.TemporaryDirectory(prefix="e31-bench-python-") as d:
        tmp = Path(d)
        parts = set(args.parts.split(","))
        sandbox_part(module, tmp, args.repeat)  # the others use its cache and files
        if "pool" in parts:
            pool_part(module, tmp, args.repeat)
        if "node" in parts:
            node_part(tmp, args.repeat, args.sweep)
    print(f"load average at the end {os.getloadavg()[0]:.1f}")
    if MISSED:
        print(f"floors missed: {', '.join(MISSED)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
