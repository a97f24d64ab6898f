"""Batch inference from the Python client (e31.client) against a real `e31 node run` process on
127.0.0.1: `generate` submits a prompts file as one batch sharing the shipped model, `merge` writes the
completions in the prompts' order with every job's receipt, byte for byte what `e31 results --merge`
writes; the trio flavour gives the same completions; each bad input is its typed error."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from e31.client import (
    AsyncClient,
    Client,
    Generation,
    Incomplete,
    MergeError,
    ModelFileError,
    OptionError,
    PromptsError,
)
from test_jobs_e2e import MONTECARLO, Node, e31


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    n = Node(tmp_path_factory.mktemp("client-generate") / "a")
    try:
        yield n
    finally:
        n.stop()


def prompts_file(path: Path, n: int = 5, bad: bool = True) -> Path:
    lines = [json.dumps({"id": i, "prompt": "And God said", "max_tokens": 4 + i}) for i in range(1, n + 1)]
    if bad:
        lines[2:2] = ["", '{"id": "bad", "prompt": 7}']  # a blank line and a malformed one (line 4)
    path.write_text("\n".join(lines) + "\n")
    return path


def test_generate_and_merge_write_the_completions_in_order_as_the_cli_does(
    node: Node, tmp_path: Path
) -> None:
    prompts = prompts_file(tmp_path / "prompts.jsonl")
    with Client(node.data_dir) as client:
        batch = client.generate(prompts, prompts_per_job=2, pass_bad_lines=True, deadline="30m")
        assert isinstance(batch, Generation)
        assert (batch.prompts, batch.malformed, len(batch.job_ids)) == (6, 1, 3)
        assert batch.limits["fuel"] > 0 and batch.limits["memory"] > 4_478_492  # room for the model
        jobs = client.wait(batch.batch_id)
        assert all(j.succeeded for j in jobs), [j.why for j in jobs]
        merged = client.merge(batch.batch_id, tmp_path / "completions.jsonl")

    assert (merged.jobs, merged.merged_jobs, merged.completions, merged.error_lines) == (3, 3, 6, 1)
    assert merged.missing == () and merged.jobs_dir == tmp_path / "completions.jsonl.jobs"
    lines = [json.loads(line) for line in merged.out.read_text().splitlines()]
    assert [c["id"] for c in lines] == [1, 2, "bad", 3, 4, 5]
    error = lines[2]
    assert error["finish_reason"] == "error" and error["line"] == 4  # the prompts file's own line number
    done = [c for c in lines if c["finish_reason"] != "error"]
    assert all(c["completion_tokens"] == c["id"] + 4 or c["finish_reason"] == "stop" for c in done), done
    folders = sorted(p.name for p in merged.jobs_dir.iterdir())
    assert folders == [f"{i:04d}-{j}" for i, j in enumerate(batch.job_ids, 1)]
    assert all((merged.jobs_dir / f / "receipt").stat().st_size > 0 for f in folders)

    # the command line runs the same code: the same file, byte for byte
    cli = e31("results", batch.batch_id, "--merge", str(tmp_path / "cli.jsonl"), data_dir=node.data_dir)
    assert cli.returncode == 0, cli.stderr
    assert (tmp_path / "cli.jsonl").read_bytes() == merged.out.read_bytes()

    with pytest.raises(MergeError, match="exists: not overwritten"):
        Client(node.data_dir).merge(batch.batch_id, merged.out)
    again = Client(node.data_dir).merge(batch.batch_id, merged.out, overwrite=True)
    assert again.out.read_bytes() == (tmp_path / "cli.jsonl").read_bytes()


async def test_the_trio_flavour_gives_the_same_completions(node: Node, tmp_path: Path) -> None:
    prompts = prompts_file(tmp_path / "prompts.jsonl", n=3, bad=False)
    async with AsyncClient(node.data_dir) as client:
        batch = await client.generate(prompts, prompts_per_job=3, deadline=1800)
        assert len(batch.job_ids) == 1
        jobs = await client.wait(batch.batch_id)
        assert jobs[0].succeeded, jobs[0].why
        merged = await client.merge(batch.batch_id, tmp_path / "async.jsonl", jobs_dir=tmp_path / "jobs")
    assert merged.jobs_dir == tmp_path / "jobs" and (tmp_path / "jobs").is_dir()
    with Client(node.data_dir) as sync:
        other = sync.generate(prompts, prompts_per_job=1)
        sync.wait(other.batch_id)
        again = sync.merge(other.batch_id, tmp_path / "sync.jsonl")
    assert merged.completions == again.completions == 3
    assert merged.out.read_bytes() == again.out.read_bytes()  # deterministic, however the prompts are cut


def test_an_unfinished_batch_is_refused_unless_partial(node: Node, tmp_path: Path) -> None:
    client = Client(node.data_dir)
    # a long job first keeps the node's one core busy, so the batch waits in the queue
    busy = client.submit(MONTECARLO, args=["1", "3000000000"], fuel="900G", timeout="10m", deadline="1h")
    batch = client.generate(prompts_file(tmp_path / "p.jsonl", n=2, bad=False), prompts_per_job=1)
    client.cancel([batch.job_ids[1], busy], reason="test")
    with pytest.raises(Incomplete, match=r"lines 2-2 \(job [0-9a-f]{12}: .*partial"):
        client.merge(batch.batch_id, tmp_path / "c.jsonl")
    assert not (tmp_path / "c.jsonl").exists()
    jobs = client.wait(batch.batch_id)
    assert [j.state for j in jobs] == ["done", "cancelled"], [j.why for j in jobs]
    merged = client.merge(batch.batch_id, tmp_path / "c.jsonl", partial=True)
    assert (merged.merged_jobs, merged.completions) == (1, 1)
    assert [(m.job_id, m.first, m.last, m.state) for m in merged.missing] == [
        (batch.job_ids[1], 2, 2, "cancelled")
    ]


def test_bad_input_is_a_typed_error(node: Node, tmp_path: Path) -> None:
    client = Client(node.data_dir)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1, "prompt": "x"}\n{\n')
    with pytest.raises(PromptsError, match="line 2: not JSON"):
        client.generate(bad)
    with pytest.raises(PromptsError, match="no such file"):
        client.generate(tmp_path / "absent.jsonl")
    good = prompts_file(tmp_path / "good.jsonl", n=1, bad=False)
    with pytest.raises(OptionError, match="needs its pair"):
        client.generate(good, model=tmp_path / "m.bin")
    with pytest.raises(OptionError, match="prompts_per_job"):
        client.generate(good, prompts_per_job=0)
    with pytest.raises(OptionError, match="deadline"):
        client.generate(good, deadline="soon")
    (tmp_path / "m.bin").write_bytes(b"\x00" * 10)
    with pytest.raises(ModelFileError, match=r"shorter than a llama2\.c checkpoint header"):
        client.generate(good, model=tmp_path / "m.bin", tokenizer=tmp_path / "m.bin")
    with pytest.raises(OptionError, match="not a batch id"):
        client.merge("abcdef0123", tmp_path / "c.jsonl")
    sweep = client.map(MONTECARLO, [1], deadline="10m")
    with pytest.raises(MergeError, match="not an `e31 generate` job"):
        client.merge(sweep.batch_id, tmp_path / "c.jsonl")
    assert PromptsError.exit_code == ModelFileError.exit_code == MergeError.exit_code == 2
    assert Incomplete.exit_code == 1


def test_the_example_in_the_inference_guide_runs_as_shown(node: Node, tmp_path: Path) -> None:
    import os
    import re
    import subprocess
    import sys

    guide = (Path(__file__).resolve().parents[2] / "docs" / "inference.md").read_text()
    section = guide[guide.index("### From Python") :]
    script = re.search(r"```python\n(.*?)```", section, re.S)
    assert script is not None
    prompts_file(tmp_path / "prompts.jsonl", n=3, bad=False)
    (tmp_path / "batch.py").write_text(script.group(1))
    env = {**os.environ, "E31_DATA_DIR": str(node.data_dir)}
    done = subprocess.run(
        [sys.executable, "batch.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert re.fullmatch(
        r"3 prompts in 1 jobs: batch-[0-9a-f]{16}\n3 completions, 0 error lines\n", done.stdout
    )
    assert len((tmp_path / "completions.jsonl").read_text().splitlines()) == 3
