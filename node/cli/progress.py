"""Progress on stderr for operations that may take more than a second: a bar for a wait (done/total,
the rate over the time this command watched, the time left), and a ticking line for one long request
(an export, an upload, a re-execution) that shows what runs and for how long.

Drawn only when stderr is a terminal or the command was given --progress; otherwise nothing is
written, so logs and pipes stay clean. Each redraw overwrites the line (carriage return); `close`
ends it with a newline.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from types import TracebackType
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from ..client.records import Progress

TICK = 1.0
"""Seconds between redraws of a ticking line."""


def add_progress_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--progress",
        action="store_true",
        help="draw progress on stderr even when it is not a terminal (it is drawn on a terminal anyway)",
    )


def wanted(args: argparse.Namespace, stream: TextIO | None = None) -> bool:
    stream = stream or sys.stderr
    return bool(getattr(args, "progress", False)) or stream.isatty()


def progress_line(
    done: int, total: int, elapsed: float, width: int = 30, *, rate: float | None = None
) -> str:
    """`[####....] done/total  R jobs/s  ETA Ns`: `rate` defaults to done/elapsed."""
    filled = round(width * done / total) if total else width
    if rate is None:
        rate = done / elapsed if elapsed > 0 else 0.0
    eta = "?" if not rate else f"{(total - done) / rate:.0f}s"
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total}  {rate:.2f} jobs/s  ETA {eta}"


class Bar:
    """A wait's progress bar; `update` is the client's progress callback."""

    def __init__(self, show: bool, stream: TextIO | None = None) -> None:
        self.show = show
        self.stream = stream or sys.stderr
        self.drawn = False

    def update(self, p: Progress) -> None:
        if not self.show:
            return
        line = progress_line(p.ended, p.total, p.elapsed, rate=p.rate or 0.0)
        print("\r" + line, end="", file=self.stream, flush=True)
        self.drawn = True

    def close(self) -> None:
        if self.drawn:
            print(file=self.stream, flush=True)
            self.drawn = False


class Ticker:
    """`with Ticker("exporting receipts", show):` redraws "exporting receipts... 12s" every second on
    stderr from a thread while the block runs (one blocking request, a local computation), from its
    first second on: work that ends sooner draws nothing."""

    def __init__(self, what: str, show: bool, stream: TextIO | None = None) -> None:
        self.what = what
        self.show = show
        self.stream = stream or sys.stderr
        self.detail = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start = time.monotonic()
        self._lock = threading.Lock()
        self._drawn = False
        """Whether the line is on the screen: only once the work has taken TICK seconds."""

    def note(self, detail: str) -> None:
        """What the line says after the elapsed time (3/12 jobs re-run, ...); redrawn once it shows."""
        self.detail = detail
        if self._drawn:
            self._draw()

    def _draw(self) -> None:
        if not self.show:
            return
        self._drawn = True
        elapsed = time.monotonic() - self._start
        with self._lock:
            text = f"{self.what}... {elapsed:.0f}s" + (f"  {self.detail}" if self.detail else "")
            print("\r" + text.ljust(60), end="", file=self.stream, flush=True)

    def _loop(self) -> None:
        while not self._stop.wait(TICK):
            self._draw()

    def __enter__(self) -> Ticker:
        if self.show:
            self._start = time.monotonic()
            self._thread = threading.Thread(target=self._loop, name="e31-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            if self._drawn:  # work of under a second leaves no line
                self._draw()
                print(file=self.stream, flush=True)
