"""The files a submission names, and the files the node writes for a request, under hostile shapes.

The CLI side: `e31 submit --batch` reads only a regular file, at most batch_file.MAX_BATCH_BYTES, never
blocking on a FIFO or reading a device without end, and parses each line with a depth limit. The API
side, on a real node process: the module, input and stdin paths of POST /v1/jobs and /v1/batches are
read only from regular files whose last component is not a symbolic link, and results (POST
/v1/jobs/{id}/results) and bundles (POST /v1/receipts/export) are never written through a link nor over
an existing file unless the request asks for overwrite. Real FIFOs, symlinks, sockets and /dev/zero.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e31.node.api.client import ApiError
from e31.node.cli import batch_file
from e31.node.cli.main import CliError
from e31.node.cli.submit import add_arguments, batch_body, request_body
from test_jobs_e2e import ROOT, Node

ECHO = ROOT / "sandbox" / "workloads" / "echo.wasm"
MANDELBROT = ROOT / "sandbox" / "workloads" / "mandelbrot.wasm"


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def _e31(*argv: str, cwd: Path, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """`e31 ARGV` against a data dir with no node, under a 1 GiB address-space limit (so a read without
    end fails fast instead of filling the machine) and a timeout (so a hang fails the test)."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    env = {**os.environ, "E31_DATA_DIR": str(cwd / "no-node")}
    return subprocess.run(
        [sys.executable, "-m", "e31.node", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        cwd=cwd,
        env=env,
        preexec_fn=limit,
    )


def _one_usage_line(done: subprocess.CompletedProcess[str], expect: str) -> None:
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("e31: error:"), done.stderr[-2000:]
    assert expect in lines[0], lines[0]
    assert "Traceback" not in done.stderr


# --- the CLI: batch files ---------------------------------------------------------------------------------


def test_submit_batch_from_dev_zero_is_refused_at_once(tmp_path: Path) -> None:
    started = time.monotonic()
    done = _e31("submit", str(ECHO), "--batch", "/dev/zero", cwd=tmp_path)
    _one_usage_line(done, "--batch /dev/zero: a character device, not a regular file")
    assert time.monotonic() - started < 30
    # the body alone, in a child under the same memory limit (a read without end must not happen here)
    code = (
        "import argparse, resource\n"
        "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
        "from e31.node.cli.main import CliError\n"
        "from e31.node.cli.submit import add_arguments, batch_body\n"
        "p = argparse.ArgumentParser(); add_arguments(p)\n"
        "try:\n"
        f"    batch_body(p.parse_args([{str(ECHO)!r}, '--batch', '/dev/zero']), 1000.0)\n"
        "except CliError as e:\n"
        "    print(e.exit_code, e)\n"
    )
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert child.stdout.strip() == "2 --batch /dev/zero: a character device, not a regular file", (
        child.stdout + child.stderr[-2000:]
    )


def test_submit_batch_from_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "jobs.jsonl"
    os.mkfifo(fifo)
    done = _e31("submit", str(ECHO), "--batch", str(fifo), cwd=tmp_path, timeout=30)
    _one_usage_line(done, f"--batch {fifo}: a FIFO, not a regular file")
    # in process too: a read that blocked would hold this thread until a writer came
    errors: list[BaseException] = []

    def body() -> None:
        try:
            batch_body(_args(str(ECHO), "--batch", str(fifo)), 1000.0)
        except BaseException as e:
            errors.append(e)

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    thread.join(10)
    if thread.is_alive():
        with open(fifo, "w"):  # release the blocked reader, then fail
            pass
        thread.join(10)
        pytest.fail("batch_body blocked on a FIFO")
    assert len(errors) == 1 and isinstance(errors[0], CliError) and "a FIFO" in str(errors[0])


def test_batch_files_that_are_not_regular_files_are_refused(tmp_path: Path) -> None:
    sock_path = tmp_path / "s.jsonl"
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock_path))
    try:
        for path, kind in ((tmp_path, "a directory"), (sock_path, "a socket")):
            with pytest.raises(CliError, match=f"{kind}, not a regular file"):
                batch_body(_args(str(ECHO), "--batch", str(path)), 1000.0)
    finally:
        server.close()
    with pytest.raises(CliError, match="no such file"):
        batch_body(_args(str(ECHO), "--batch", str(tmp_path / "missing.jsonl")), 1000.0)


