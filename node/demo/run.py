"""`e31 demo`: the whole product on one machine, end to end, in under a minute.

The steps, each through the same command lines a user types (run in this process through
`e31.node.cli.main` for the many small calls, as subprocesses for the export and the audit):

1. start a LocalNetwork of N real nodes (node/demo_net.py) under a work dir (temporary, or --keep DIR);
2. `e31 submit mandelbrot.wasm` once per tile (node/demo_image.py plans the tiles) to the first node,
   a few at a time (the command line is parsed and turned into a request by `e31 submit`'s own code);
3. poll `e31 jobs --json` until every job is done, failed or expired, reporting progress;
4. `e31 results JOB --out DIR` for each finished job, paste its PGM tile into the image, colour it and
   write ./e31-demo.png (node/png.py);
5. `e31 receipts export --with-blobs` every receipt into one bundle and `e31 audit --reexecute` it:
   signatures, acknowledgements, log inclusion, and re-execution in the local sandbox;
6. stop the network (always, also after an error or Ctrl-C).

A job counts as verified only when it succeeded, its receipt and acknowledgement are in the bundle, and
the audit, which re-executes every job, found nothing wrong with it (node/demo_verdict.py). The caller
(node/cmd_demo.py) renders the DemoResult; `events` receives progress as it happens.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

from ..errors import NodeError
from ..lifecycle import TERMINAL
from .image import HEIGHT, MAX_ITER, MAX_TILES, WIDTH, ImageError, Mosaic, Tile, colourise, plan_tiles
from .net import LOG_FILE, MAX_NODES, LocalNetwork, NetworkError
from .verdict import NodeRow, VerdictError, bundle_jobs, judge

IMAGE_NAME = "e31-demo.png"
BUNDLE_NAME = "receipts.e31bundle"
POLL_INTERVAL = 0.2
EXPORT_TRIES = 10
"""Exports of the receipts at most, POLL_INTERVAL apart, until every done job's acknowledgement is in
(a submitter signs acks a batch at a time, a moment after the jobs end)."""
SUBMIT_THREADS = 4


class DemoError(NodeError):
    """The demo cannot go on; the message names the node or job at fault and where its log is.
    `code` is the exit status: 2 for a bad argument, else 1."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


class Events(Protocol):
    def step(self, text: str) -> None: ...

    def progress(self, done: int, failed: int, total: int, elapsed: float) -> None: ...


@dataclass(frozen=True, slots=True)
class DemoOptions:
    nodes: int = 3
    jobs: int = 24
    keep: Path | None = None
    image: Path = Path(IMAGE_NAME)
    job_timeout: float = 300.0
    """Seconds the demo waits for all jobs to finish once submitted."""
    fuel: int | None = None
    """Each job's fuel limit instead of fuel_for(tile) (tests use it to make jobs fail)."""
    workload: str = "mandelbrot"
    """`mandelbrot` (this module) or `generate` (inference.py)."""
    prompts: Path | None = None
    """The generate workload's prompts file (default: the shipped one)."""
    completions: Path = Path("e31-demo-completions.jsonl")
    """Where the generate workload writes the merged completions."""

    def check(self) -> None:
        if not 1 <= self.nodes <= MAX_NODES:
            raise DemoError(f"--nodes must be from 1 to {MAX_NODES}, got {self.nodes}", code=2)
        if not 1 <= self.jobs <= MAX_TILES:
            raise DemoError(f"--jobs must be from 1 to {MAX_TILES}, got {self.jobs}", code=2)


