"""Benchmark: what strangers cost a node. N handshakes from N distinct fresh keys against one real node.

Starts a real `e31 node run` process on 127.0.0.1 (tests/node/node_process.py: `--dial-private` since
every address here is loopback; `--max-peers CAP`), then runs N real transport handshakes, each from a
new key, CONCURRENCY at a time; each connection closes right after its handshake. Every
`--record-every`-th stranger first sends a `peers` message with its own signed contact record naming
a loopback port this benchmark listens on, so the node also stores rows and may try to confirm those
addresses: the accepts on that port are the node's dials to unconfirmed addresses, which its budget
bounds. It samples the node's VmRSS (/proc/PID/status), its peer table (GET /v1/peers) and its stored
peer rows (the database, read only) before, during and after. Floors: RSS within 20 MB of its value
after the warm-up, table and rows at most the cap. Bounded in count (N) and time (`--deadline`). Linux
only (reads /proc).

    .venv/bin/python tests/bench/bench_strangers.py [--handshakes 100000] [--max-peers 1000] [--json]
"""

from __future__ import annotations

import argparse
import json
import socket
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

import trio
from e31.node.api.client import ApiClient
from e31.node.net.transport import TransportError, dial
from e31.protocol.envelope import node_id_of, sign_message
from e31.protocol.messages import Contact, Peers
from nacl.signing import SigningKey

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "node"))

from node_process import NodeProcess

RSS_FLOOR_MB = 20.0
NETWORK = "main"


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def table_size(data_dir: Path) -> int:
    with ApiClient(data_dir, timeout=30.0) as api:
        peers = api.get("/v1/peers")
    assert isinstance(peers, list)
    return len(peers)


def stored_rows(data_dir: Path) -> int:
    db = sqlite3.connect(f"file:{data_dir / 'node.sqlite'}?mode=ro", uri=True, timeout=10.0)
    try:
        return int(db.execute("SELECT count(*) FROM peers").fetchone()[0])
    finally:
        db.close()


async def stranger(port: int, record_port: int | None) -> bool:
    key = SigningKey.generate()
    try:
        with trio.fail_after(10):
            conn = await dial("127.0.0.1", port, identity=key, network=NETWORK)
            if record_port is not None:
                expires = int((time.time() + 600) * 1000)
                record = sign_message(
                    Contact(NETWORK, node_id_of(key), (f"127.0.0.1:{record_port}",), expires), key
                )
                await conn.send(sign_message(Peers(NETWORK, node_id_of(key), (record,), expires), key))
            await conn.aclose()
    except (TransportError, trio.TooSlowError, OSError):
        return False
    return True


async def flood(
    port: int, count: int, concurrency: int, record_every: int, record_port: int, seconds: float
) -> int:
    """`count` handshakes, `concurrency` at a time, for `seconds` at most; returns how many succeeded."""
    ok = 0
    slots = trio.Semaphore(concurrency)
    deadline = trio.current_time() + seconds

    async def one(i: int) -> None:
        nonlocal ok
        try:
            succeeded = await stranger(port, record_port if record_every and i % record_every == 0 else None)
            ok += succeeded  # not `ok += await ...`: that reads `ok` before the await
        finally:
            slots.release()

    async with trio.open_nursery() as nursery:
        for i in range(count):
            await slots.acquire()  # at most `concurrency` strangers at once
            if trio.current_time() >= deadline:
                slots.release()
                break
            nursery.start_soon(one, i)
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--handshakes", type=int, default=100_000, help="strangers, one handshake each")
    parser.add_argument("--max-peers", type=int, default=1000, help="the node's cap on known peers")
    parser.add_argument("--warmup", type=int, default=5000, help="handshakes before the RSS baseline")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument(
        "--record-every", type=int, default=10, help="every k-th stranger sends its record (0: none)"
    )
    parser.add_argument("--samples", type=int, default=5, help="measurements during the run")
    parser.add_argument("--deadline", type=float, default=1800.0, help="seconds at most for the whole flood")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()
    out: dict[str, object] = {"handshakes": args.handshakes, "max_peers": args.max_peers}
    with tempfile.TemporaryDirectory() as tmp, socket.socket() as sink:
        root = Path(tmp)
        sink.bind(("127.0.0.1", 0))
        sink.listen(512)
        sink.setblocking(False)
        record_port = sink.getsockname()[1]
        accepts = 0

        def drain_sink() -> None:
            nonlocal accepts
            while True:
                try:
                    conn, _ = sink.accept()
                except BlockingIOError:
                    return
                conn.close()
                accepts += 1

        node = NodeProcess(root / "node", "--max-peers", str(args.max_peers), "--log-level", "warning")
        proc, data = node.proc, node.data_dir
        port = int(node.address.rpartition(":")[2])
        try:
            out["rss_start_mb"] = round(rss_mb(proc.pid), 1)
            warmup = min(args.warmup, args.handshakes)
            started = time.monotonic()
            end = started + args.deadline
            ok = trio.run(
                flood,
                port,
                warmup,
                args.concurrency,
                args.record_every,
                record_port,
                args.deadline,
            )
            drain_sink()
            baseline = rss_mb(proc.pid)
            out["rss_after_warmup_mb"] = round(baseline, 1)
            samples = []
            rest = args.handshakes - warmup
            chunk = max(1, rest // max(1, args.samples))
            sent = warmup
            while sent < args.handshakes and time.monotonic() < end:
                n = min(chunk, args.handshakes - sent)
                ok += trio.run(
                    flood,
                    port,
                    n,
                    args.concurrency,
                    args.record_every,
                    record_port,
                    max(0.0, end - time.monotonic()),
                )
                sent += n
                drain_sink()
                samples.append(
                    {
                        "handshakes": sent,
                        "rss_mb": round(rss_mb(proc.pid), 1),
                        "table": table_size(data),
                        "rows": stored_rows(data),
                    }
                )
                if not args.json:
                    print(f"  after {sent:>7} handshakes: {samples[-1]}", flush=True)
            elapsed = time.monotonic() - started
            time.sleep(2.0)
            drain_sink()
            after = {
                "rss_mb": round(rss_mb(proc.pid), 1),
                "table": table_size(data),
                "rows": stored_rows(data),
            }
            out.update(
                sent=sent,
                succeeded=ok,
                seconds=round(elapsed, 1),
                per_second=round(sent / elapsed, 1),
                samples=samples,
                after=after,
                unconfirmed_dials=accepts,
            )
            out["exit_code"] = node.stop()
        finally:
            node.kill()
    rss_growth = max([s["rss_mb"] for s in samples] + [after["rss_mb"]]) - baseline  # type: ignore[operator]
    worst_table = max([s["table"] for s in samples] + [after["table"]])  # type: ignore[type-var]
    worst_rows = max([s["rows"] for s in samples] + [after["rows"]])  # type: ignore[type-var]
    passed = rss_growth <= RSS_FLOOR_MB and worst_table <= args.max_peers and worst_rows <= args.max_peers
    out.update(
        rss_growth_mb=round(rss_growth, 1), worst_table=worst_table, worst_rows=worst_rows, passed=passed
    )
    if args.json:
        print(json.dumps(out))
    else:
        print(json.dumps({k: v for k, v in out.items() if k != "samples"}, indent=1))
        print(
            ("ok" if passed else "FAIL")
            + f": RSS +{rss_growth:.1f} MB after warm-up (floor {RSS_FLOOR_MB:.0f}), "
            f"table at most {worst_table}, rows at most {worst_rows} (cap {args.max_peers})"
        )
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
