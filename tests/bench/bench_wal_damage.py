"""A WAL-damage run: many seeded damages of a crashed node's store, and whether any loses history silently.

    .venv/bin/python tests/bench/bench_wal_damage.py [--trials 200] [--jobs 12] [--seed 1]

One real `e31 node run` process on 127.0.0.1 runs `--jobs` jobs (it executes them itself, so it also keeps
a receipt log and signs tree heads) and is then killed with SIGKILL: most of what it committed sits in
node.sqlite-wal. Each trial copies that data dir and damages it one way, drawn from a seeded generator:

- `wal-flip`: 1 to 16 bytes of the WAL flipped at random offsets (headers, frame headers, pages);
- `wal-cut`: the WAL truncated at a random offset;
- `wal-page-zero`: one 4 KiB stretch of the WAL zeroed;
- `wal-delete`: the WAL removed;
- `db-flip`: 1 to 16 bytes of node.sqlite flipped;
- `db-cut`: node.sqlite truncated at a random offset.

The `db-*` damages are made to a second copy whose WAL was checkpointed into node.sqlite first (as a node
that ran long enough has it), so that the database file holds the history they damage.

Then it opens the store as the node does at start (`Store(path)`: the watermark check, store/watermark.py)
and, when that succeeds, reads every job and the receipt log's size. Outcomes:
- `whole`: opened, and it holds every job and receipt-log entry of the undamaged store (the damage
  touched nothing SQLite uses, or only what it could do without);
- `refused`: StoreBehind (the store is behind its watermark), or another StoreError at open, or a
  DatabaseError on the first read: the node says so and does not run on it;
- `SILENT`: opened without an error and holds less: history lost silently. Floor (issue 18): 0.
Exits 1 if any trial is SILENT.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import sqlite3
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "node"))

from e31.node.errors import StoreError
from e31.node.store.db import Store
from test_jobs_e2e import Node, e31, submit, wait_for

FILES = ("node.sqlite", "node.sqlite-wal", "node.sqlite.watermark")


def flip(path: Path, rng: random.Random) -> str:
    data = bytearray(path.read_bytes())
    n = rng.randint(1, 16)
    for _ in range(n):
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))
    return f"{n} bytes"


def cut(path: Path, rng: random.Random) -> str:
    at = rng.randrange(path.stat().st_size)
    os.truncate(path, at)
    return f"at {at}"


def zero_page(path: Path, rng: random.Random) -> str:
    data = bytearray(path.read_bytes())
    at = rng.randrange(max(1, len(data) - 4096))
    data[at : at + 4096] = bytes(min(4096, len(data) - at))
    path.write_bytes(bytes(data))
    return f"at {at}"


def delete(path: Path, rng: random.Random) -> str:
    path.unlink()
    return ""


DAMAGE: dict[str, tuple[str, Callable[[Path, random.Random], str]]] = {
    "wal-flip": ("node.sqlite-wal", flip),
    "wal-cut": ("node.sqlite-wal", cut),
    "wal-page-zero": ("node.sqlite-wal", zero_page),
    "wal-delete": ("node.sqlite-wal", delete),
    "db-flip": ("node.sqlite", flip),
    "db-cut": ("node.sqlite", cut),
}


def contents(db_path: Path) -> tuple[int, int]:
    """(jobs, receipt-log entries) of a store as SQLite reads it with its WAL (read from a copy)."""
    with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as db:
        jobs = db.execute("SELECT count(*) FROM jobs").fetchone()[0]
        log = db.execute("SELECT count(*) FROM receipt_log").fetchone()[0]
        db.execute("PRAGMA quick_check").fetchall()
    return int(jobs), int(log)


def crashed(tmp: Path, jobs: int) -> Path:
    node = Node(tmp / "a")
    try:
        ids = [submit(node, seed, 20_000) for seed in range(jobs)]
        done = e31("wait", *ids, "--timeout", "300", data_dir=node.data_dir, timeout=330)
        assert done.returncode == 0, done.stdout + done.stderr

        def logged() -> bool:
            body = (node.data_dir / "node.sqlite.watermark").read_text()
            return f'"size": {jobs}' in body or f'"size":{jobs}' in body

        wait_for("a signed tree head of every job", logged)
    finally:
        os.kill(node.proc.pid, signal.SIGKILL)
        node.proc.wait()
    return node.data_dir


def trial(
    template: Path, work: Path, kind: str, rng: random.Random, truth: tuple[int, int]
) -> tuple[str, str]:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    for name in FILES:
        if (template / name).exists() and (template / name).stat().st_size:
            shutil.copyfile(template / name, work / name)
    name, how = DAMAGE[kind]
    detail = how(work / name, rng)
    try:
        store = Store(work / "node.sqlite")
    except StoreError as e:
        return "refused", f"{type(e).__name__} ({detail})"
    except sqlite3.DatabaseError as e:
        return "refused", f"DatabaseError at open: {e} ({detail})"
    try:
        got = contents(work / "node.sqlite")
    except sqlite3.DatabaseError as e:
        return "refused", f"DatabaseError on read: {e} ({detail})"
    finally:
        store.close()
    if got[0] >= truth[0] and got[1] >= truth[1]:
        return "whole", detail
    return "SILENT", f"{got} of {truth} ({detail})"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=12)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="e31-wal-") as tmp_s:
        tmp = Path(tmp_s)
        template = crashed(tmp, args.jobs)
        wal = (template / "node.sqlite-wal").stat().st_size
        db = (template / "node.sqlite").stat().st_size
        print(f"crashed store: node.sqlite {db} bytes, WAL {wal} bytes")
        copy = tmp / "truth"
        copy.mkdir()
        for name in FILES:
            shutil.copyfile(template / name, copy / name)
        truth = contents(copy / "node.sqlite")
        with sqlite3.connect(copy / "node.sqlite") as conn:  # the checkpointed twin, for db-* damage
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        print(f"checkpointed twin: node.sqlite {(copy / 'node.sqlite').stat().st_size} bytes")
        assert contents(copy / "node.sqlite") == truth
        print(f"undamaged: {truth[0]} jobs, {truth[1]} receipt-log entries")
        table: Counter[tuple[str, str]] = Counter()
        silent: list[str] = []
        for i in range(args.trials):
            kind = rng.choice(sorted(DAMAGE))
            source = copy if kind.startswith("db-") else template
            verdict, why = trial(source, tmp / "work", kind, rng, truth)
            table[kind, verdict] += 1
            if verdict == "SILENT":
                silent.append(f"trial {i} {kind}: {why}")
        print("| damage | whole | refused | SILENT |")
        print("|---|---|---|---|")
        for kind in sorted(DAMAGE):
            print(f"| {kind} | {table[kind, 'whole']} | {table[kind, 'refused']} | {table[kind, 'SILENT']} |")
        for line in silent:
            print(line)
        print(f"trials {args.trials}: silent history losses {len(silent)} (floor: 0)")
        return 1 if silent else 0


if __name__ == "__main__":
    sys.exit(main())
