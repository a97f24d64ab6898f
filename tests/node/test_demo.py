"""`e31 demo`: the real thing end to end (node processes, jobs, results, export, audit), its failure paths,
and the pure parts it is built from (tile plan, PGM parsing, mosaic, colours, progress and table text)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from e31.node.demo.command import format_nodes, format_progress
from e31.node.demo.image import (
    HEIGHT,
    MAX_ITER,
    WIDTH,
    ImageError,
    Mosaic,
    Tile,
    colourise,
    grid,
    palette,
    parse_pgm,
    plan_tiles,
)
from e31.node.demo.net import LocalNetwork, NetworkError, process_tree_rss
from e31.node.demo.run import DemoOptions, DemoResult, demo_network, fuel_for
from e31.node.demo.verdict import NodeRow, judge
from test_png import decode

WORKLOADS = Path(__file__).resolve().parents[2] / "sandbox" / "workloads"


def demo(*args: str, cwd: Path, timeout: float = 240.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "e31.node", "demo", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


# --- the real demo ---------------------------------------------------------------------------------


def test_the_demo_runs_jobs_across_three_nodes_and_every_one_verifies(tmp_path: Path) -> None:
    keep = tmp_path / "kept"
    done = demo("--nodes", "3", "--jobs", "6", "--json", "--keep", str(keep), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    report = json.loads(done.stdout)
    assert report["jobs"] == report["verified"] == 6
    assert report["failed"] == [] and report["problems"] == []
    assert report["reexecuted"] >= 1
    image = Path(report["image"])
    assert image == (tmp_path / "e31-demo.png").resolve()
    width, height, colour, pixels = decode(image.read_bytes())
    assert (width, height, colour) == (WIDTH, HEIGHT, 2)
    assert pixels[:3] != b"\x00\x00\x00"  # the top-left corner is far outside the set: coloured
    bundle = Path(report["receipts"])
    assert bundle.is_file() and bundle.parent == keep.resolve() and bundle.stat().st_size > 0
    rows = report["per_node"]
    assert [r["node"] for r in rows] == ["node1", "node2", "node3"]
    assert sum(r["jobs"] for r in rows) == 6
    assert all(r["fuel"] > 0 and r["compute_seconds"] > 0 for r in rows if r["jobs"])
    for name in ("node1", "node2", "node3"):
        data_dir = keep / name
        assert (data_dir / "node.log").is_file()
        assert not (data_dir / "api.json").exists()  # each node stopped cleanly and removed it
        assert "Traceback" not in (data_dir / "node.log").read_text()


def test_the_table_form_names_every_node(tmp_path: Path) -> None:
    done = demo("--nodes", "2", "--jobs", "2", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "NODE ID" in done.stdout and "node1" in done.stdout and "node2" in done.stdout
    assert "all 2 jobs verified" in done.stdout
    assert (tmp_path / "e31-demo.png").is_file()
    assert (tmp_path / "e31-demo-receipts.e31bundle").is_file()
    assert not [line for line in done.stdout.splitlines() if line.startswith("data dirs")]  # removed


# --- failure paths -----------------------------------------------------------------------------------


def test_a_failed_job_is_named_and_the_demo_fails(tmp_path: Path) -> None:
    keep = tmp_path / "kept"
    done = demo(
        "--nodes", "2", "--jobs", "2", "--job-fuel", "1000", "--json", "--keep", str(keep), cwd=tmp_path
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    report = json.loads(done.stdout)
    assert report["ok"] is False and report["jobs"] == 2 and report["verified"] == 0 and report["done"] == 0
    assert len(report["failed"]) == 2
    for line, tile in zip(sorted(report["failed"]), plan_tiles(2), strict=True):
        assert line.startswith(f"{tile.name} (job ")
        assert "fuel" in line  # the outcome, as the submitter's node tells it
    assert report["work_dir"] == str(keep.resolve())  # the logs stay
    width, height, _, pixels = decode(Path(report["image"]).read_bytes())
    assert (width, height) == (WIDTH, HEIGHT) and set(pixels) == {0}  # no tile to paste: all black


@pytest.mark.parametrize(
    "args", [("--nodes", "0"), ("--jobs", "0"), ("--jobs", "257"), ("--nodes", "x"), ("--nodes", "17")]
)
def test_bad_counts_are_usage_errors(tmp_path: Path, args: tuple[str, ...]) -> None:
    done = demo(*args, cwd=tmp_path, timeout=30.0)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith(f"e31 demo: error: argument {args[0]}")
    assert "Traceback" not in done.stderr
    assert not list(tmp_path.iterdir())


def test_keep_refuses_a_directory_in_use(tmp_path: Path) -> None:
    keep = tmp_path / "busy"
    keep.mkdir()
    (keep / "precious").write_text("mine")
    done = demo("--keep", str(keep), "--jobs", "1", cwd=tmp_path, timeout=30.0)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"e31: error: --keep {keep}: must be a new or empty directory (the demo never reuses data dirs)"
    ]
    assert [p.name for p in keep.iterdir()] == ["precious"]


def test_a_node_that_cannot_start_is_named_with_its_log(tmp_path: Path) -> None:
    net = LocalNetwork(tmp_path, 2, extra_args=("--cores", "-1"))
    with pytest.raises(NetworkError) as caught:
        net.start()
    net.stop()
    text = str(caught.value)
    assert text.startswith("node1: exited with status 1 while starting; its log is ")
    assert str(tmp_path / "node1" / "node.log") in text
    assert "--cores" in text  # the tail of the log says why
    assert [n.name for n in net.nodes] == ["node1", "node2"]
    assert all(n.process.poll() is not None for n in net.nodes)  # stop() leaves nothing running


def test_wait_mesh_returns_once_every_node_links_to_every_other(tmp_path: Path) -> None:
    """`start` waits for the links to the first node only; `wait_mesh` (what benchmarks wait for) for
    every pair, read back here through each node's own API."""
    net = LocalNetwork(tmp_path, 4)
    try:
        with pytest.raises(ValueError, match="not started"):
            net.wait_mesh()
        net.start()
        net.wait_mesh()
        ids = {n.node_id for n in net.nodes}
        for node in net.nodes:
            assert net.connected(node) >= ids - {node.node_id}, node.name
    finally:
        net.stop()


