"""ModuleBytes (node/market/module_bytes.py): a module read and checked once for all the runs of it."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import trio
from e31.node.market.module_bytes import ModuleBytes
from e31.node.store.blobs import BlobCorrupt, BlobNotFound, BlobStore
from e31.protocol.ids import NodeId
from e31.sandbox.job import JobSpec, module_digest
from market_nodes import Net, RealNode, start, wait_state


def _root(blobs: BlobStore, data: bytes) -> bytes:
    return bytes.fromhex(blobs.put(data))


def test_a_module_is_read_once_and_every_run_gets_the_same_bytes(tmp_path: Path) -> None:
    blobs = BlobStore(tmp_path / "blobs")
    module = (Path(__file__).resolve().parents[2] / "sandbox" / "workloads" / "montecarlo.wasm").read_bytes()
    root = _root(blobs, module)
    memo = ModuleBytes(blobs)
    first = memo.read(root)
    specs = [JobSpec(module=memo.read(root), args=(str(i),)) for i in range(3)]
    assert first == module and memo.reads == 1
    assert all(spec.module is first for spec in specs)  # one object: the spec's hash is remembered
    assert specs[0].module_sha256 == module_digest(module)


def test_the_least_recently_run_module_is_forgotten_past_the_budget(tmp_path: Path) -> None:
    blobs = BlobStore(tmp_path / "blobs")
    a, b, c = (_root(blobs, bytes([n]) * 400) for n in (1, 2, 3))
    memo = ModuleBytes(blobs, budget=1000)
    memo.read(a)
    memo.read(b)
    memo.read(a)  # a was run last: b goes first
    memo.read(c)
    assert memo.size == 800 and memo.reads == 3
    memo.read(a)
    assert memo.reads == 3
    memo.read(b)
    assert memo.reads == 4


def test_a_module_larger_than_the_budget_is_read_for_each_run(tmp_path: Path) -> None:
    blobs = BlobStore(tmp_path / "blobs")
    big = _root(blobs, b"x" * 2000)
    memo = ModuleBytes(blobs, budget=1000)
    assert memo.read(big) == b"x" * 2000
    memo.read(big)
    assert memo.reads == 2 and memo.size == 0


def test_a_missing_or_corrupt_module_raises_and_is_not_kept(tmp_path: Path) -> None:
    blobs = BlobStore(tmp_path / "blobs")
    memo = ModuleBytes(blobs)
    with pytest.raises(BlobNotFound):
        memo.read(b"\x05" * 32)
    root = _root(blobs, b"module bytes")
    path = blobs.path(root.hex())
    path.chmod(0o644)
    path.write_bytes(b"module bytes!")  # changed on disk before its first read
    with pytest.raises(BlobCorrupt):
        memo.read(root)
    assert memo.size == 0 and memo.reads == 0


def test_threads_asking_at_once_share_one_read(tmp_path: Path) -> None:
    blobs = BlobStore(tmp_path / "blobs")
    root = _root(blobs, b"m" * 300_000)
    memo = ModuleBytes(blobs)
    start = threading.Barrier(4)
    got: list[bytes] = []

    def run() -> None:
        start.wait()
        got.append(memo.read(root))

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(got) == 4 and all(g is got[0] for g in got) and memo.reads == 1


def test_the_bytes_kept_are_the_bytes_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check hashes the bytes read, not the file again: bytes that changed between a check of the
    file and its read (here: a read that returns other bytes) are refused, and nothing is kept."""
    blobs = BlobStore(tmp_path / "blobs")
    root = _root(blobs, b"the module")
    real_open = open

    class Swapped:
        def __init__(self, f: Any) -> None:
            self.f = f

        def __enter__(self) -> Any:
            return self

        def __exit__(self, *exc: object) -> None:
            self.f.close()

        def fileno(self) -> int:
            return int(self.f.fileno())

        def read(self) -> bytes:
            return b"the modulX"

    def fake_open(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        f = real_open(path, mode, *args, **kwargs)
        return Swapped(f) if str(path) == str(blobs.path(root.hex())) else f

    monkeypatch.setattr("builtins.open", fake_open)
    memo = ModuleBytes(blobs)
    with pytest.raises(BlobCorrupt):
        memo.read(root)
    assert memo.size == 0


async def test_an_executor_reads_a_sweeps_module_once(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    await start(nursery, a, b)
    batch = [a.manifest((str(seed), "1000")) for seed in range(6)]
    await a.submitter.submit_batch(batch)
    rows = [await wait_state(a, m.job_id.raw, "done") for m in batch]
    assert {row.executor for row in rows} == {str(NodeId(b.id))}
    assert b.executor.modules.reads == 1
