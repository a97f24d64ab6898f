"""`e31 demo [--nodes N] [--jobs M] [--json] [--keep DIR]`: a local network renders a Mandelbrot image.

With `--workload generate` the network runs batch inference instead (node/demo/inference.py).

The work is node/demo.py's; this module parses the flags, shows progress (one updating line on a TTY,
plain lines otherwise; on stderr when --json keeps stdout for the JSON object), prints the per-node table
and maps the outcome to the exit code: 0 when every job verified, 1 otherwise, 2 for a usage error,
130 after Ctrl-C and 143 after SIGTERM (the network is stopped first in every case).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from .run import DemoResult
    from .verdict import NodeRow


def _count(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        if not text.strip().isdigit() or not low <= int(text) <= high:
            raise argparse.ArgumentTypeError(f"must be a whole number from {low} to {high}, got {text!r}")
        return int(text)

    return parse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from .image import MAX_TILES
    from .net import MAX_NODES

    parser.description = (
        "Start a throwaway network of local nodes, render a Mandelbrot image as tile jobs "
        "across it, write ./e31-demo.png, then export and audit every receipt."
    )
    parser.add_argument(
        "--nodes",
        type=_count(1, MAX_NODES),
        default=3,
        metavar="N",
        help="node processes to start (default 3)",
    )
    parser.add_argument(
        "--jobs",
        type=_count(1, MAX_TILES),
        metavar="M",
        help="tiles to render, one job each (default 24); with --workload generate, the jobs the "
        "prompts are spread over (default 8)",
    )
    parser.add_argument(
        "--workload",
        choices=("mandelbrot", "generate"),
        default="mandelbrot",
        help="mandelbrot (default): render ./e31-demo.png; generate: the shipped language model answers "
        "the shipped prompts into ./e31-demo-completions.jsonl",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object with the outcome")
    parser.add_argument(
        "--keep",
        type=Path,
        metavar="DIR",
        help="keep the data dirs, logs and receipts bundle in DIR (new or empty)",
    )
    # The generate workload's prompts file instead of the shipped one (tests); not for users.
    parser.add_argument("--prompts", type=Path, metavar="FILE", help=argparse.SUPPRESS)
    # Each job's fuel limit, for tests that need jobs to fail (out of fuel); not for users.
    parser.add_argument("--job-fuel", type=_count(1, 10**12), metavar="N", help=argparse.SUPPRESS)


class _Sigterm:
    """SIGTERM is handled as Ctrl-C is (KeyboardInterrupt: a clean stop) and remembered for the exit
    status; a flag, because the e31 commands the demo runs in-process turn any KeyboardInterrupt into 130."""

    received = False

    @classmethod
    def handler(cls, signum: int, frame: FrameType | None) -> None:
        cls.received = True
        raise KeyboardInterrupt


class Progress:
    """The demo's narration: steps as lines, job progress as one updating line (TTY) or plain lines."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self._open_line = False
        self._last: tuple[int, int] | None = None
        self._last_print = 0.0

    def close(self) -> None:
        """End an open progress line, so what follows starts on its own line."""
        if self._open_line:
            self.stream.write("\n")
            self._open_line = False

    def step(self, text: str) -> None:
        self.close()
        print(text, file=self.stream, flush=True)

    def progress(self, done: int, failed: int, total: int, elapsed: float) -> None:
        finished = done + failed
        now = time.monotonic()
        if not self.tty and self._last is not None:  # plain lines: on change, at most one a second
            changed = (done, failed) != self._last
            if not changed or (finished < total and now - self._last_print < 1.0):
                return
        self._last, self._last_print = (done, failed), now
        line = format_progress(done, failed, total, elapsed)
        if self.tty:
            self.stream.write("\r\x1b[K" + line)
            self._open_line = finished < total
            if not self._open_line:
                self.stream.write("\n")
            self.stream.flush()
        else:
            print(line, file=self.stream, flush=True)