def test_wait_mesh_refuses_more_nodes_than_a_node_dials(tmp_path: Path) -> None:
    net = LocalNetwork(tmp_path, 10)  # a node dials up to 8 peers (PeerSettings.target_degree)
    with pytest.raises(ValueError, match="at most 8 peers"):
        net.wait_mesh()
    assert net.nodes == []  # refused before anything was asked of a node


@contextlib.contextmanager
def ctrl_c_not_ignored() -> Iterator[None]:
    """Children started inside get Ctrl-C's default action, whatever this process does with SIGINT.

    A shell script's background job (`pytest ... &`, and nohup) starts with SIGINT ignored; an ignored
    signal stays ignored across fork and exec, and Python then installs no KeyboardInterrupt handler,
    as a program run that way should. A demo started from such a pytest ignored the test's SIGINT and
    finished with status 0. A handler (not SIG_IGN) here becomes SIG_DFL in the child at exec."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_child_gets_ctrl_c_even_when_pytest_ignores_it() -> None:
    code = "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as in a background job of a script
    try:
        ignored = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        with ctrl_c_not_ignored():
            child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN  # put back as it was
    finally:
        signal.signal(signal.SIGINT, previous)
    assert (ignored.stdout.strip(), child.stdout.strip()) == ("False", "True")


@pytest.mark.parametrize(
    ("signum", "code", "said"), [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")]
)
def test_a_signal_stops_every_node(tmp_path: Path, signum: int, code: int, said: str) -> None:
    keep = tmp_path / "kept"
    with ctrl_c_not_ignored():
        proc = subprocess.Popen(
            [sys.executable, "-m", "e31.node", "demo", "--nodes", "2", "--jobs", "2", "--keep", str(keep)],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            stdin=subprocess.DEVNULL,
        )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "nodes linked" in line:
                break
        pids = [json.loads((keep / n / "api.json").read_text())["pid"] for n in ("node1", "node2")]
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code
    assert f"{said}; the network is stopped" in err and "Traceback" not in err
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


class CtrlCWhile:
    """The demo's narration, with a Ctrl-C while it prints the step that starts with `text`."""

    def __init__(self, text: str) -> None:
        self.text, self.steps = text, list[str]()

    def step(self, text: str) -> None:
        self.steps.append(text)
        if text.startswith(self.text):
            raise KeyboardInterrupt

    def progress(self, done: int, failed: int, total: int, elapsed: float) -> None:
        pass


def test_a_ctrl_c_while_the_stop_is_announced_still_stops_every_node(tmp_path: Path) -> None:
    events, result = CtrlCWhile("stopping the network"), DemoResult(nodes=2, jobs=0)
    started: list[LocalNetwork] = []
    try:
        with (
            pytest.raises(KeyboardInterrupt),
            demo_network(DemoOptions(nodes=2), events, result, tmp_path, True, time.monotonic()) as net,
        ):
            started.append(net)  # the steps went well; the Ctrl-C comes as the network is being stopped
        running = [n.name for n in net.nodes if n.process.poll() is None or n.stopped_with is None]
    finally:
        for network in started:
            network.stop()  # whatever the outcome, no node outlives the test
    assert events.steps[-1] == "stopping the network"
    assert [n.name for n in net.nodes] == ["node1", "node2"]
    assert running == [] and result.problems == []


