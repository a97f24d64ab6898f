"""Giving the C heap's free pages back to the OS (node/memtrim.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import trio
import trio.testing
from e31.node.host import memtrim

needs_glibc = pytest.mark.skipif(not memtrim.available(), reason="malloc_trim is glibc's")


@needs_glibc
def test_trim_returns_free_heap_pages_that_malloc_keeps() -> None:
    """80 MB of freed 2 KB blocks under a live block at the top of the heap stay resident until the
    trim; the trim releases them. Run in a fresh process so the test's own heap does not matter."""
    script = textwrap.dedent("""
        from e31.node.host import memtrim
        def anon():
            for line in open("/proc/self/status"):
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
        blocks = [bytes(2000) + i.to_bytes(4, "big") for i in range(40_000)]
        pin = [bytes(2000) + b"pin"]
        del blocks
        before = anon()
        print(memtrim.trim(), before - anon())
    """)
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    ).stdout.split()
    assert out[0] == "True"
    assert int(out[1]) > 40 * 1024 * 1024, f"only {int(out[1])} bytes were given back"


async def test_the_trimmer_trims_every_interval(
    monkeypatch: pytest.MonkeyPatch, mock_clock: trio.testing.MockClock
) -> None:
    mock_clock.autojump_threshold = 1.0  # real seconds: never while a trim runs in its thread
    calls: list[int] = []
    monkeypatch.setattr(memtrim, "available", lambda: True)
    monkeypatch.setattr(memtrim, "trim", lambda: calls.append(1) or True)  # runs in a worker thread
    with trio.move_on_after(35):
        await memtrim.run_trimmer(10)
    assert len(calls) == 3


async def test_the_trimmer_returns_where_there_is_no_malloc_trim(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memtrim, "available", lambda: False)
    with trio.fail_after(5):
        await memtrim.run_trimmer(0.01)


async def test_the_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        await memtrim.run_trimmer(0)