def format_progress(done: int, failed: int, total: int, elapsed: float, width: int = 24) -> str:
    finished = done + failed
    filled = width * finished // total if total else width
    bar = "#" * filled + "-" * (width - filled)
    rate = finished / elapsed if elapsed > 0 else 0.0
    if finished >= total:
        eta = "done"
    elif rate > 0:
        eta = f"ETA {max(0.0, (total - finished) / rate):.0f}s"
    else:
        eta = "ETA ?"
    fail = f", {failed} failed" if failed else ""
    return f"[{bar}] {finished}/{total} jobs{fail}  {rate:.1f} jobs/s  {eta}"


NODE_COLUMNS = ("NODE", "NODE ID", "JOBS", "FUEL", "COMPUTE", "QUEUE WAIT")


def format_nodes(rows: list[NodeRow]) -> str:
    table = [NODE_COLUMNS]
    for r in rows:
        short = r.node_id if len(r.node_id) <= 16 else r.node_id[:15] + "…"
        table.append(
            (
                r.name,
                short,
                str(r.jobs),
                f"{r.fuel:,}",
                f"{r.compute_seconds:.3f} s",
                f"{r.queue_wait_seconds:.3f} s",
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(NODE_COLUMNS))]
    right = {2, 3, 4, 5}
    return "\n".join(
        "  ".join(
            cell.rjust(w) if i in right else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in table
    )


def format_summary(result: DemoResult) -> str:
    from .run import shown

    lines = []
    if result.rows:
        lines += ["", format_nodes(result.rows), ""]
    if result.output is not None:
        lines.append(f"completions: {shown(result.output)}")
    if result.blob_bytes:
        moved = ", ".join(f"{name} {n:,}" for name, n in result.blob_bytes.items())
        lines.append(f"blob bytes received (model, tokenizer, module, prompts; at most once each): {moved}")
    if result.receipts is not None:
        bundle = shown(result.receipts)
        lines.append(f"receipts: {bundle} (audit them yourself: e31 audit {bundle} --reexecute)")
    for failure in result.failed:
        lines.append(f"failed: {failure}")
    for problem in result.problems:
        lines.append(f"problem: {problem}")
    if result.notes and result.receipts is not None:
        lines.append(
            f"the audit also made {len(result.notes)} note(s), things it could not check that are "
            f"not problems: see them with e31 audit {shown(result.receipts)}"
        )
    if result.ok:
        lines.append(
            f"all {result.jobs} jobs verified ({result.reexecuted} re-executed by the audit) "
            f"in {result.wall_seconds:.1f} s; the network is stopped"
        )
    else:
        lines.append(f"{result.verified} of {result.jobs} jobs verified: the demo FAILED")
    if result.work_dir is not None:
        lines.append(f"data dirs and node logs: {shown(result.work_dir)}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from ..cli.main import CliError
    from .run import DemoError, DemoOptions, run_demo

    narration = sys.stderr if args.json else sys.stdout
    progress = Progress(narration)
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _Sigterm.handler) if main_thread else None
    try:
        if args.workload == "generate":
            from .inference import DEFAULT_JOBS, run_generate_demo

            jobs = DEFAULT_JOBS if args.jobs is None else args.jobs
            options = DemoOptions(
                nodes=args.nodes, jobs=jobs, keep=args.keep, workload="generate", prompts=args.prompts
            )
            result = run_generate_demo(options, progress)
        else:
            jobs = 24 if args.jobs is None else args.jobs
            options = DemoOptions(nodes=args.nodes, jobs=jobs, keep=args.keep, fuel=args.job_fuel)
            result = run_demo(options, progress)
    except DemoError as e:
        progress.close()
        raise CliError(str(e), e.code) from None
    except KeyboardInterrupt:
        progress.close()
        if _Sigterm.received:
            print("e31 demo: terminated; the network is stopped", file=sys.stderr)
            return 143
        echo = "\n" if sys.stderr.isatty() else ""  # after the terminal's "^C"
        print(f"{echo}e31 demo: interrupted; the network is stopped", file=sys.stderr)
        return 130
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    else:
        print(format_summary(result))
    return 0 if result.ok else 1
