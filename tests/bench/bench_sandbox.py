"""Sandbox at scale: cold compile vs cached start, tiny jobs/s through the worker pool, Mandelbrot as
native C vs wasm vs our sandbox, and the resident memory of an idle worker.

Run: .venv/bin/python tests/bench/bench_sandbox.py [--quick]
Prints a table; exits 1 if a floor is missed. Timings of CPU-bound runs are CPU seconds (user+sys) of the
process doing the work, medians of several rounds: on a shared 2-core machine wall time mostly measures the
neighbours. The Mandelbrot rows separate what wasmtime's fuel metering costs (plain wasm vs wasm + fuel,
both driven by a bare wasmtime engine here) from what our layer adds (our virtual WASI, limits, watchdog,
result hashing: sandbox vs wasm + fuel).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import wasmtime
from e31.sandbox.cache import ModuleCache
from e31.sandbox.job import JobSpec
from e31.sandbox.limits import Limits, Status
from e31.sandbox.pool import WorkerPool
from e31.sandbox.profile import PROFILE, new_engine
from e31.sandbox.runner import compile_module, run

WORKLOADS = Path(__file__).resolve().parents[2] / "sandbox" / "workloads"
MANDEL_ARGS = ("768", "512", "0", "0", "768", "512", "1000")

FLOORS = {
    "tiny_jobs_per_s": 300.0,  # at least, through 2 workers
    "sandbox_vs_native": 2.0,  # at most
    "idle_worker_rss_mb": 80.0,  # at most
}


def cpu_of_self(fn: Callable[[], object]) -> float:
    t = resource.getrusage(resource.RUSAGE_SELF)
    fn()
    u = resource.getrusage(resource.RUSAGE_SELF)
    return (u.ru_utime - t.ru_utime) + (u.ru_stime - t.ru_stime)


def cpu_of_child(argv: list[str], stdout: Path) -> float:
    t = resource.getrusage(resource.RUSAGE_CHILDREN)
    with stdout.open("wb") as out:
        subprocess.run(argv, stdout=out, check=True)
    u = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (u.ru_utime - t.ru_utime) + (u.ru_stime - t.ru_stime)


def median(fn: Callable[[], float], rounds: int) -> float:
    return statistics.median(fn() for _ in range(rounds))


def wall(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


# -- (1) cold compile vs cached start ----------------------------------------------------------------


def bench_cache(tmp: Path, rounds: int) -> dict[str, float]:
    engine = new_engine()
    wasm = (WORKLOADS / "mandelbrot.wasm").read_bytes()
    spec = JobSpec(wasm, args=("8", "8", "0", "0", "8", "8", "10"))
    cache_dir = tmp / "cache"
    ModuleCache(cache_dir).get(engine, wasm)

    def cold_job() -> None:
        assert run(spec, engine=engine, module=compile_module(engine, wasm)).status is Status.EXITED

    def cached_job() -> None:
        module = ModuleCache(cache_dir).get(engine, wasm)  # a fresh instance: read, verify, deserialize
        assert run(spec, engine=engine, module=module).status is Status.EXITED

    def disk_hit() -> None:
        ModuleCache(cache_dir).get(engine, wasm)

    warm = ModuleCache(cache_dir)
    warm.get(engine, wasm)
    return {
        "compile_ms": 1000 * median(lambda: wall(lambda: compile_module(engine, wasm)), rounds),
        "disk_hit_ms": 1000 * median(lambda: wall(disk_hit), rounds * 4),
        "memory_hit_us": 1e6 * median(lambda: wall(lambda: warm.get(engine, wasm)), rounds * 20),
        "cold_job_ms": 1000 * median(lambda: wall(cold_job), rounds),
        "cached_job_ms": 1000 * median(lambda: wall(cached_job), rounds * 4),
    }


# -- (2) tiny jobs per second through the pool, and (4) idle worker memory --------------------------------


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def bench_pool(tmp: Path, jobs: int) -> dict[str, float]:
    spec = JobSpec((WORKLOADS / "echo.wasm").read_bytes(), args=("hi",))
    with WorkerPool(2, tmp / "pool-cache") as pool:
        fresh_rss = max(rss_mb(pid) for pid in pool.worker_pids())
        for _ in range(20):
            assert pool.run(spec).stdout == b"hi\n"
        callers = 4
        per_caller = jobs // callers
        failures: list[str] = []

        def caller() -> None:
            for _ in range(per_caller):
                r = pool.run(spec)
                if r.stdout != b"hi\n":
                    failures.append(repr(r))

        threads = [threading.Thread(target=caller) for _ in range(callers)]
        t = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        elapsed = time.perf_counter() - t
        if failures:
            raise RuntimeError(f"{len(failures)} tiny jobs failed: {failures[0]}")
        serial = wall(lambda: [pool.run(spec) for _ in range(200)]) / 200
        idle_rss = max(rss_mb(pid) for pid in pool.worker_pids())
    return {
        "tiny_jobs_per_s": callers * per_caller / elapsed,
        "tiny_job_latency_ms": 1000 * serial,
        "fresh_worker_rss_mb": fresh_rss,
        "idle_worker_rss_mb": idle_rss,
    }


# -- (3) Mandelbrot: native, wasm, wasm + fuel, our sandbox ------------------------------------------


def plain_wasm_runner(fuel: bool, tmp: Path) -> Callable[[], float]:
    """A bare wasmtime engine (wasmtime's own WASI), as a guest would run outside e31."""
    config = PROFILE.config() if fuel else wasmtime.Config()
    engine = wasmtime.Engine(config)
    module = wasmtime.Module(engine, (WORKLOADS / "mandelbrot.wasm").read_bytes())
    linker = wasmtime.Linker(engine)
    linker.define_wasi()
    out = tmp / f"plain-{fuel}.pgm"

    def once() -> float:
        store = wasmtime.Store(engine)
        if fuel:
            store.set_fuel(Limits.MAX_FUEL)
            store.set_epoch_deadline(1 << 40)
        wasi = wasmtime.WasiConfig()
        wasi.argv = ["mandelbrot", *MANDEL_ARGS]
        wasi.stdout_file = str(out)
        store.set_wasi(wasi)
        instance = linker.instantiate(store, module)
        start = instance.exports(store)["_start"]
        assert isinstance(start, wasmtime.Func)

        def call() -> None:
            try:
                start(store)
            except wasmtime.ExitTrap as e:
                assert e.code == 0

        cpu = cpu_of_self(call)
        store.close()
        return cpu

    return once


def bench_mandelbrot(tmp: Path, rounds: int) -> dict[str, float]:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise RuntimeError("no C compiler (gcc) for the native baseline")
    native = tmp / "mandelbrot-native"
    subprocess.run([cc, "-O2", "-o", str(native), str(WORKLOADS / "mandelbrot.c"), "-lm"], check=True)
    native_out = tmp / "native.pgm"
    native_cpu = median(lambda: cpu_of_child([str(native), *MANDEL_ARGS], native_out), rounds)

    plain = median(plain_wasm_runner(False, tmp), rounds)
    fueled = median(plain_wasm_runner(True, tmp), rounds)

    engine = new_engine()
    wasm = (WORKLOADS / "mandelbrot.wasm").read_bytes()
    module = compile_module(engine, wasm)
    spec = JobSpec(wasm, args=MANDEL_ARGS, limits=Limits(fuel=Limits.MAX_FUEL, wall_seconds=600))
    results = []

    def sandboxed() -> float:
        return cpu_of_self(lambda: results.append(run(spec, engine=engine, module=module)))

    ours = median(sandboxed, rounds)
    r = results[-1]
    if r.status is not Status.EXITED or r.stdout_sha256 != _sha256(native_out):
        raise RuntimeError(f"sandboxed Mandelbrot differs from native: {r.status} {r.message}")
    if _sha256(tmp / "plain-False.pgm") != _sha256(native_out):
        raise RuntimeError("plain wasm Mandelbrot differs from native")

    with WorkerPool(1, tmp / "mandel-cache") as pool:
        pool.run(spec)
        through_pool = median(lambda: wall(lambda: pool.run(spec)), rounds)

    return {
        "native_s": native_cpu,
        "wasm_s": plain,
        "wasm_fuel_s": fueled,
        "sandbox_s": ours,
        "pool_wall_s": through_pool,
        "wasm_vs_native": plain / native_cpu,
        "fuel_cost": fueled / plain,
        "our_layer_cost": ours / fueled,
        "sandbox_vs_native": ours / native_cpu,
        "fuel_used": float(r.fuel_used),
    }


def _sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="fewer rounds and jobs (a smoke run)")
    args = p.parse_args()
    rounds = 3 if args.quick else 5
    jobs = 800 if args.quick else 4000
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        cache = bench_cache(tmp, rounds)
        pool = bench_pool(tmp, jobs)
        mandel = bench_mandelbrot(tmp, rounds)

    rows = [
        ("(1) compile mandelbrot.wasm (cold)", f"{cache['compile_ms']:.1f} ms", ""),
        ("(1) cache disk hit (read, HMAC, deserialize)", f"{cache['disk_hit_ms']:.2f} ms", ""),
        ("(1) cache memory hit", f"{cache['memory_hit_us']:.1f} us", ""),
        ("(1) tiny job, cold compile", f"{cache['cold_job_ms']:.1f} ms", ""),
        ("(1) tiny job, cached start", f"{cache['cached_job_ms']:.2f} ms", ""),
        (
            "(2) tiny jobs/s, pool of 2, 4 callers",
            f"{pool['tiny_jobs_per_s']:.0f} /s",
            f">= {FLOORS['tiny_jobs_per_s']:.0f}",
        ),
        ("(2) tiny job latency through the pool", f"{pool['tiny_job_latency_ms']:.2f} ms", ""),
        (
            f"(3) mandelbrot {'x'.join(MANDEL_ARGS[:2])}/{MANDEL_ARGS[6]}: native gcc -O2",
            f"{mandel['native_s']:.3f} s",
            "",
        ),
        (
            "(3) wasm, bare wasmtime, no fuel",
            f"{mandel['wasm_s']:.3f} s",
            f"{mandel['wasm_vs_native']:.2f}x native",
        ),
        (
            "(3) wasm, bare wasmtime, fuel + epochs",
            f"{mandel['wasm_fuel_s']:.3f} s",
            f"{mandel['fuel_cost']:.2f}x wasm (metering)",
        ),
        (
            "(3) wasm, e31 sandbox",
            f"{mandel['sandbox_s']:.3f} s",
            f"{mandel['our_layer_cost']:.2f}x wasm+fuel (our layer)",
        ),
        (
            "(3) e31 sandbox vs native",
            f"{mandel['sandbox_vs_native']:.2f}x",
            f"<= {FLOORS['sandbox_vs_native']:.1f}x",
        ),
        ("(3) through the pool (wall, incl. IPC)", f"{mandel['pool_wall_s']:.3f} s", ""),
        ("(4) worker RSS, fresh", f"{pool['fresh_worker_rss_mb']:.1f} MB", ""),
        (
            "(4) worker RSS, idle after jobs",
            f"{pool['idle_worker_rss_mb']:.1f} MB",
            f"<= {FLOORS['idle_worker_rss_mb']:.0f} MB",
        ),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"e31 sandbox benchmark (CPU seconds for the Mandelbrot rows; {os.cpu_count()} CPUs)")
    for name, value, note in rows:
        print(f"  {name:<{width}}  {value:>12}  {note}")

    missed = []
    if pool["tiny_jobs_per_s"] < FLOORS["tiny_jobs_per_s"]:
        missed.append("tiny jobs/s")
    if mandel["sandbox_vs_native"] > FLOORS["sandbox_vs_native"]:
        missed.append("sandbox vs native")
    if pool["idle_worker_rss_mb"] > FLOORS["idle_worker_rss_mb"]:
        missed.append("idle worker RSS")
    if missed:
        print(f"FLOOR MISSED: {', '.join(missed)}")
        return 1
    print("all floors met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
