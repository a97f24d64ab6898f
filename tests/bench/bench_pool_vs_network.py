"""The demo's 24-tile Mandelbrot sweep: over 3 local nodes, and in a ProcessPoolExecutor on the same cores.

    .venv/bin/python tests/bench/bench_pool_vs_network.py [--quick] [--tiles 24] [--repeat 1]

Network: three `e31 node run` processes on 127.0.0.1 (one core each), every tile submitted to the
first node through its local API, timed from the first submit to the last tile verified and
acknowledged. Pool: the same tiles run by e31.sandbox.runner.run in a
concurrent.futures.ProcessPoolExecutor with one process per core, timed from the first task handed
to the pool (already started, module compiled in each process) to the last result. Both run the same
module bytes, arguments and limits, so each tile's stdout hash must agree between the two; a
mismatch or a failed tile exits 1. The ratio is the price of the network (signing, gossip,
transfer, receipts) over bare local parallelism; no floor is set on it.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench_jobs import BenchError, net, submit, wait
from e31.node.api.client import ApiClientError
from e31.node.demo.image import HEIGHT, MAX_ITER, WIDTH, Tile, plan_tiles
from e31.node.demo.run import fuel_for
from e31.sandbox import runner
from e31.sandbox.job import JobSpec
from e31.sandbox.limits import Limits

MODULE = Path(__file__).resolve().parents[2] / "sandbox" / "workloads" / "mandelbrot.wasm"
MEMORY = 16 << 20
WALL = 60


def limits(tile: Tile) -> Limits:
    return Limits(
        fuel=fuel_for(tile),
        memory_bytes=MEMORY,
        wall_seconds=WALL,
        max_output_bytes=tile.width * tile.height + 64,
    )


def job_body(tile: Tile) -> dict[str, Any]:
    lim = limits(tile)
    return {
        "module": str(MODULE),
        "args": tile.guest_args(WIDTH, HEIGHT, MAX_ITER),
        "limits": {
            "fuel": lim.fuel,
            "memory": lim.memory_bytes,
            "timeout": lim.wall_seconds,
            "max_output": lim.max_output_bytes,
        },
    }


_WORKER: dict[str, Any] = {}
"""Per pool process: the module's bytes and its compiled form (compiled once, as a node's cache does)."""


def _warm() -> None:
    _WORKER["bytes"] = MODULE.read_bytes()
    _WORKER["module"] = runner.compile_module(runner.default_engine(), _WORKER["bytes"])


def _run_tile(tile: Tile) -> tuple[int, str, str]:
    spec = JobSpec(
        module=_WORKER["bytes"], args=tuple(tile.guest_args(WIDTH, HEIGHT, MAX_ITER)), limits=limits(tile)
    )
    result = runner.run(spec, module=_WORKER["module"])
    return tile.index, str(result.status), result.stdout_sha256


def pool_sweep(tiles: list[Tile], workers: int) -> tuple[float, dict[int, str]]:
    with ProcessPoolExecutor(workers, initializer=_warm) as pool:
        list(pool.map(time.sleep, [0.2] * workers))  # every process started and initialised
        t0 = time.monotonic()
        results = list(pool.map(_run_tile, tiles))
        elapsed = time.monotonic() - t0
    bad = [(i, s) for i, s, _ in results if s != "exited"]
    if bad:
        raise BenchError(f"pool: tiles ended {bad}")
    return elapsed, {i: h for i, _, h in results}


def network_sweep(network: Any, tiles: list[Tile]) -> tuple[float, dict[int, str]]:
    api = network.nodes[0].api(timeout=120)
    t0 = time.monotonic()
    with ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(lambda t: submit(api, job_body(t)), tiles))
        docs = list(pool.map(lambda j: wait(api, j, timeout=600), ids))
    elapsed = time.monotonic() - t0
    hashes = {}
    for tile, doc in zip(tiles, docs, strict=True):
        hashes[tile.index] = stdout_hash(network, doc)
    return elapsed, hashes


def stdout_hash(network: Any, doc: dict[str, Any]) -> str:
    """The SHA-256 of the tile's stdout, fetched through the API behind `e31 results`."""
    api = network.nodes[0].api(timeout=120)
    with tempfile.TemporaryDirectory() as out:
        api.post(f"/v1/jobs/{doc['job_id']}/results", {"out": out})
        return hashlib.sha256((Path(out) / "stdout").read_bytes()).hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="6 tiles instead of 24")
    parser.add_argument("--tiles", type=int)
    parser.add_argument("--repeat", type=int, default=1, help="sweeps of each kind (medians reported)")
    args = parser.parse_args()
    tiles = plan_tiles(args.tiles or (6 if args.quick else 24))
    cores = len(os.sched_getaffinity(0))
    pool_times, net_times = [], []
    try:
        for _ in range(args.repeat):
            t, pool_hashes = pool_sweep(tiles, cores)
            pool_times.append(t)
        with net(3, cores=1) as network:
            api = network.nodes[0].api(timeout=120)
            warm = plan_tiles(len(tiles))[0]
            wait(api, submit(api, job_body(warm)), timeout=600)  # compile the module before timing
            for _ in range(args.repeat):
                t, net_hashes = network_sweep(network, tiles)
                net_times.append(t)
    except (ApiClientError, BenchError) as e:
        print(f"bench_pool_vs_network: {e}", file=sys.stderr)
        return 1
    differ = sorted(i for i in pool_hashes if pool_hashes[i] != net_hashes.get(i))
    pool_s, net_s = statistics.median(pool_times), statistics.median(net_times)
    print(f"e31 Mandelbrot sweep, {len(tiles)} tiles of a {WIDTH}x{HEIGHT} image, {cores} cores")
    print(f"  ProcessPoolExecutor, {cores} processes: {pool_s:.2f} s")
    print(f"  3 local nodes (one core each):        {net_s:.2f} s   ({net_s / pool_s:.2f}x the pool)")
    if differ:
        print(f"  OUTPUTS DIFFER between the pool and the network for tiles {differ}")
        return 1
    print(f"  every tile's output identical in both ({len(tiles)} stdout hashes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
