"""A damaged WAL or database file never loses history silently (issue 18).

One real node process runs 12 jobs (it executes them itself, so it also keeps a receipt log and signs
tree heads), then is killed with SIGKILL: nearly all it committed sits in node.sqlite-wal. Each test
copies that data dir, damages it exactly one way (8 bytes of the WAL header flipped, the WAL replaced by
another store's, node.sqlite deleted, node.sqlite truncated to 0, the WAL cut in half), and checks that
`e31 node run` refuses with one line and exit 65, that `e31 node recover` explains and exits 65, that
`--accept-loss` keeps the evidence and lets the node start, and that the node then never signs a tree
head whose root differs from one signed before at the same size.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from e31.node.store.db import Store
from e31.protocol.envelope import verify
from e31.protocol.messages import TreeHead
from test_jobs_e2e import Node, e31, submit, wait_for

JOBS = 12


def heads_of(data_dir: Path) -> dict[int, bytes]:
    """size -> root of every tree head stored in the data dir's database (read from a copy, WAL and all)."""
    copy = data_dir.with_name(data_dir.name + ".heads")
    shutil.rmtree(copy, ignore_errors=True)
    copy.mkdir()
    for name in ("node.sqlite", "node.sqlite-wal"):
        if (data_dir / name).exists():
            shutil.copyfile(data_dir / name, copy / name)
    with sqlite3.connect(copy / "node.sqlite") as db:
        rows = db.execute("SELECT size, raw FROM receipt_log_heads").fetchall()
    shutil.rmtree(copy)
    return {size: verify(bytes(raw), TreeHead).message.root.raw for size, raw in rows}


def watermark(data_dir: Path) -> dict[str, object]:
    body: dict[str, object] = json.loads((data_dir / "node.sqlite.watermark").read_text())["body"]
    return body


@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """A data dir left by SIGKILL after 12 jobs, and another store's WAL (of an open store)."""
    tmp = tmp_path_factory.mktemp("crash")
    node = Node(tmp / "a")
    try:
        ids = [submit(node, seed, 20_000) for seed in range(JOBS)]
        done = e31("wait", *ids, "--timeout", "120", data_dir=node.data_dir)
        assert done.returncode == 0, done.stdout + done.stderr
        wait_for("a signed tree head of every job", lambda: watermark(node.data_dir)["log"]["size"] == JOBS)  # type: ignore[index]
    finally:
        os.kill(node.proc.pid, signal.SIGKILL)
        node.proc.wait()
    assert (node.data_dir / "node.sqlite-wal").stat().st_size > 100 * (
        node.data_dir / "node.sqlite"
    ).stat().st_size
    other = Store(tmp / "other" / "node.sqlite")
    other.kv_set("x", b"y")
    other.sync()
    other_wal = tmp / "other.wal"
    shutil.copyfile(tmp / "other" / "node.sqlite-wal", other_wal)
    other.close()
    yield node.data_dir, other_wal


def flip_wal_header(d: Path, other: Path) -> None:
    wal = d / "node.sqlite-wal"
    data = bytearray(wal.read_bytes())
    data[:8] = bytes(b ^ 0xFF for b in data[:8])
    wal.write_bytes(bytes(data))


def replace_wal(d: Path, other: Path) -> None:
    shutil.copyfile(other, d / "node.sqlite-wal")


def delete_db(d: Path, other: Path) -> None:
    (d / "node.sqlite").unlink()


def truncate_db(d: Path, other: Path) -> None:
    os.truncate(d / "node.sqlite", 0)


def cut_wal(d: Path, other: Path) -> None:
    wal = d / "node.sqlite-wal"
    os.truncate(wal, wal.stat().st_size // 2)


DAMAGE: dict[str, Callable[[Path, Path], None]] = {
    "wal-header-flipped": flip_wal_header,
    "wal-replaced": replace_wal,
    "db-deleted": delete_db,
    "db-truncated": truncate_db,
    "wal-cut-in-half": cut_wal,
}


def node_run(data_dir: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "e31.node", "node", "run", "--data-dir", str(data_dir)]
    return subprocess.run(
        [*command, "--listen", "127.0.0.1:0", "--no-mdns"],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def files_of(d: Path) -> list[tuple[str, int]]:
    """The data dir's files and sizes, but the lock file and SQLite's shared-memory index."""
    skip = ("node.lock", "node.sqlite-shm")
    return sorted((p.name, p.stat().st_size) for p in d.iterdir() if p.is_file() and p.name not in skip)


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_store_is_refused_then_recovered_without_a_contradicting_head(
    crashed: tuple[Path, Path], tmp_path: Path, damage: str
) -> None:
    template, other_wal = crashed
    before = heads_of(template)
    assert max(before) == JOBS
    d = tmp_path / "a"
    shutil.copytree(template, d, ignore=shutil.ignore_patterns("node.lock", "api.json"))
    DAMAGE[damage](d, other_wal)
    files = files_of(d)

    refused = node_run(d)
    assert refused.returncode == 65, refused.stderr
    errors = [line for line in refused.stderr.splitlines() if line.startswith("e31: error:")]
    assert len(errors) == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert "e31 node recover" in errors[0], errors[0]
    # nothing was written: the damaged files are as they were
    assert files_of(d) == files

    explained = e31("node", "recover", "--data-dir", str(d))
    assert explained.returncode == 65, explained.stdout + explained.stderr
    assert "behind what the node promised" in explained.stdout and "--accept-loss" in explained.stdout
    assert node_run(d).returncode == 65  # explaining accepts nothing

    accepted = e31("node", "recover", "--data-dir", str(d), "--accept-loss")
    assert accepted.returncode == 0, accepted.stdout + accepted.stderr
    kept = list((d / "lost").iterdir())
    assert len(kept) == 1 and (kept[0] / "node.sqlite.watermark").exists()
    mark = watermark(d)
    assert len(mark["losses"]) == 1  # type: ignore[arg-type]
    assert mark["losses"][0]["before"]["log"]["size"] == JOBS  # type: ignore[index]

    node = Node(d)
    try:
        job = submit(node, 99, 20_000)
        assert e31("wait", job, "--timeout", "120", data_dir=d).returncode == 0
        wait_for("a head above every size signed before", lambda: watermark(d)["log"]["size"] > JOBS)  # type: ignore[operator]
    finally:
        node.stop()
    assert node.proc.returncode == 0
    after = heads_of(d)
    assert max(after) > JOBS
    contradicting = {s for s in before.keys() & after.keys() if before[s] != after[s]}
    assert not contradicting, f"heads signed again with another root at sizes {sorted(contradicting)}"
    assert node_run_is_accepted_again(d)


def node_run_is_accepted_again(d: Path) -> bool:
    """After a clean stop the store is not behind its watermark: recover says so."""
    out = e31("node", "recover", "--data-dir", str(d))
    return out.returncode == 0 and "not behind its watermark" in out.stdout


def test_a_store_without_a_watermark_gets_one_from_the_database(tmp_path: Path) -> None:
    """An existing store from before watermarks (no file) is opened, and the watermark made from it."""
    with Store(tmp_path / "node.sqlite") as store:
        store.kv_set("k", b"v")
        with store.transaction() as c:
            c.execute("INSERT INTO kv (key, value) VALUES ('d', x'00')")
    (tmp_path / "node.sqlite.watermark").unlink()
    with Store(tmp_path / "node.sqlite") as store:
        assert store.seq == 1
    assert watermark(tmp_path)["seq"] == 1
