"""The Python client (e31.client) against a real `e31 node run` process on 127.0.0.1: a sweep with
map, a wait with progress, results to a folder and in memory, prefixes and batch ids, cancel, the
trio flavour, and each error as its typed exception."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from e31.client import (
    AsyncClient,
    BadId,
    Client,
    Exists,
    InvalidRequest,
    NodeNotRunning,
    NotFinished,
    NotFound,
    OptionError,
    Progress,
)
from test_jobs_e2e import MONTECARLO, Node

ECHO = MONTECARLO.with_name("echo.wasm")


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    n = Node(tmp_path_factory.mktemp("client") / "a")
    try:
        yield n
    finally:
        n.stop()


def test_a_sweep_in_five_lines(node: Node, tmp_path: Path) -> None:
    seen: list[Progress] = []
    client = Client(node.data_dir)
    batch = client.map(MONTECARLO, [[seed, 20_000] for seed in range(4)], deadline="10m")
    jobs = client.wait(batch.batch_id, progress=seen.append)
    client.results(batch.batch_id, out=tmp_path / "sweep")

    assert [j.job_id for j in jobs] == list(batch.job_ids)
    assert all(j.succeeded and j.ended for j in jobs), [j.why for j in jobs]
    assert seen and seen[-1].done and seen[-1].total == 4 and seen[-1].states == {"done": 4}
    assert all(0 <= p.ended <= p.total for p in seen)
    index = json.loads((tmp_path / "sweep" / "index.json").read_text())
    assert [e["job_id"] for e in index["jobs"]] == list(batch.job_ids)
    for number, entry in enumerate(index["jobs"], 1):
        folder = tmp_path / "sweep" / entry["dir"]
        assert entry["dir"].startswith(f"{number:04d}-") and entry["succeeded"]
        assert entry["args"] == [str(number - 1), "20000"]
        assert (folder / "stdout").read_bytes() and (folder / "receipt").exists()
    # the same results in memory, and one job by a prefix of its id
    held = client.results(batch.batch_id)
    assert [r.stdout for r in held] == [
        (tmp_path / "sweep" / e["dir"] / "stdout").read_bytes() for e in index["jobs"]
    ]
    one = client.job(batch.job_ids[2][:10])
    assert one.job_id == batch.job_ids[2] and one.args == ("2", "20000")
    assert [j.job_id for j in client.jobs(batch=batch.batch_id, sort="-id", limit=2)] == sorted(
        batch.job_ids
    )[::-1][:2]
    assert {j.job_id for j in client.jobs(state="done")} >= set(batch.job_ids)


def test_submit_one_job_with_inputs_and_read_its_result(node: Node, tmp_path: Path) -> None:
    stdin = tmp_path / "in.txt"
    stdin.write_text("hello from stdin\n")
    with Client(node.data_dir) as client:
        job_id = client.submit(ECHO, stdin=stdin, fuel="1G", memory="64MiB", timeout="30s", deadline=600)
        (job,) = client.wait(job_id[:8])
        assert job.succeeded, job.why
        (result,) = client.results(job_id)
        assert result.stdout == b"hello from stdin\n" and result.directory is None
        (on_disk,) = client.results(job_id[:12], out=tmp_path / "one")
        assert (
            on_disk.directory == tmp_path / "one"
            and (tmp_path / "one" / "stdout").read_bytes() == result.stdout
        )
        assert not (tmp_path / "one" / "index.json").exists()  # one job goes straight into the folder
        (c,) = client.cancel(job_id)
        assert not c.cancelled and c.state == "done"
        (tmp_path / "one" / "stdout").write_text("changed")
        with pytest.raises(Exists, match="not overwritten"):
            client.results(job_id, out=tmp_path / "one")
        client.results(job_id, out=tmp_path / "one", overwrite=True)
        assert (tmp_path / "one" / "stdout").read_bytes() == result.stdout


def test_cancel_a_queued_job_and_its_results_are_refused(node: Node) -> None:
    client = Client(node.data_dir)
    # a long job first keeps the node's one core busy, so the second waits in the queue
    busy = client.submit(MONTECARLO, args=["1", "3000000000"], fuel="900G", timeout="10m", deadline="1h")
    queued = client.submit(MONTECARLO, args=["2", "10"], deadline="1h")
    answers = client.cancel([queued, busy], reason="test")
    assert [a.job_id for a in answers] == [queued, busy]
    jobs = client.wait([queued, busy], timeout=60)
    assert all(j.state == "cancelled" for j in jobs), [(j.state, j.why) for j in jobs]
    with pytest.raises(NotFinished):
        client.results(queued)


def test_errors_are_typed(node: Node, tmp_path: Path) -> None:
    client = Client(node.data_dir)
    with pytest.raises(BadId, match="not a job id"):
        client.job("xyz")
    with pytest.raises(NotFound):
        client.wait("abcdef0123")
    with pytest.raises(NotFound):
        client.results("batch-0123456789abcdef")
    bad = tmp_path / "bad.wasm"
    bad.write_text("not wasm")
    with pytest.raises(InvalidRequest, match=r"bad\.wasm"):
        client.submit(bad)
    with pytest.raises(OptionError, match="fuel"):
        client.submit(MONTECARLO, fuel="lots")
    with pytest.raises(OptionError, match="deadline"):
        client.submit(MONTECARLO, deadline="tomorrow")
    with pytest.raises(OptionError, match="sort"):
        client.jobs(sort="colour")
    with pytest.raises(NodeNotRunning):
        Client(tmp_path / "no-node").jobs()
    assert issubclass(BadId, Exception) and BadId.exit_code == 2 and NodeNotRunning.exit_code == 69


def test_wat_is_translated_by_the_node(node: Node, tmp_path: Path) -> None:
    wat = tmp_path / "exit3.wat"
    wat.write_text(
        '(module (import "wasi_snapshot_preview1" "proc_exit" (func $exit (param i32)))'
        ' (memory (export "memory") 1) (func (export "_start") (call $exit (i32.const 3))))'
    )
    client = Client(node.data_dir)
    (job,) = client.wait(client.submit(wat))
    assert job.state == "done" and job.outcome is not None and job.outcome.exit_code == 3
    broken = tmp_path / "broken.wat"
    broken.write_text("(module (func")
    with pytest.raises(InvalidRequest, match=r"broken\.wat"):
        client.submit(broken)


async def test_the_trio_flavour(node: Node) -> None:
    async with AsyncClient(node.data_dir) as client:
        batch = await client.map(MONTECARLO, [1, 2], deadline="10m")
        with trio.move_on_after(0.01):  # a cancelled wait returns at once
            await client.wait(batch.batch_id)
        jobs = await client.wait(batch.batch_id)
        assert [j.state for j in jobs] == ["done", "done"]
        held = await client.results(batch.job_ids[0])
        assert held[0].read("receipt")


def test_the_sync_client_does_not_import_trio(node: Node) -> None:
    import subprocess

    code = (
        "import sys\nfrom e31.client import Client\n"
        f"Client({str(node.data_dir)!r}).status()\n"
        "print('trio' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_sweep_in_the_guide_runs_as_shown(node: Node, tmp_path: Path) -> None:
    import os
    import re
    import shutil
    import subprocess

    guide = (Path(__file__).resolve().parents[2] / "docs" / "submitting.md").read_text()
    section = guide[guide.index("## From Python: `e31.client`") :]
    script = re.search(r"```python\n(.*?)```", section, re.S)
    assert script is not None
    code = script.group(1)
    assert len([ln for ln in code.splitlines() if ln.strip()]) == 5  # "a sweep in five lines"
    shutil.copy(MONTECARLO, tmp_path / "montecarlo.wasm")
    (tmp_path / "sweep.py").write_text(code)
    env = {**os.environ, "E31_DATA_DIR": str(node.data_dir)}
    done = subprocess.run(
        [sys.executable, "sweep.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "8/8 ended"
    index = json.loads((tmp_path / "pi-sweep" / "index.json").read_text())
    assert len(index["jobs"]) == 8 and all(e["succeeded"] for e in index["jobs"])