def test_a_batch_file_over_the_cap_is_refused_by_its_size(tmp_path: Path) -> None:
    big = tmp_path / "big.jsonl"
    with open(big, "wb") as f:
        f.truncate(batch_file.MAX_BATCH_BYTES + 1)  # sparse: nothing is written
    done = _e31("submit", str(ECHO), "--batch", str(big), cwd=tmp_path)
    _one_usage_line(done, f"more than the {batch_file.MAX_BATCH_BYTES} allowed")
    exact = tmp_path / "exact.jsonl"
    line = b'{"args": ["x"]}\n'
    exact.write_bytes(line * (batch_file.MAX_BATCH_BYTES // len(line)))
    jobs = batch_body(_args(str(ECHO), "--batch", str(exact)), 1000.0)["jobs"]
    assert isinstance(jobs, list) and len(jobs) == batch_file.MAX_BATCH_BYTES // len(line)


def test_the_batch_cap_is_the_local_api_body_cap() -> None:
    from e31.node.api.server import ControlLimits

    assert ControlLimits().max_body == batch_file.MAX_BATCH_BYTES


def test_a_batch_file_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"args": ["\xff"]}\n')
    with pytest.raises(CliError, match="not UTF-8 text"):
        batch_body(_args(str(ECHO), "--batch", str(bad)), 1000.0)


@pytest.mark.parametrize("depth", [batch_file.MAX_LINE_DEPTH + 1, 1000, 100_000])
def test_a_deeply_nested_line_is_an_error_for_that_line(tmp_path: Path, depth: int) -> None:
    text = '{"args": ["1"]}\n' + '{"args": ' + "[" * depth + "]" * depth + "}\n"
    with pytest.raises(batch_file.BatchError) as info:
        batch_file.parse_lines(text, "f.jsonl")
    assert str(info.value) == f"f.jsonl:2: nested deeper than {batch_file.MAX_LINE_DEPTH} levels"


def test_a_deep_line_through_the_command_is_one_line(tmp_path: Path) -> None:
    deep = tmp_path / "deep.jsonl"
    deep.write_text('{"args": ["1"]}\n' + "[" * 100_000 + "]" * 100_000 + "\n")
    done = _e31("submit", str(ECHO), "--batch", str(deep), cwd=tmp_path)
    _one_usage_line(done, f"deep.jsonl:2: nested deeper than {batch_file.MAX_LINE_DEPTH} levels")


def test_lines_within_the_depth_limit_and_brackets_in_strings_are_fine() -> None:
    text = json.dumps({"args": ["[" * 100, "{" * 100], "env": [["K", "]]]"]]}) + "\n"
    assert batch_file.parse_lines(text, "f.jsonl") == [
        {"args": ["[" * 100, "{" * 100], "env": [["K", "]]]"]]}
    ]


def test_a_batch_file_may_be_a_link_read_as_the_user(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (real / "jobs.jsonl").write_text('{"stdin": "in.txt"}\n')
    (tmp_path / "link.jsonl").symlink_to(real / "jobs.jsonl")
    body = batch_body(_args(str(ECHO), "--batch", str(tmp_path / "link.jsonl")), 1000.0)
    assert body["jobs"] == [{"stdin": str(tmp_path / "in.txt")}]  # relative to the link's directory


def test_the_single_job_body_names_paths_as_given_for_the_node_to_check(tmp_path: Path) -> None:
    (tmp_path / "link.wasm").symlink_to(ECHO)
    body = request_body(_args(str(tmp_path / "link.wasm"), "--stdin", "/dev/zero"), 1000.0)
    assert body["module"] == str(tmp_path / "link.wasm") and body["stdin"] == "/dev/zero"


# --- the node: files a request names --------------------------------------------------------------------


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Node, Path]]:
    base = tmp_path_factory.mktemp("files")
    shutil.copy(ECHO, base / "echo.wasm")
    shutil.copy(MANDELBROT, base / "mandelbrot.wasm")
    n = Node(base / "node")
    try:
        yield n, base
    finally:
        n.stop()