@dataclass
class DemoResult:
    nodes: int
    jobs: int
    done: int = 0
    verified: int = 0
    reexecuted: int = 0
    failed: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """The audit's notes: things it could not check that are not problems (see docs/auditing.md)."""
    image: Path | None = None
    receipts: Path | None = None
    work_dir: Path | None = None
    """Where the data dirs, logs and fetched results are; None once removed."""
    rows: list[NodeRow] = field(default_factory=list)
    wall_seconds: float = 0.0
    peak_rss_bytes: int | None = None
    workload: str = "mandelbrot"
    output: Path | None = None
    """The generate workload's merged completions file."""
    blob_bytes: dict[str, int] = field(default_factory=dict)
    """The generate workload: bytes of blob chunks each node received (its GET /metrics)."""

    @property
    def ok(self) -> bool:
        return self.verified == self.jobs and not self.failed and not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "nodes": self.nodes,
            "jobs": self.jobs,
            "done": self.done,
            "verified": self.verified,
            "reexecuted": self.reexecuted,
            "failed": self.failed,
            "problems": self.problems,
            "notes": self.notes,
            "image": None if self.image is None else str(self.image),
            "receipts": None if self.receipts is None else str(self.receipts),
            "work_dir": None if self.work_dir is None else str(self.work_dir),
            "per_node": [r.to_json() for r in self.rows],
            "wall_seconds": round(self.wall_seconds, 3),
            "peak_rss_bytes": self.peak_rss_bytes,
            **(
                {}
                if self.workload == "mandelbrot"
                else {
                    "workload": self.workload,
                    "completions": None if self.output is None else str(self.output),
                    "blob_bytes_received": self.blob_bytes,
                }
            ),
        }


# --- calling the e31 command line --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Called:
    args: tuple[str, ...]
    code: int
    stdout: str
    stderr: str

    def error_line(self) -> str:
        lines = [ln for ln in self.stderr.strip().splitlines() if ln.strip()]
        return lines[-1].removeprefix("e31: error: ") if lines else f"exit status {self.code}"


def e31(*args: str) -> Called:
    """Run `e31 ARGS` in this process, capturing its output (the cheap way for many small calls)."""
    from ..cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as e:  # argparse's usage errors
            code = e.code if isinstance(e.code, int) else 2
    if code == 130:
        raise KeyboardInterrupt
    return Called(tuple(args), code, out.getvalue(), err.getvalue())


def e31_process(*args: str, timeout: float) -> Called:
    """Run `e31 ARGS` as a child process (isolates heavy steps: the export, the re-executing audit)."""
    command = [sys.executable, "-m", "e31.node", *args]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        return Called(tuple(args), 124, "", f"e31: error: `e31 {args[0]}` gave no answer in {timeout:g} s")
    if done.returncode == 130:
        raise KeyboardInterrupt
    return Called(tuple(args), done.returncode, done.stdout, done.stderr)


def _json(called: Called, what: str) -> Any:
    try:
        return json.loads(called.stdout)
    except ValueError:
        raise DemoError(f"`e31 {' '.join(called.args[:2])}` printed no JSON for {what}") from None


# --- the steps -----------------------------------------------------------------------------------------


@contextlib.contextmanager
def _module() -> Iterator[Path]:
    with resources.as_file(resources.files("e31.sandbox") / "workloads" / "mandelbrot.wasm") as path:
        if not path.is_file():
            raise DemoError(f"the demo's guest program is missing: {path}")
        yield path


def fuel_for(tile: Tile, max_iter: int = MAX_ITER) -> int:
    """A fuel budget that covers the tile even if every pixel is inside the set (about 31 fuel per
    iteration of the guest's loop, measured) with a margin, so bids estimate run time from it sensibly."""
    return tile.width * tile.height * (max_iter * 40 + 400) + 1_000_000


def submit_argv(module: Path, tile: Tile, fuel: int | None) -> list[str]:
    """The `e31 submit` command line (after `--data-dir`) for one tile."""
    guest = [word for arg in tile.guest_args(WIDTH, HEIGHT, MAX_ITER) for word in ("--arg", arg)]
    return [
        str(module),
        *guest,
        "--fuel",
        str(fuel or fuel_for(tile)),
        "--memory",
        "16MiB",
        "--timeout",
        "60",
        "--max-output",
        str(tile.width * tile.height + 64),
        "--deadline",
        "10m",
    ]


