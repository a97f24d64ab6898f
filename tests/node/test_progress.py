"""Progress on stderr (node/cli/progress.py): a ticking line only for work that lasts, the wait bar's
rate as the client measured it over the watched time."""

from __future__ import annotations

import io
import threading

import pytest
from e31.client import Progress
from e31.node.cli import progress
from e31.node.cli.progress import Bar, Ticker, progress_line


def test_work_under_a_tick_draws_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "TICK", 3600.0)
    out = io.StringIO()
    with Ticker("exporting", True, out):
        pass
    assert out.getvalue() == ""


def test_long_work_shows_what_runs_and_for_how_long(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "TICK", 0.01)
    out = io.StringIO()
    shown = threading.Event()
    with Ticker("re-executing", True, out) as ticker:
        for _ in range(10_000):  # until the line is there (bounded: a hang fails, not stalls)
            if out.getvalue():
                shown.set()
                break
            shown.wait(0.01)
        ticker.note("3/12 jobs")
    assert shown.is_set()
    last = out.getvalue().split("\r")[-1]
    assert last.startswith("re-executing... ") and "3/12 jobs" in last and last.endswith("\n")


def test_nothing_is_drawn_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "TICK", 0.01)
    out = io.StringIO()
    with Ticker("exporting", False, out) as ticker:
        ticker.note("x")
    bar = Bar(False, out)
    bar.update(Progress(3, 1, {"done": 1}, 1.0, None, None))
    bar.close()
    assert out.getvalue() == ""


def test_the_bar_shows_the_watched_rate() -> None:
    out = io.StringIO()
    bar = Bar(True, out)
    bar.update(Progress(10, 10, {"done": 10}, 0.002, None, None))  # all ended before the wait began
    bar.close()
    assert out.getvalue() == "\r[##############################] 10/10  0.00 jobs/s  ETA ?\n"
    assert progress_line(3, 10, 1.5, width=10, rate=0.5) == "[###.......] 3/10  0.50 jobs/s  ETA 14s"