# --- the pieces --------------------------------------------------------------------------------------


@pytest.mark.parametrize("count", [1, 2, 6, 7, 24, 100, 256])
def test_the_tiles_cover_the_image_exactly_once(count: int) -> None:
    tiles = plan_tiles(count)
    assert [t.index for t in tiles] == list(range(count))
    covered = bytearray(WIDTH * HEIGHT)
    for t in tiles:
        for y in range(t.y, t.y + t.height):
            covered[y * WIDTH + t.x : y * WIDTH + t.x + t.width] = bytes(
                b + 1 for b in covered[y * WIDTH + t.x : y * WIDTH + t.x + t.width]
            )
    assert set(covered) == {1}


def test_the_grid_prefers_square_tiles() -> None:
    assert grid(24) == (6, 4)
    assert grid(6) == (3, 2)
    assert grid(7) == (7, 1)
    assert grid(1) == (1, 1)
    with pytest.raises(ImageError):
        grid(0)
    with pytest.raises(ImageError):
        grid(257)


def test_guest_args_and_fuel() -> None:
    tile = Tile(3, 560, 400, 10, 20)
    assert tile.guest_args() == [str(WIDTH), str(HEIGHT), "560", "400", "10", "20", str(MAX_ITER)]
    # Every pixel inside the set costs about 31 fuel per iteration (measured): the budget covers it.
    assert fuel_for(tile) > 10 * 20 * MAX_ITER * 31


def test_parse_pgm() -> None:
    assert parse_pgm(b"P5\n2 1\n255\n\x01\x02") == (2, 1, b"\x01\x02")
    assert parse_pgm(b"P5 # made by hand\n2 # w\n 1 255 \x01\x02") == (2, 1, b"\x01\x02")
    assert parse_pgm(b"P5\n1 1\n255\n\n") == (1, 1, b"\n")  # pixel bytes may look like whitespace
    for bad, match in [
        (b"P6\n1 1\n255\n\x00", "P5"),
        (b"P5\n1 1\n65535\n\x00\x00", "8-bit"),
        (b"P5\n2 2\n255\n\x00", "expected 2x2"),
        (b"P5\n1", "ends early"),
        (b"P5\n-1 1\n255\n", "decimal"),
        (b"", "ends early"),
        (b"P5\n0 1\n255\n", "positive"),
    ]:
        with pytest.raises(ImageError, match=match):
            parse_pgm(bad)


def test_the_mosaic_places_tiles_and_refuses_what_does_not_fit() -> None:
    tiles = plan_tiles(4, 4, 2)
    assert [(t.x, t.y, t.width, t.height) for t in tiles] == [
        (0, 0, 2, 1),
        (2, 0, 2, 1),
        (0, 1, 2, 1),
        (2, 1, 2, 1),
    ]
    mosaic = Mosaic(tiles, 4, 2)
    for t in tiles:
        mosaic.paste(t.index, b"P5\n2 1\n255\n" + bytes([t.index + 1, t.index + 11]))
    assert mosaic.complete and not mosaic.missing()
    assert bytes(mosaic.pixels) == bytes([1, 11, 2, 12, 3, 13, 4, 14])
    with pytest.raises(ImageError, match="already pasted"):
        mosaic.paste(0, b"P5\n2 1\n255\n\x00\x00")
    with pytest.raises(ImageError, match="no tile 9"):
        mosaic.paste(9, b"")
    fresh = Mosaic(tiles, 4, 2)
    with pytest.raises(ImageError, match=r"tile 1 at \(2,0\) 2x1: the job's output is 1x2"):
        fresh.paste(1, b"P5\n1 2\n255\n\x00\x00")
    assert [t.index for t in fresh.missing()] == [0, 1, 2, 3]


def test_the_tiles_of_real_runs_paste_into_the_full_image() -> None:
    """The tile plan agrees with the guest's coordinates: six tile jobs equal one whole-image job."""
    from e31.sandbox.job import JobSpec
    from e31.sandbox.runner import run

    module = (WORKLOADS / "mandelbrot.wasm").read_bytes()
    width, height = 70, 50

    def render(args: list[str]) -> bytes:
        result = run(JobSpec(module=module, args=tuple(args)))
        assert result.status == "exited" and result.exit_code == 0, result.message
        return result.stdout

    tiles = plan_tiles(6, width, height)
    mosaic = Mosaic(tiles, width, height)
    for t in tiles:
        mosaic.paste(t.index, render(t.guest_args(width, height)))
    whole = render([str(width), str(height), "0", "0", str(width), str(height), str(MAX_ITER)])
    assert parse_pgm(whole) == (width, height, bytes(mosaic.pixels))
    assert 0 in mosaic.pixels and len(set(mosaic.pixels)) > 10  # the set and its bands are there