def _submit(data_dir: Path, module: Path, tiles: Sequence[Tile], fuel: int | None) -> dict[str, Tile]:
    """Submit every tile to the node, SUBMIT_THREADS at a time.

    Each command line goes through `e31 submit`'s own parser and request builder; only the HTTP call is
    made here, from a few threads, because the node checks each job (module compile, blob writes) for
    tens of milliseconds and one request at a time would leave it idle in between.
    """
    import argparse
    from concurrent.futures import ThreadPoolExecutor

    from ..api.client import ApiClient, ApiClientError
    from ..cli import submit as cmd_submit
    from ..cli.main import CliError

    parser = argparse.ArgumentParser(prog="e31 submit", exit_on_error=False)
    cmd_submit.add_arguments(parser)
    api = ApiClient(data_dir, timeout=60.0)

    def one(tile: Tile) -> str:
        try:
            args = parser.parse_args(submit_argv(module, tile, fuel))
            args.passthrough = []
            answer = api.post("/v1/jobs", cmd_submit.request_body(args, time.time()))
        except (argparse.ArgumentError, ApiClientError, CliError) as e:
            raise DemoError(f"submitting {tile.name} to node1 failed: {e}") from None
        job_id = answer.get("job_id") if isinstance(answer, dict) else None
        if not isinstance(job_id, str):
            raise DemoError(f"submitting {tile.name} to node1: the node's answer names no job id")
        return job_id

    pool = ThreadPoolExecutor(SUBMIT_THREADS, thread_name_prefix="e31-demo-submit")
    try:
        ids = list(pool.map(one, tiles))
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return dict(zip(ids, tiles, strict=True))


def _job_states(data_dir: Path) -> dict[str, dict[str, Any]]:
    called = e31("jobs", "--json", "--data-dir", str(data_dir))
    if called.code != 0:
        raise DemoError(f"listing node1's jobs failed: {called.error_line()}")
    rows = _json(called, "the job list")
    if not isinstance(rows, list):
        raise DemoError("`e31 jobs --json` printed something other than a list of jobs")
    return {str(row.get("job_id")): row for row in rows if isinstance(row, dict)}


def _why(row: dict[str, Any]) -> str:
    outcome = row.get("outcome")
    text = outcome.get("text") if isinstance(outcome, dict) else None
    return str(text or row.get("reason") or row.get("state", "?"))


class Named(Protocol):
    """What the demo calls one of its jobs (a tile, a span of prompts)."""

    @property
    def name(self) -> str: ...


def _wait(
    net: LocalNetwork, jobs: Mapping[str, Named], options: DemoOptions, events: Events, result: DemoResult
) -> dict[str, dict[str, Any]]:
    start = time.monotonic()
    deadline = start + options.job_timeout
    first = net.nodes[0]
    while True:
        net.check_alive()
        rss = net.rss_bytes()
        if rss is not None:
            result.peak_rss_bytes = max(result.peak_rss_bytes or 0, rss)
        states = _job_states(first.data_dir)
        finished = {j: states[j] for j in jobs if j in states and states[j].get("state") in TERMINAL}
        done = sum(1 for row in finished.values() if succeeded(row))
        events.progress(done, len(finished) - done, len(jobs), time.monotonic() - start)
        if len(finished) == len(jobs):
            return finished
        if time.monotonic() > deadline:
            late = [
                f"{jobs[j].name} (job {j}, {states.get(j, {}).get('state', 'unknown')})"
                for j in jobs
                if j not in finished
            ]
            raise DemoError(
                f"{len(late)} job(s) not finished after {options.job_timeout:g} s: "
                + "; ".join(late[:5])
                + (" ..." if len(late) > 5 else "")
                + f"; the node logs are in {net.root}"
            )
        time.sleep(POLL_INTERVAL)


def _tile_output(out: Path) -> bytes:
    """The tile the guest wrote to stdout, as `e31 results` saved it."""
    try:
        return (out / "stdout").read_bytes()
    except OSError as e:
        raise DemoError(f"`e31 results` left no readable stdout file in {out}: {e.strerror or e}") from None


def succeeded(row: dict[str, Any]) -> bool:
    """A job that is done and whose guest exited with status 0 (`e31 jobs --json` says so)."""
    return row.get("state") == "done" and row.get("succeeded") is True


