"""Durable-state speed: SQLite commits (WAL, synchronous=FULL), blob writes, local API round trips.

Run: .venv/bin/python tests/bench/bench_store.py
Prints medians of 3 runs; exits 1 if a floor is missed. The floors are far below what a laptop disk
does; they catch a regression such as an fsync per row or a blocking call in the API server.
"""

from __future__ import annotations

import hashlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio
from e31.node.api.client import ApiClient
from e31.node.api.server import ControlEndpoint, Request, Router, serve_control
from e31.node.config import load_config
from e31.node.store.blobs import CHUNK_SIZE, BlobStore
from e31.node.store.db import Store, call
from e31.protocol.blobs import blob_ref

FLOORS = {
    "commits_per_s": 100.0,
    "seen_marks_per_s_batched": 20_000.0,
    "blob_put_mb_per_s": 50.0,
    "chunked_download_mb_per_s": 30.0,
    "api_requests_per_s": 150.0,
}


def bench_commits(root: Path, n: int = 500) -> float:
    with Store(root / "commits.sqlite") as s:
        t = time.perf_counter()
        for i in range(n):  # a durable transaction around a write that alone would not be one
            s.many([call(Store.mark_seen, i.to_bytes(8, "big"), 1e12)])
        return n / (time.perf_counter() - t)


def bench_batched(root: Path, n: int = 20_000) -> float:
    with Store(root / "batched.sqlite") as s:
        t = time.perf_counter()
        with s.transaction() as c:
            c.executemany(
                "INSERT INTO seen (message_id, expires) VALUES (?, ?)",
                ((i.to_bytes(8, "big"), 1e12) for i in range(n)),
            )
        return n / (time.perf_counter() - t)


def bench_blob_put(root: Path, count: int = 16, size: int = 4 << 20) -> float:
    store = BlobStore(root / "blobs-put")
    blobs = [os.urandom(size) for _ in range(count)]
    t = time.perf_counter()
    for b in blobs:
        store.put(b)
    return count * size / (time.perf_counter() - t) / 1e6


def bench_chunked(root: Path, size: int = 32 << 20) -> float:
    store = BlobStore(root / "blobs-chunked")
    data = os.urandom(size)
    pieces = [data[i : i + CHUNK_SIZE] for i in range(0, size, CHUNK_SIZE)]
    hashes = [hashlib.sha256(p).digest() for p in pieces]
    t = time.perf_counter()
    partial = store.partial(blob_ref(data).root.hex(), size)  # a blob is named by its chunk-list root
    for i, (p, h) in enumerate(zip(pieces, hashes, strict=True)):
        partial.write_chunk(i, p, h)
    partial.finalise()
    return size / (time.perf_counter() - t) / 1e6


def bench_api(root: Path, n: int = 300) -> float:
    router = Router()

    async def status(req: Request) -> object:
        return {"ok": True}

    router.add("GET", "/v1/status", status)
    config = load_config(root, environ={})
    rate = 0.0

    async def main() -> None:
        nonlocal rate
        async with trio.open_nursery() as nursery:
            ep: ControlEndpoint = await nursery.start(
                lambda task_status: serve_control(router, config, task_status=task_status)
            )
            client = ApiClient(ep.api_file.parent)

            def loop() -> float:
                t = time.perf_counter()
                for _ in range(n):
                    client.get("/v1/status")
                return n / (time.perf_counter() - t)

            rate = await trio.to_thread.run_sync(loop)
            nursery.cancel_scope.cancel()

    trio.run(main)
    return rate


def main() -> int:
    results: dict[str, list[float]] = {k: [] for k in FLOORS}
    for _ in range(3):
        with tempfile.TemporaryDirectory() as d:
            root = Path(d)
            results["commits_per_s"].append(bench_commits(root))
            results["seen_marks_per_s_batched"].append(bench_batched(root))
            results["blob_put_mb_per_s"].append(bench_blob_put(root))
            results["chunked_download_mb_per_s"].append(bench_chunked(root))
            results["api_requests_per_s"].append(bench_api(root))
    failed = False
    for key, floor in FLOORS.items():
        median = statistics.median(results[key])
        ok = median >= floor
        failed |= not ok
        print(f"{key:28s} {median:12.1f}   (floor {floor:g}){'' if ok else '   BELOW FLOOR'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