def test_colours() -> None:
    colours = palette()
    assert len(colours) == 256 and colours[0] == (0, 0, 0)
    assert all(0 <= c <= 255 for rgb in colours for c in rgb)
    assert len(set(colours[1:40])) > 30  # neighbouring bands are told apart
    assert colourise(b"\x00\x05") == bytes([0, 0, 0, *colours[5]])


A, B, C = "a" * 64, "b" * 64, "c" * 64
LABELS = {A: "tile 0", B: "tile 1", C: "tile 2"}
NAMES = {"e31nx": "node1", "e31ny": "node2", "e31nz": "node10"}


def audit_report(problems: Sequence[dict[str, str]] = (), reexecuted: int = 3) -> dict[str, object]:
    return {
        "sound": not problems,
        "reexecuted": reexecuted,
        "problems": list(problems),
        "notes": [{"job": A, "node": "e31nx", "check": "inclusion", "what": "no proof"}],
        "nodes": [
            {"node": "e31ny", "jobs": 2, "fuel": 500, "compute_ms": 1500, "queue_wait_ms": 250},
            {"node": "e31nz", "jobs": 1, "fuel": 7, "compute_ms": 2, "queue_wait_ms": 0},
        ],
    }


def test_the_verdict_counts_a_job_only_when_everything_about_it_holds() -> None:
    everything = {A, B, C}
    sound = judge(audit_report(), LABELS, everything, everything, everything, NAMES)
    assert (sound.verified, sound.reexecuted, sound.problems) == (3, 3, [])
    assert sound.notes == [f"tile 0 (job {A}): inclusion: no proof"]
    assert [(r.name, r.jobs, r.fuel, r.compute_seconds, r.queue_wait_seconds) for r in sound.rows] == [
        ("node1", 0, 0, 0.0, 0.0),
        ("node2", 2, 500, 1.5, 0.25),
        ("node10", 1, 7, 0.002, 0.0),
    ]

    bad = judge(
        audit_report([{"job": B, "node": "e31ny", "check": "reexecute", "what": "fuel differs"}]),
        LABELS,
        everything,
        everything - {C},
        everything,
        NAMES,
    )
    assert bad.verified == 1  # A only: B has a problem, C no receipt
    assert bad.problems == [
        f"audit: tile 1 (job {B}): reexecute: fuel differs",
        f"tile 2 (job {C}): no receipt in the bundle",
    ]

    unacked = judge(audit_report(), LABELS, everything, everything, {A}, NAMES)
    assert unacked.verified == 1
    assert unacked.problems == [
        f"tile 1 (job {B}): the receipt was never acknowledged",
        f"tile 2 (job {C}): the receipt was never acknowledged",
    ]

    skipped = judge(audit_report(reexecuted=2), LABELS, everything, everything, everything, NAMES)
    assert skipped.verified == 0
    assert skipped.problems == [
        f"the audit re-executed only 2 of 3 jobs; its first note: tile 0 (job {A}): inclusion: no proof"
    ]


def test_progress_and_table_text() -> None:
    assert format_progress(0, 0, 24, 0.0) == "[------------------------] 0/24 jobs  0.0 jobs/s  ETA ?"
    assert format_progress(6, 0, 24, 2.0) == "[######------------------] 6/24 jobs  3.0 jobs/s  ETA 6s"
    assert format_progress(23, 1, 24, 8.0) == (
        "[########################] 24/24 jobs, 1 failed  3.0 jobs/s  done"
    )
    rows = [NodeRow("node1", "e31n" + "a" * 52, 5, 123456789, 0.5, 0.25), NodeRow("node2", "e31nb", 0)]
    assert format_nodes(rows).splitlines() == [
        "NODE   NODE ID           JOBS         FUEL  COMPUTE  QUEUE WAIT",
        "node1  e31naaaaaaaaaaa…     5  123,456,789  0.500 s     0.250 s",
        "node2  e31nb                0            0  0.000 s     0.000 s",
    ]


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="needs Linux /proc")
def test_process_tree_rss_counts_children() -> None:
    child = subprocess.Popen([sys.executable, "-c", "b = bytearray(64 << 20); import time; time.sleep(30)"])
    try:
        deadline = time.monotonic() + 20
        while (process_tree_rss([child.pid]) or 0) < 64 << 20:
            assert time.monotonic() < deadline, "the child's 64 MiB never showed"
            time.sleep(0.05)
        ours = process_tree_rss([os.getpid()])
        assert ours is not None and ours >= (64 << 20) + (1 << 20)  # this process and its child
        assert process_tree_rss([]) == 0
    finally:
        child.kill()
        child.wait()