def _assemble(
    data_dir: Path,
    jobs: dict[str, Tile],
    done: set[str],
    results_dir: Path,
    options: DemoOptions,
    events: Events,
    result: DemoResult,
) -> None:
    """Fetch each succeeded job's tile with `e31 results`, paste it, write the PNG (missing tiles black)."""
    clock = time.monotonic()
    mosaic = Mosaic(list(jobs.values()), WIDTH, HEIGHT)
    for job_id, tile in jobs.items():
        if job_id not in done:
            continue
        out = results_dir / f"tile{tile.index:03d}"
        called = e31("results", job_id, "--out", str(out), "--data-dir", str(data_dir))
        if called.code != 0:
            result.problems.append(
                f"fetching the output of {tile.name} (job {job_id}): {called.error_line()}"
            )
            continue
        try:
            mosaic.paste(tile.index, _tile_output(out))
        except (ImageError, DemoError) as e:
            result.problems.append(f"job {job_id}: {e}")
    from .png import RGB, write_png

    try:
        result.image = write_png(
            options.image, WIDTH, HEIGHT, colourise(mosaic.pixels), colour_type=RGB
        ).resolve()
    except OSError as e:
        result.problems.append(f"cannot write the image {options.image}: {e.strerror or e}")
        return
    tiles = (
        f"all {len(jobs)} tiles"
        if mosaic.complete
        else f"{len(mosaic.pasted)} of {len(jobs)} tiles, the rest left black"
    )
    events.step(f"wrote {shown(result.image)} ({WIDTH}x{HEIGHT}, {tiles}; {_since(clock)})")


def _audit(
    data_dir: Path,
    jobs: Mapping[str, Named],
    done: set[str],
    bundle: Path,
    names: dict[str, str],
    events: Events,
    result: DemoResult,
) -> None:
    clock = time.monotonic()
    for attempt in range(EXPORT_TRIES):  # a job's ack follows its end by up to MarketSettings.ack_batch_s
        if attempt:
            time.sleep(POLL_INTERVAL)
        called = e31_process(
            "receipts",
            "export",
            "--out",
            str(bundle),
            "--with-blobs",
            "--json",
            "--data-dir",
            str(data_dir),
            *(("--overwrite",) if attempt else ()),  # the bundle the try before wrote
            timeout=300.0,
        )
        if called.code != 0:
            result.problems.append(f"exporting the receipts failed: {called.error_line()}")
            return
        try:
            receipted, acked = bundle_jobs(bundle)
        except VerdictError as e:
            raise DemoError(str(e)) from None
        if not (done & receipted) - acked:
            break
    result.receipts = bundle.resolve()
    answer = _json(called, "the export")
    counts = answer if isinstance(answer, dict) else {}
    events.step(
        f"exported {_many(counts.get('envelopes'), 'signed envelope')} and "
        f"{_many(counts.get('blobs'), 'blob')} of {_many(counts.get('jobs'), 'job')} "
        f"to {shown(result.receipts)} ({_since(clock)})"
    )
    clock = time.monotonic()
    called = e31_process("audit", str(bundle), "--reexecute", "--json", timeout=600.0)
    if called.code not in (0, 1):
        result.problems.append(f"the audit could not run: {called.error_line()}")
        return
    report = _json(called, "the audit")
    if not isinstance(report, dict):
        raise DemoError("`e31 audit --json` printed something other than a JSON object")
    verdict = judge(report, {j: t.name for j, t in jobs.items()}, done, receipted, acked, names)
    result.verified, result.reexecuted, result.rows = verdict.verified, verdict.reexecuted, verdict.rows
    result.problems += verdict.problems
    result.notes = verdict.notes
    rerun = _many(report.get("reexecuted", 0), "job")
    if report.get("sound"):
        said = f"sound; {rerun} re-executed here with identical outputs and fuel"
    else:
        said = f"{_many(len(report.get('problems') or []), 'PROBLEM')} found ({rerun} re-executed)"
    events.step(f"audited the bundle: {said} ({_since(clock)})")


