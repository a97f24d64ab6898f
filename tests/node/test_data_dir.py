"""The data dir holds job arguments, outputs and the node's key: it stays private, and a node never starts
on it in a way that would lose or contradict its history. Real `e31 node run` processes."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from test_jobs_e2e import Node, e31


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _started_once(data_dir: Path) -> None:
    node = Node(data_dir)
    node.stop()


def test_a_new_node_keeps_its_files_to_its_user(tmp_path: Path) -> None:
    data = tmp_path / "node"
    _started_once(data)
    assert _mode(data) == 0o700
    files = [p for p in data.rglob("*") if p.is_file()]
    assert any(p.name == "node.sqlite" for p in files) and any(p.name == "identity.key" for p in files)
    assert {str(p.relative_to(data)): _mode(p) & 0o077 for p in files} == {
        str(p.relative_to(data)): 0 for p in files
    }
    assert all(_mode(p) & 0o077 == 0 for p in data.rglob("*") if p.is_dir())


@pytest.mark.parametrize("target", ["dir", "database"])
def test_a_data_dir_or_database_open_to_others_is_refused_in_one_line(tmp_path: Path, target: str) -> None:
    data = tmp_path / "node"
    _started_once(data)
    path, fix = (data, "chmod 700") if target == "dir" else (data / "node.sqlite", "chmod 600")
    os.chmod(path, 0o755 if target == "dir" else 0o644)
    proc = e31("node", "run", "--data-dir", str(data), "--listen", "127.0.0.1:0", "--no-mdns", timeout=60)
    assert proc.returncode == 1
    (line,) = proc.stderr.strip().splitlines()[-1:]
    assert line.startswith("e31: error: ") and "open to other users" in line and f"{fix} {path}" in line
    assert "Traceback" not in proc.stderr


def test_a_missing_key_with_existing_data_refuses_and_writes_no_new_key(tmp_path: Path) -> None:
    data = tmp_path / "node"
    _started_once(data)
    key = data / "identity.key"
    key.unlink()
    proc = e31("node", "run", "--data-dir", str(data), "--listen", "127.0.0.1:0", "--no-mdns", timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "identity.key is missing" in proc.stderr and "restore the key" in proc.stderr
    assert not key.exists(), "a new key was written over the old node's history"
    assert (data / "node.sqlite").exists()
