"""A corruption run: every blob kind, every position of the damage, and what the nodes sign after it.

    .venv/bin/python tests/bench/bench_corruption.py [--size 307200]

Each case builds two fresh nodes (tests/node/market_nodes.py: real stores, blob stores and sandbox
workers on an in-memory net; a submits, b executes), runs one job so every blob is where the case
needs it, damages one stored copy in one way, then runs or reads what uses it again:

- kinds, where the damage is done and what then uses the blob:
  - `exec-module`: the executor's cached module (wordfreq.wasm); a second job with it;
  - `exec-input`: the executor's cached input file (/input/data); a second job with it;
  - `exec-stdin`: the executor's cached stdin (echo.wasm copies it to stdout); a second job;
  - `sub-module`, `sub-input`, `sub-stdin`: the submitter's copy, before a fresh executor (c) fetches
    it for the first time;
  - `sub-output`: the submitter's stored stdout of a finished job (echo of `--size` bytes), read back
    the way `e31 results` reads it;
- positions: `head` (the first 8 bytes flipped), `middle` (8 bytes in the middle), `tail` (the last
  byte), `trunc-0` (the file truncated to 0), `trunc-half`, and `stealth` (8 middle bytes flipped with
  the file's size and mtime put back).

Outcome of a case: `true` (the job ended done and its signed receipt names exactly the outputs and fuel of
the undamaged run: the damaged copy was found, quarantined and fetched again), `failed` (the job ended with
a stated reason, or the read was refused: nothing wrong was signed or returned), or `WRONG` (a signed
receipt over other outputs, or damaged bytes returned). The run's floor (issue 18): 0 WRONG. Exits 1 if
one is found.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "node"))

from e31.node.store.blobs import BlobError
from e31.node.store.db import Store
from e31.protocol.blobs import blob_ref
from e31.protocol.envelope import verify
from e31.protocol.jobs import FileRef, JobManifest
from e31.protocol.receipts import UsageReceipt
from market_nodes import Net, RealNode, start

KINDS = ("exec-module", "exec-input", "exec-stdin", "sub-module", "sub-input", "sub-stdin", "sub-output")
POSITIONS = ("head", "middle", "tail", "trunc-0", "trunc-half", "stealth")
TERMINAL = ("done", "failed", "expired", "cancelled")


def damage(path: Path, position: str) -> None:
    st = path.stat()
    data = bytearray(path.read_bytes())
    if position == "trunc-0":
        os.truncate(path, 0)
        return
    if position == "trunc-half":
        os.truncate(path, len(data) // 2)
        return
    at = {"head": 0, "middle": len(data) // 2, "tail": len(data) - 1, "stealth": len(data) // 2}[position]
    span = 1 if position == "tail" else 8
    for i in range(at, min(at + span, len(data))):
        data[i] ^= 0xFF
    path.chmod(0o600)
    path.write_bytes(bytes(data))
    if position == "stealth":
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def outcome_of(receipt: UsageReceipt) -> tuple[Any, ...]:
    """What a receipt says the job produced: stdout, stderr, output files, exit code and fuel."""
    outputs = tuple((f.name, f.blob.root.raw) for f in receipt.outputs)
    return (receipt.stdout.root.raw, receipt.stderr.root.raw, outputs, receipt.outcome, receipt.fuel_used)


async def wait_terminal(node: RealNode, job_id: bytes, seconds: float = 60.0) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        row = await node.job(job_id)
        if row is not None and row.state in TERMINAL:
            return row
        await trio.sleep(0.05)
    raise AssertionError(f"job {job_id.hex()[:12]} reached no terminal state in {seconds} s")


async def receipt_of(node: RealNode, job_id: bytes) -> UsageReceipt | None:
    rows = await node.store.run(Store.receipts_for_job, job_id)
    if not rows:
        return None
    env = await node.store.run(Store.envelope, rows[-1].message_id)
    assert env is not None
    return verify(bytes(env.raw), UsageReceipt).message


def job_for(node: RealNode, kind: str, data: bytes) -> JobManifest:
    """The case's job: wordfreq over /input/data for module and input damage, echo of stdin otherwise."""
    if kind.endswith("stdin") or kind == "sub-output":
        base = node.manifest((), workload="echo")
        node.blobs.put(data)
        return dataclasses.replace(base, stdin=blob_ref(data))
    base = node.manifest(("5",), workload="wordfreq")
    node.blobs.put(data)
    return dataclasses.replace(base, inputs=(FileRef("data", blob_ref(data)),))