def shown(path: Path) -> str:
    """A path as the user should read it: relative when under the current directory."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _many(count: object, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{'?' if count is None else count} {noun}s"


def _since(clock: float) -> str:
    return f"{time.monotonic() - clock:.1f} s"


def _work_dir(keep: Path | None) -> tuple[Path, bool]:
    if keep is None:
        return Path(tempfile.mkdtemp(prefix="e31-demo-")), False
    if keep.exists() and (not keep.is_dir() or any(keep.iterdir())):
        raise DemoError(
            f"--keep {keep}: must be a new or empty directory (the demo never reuses data dirs)", code=2
        )
    try:
        keep.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DemoError(f"--keep {keep}: cannot create it: {e.strerror or e}", code=2) from None
    return keep.resolve(), True


@contextlib.contextmanager
def demo_network(
    options: DemoOptions, events: Events, result: DemoResult, work: Path, keep: bool, started: float
) -> Iterator[LocalNetwork]:
    """A LocalNetwork of `options.nodes` nodes under `work`, started, for one demo's steps (every
    workload's); it is stopped when they end, however they end. A DemoError or NetworkError is raised
    again as a DemoError naming where the node logs are. The work dir is removed at the end when the
    steps went well (result.ok, no problem stopping) or were interrupted (Ctrl-C), unless `keep`."""
    net = LocalNetwork(work, options.nodes)
    remove_work = False
    try:
        events.step(f"starting {options.nodes} node(s) in {shown(work)}")
        clock = time.monotonic()
        net.start(lambda text: events.step("  " + text))
        events.step(f"  the network is up ({_since(clock)})")
        yield net
        remove_work = result.ok and not keep
    except KeyboardInterrupt:
        remove_work = not keep
        raise
    except (DemoError, NetworkError) as e:
        text = str(e)
        if str(work) not in text:
            text += f" (the node logs are in {work}/NODE/{LOG_FILE})"
        raise DemoError(text) from None
    finally:
        try:
            events.step("stopping the network")
        finally:  # a Ctrl-C while the line is printed must not skip the stop and leave the nodes running
            result.problems += net.stop()
        result.wall_seconds = time.monotonic() - started
        if remove_work and not result.problems:
            shutil.rmtree(work, ignore_errors=True)
            result.work_dir = None


def run_demo(options: DemoOptions, events: Events) -> DemoResult:
    """Run the whole demo; the network is stopped before this returns or raises.

    The work dir (data dirs, fetched results) is removed at the end unless --keep names it, or something
    went wrong: then it stays for its logs, and DemoResult.work_dir (or the error message) names it. The
    bundle goes into --keep DIR, else next to the image, so it can be audited again afterwards.
    Raises DemoError or NetworkError for a failure that ends the demo early, KeyboardInterrupt on Ctrl-C.
    """
    options.check()
    started = time.monotonic()
    work, keep = _work_dir(options.keep)
    result = DemoResult(nodes=options.nodes, jobs=options.jobs, work_dir=work)
    bundle = work / BUNDLE_NAME if keep else options.image.with_name(options.image.stem + "-" + BUNDLE_NAME)
    with demo_network(options, events, result, work, keep, started) as net:
        names = {n.node_id: n.name for n in net.nodes}
        first = net.nodes[0]
        clock = time.monotonic()
        with _module() as module:
            jobs = _submit(first.data_dir, module, plan_tiles(options.jobs, WIDTH, HEIGHT), options.fuel)
        events.step(f"submitted {len(jobs)} Mandelbrot tile job(s) to node1 ({_since(clock)})")
        finished = _wait(net, jobs, options, events, result)
        done = {j for j, row in finished.items() if succeeded(row)}
        result.done = len(done)
        result.failed = [
            f"{jobs[j].name} (job {j}): {_why(row)}" for j, row in finished.items() if j not in done
        ]
        _assemble(first.data_dir, jobs, done, work / "results", options, events, result)
        _audit(first.data_dir, jobs, done, bundle, names, events, result)
    return result
