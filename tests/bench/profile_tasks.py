"""Exact CPU per trio task, and SQL statements, in each node process during one sweep of tiny jobs.

    .venv/bin/python tests/bench/profile_tasks.py [--jobs N] [--nodes K] [--before K] [--top T]

Starts K (default 3) `e31 node run` processes on 127.0.0.1 (bench_jobs.py's `net()`), runs a warm-up job
and K `--before` sweeps, then measures one sweep of N tiny jobs (bench_jobs.py's sweep). Each node
process loads an instrument from a `sitecustomize` module this script writes to a temporary directory
(put on the nodes' PYTHONPATH; no code of the node changes): a trio Instrument that adds up the thread
CPU time (`time.thread_time`) of every task step by the coroutine the task started with, and an SQLite
connection class that counts every statement its `execute` and `executemany` run, by its text (the
parameters are not in it), with the CPU time of the thread that runs it. SIGUSR2 starts and stops the count;
the node writes what it counted to a file in that directory. Printed per node: the CPU per job of the
sweep of its main thread (the event loop, in and between task steps) and of the whole process (its
threads: the sandbox pool's supervisors, the store's syncs, the receipt log's appends and proofs; not
its sandbox workers, which are processes of their own), the tasks by CPU (steps per job, CPU per step),
and the statements per job.

Why this and not py-spy (profile_jobs.py): SQLite and libsodium release the GIL while they work, so
`py-spy --gil` does not see that time, and without --gil, or with a wall-clock profiler, the time a
thread waits to take the GIL back counts as its own. A task's thread CPU time is neither. The
instrument costs about 1 us per task step (two clock reads) and about as much per statement, charged
to the task that runs it: compare figures within one run of this script, or between two trees run the
same way (docs/benchmarks.md). Bounded: one sweep of N jobs, each node given bench_jobs.py's timeouts.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_jobs import BenchError, net, sweep, tiny, wait
from e31.node.api.client import ApiClientError
from e31.node.demo.net import NetworkError

ENV = "E31_BENCH_TASK_CPU"
"""The directory the instrument writes to (its presence turns the instrument on in a process)."""

INSTRUMENT = f'''
"""Written by tests/bench/profile_tasks.py: per-task CPU and SQL statements in an e31 node process."""
import os

if os.environ.get("{ENV}"):
    import collections
    import json
    import signal
    import sqlite3
    import threading
    import time

    import trio

    _cpu = collections.Counter()
    _steps = collections.Counter()
    _sql = collections.Counter()
    _sql_lock = threading.Lock()  # statements run in the event loop's thread and in worker threads
    _state = {{"on": False, "t": 0.0, "main": 0.0, "process": 0.0, "threads": {{}}}}
    _folded = {{}}

    class _Tasks(trio.abc.Instrument):
        def before_task_step(self, task):
            _state["t"] = time.thread_time()

        def after_task_step(self, task):
            if _state["on"]:
                name = getattr(task.coro, "__qualname__", type(task.coro).__name__)
                _cpu[name] += time.thread_time() - _state["t"]
                _steps[name] += 1

    _run = trio.run

    def _instrumented_run(*args, **kwargs):
        kwargs["instruments"] = [*kwargs.get("instruments", ()), _Tasks()]
        return _run(*args, **kwargs)

    trio.run = _instrumented_run

    _sql_cpu = collections.Counter()

    def _count(sql, n, seconds):
        key = _folded.get(sql)
        if key is None:
            key = _folded[sql] = " ".join(sql.split())[:160]
        with _sql_lock:
            _sql[key] += n
            _sql_cpu[key] += seconds

    class _Counted(sqlite3.Connection):
        """Counts each statement by its text as written (its parameters are not in it), and the CPU
        time of the thread that runs it."""

        def execute(self, sql, *args):
            if not _state["on"]:
                return super().execute(sql, *args)
            t = time.thread_time()
            try:
                return super().execute(sql, *args)
            finally:
                _count(sql, 1, time.thread_time() - t)

        def executemany(self, sql, params):
            if not _state["on"]:
                return super().executemany(sql, params)
            params = list(params)
            t = time.thread_time()
            try:
                return super().executemany(sql, params)
            finally:
                _count(sql, len(params), time.thread_time() - t)

    _connect = sqlite3.connect

    def _counted_connect(*args, **kwargs):
        kwargs.setdefault("factory", _Counted)
        return _connect(*args, **kwargs)

    sqlite3.connect = _counted_connect

    def _toggle(signum, frame):
        if not _state["on"]:
            _cpu.clear(); _steps.clear()
            with _sql_lock:
                _sql.clear()
                _sql_cpu.clear()
            _state.update(on=True, main=time.thread_time(), process=time.process_time(), threads=_threads())
            return
        _state["on"] = False
        out = {{
            "main": time.thread_time() - _state["main"],
            "process": time.process_time() - _state["process"],
            "cpu": dict(_cpu),
            "steps": dict(_steps),
            "sql": dict(_sql),  # (a statement still running in a thread may be counted after)
            "sql_cpu": dict(_sql_cpu),
            "threads": _by_kind(
                (name, seconds - _state["threads"].get(tid, ("", 0.0))[1])
                for tid, (name, seconds) in _threads().items()
            ),
        }}
        path = os.path.join(os.environ["{ENV}"], "%d.json" % os.getpid())
        with open(path + ".tmp", "w") as f:
            json.dump(out, f)
        os.replace(path + ".tmp", path)

    def _threads():
        """(name, CPU seconds so far) of each of this process's threads, by thread id (/proc; the tick
        is 10 ms). By id, not name: trio renames its worker threads as they take on work."""
        names = {{t.native_id: t.name for t in threading.enumerate()}}
        tick = os.sysconf("SC_CLK_TCK")
        out = {{}}
        for tid in os.listdir("/proc/self/task"):
            try:
                with open("/proc/self/task/%s/stat" % tid) as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            cpu = (int(fields[11]) + int(fields[12])) / tick
            out[int(tid)] = (names.get(int(tid), "thread %s" % tid), cpu)
        return out

    def _by_kind(threads):
        """Threads' CPU, (name, seconds) pairs, by kind: numbered names (trio's worker threads, a pool's
        supervisors) folded into one. A thread that ended during the sweep is not counted."""
        out = {{}}
        for name, seconds in threads:
            kind = name.rstrip("0123456789-_ ") or name
            out[kind] = out.get(kind, 0.0) + seconds
        return out

    signal.signal(signal.SIGUSR2, _toggle)
'''


def _collect(directory: Path, pids: list[int], timeout: float = 10.0) -> dict[int, dict[str, Any]]:
    """Each node's counts, once it has written them (SIGUSR2 is handled between the loop's steps)."""
    end = time.monotonic() + timeout
    out: dict[int, dict[str, Any]] = {}
    while len(out) < len(pids):
        for pid in pids:
            path = directory / f"{pid}.json"
            if pid not in out and path.exists():
                out[pid] = json.loads(path.read_text())
        if len(out) < len(pids):
            if time.monotonic() > end:
                raise BenchError(f"only {len(out)} of {len(pids)} nodes wrote their counts")
            time.sleep(0.05)
    return out


def report(counts: dict[str, Any], jobs: int, top: int) -> list[str]:
    cpu, steps, sql = counts["cpu"], counts["steps"], counts["sql"]
    per = 1000 / jobs
    lines = [
        f"main thread {counts['main'] * per:.3f} ms CPU per job, whole process "
        f"{counts['process'] * per:.3f}, in task steps {sum(cpu.values()) * per:.3f}",
        "  tasks by CPU: ms per job, steps per job, us per step",
    ]
    for name, seconds in sorted(cpu.items(), key=lambda kv: -kv[1])[:top]:
        lines.append(
            f"    {seconds * per:7.3f} {steps[name] / jobs:6.2f} {seconds * 1e6 / steps[name]:8.1f}  {name}"
        )
    threads = sorted(counts["threads"].items(), key=lambda kv: -kv[1])
    lines.append(
        "  threads (ms per job, /proc's 10 ms ticks): "
        + ", ".join(f"{name} {seconds * per:.3f}" for name, seconds in threads if seconds > 0)
    )
    sql_cpu = counts["sql_cpu"]
    lines.append(
        f"  SQL: {sum(sql.values()) / jobs:.1f} statements per job, {sum(sql_cpu.values()) * per:.3f} ms CPU "
        "per job (statements per job, us of CPU per statement; the costliest first)"
    )
    for statement, n in sorted(sql.items(), key=lambda kv: -sql_cpu[kv[0]])[:top]:
        lines.append(f"    {n / jobs:6.2f} {sql_cpu[statement] * 1e6 / n:7.1f}  {statement[:100]}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000, help="jobs in the measured sweep (default 1000)")
    parser.add_argument("--nodes", type=int, default=3, help="node processes (default 3)")
    parser.add_argument("--before", type=int, default=1, help="unmeasured sweeps first (default 1)")
    parser.add_argument("--top", type=int, default=12, help="tasks and statements shown per node")
    args = parser.parse_args()
    if args.jobs < 1 or not 1 <= args.nodes <= 16 or args.before < 0:
        parser.error("--jobs must be at least 1, --nodes 1 to 16, --before 0 or more")
    with tempfile.TemporaryDirectory(prefix="e31-task-cpu-") as tmp:
        directory = Path(tmp)
        (directory / "sitecustomize.py").write_text(INSTRUMENT)
        os.environ[ENV] = str(directory)
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (tmp, os.environ.get("PYTHONPATH")) if p)
        try:
            with net(args.nodes) as network:
                api = network.nodes[0].api(timeout=60)
                wait(api, api.post("/v1/jobs", tiny(0))["job_id"])
                for i in range(args.before):
                    sweep(network, args.jobs, 1_000 + i * args.jobs)
                pids = [n.pid for n in network.nodes]
                for pid in pids:
                    os.kill(pid, signal.SIGUSR2)
                t0 = time.time()
                swept = sweep(network, args.jobs, 1_000_000)
                for pid in pids:
                    os.kill(pid, signal.SIGUSR2)
                counts = _collect(directory, pids)
                ids = {str(n.node_id): i for i, n in enumerate(network.nodes)}
                ran = [0] * len(pids)
                for doc in api.get("/v1/jobs"):
                    if doc.get("created", 0) >= t0 and doc.get("executor") in ids:  # (one clock: one host)
                        ran[ids[doc["executor"]]] += 1
        except (BenchError, ApiClientError, NetworkError, OSError) as e:
            print(f"profile_tasks: {e}", file=sys.stderr)
            return 1
    print(
        f"one sweep of {args.jobs} tiny jobs on {args.nodes} nodes: {swept['overall']:.1f} jobs/s "
        f"({swept['seconds']:.2f} s); {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"load {', '.join(f'{x:.1f}' for x in os.getloadavg())}"
    )
    for i, pid in enumerate(pids):
        print(f"node{i} (ran {ran[i]} jobs): " + "\n".join(report(counts[pid], args.jobs, args.top)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