def _job(base: Path, **fields: Any) -> dict[str, Any]:
    return {"module": str(base / "echo.wasm"), "args": [], "limits": {}, **fields}


def _refused(n: Node, path: str, body: dict[str, Any]) -> ApiError:
    with pytest.raises(ApiError) as info:
        n.api.request("POST", path, body)
    assert 400 <= info.value.status < 500, info.value
    return info.value


def _hostile(base: Path) -> dict[str, Path]:
    """Paths that are not plain regular files, made once per test directory."""
    d = base / "hostile"
    if not d.exists():
        d.mkdir()
        (d / "data.txt").write_text("data\n")
        (d / "link.txt").symlink_to(d / "data.txt")
        (d / "link.wasm").symlink_to(base / "echo.wasm")
        (d / "dangling").symlink_to(d / "nothing")
        os.mkfifo(d / "fifo")
        (d / "dir").mkdir()
    return {
        "link": d / "link.txt",
        "module link": d / "link.wasm",
        "dangling": d / "dangling",
        "fifo": d / "fifo",
        "dir": d / "dir",
        "zero": Path("/dev/zero"),
    }


EXPECT = {
    "link": "a symbolic link",
    "module link": "a symbolic link",
    "dangling": "a symbolic link",
    "fifo": "a FIFO",
    "dir": "a directory",
    "zero": "a character device",
}


def test_inputs_stdin_and_modules_that_are_links_or_not_regular_files_are_refused(
    node: tuple[Node, Path],
) -> None:
    n, base = node
    before = len(n.api.get("/v1/jobs"))
    for what, path in _hostile(base).items():
        started = time.monotonic()
        e = _refused(n, "/v1/jobs", _job(base, inputs=[{"name": "x", "path": str(path)}]))
        assert f"input 'x' {path}: {EXPECT[what]}" in e.message, e.message
        e = _refused(n, "/v1/jobs", _job(base, stdin=str(path)))
        assert f"stdin {path}: {EXPECT[what]}" in e.message, e.message
        e = _refused(n, "/v1/jobs", _job(base, module=str(path)))
        assert f"module {path}: {EXPECT[what]}" in e.message, e.message
        e = _refused(
            n, "/v1/batches", {"module": str(base / "echo.wasm"), "jobs": [{}, {"stdin": str(path)}]}
        )
        assert e.message.startswith("job 2: stdin") and EXPECT[what] in e.message, e.message
        e = _refused(n, "/v1/batches", {"module": str(path), "jobs": [{}]})
        assert EXPECT[what] in e.message, e.message
        assert time.monotonic() - started < 20  # nothing blocked on the FIFO or read /dev/zero
    assert len(n.api.get("/v1/jobs")) == before  # nothing stored


def test_a_link_is_refused_even_after_the_real_file_was_accepted(node: tuple[Node, Path]) -> None:
    n, base = node
    module = base / "swap.wasm"
    shutil.copy(ECHO, module)
    n.api.request("POST", "/v1/jobs", _job(base, module=str(module), args=["x"]))
    module.unlink()
    module.symlink_to(base / "echo.wasm")  # the same bytes, but now through a link
    e = _refused(n, "/v1/jobs", _job(base, module=str(module), args=["x"]))
    assert "a symbolic link" in e.message


def test_directories_above_the_file_may_be_links(node: tuple[Node, Path]) -> None:
    n, base = node
    real = base / "real-dir"
    real.mkdir()
    (real / "in.txt").write_text("through a linked directory\n")
    (base / "linked-dir").symlink_to(real)
    job = n.api.request("POST", "/v1/jobs", _job(base, stdin=str(base / "linked-dir" / "in.txt")))["job_id"]
    assert n.api.get(f"/v1/jobs/{job}/wait?timeout=60")["state"] == "done"


# --- the node: files it writes ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def done_job(node: tuple[Node, Path]) -> str:
    n, base = node
    body = {
        "module": str(base / "mandelbrot.wasm"),
        "args": ["8", "8", "0", "0", "8", "8", "10", "/output/tile.pgm"],
    }
    job = n.api.request("POST", "/v1/jobs", body)["job_id"]
    doc = n.api.get(f"/v1/jobs/{job}/wait?timeout=60")
    assert doc["state"] == "done" and doc["receipt"]["outputs"] == ["tile.pgm"], doc
    return str(job)


