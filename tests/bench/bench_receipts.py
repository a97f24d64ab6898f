"""Receipt log, bundle and audit throughput: `python tests/bench/bench_receipts.py [--jobs N]`.

Builds N real jobs (small Mandelbrot tiles run in the sandbox, signed offer, assignment, receipt and
acknowledgement), then measures: durable appends to an executor's receipt log (SQLite, synchronous=FULL),
signed inclusion proofs, exporting a bundle from a node's store, decoding it, and auditing it with and
without re-execution. Prints medians of 3 and exits 1 if a floor is missed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "node"))

from e31.node.audit.bundle import decode_bundle, export_bundle
from e31.node.audit.checks import audit
from e31.node.store.blobs import BlobStore
from e31.node.store.db import Store
from e31.node.store.receiptlog import ReceiptLog
from e31.protocol.envelope import verify
from receipt_fixtures import NET, T0, key, mandelbrot

FLOORS = {"append/s": 30.0, "proofs/s": 500.0, "audit receipts/s": 200.0}


def median_rate(n: int, fn: Callable[[int], None]) -> float:
    times = []
    for trial in range(3):
        t = time.perf_counter()
        fn(trial)
        times.append(time.perf_counter() - t)
    return n / statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=200)
    args = parser.parse_args()
    n = args.jobs
    t = time.perf_counter()
    jobs = [mandelbrot(nonce=i) for i in range(n)]
    print(f"built {n} jobs (real sandbox runs) in {time.perf_counter() - t:.1f} s")
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        stores = [Store(Path(tmp) / f"log{i}.sqlite") for i in range(3)]
        logs = [ReceiptLog(s, key("executor"), NET) for s in stores]
        figures["append/s"] = median_rate(n, lambda i: [logs[i].append(j.receipt) for j in jobs])
        ids = [j.receipt_id.raw for j in jobs]
        figures["proofs/s"] = median_rate(n, lambda i: [logs[i].inclusion(r, T0) for r in ids])
        store, blobs = stores[0], BlobStore(Path(tmp) / "blobs")
        for j in jobs:
            for raw in j.envelopes:
                env = verify(raw)
                store.put_envelope(env.message_id.raw, env.kind, raw, 1.0, j.job_id.raw)
            for data in j.blobs.values():
                blobs.put(data)
        exported: list[bytes] = []
        figures["export jobs/s"] = median_rate(
            n,
            lambda i: exported.append(
                export_bundle(store, blobs, None, True, receipt_log=logs[0], now_ms=T0 + i).data
            ),
        )
        data = exported[-1]
        figures["decode MB/s"] = median_rate(len(data) // 10**6 or 1, lambda i: decode_bundle(data))
        bundle = decode_bundle(data)
        reports = []
        figures["audit receipts/s"] = median_rate(n, lambda i: reports.append(audit(bundle)))
        sample = min(n, 20)
        small = decode_bundle(
            export_bundle(
                store, blobs, [j.job_id.raw for j in jobs[:sample]], True, receipt_log=logs[0], now_ms=T0
            ).data
        )
        figures["audit --reexecute receipts/s"] = median_rate(
            sample, lambda i: reports.append(audit(small, reexecute=True))
        )
        for s in stores:
            s.close()
    assert all(r.sound for r in reports), [r.problems[:3] for r in reports if not r.sound]
    print(f"bundle of {n} jobs with proofs and blobs: {len(data):,} bytes")
    failed = False
    for name, value in figures.items():
        floor = FLOORS.get(name)
        mark = "" if floor is None else (f"  (floor {floor:g})" + ("  MISSED" if value < floor else ""))
        failed |= floor is not None and value < floor
        print(f"{name:32} {value:10.1f}{mark}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