def target_of(kind: str, job: JobManifest) -> bytes:
    if kind.endswith("module"):
        return job.module.root.raw
    if kind.endswith("input"):
        return job.inputs[0].blob.root.raw
    assert job.stdin is not None
    return job.stdin.root.raw


async def run_case(tmp: Path, kind: str, position: str, data: bytes) -> tuple[str, str]:
    net = Net()
    async with trio.open_nursery() as nursery:
        net.nursery = nursery
        a, b = RealNode(net, tmp, "a", 1), RealNode(net, tmp, "b", 2)
        await start(nursery, a, b)
        first = job_for(a, kind, data)
        await a.submitter.submit(first)
        row = await wait_terminal(a, first.job_id.raw)
        assert row.state == "done", f"the undamaged run ended {row.state}"
        truth = await receipt_of(a, first.job_id.raw)
        assert truth is not None
        try:
            if kind == "sub-output":
                root = truth.stdout.root.raw
                damage(a.blobs.path(root), position)
                try:
                    got = a.blobs.read(root)
                except BlobError as e:
                    return "failed", type(e).__name__
                return (
                    ("true", "read whole")
                    if blob_ref(got).root.raw == root
                    else ("WRONG", "damaged bytes read")
                )
            if kind.startswith("exec"):
                damage(b.blobs.path(target_of(kind, first)), position)
            else:
                # a fresh executor fetches from the submitter's damaged copy; b stops bidding
                del net.offer_sinks[b.id]
                c = RealNode(net, tmp, "c", 3)
                await start(nursery, c)
                damage(a.blobs.path(target_of(kind, first)), position)
            second = dataclasses.replace(first, nonce=os.urandom(16))
            await a.submitter.submit(second)
            row = await wait_terminal(a, second.job_id.raw)
            got_receipt = await receipt_of(a, second.job_id.raw)
            if row.state != "done":
                if got_receipt is not None and outcome_of(got_receipt) != outcome_of(truth):
                    return "WRONG", f"{row.state} with a receipt over other outputs"
                return "failed", f"{row.state}: {row.reason or ''}"[:70]
            assert got_receipt is not None
            if outcome_of(got_receipt) != outcome_of(truth):
                return "WRONG", "done with a receipt over other outputs"
            return "true", "fetched again" if kind.startswith("exec") else "done"
        finally:
            nursery.cancel_scope.cancel()


async def main_async(size: int, show: Callable[[str], None]) -> int:
    data = bytes((i * 131 + 7) % 251 for i in range(size)).replace(b"\x00", b" ")
    # wordfreq needs words: spaces every so often
    data = bytes(b if i % 9 else 32 for i, b in enumerate(data))
    wrong = 0
    counts: dict[str, int] = {}
    show(f"| kind | {' | '.join(POSITIONS)} |")
    show("|---|" + "---|" * len(POSITIONS))
    for kind in KINDS:
        cells = []
        for position in POSITIONS:
            with tempfile.TemporaryDirectory(prefix="e31-corrupt-") as tmp:
                verdict, why = await run_case(Path(tmp), kind, position, data)
            counts[verdict] = counts.get(verdict, 0) + 1
            wrong += verdict == "WRONG"
            cells.append(f"{verdict} ({why})")
        show(f"| {kind} | {' | '.join(cells)} |")
    show("")
    show(f"cases {sum(counts.values())}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    show(f"wrong results signed or returned: {wrong} (floor: 0)")
    return 1 if wrong else 0


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", type=int, default=307 * 1024, help="bytes of the input / stdin blob")
    args = parser.parse_args()
    return trio.run(main_async, args.size, print)


if __name__ == "__main__":
    sys.exit(main())
