"""The watermark's write-behind: at most one write per interval, never ahead of what it was given, and
the last value written at close."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from e31.node.store import watermark
from e31.node.store.db import Store
from e31.node.store.watermark import Keeper, Mark


def written_seq(path: Path) -> int:
    mark = watermark.read(path)
    assert mark is not None
    return mark.seq


def wait_until(what: str, predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    """Polls `predicate` (the writer is a thread: there is no event to wait on from here)."""
    tick = threading.Event()
    for _ in range(int(timeout / 0.005)):
        if predicate():
            return
        tick.wait(0.005)
    raise AssertionError(f"not within {timeout:g} s: {what}")


def counting_writes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    seqs: list[int] = []
    write = watermark.write

    def counted(path: Path, mark: Mark) -> None:
        seqs.append(mark.seq)
        write(path, mark)

    monkeypatch.setattr(watermark, "write", counted)
    return seqs


def test_syncs_within_one_interval_share_one_write_and_close_writes_the_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seqs = counting_writes(monkeypatch)
    path = tmp_path / "x.watermark"
    keeper = Keeper(path, Mark(store_id=b"s" * 16, seq=0), interval=3600.0)
    keeper.advance_soon(1)  # the first write is not held back
    wait_until("the first write", lambda: path.exists() and written_seq(path) == 1)
    for seq in range(2, 50):
        keeper.advance_soon(seq)
    keeper.advance_soon(7)  # never moved back
    assert written_seq(path) == 1 and seqs == [1]  # the interval has not passed: still one write
    keeper.close()
    assert written_seq(path) == 49
    assert seqs == [1, 49]


def test_with_no_interval_every_advance_is_written_soon(tmp_path: Path) -> None:
    path = tmp_path / "x.watermark"
    keeper = Keeper(path, Mark(store_id=b"s" * 16, seq=0), interval=0.0)
    keeper.advance_soon(3)
    wait_until("the first write", lambda: path.exists() and written_seq(path) == 3)
    keeper.advance_soon(4)
    wait_until("the second write, before close", lambda: written_seq(path) == 4)
    keeper.close()
    assert written_seq(path) == 4


def test_a_store_closed_after_a_burst_of_syncs_is_not_behind_its_watermark(tmp_path: Path) -> None:
    store = Store(tmp_path / "node.sqlite")
    for i in range(40):
        store.kv_set(f"k{i}", b"v")
        store.sync()
    seq = store.seq
    store.close()
    assert written_seq(watermark.path_for(tmp_path / "node.sqlite")) == seq
    again = Store(tmp_path / "node.sqlite")  # the watermark check at open passes
    assert again.seq == seq
    again.close()