def _results(n: Node, job: str, out: Path, **extra: Any) -> Any:
    return n.api.request("POST", f"/v1/jobs/{job}/results", {"out": str(out), **extra})


def test_results_are_written_again_only_when_unchanged_or_asked(
    node: tuple[Node, Path], done_job: str
) -> None:
    n, base = node
    out = base / "results"
    files = _results(n, done_job, out)["files"]
    assert files == ["stdout", "stderr", "output/tile.pgm", "receipt"]
    first = {f: (out / f).read_bytes() for f in files}
    assert _results(n, done_job, out)["files"] == files  # the same bytes again: nothing to refuse
    (out / "output" / "tile.pgm").write_bytes(b"mine")
    with pytest.raises(ApiError) as info:
        _results(n, done_job, out)
    assert info.value.status == 409 and "tile.pgm exists" in info.value.message
    assert (out / "output" / "tile.pgm").read_bytes() == b"mine"
    assert _results(n, done_job, out, overwrite=True)["files"] == files
    assert {f: (out / f).read_bytes() for f in files} == first
    with pytest.raises(ApiError) as info:
        _results(n, done_job, out, overwrite="yes")
    assert info.value.status == 400


def test_results_never_follow_a_link_planted_in_the_destination(
    node: tuple[Node, Path], done_job: str
) -> None:
    n, base = node
    victim = base / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep me\n")
    # a link where a result file goes
    out = base / "planted-file"
    out.mkdir()
    (out / "stdout").symlink_to(victim / "precious")
    with pytest.raises(ApiError) as info:
        _results(n, done_job, out)
    assert info.value.status == 409 and "stdout exists" in info.value.message
    assert (victim / "precious").read_text() == "keep me\n"
    _results(n, done_job, out, overwrite=True)  # replaces the link itself, not what it points to
    assert not (out / "stdout").is_symlink() and (victim / "precious").read_text() == "keep me\n"
    # a link where a result directory goes
    out = base / "planted-dir"
    out.mkdir()
    (out / "output").symlink_to(victim)
    for extra in ({}, {"overwrite": True}):
        with pytest.raises(ApiError) as info:
            _results(n, done_job, out, **extra)
        assert info.value.status == 400 and "output is a symbolic link" in info.value.message
    assert sorted(p.name for p in victim.iterdir()) == ["precious"]
    # the destination itself a link
    (base / "planted-out").symlink_to(victim)
    with pytest.raises(ApiError) as info:
        _results(n, done_job, base / "planted-out")
    assert info.value.status == 400 and "is a symbolic link" in info.value.message
    assert sorted(p.name for p in victim.iterdir()) == ["precious"]
    assert "Traceback" not in n.log.read_text()


def test_an_export_is_not_written_over_a_file_or_through_a_link_unless_asked(
    node: tuple[Node, Path], done_job: str
) -> None:
    n, base = node
    out = base / "bundle.e31"
    body: dict[str, Any] = {"jobs": [done_job], "with_blobs": False, "out": str(out)}
    assert n.api.request("POST", "/v1/receipts/export", body)["jobs"] == 1
    with pytest.raises(ApiError) as info:
        n.api.request("POST", "/v1/receipts/export", body)
    assert info.value.status == 409 and "exists" in info.value.message
    replaced = n.api.request("POST", "/v1/receipts/export", {**body, "overwrite": True})
    assert out.stat().st_size == replaced["bytes"]  # the bundle may have grown (a proof came in)
    victim = base / "export-victim"
    victim.write_text("keep me\n")
    link = base / "link.e31"
    link.symlink_to(victim)
    with pytest.raises(ApiError) as info:
        n.api.request("POST", "/v1/receipts/export", {**body, "out": str(link)})
    assert info.value.status == 409
    assert victim.read_text() == "keep me\n"
    replaced = n.api.request("POST", "/v1/receipts/export", {**body, "out": str(link), "overwrite": True})
    assert victim.read_text() == "keep me\n" and not link.is_symlink()
    assert link.stat().st_size == replaced["bytes"]
    assert not [p for p in base.iterdir() if p.name.startswith(".") and "bundle" in p.name]
