"""Finding a dead pool's workers by their command line (a fake /proc here; real processes in
test_worker.py)."""

from __future__ import annotations

from pathlib import Path

from e31.sandbox.orphans import orphaned_workers


def _process(proc: Path, pid: int, ppid: int, argv: list[str]) -> None:
    d = proc / str(pid)
    d.mkdir()
    (d / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    (d / "stat").write_text(f"{pid} (python3 x) S {ppid} {pid} {pid} 0 -1 4194560 0 0\n")


def _worker(cache: str, parent: str | None) -> list[str]:
    argv = ["/usr/bin/python3", "-m", "e31.sandbox.worker", "--request-fd", "5", "--cache-dir", cache]
    return argv + (["--parent", parent] if parent is not None else [])


def test_only_workers_of_this_cache_whose_pool_died_are_orphans(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "self").mkdir()  # not a pid
    _process(proc, 100, 1, _worker("/data/cache", "42"))  # its pool (42) died: reparented to init
    _process(proc, 101, 42, _worker("/data/cache", "42"))  # its pool is alive
    _process(proc, 102, 1, _worker("/other/cache", "43"))  # another node's
    _process(proc, 103, 1, _worker("/data/cache", None))  # says nothing of its pool: left alone
    _process(proc, 104, 1, _worker("/data/cache", "x"))
    _process(proc, 105, 1, ["/usr/bin/python3", "-c", "e31.sandbox.worker --cache-dir /data/cache"])
    (proc / "106").mkdir()  # vanished while being read
    assert orphaned_workers("/data/cache", proc) == [100]
    assert orphaned_workers("/other/cache", proc) == [102]
    assert orphaned_workers("/nowhere", tmp_path / "no-proc") == []
