"""The CLI for sweeps and daily use against a real node process: `e31 results BATCH --out`, `e31 jobs`
filters, sorting, limits, --watch and its uncut OUTCOME column, `e31 logs`, prefixes and batch ids in
every command (`receipts export --job` too), late `e31 wait` rates, and `e31 node stop`; each with its
typed one-line errors."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from e31.client import Client
from test_jobs_e2e import MONTECARLO, Node, e31, wait_for

ECHO = MONTECARLO.with_name("echo.wasm")


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    n = Node(tmp_path_factory.mktemp("cli") / "a")
    try:
        yield n
    finally:
        n.stop()


@pytest.fixture(scope="module")
def sweep(node: Node) -> tuple[str, list[str]]:
    client = Client(node.data_dir)
    batch = client.map(ECHO, [["word", str(i)] for i in range(3)], deadline="10m")
    client.wait(batch.batch_id)
    return batch.batch_id, list(batch.job_ids)


def _one_line_error(done: subprocess.CompletedProcess[str], code: int, text: str) -> None:
    assert done.returncode == code, (done.returncode, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("e31: error:") and text in lines[0], done.stderr


def test_results_of_a_batch_go_into_one_folder_with_an_index(
    node: Node, sweep: tuple[str, list[str]], tmp_path: Path
) -> None:
    batch, ids = sweep
    out = tmp_path / "all"
    done = e31("results", batch, "--out", str(out), data_dir=node.data_dir)
    assert done.returncode == 0, done.stderr
    index = json.loads((out / "index.json").read_text())
    assert [e["job_id"] for e in index["jobs"]] == ids
    for i, entry in enumerate(index["jobs"]):
        assert (out / entry["dir"] / "stdout").read_text() == f"word {i}\n"
        assert entry["args"] == ["word", str(i)] and entry["succeeded"]
    # again: the same bytes count as written; and two jobs by prefix into another folder
    again = e31("results", batch, "--out", str(out), data_dir=node.data_dir)
    assert again.returncode == 0, again.stderr
    two = e31("results", ids[0][:8], ids[2][:9], "--out", str(tmp_path / "two"), data_dir=node.data_dir)
    assert two.returncode == 0, two.stderr
    assert [e["job_id"] for e in json.loads((tmp_path / "two" / "index.json").read_text())["jobs"]] == [
        ids[0],
        ids[2],
    ]


def test_jobs_filters_sorts_and_limits(node: Node, sweep: tuple[str, list[str]]) -> None:
    batch, ids = sweep
    listed = e31("jobs", "--batch", batch, "--json", data_dir=node.data_dir)
    assert [j["job_id"] for j in json.loads(listed.stdout)] == ids
    newest = e31(
        "jobs", "--batch", batch, "--sort", "id", "-r", "--limit", "2", "--json", data_dir=node.data_dir
    )
    assert [j["job_id"] for j in json.loads(newest.stdout)] == sorted(ids, reverse=True)[:2]
    done = e31("jobs", "--state", "done", "--batch", batch, data_dir=node.data_dir)
    assert done.returncode == 0 and "3 jobs: 3 done" in done.stdout
    none = e31("jobs", "--state", "cancelled", "--batch", batch, data_dir=node.data_dir)
    assert none.stdout.strip() == "no jobs"
    by_prefix = e31("jobs", ids[1][:7], batch, "--json", data_dir=node.data_dir)
    assert [j["job_id"] for j in json.loads(by_prefix.stdout)] == [ids[1], ids[0], ids[2]]
    watched = e31("jobs", "--watch", "0.1", batch, data_dir=node.data_dir)  # all ended: one frame
    assert watched.returncode == 0 and watched.stdout.count("3 jobs: 3 done") == 1


def test_a_long_reason_is_shown_whole(node: Node) -> None:
    client = Client(node.data_dir)
    reason = "the sweep was started with the wrong seed range; " * 4
    busy = client.submit(MONTECARLO, args=["1", "3000000000"], fuel="900G", timeout="10m", deadline="1h")
    client.cancel(busy, reason=reason.strip())
    (job,) = client.wait(busy, timeout=60)
    assert job.state == "cancelled" and job.reason and reason.strip() in job.reason
    shown = e31("jobs", busy[:10], data_dir=node.data_dir)
    assert job.reason in shown.stdout, shown.stdout
    logs = e31("logs", busy[:10], data_dir=node.data_dir)
    _one_line_error(logs, 1, "ended cancelled")


def test_logs_print_the_guests_streams(node: Node, sweep: tuple[str, list[str]], tmp_path: Path) -> None:
    _, ids = sweep
    done = e31("logs", ids[1][:8], data_dir=node.data_dir)
    assert done.returncode == 0 and done.stdout == "word 1\n" and done.stderr == ""
    stdin = tmp_path / "in.txt"
    stdin.write_text("streamed\n")
    job_id = Client(node.data_dir).submit(ECHO, stdin=stdin)
    followed = e31("logs", "--follow", "--stdout", job_id[:10], data_dir=node.data_dir)
    assert followed.returncode == 0 and followed.stdout == "streamed\n", followed.stderr


def test_ids_are_checked_with_typed_one_line_errors(
    node: Node, sweep: tuple[str, list[str]], tmp_path: Path
) -> None:
    for argv in (
        ["jobs", "zz"],
        ["wait", "abc"],
        ["logs", "g" * 10],
        ["cancel", "batch-1"],
        ["results", "12345", "--out", str(tmp_path)],
    ):
        _one_line_error(e31(*argv, data_dir=node.data_dir), 2, "not a")
    for argv in (["jobs", "fedcba98"], ["wait", "batch-0123456789abcdef"], ["logs", "0" * 64]):
        _one_line_error(e31(*argv, data_dir=node.data_dir), 1, "no ")
    _one_line_error(e31("logs", sweep[0], data_dir=node.data_dir), 2, "names 3 jobs")
    argparse_error = e31("jobs", "--sort", "colour", data_dir=node.data_dir)
    assert argparse_error.returncode == 2 and "argument --sort: invalid choice" in argparse_error.stderr


def test_receipts_export_takes_prefixes_and_batch_ids(
    node: Node, sweep: tuple[str, list[str]], tmp_path: Path
) -> None:
    batch, ids = sweep
    out = tmp_path / "b.e31"
    done = e31(
        "receipts",
        "export",
        "--job",
        batch,
        "--job",
        ids[0][:6],
        "--out",
        str(out),
        "--json",
        "--progress",
        data_dir=node.data_dir,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["jobs"] == 3
    assert done.stderr == ""  # under a second: no progress line, even with --progress
    audit = e31("audit", str(out), "--json", data_dir=node.data_dir)
    assert audit.returncode == 0 and json.loads(audit.stdout)["sound"]
    bad = e31("receipts", "export", "--job", "xx", "--out", str(tmp_path / "c.e31"), data_dir=node.data_dir)
    assert bad.returncode == 2 and "not a job id" in bad.stderr
    unknown = e31(
        "receipts", "export", "--job", "abcdef99", "--out", str(tmp_path / "c.e31"), data_dir=node.data_dir
    )
    _one_line_error(unknown, 1, "no job on this node has an id beginning with abcdef99")


def test_a_late_wait_reports_no_rate_for_jobs_that_ended_before_it(
    node: Node, sweep: tuple[str, list[str]]
) -> None:
    done = e31("wait", "--progress", sweep[0], data_dir=node.data_dir)
    assert done.returncode == 0, done.stderr
    assert "3/3  0.00 jobs/s" in done.stderr, done.stderr
    assert "batch " in done.stdout and "3 succeeded" in done.stdout


def test_node_stop_stops_the_node_cleanly(tmp_path: Path) -> None:
    n = Node(tmp_path / "s")
    try:
        done = e31("node", "stop", data_dir=n.data_dir)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"stopped node {n.node_id} (pid {n.proc.pid})"
        assert n.proc.wait(timeout=30) == 0  # gone already: the command waited for it
        assert not (n.data_dir / "api.json").exists()
        assert "Traceback" not in n.log.read_text()
    finally:
        n.stop()
    again = e31("node", "stop", data_dir=n.data_dir)
    _one_line_error(again, 1, "no node is running")


def test_a_node_of_another_network_is_named_on_both_sides(node: Node, tmp_path: Path) -> None:
    lab = Node(tmp_path / "lab", "--network", "lab", "--bootstrap", node.address)
    try:
        dialer = "is on network 'main'; this node is on 'lab': nodes of different networks never connect"
        wait_for("the dialing side's warning", lambda: dialer in lab.log.read_text())
        responder = "on network 'lab' dialled this node, which is on 'main'"
        wait_for("the answering side's warning", lambda: responder in node.log.read_text())
        for log, text in ((lab.log, dialer), (node.log, responder)):
            (line,) = [ln for ln in log.read_text().splitlines() if text in ln]
            assert " WARNING " in line, line
    finally:
        lab.stop()


def test_node_run_starts_by_saying_what_it_offers(node: Node) -> None:
    first = [ln.split(" node: ", 1)[-1] for ln in node.log.read_text().splitlines()[:3]]
    assert first[0].startswith("offering 1 of ") and " cores, " in first[0]
    assert first[1].startswith("idle policy: jobs run whenever cores are free")
    assert first[2].startswith("network main; listen 127.0.0.1:0; mDNS off; data dir ")


def test_sandbox_run_and_submit_take_the_same_job_flags(node: Node, tmp_path: Path) -> None:
    from e31.node.cli.main import build_parser

    def flags(command: list[str]) -> dict[str, tuple[str | None, str | None]]:
        parser = build_parser(command)
        sub = next(a for a in parser._actions if a.dest == "command").choices[command[0]]  # type: ignore[attr-defined]
        if command[0] == "sandbox":
            sub = next(a for a in sub._actions if a.dest == "sandbox_command").choices["run"]
        return {s: (a.metavar, a.help) for a in sub._actions for s in a.option_strings if s.startswith("--")}

    run, submit = flags(["sandbox", "run"]), flags(["submit"])
    for flag in ("--input", "--arg", "--env", "--stdin", "--fuel", "--memory", "--timeout", "--max-output"):
        assert run[flag] == submit[flag], flag
    # the same value means the same thing: a file and a directory as inputs, NAME=VALUE refused alike
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    (data / "sub" / "b.txt").write_text("b")
    (tmp_path / "a.txt").write_text("a")
    for command in (["sandbox", "run", str(ECHO)], ["submit", str(ECHO)]):
        bad = e31(*command, "--env", "NOEQUALS", data_dir=node.data_dir)
        assert bad.returncode == 2 and "argument --env: expected NAME=VALUE" in bad.stderr
    from e31.node.cli.options import input_entries

    assert input_entries([f"x={tmp_path / 'a.txt'}", f"d={data}", str(data)]) == [
        ("x", tmp_path / "a.txt"),
        ("d/sub/b.txt", data / "sub" / "b.txt"),
        ("sub/b.txt", data / "sub" / "b.txt"),
    ]
    wordfreq = ECHO.with_name("wordfreq.wasm")
    given = ["--input", f"x={tmp_path / 'a.txt'}", "--input", f"d={data}", "--", "10"]
    local = e31("sandbox", "run", str(wordfreq), *given)
    assert local.returncode == 0, local.stderr
    submitted = e31("submit", str(wordfreq), *given, data_dir=node.data_dir)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.split()[-1]
    remote = e31("logs", "--follow", "--stdout", job_id, data_dir=node.data_dir)
    assert remote.stdout == local.stdout and sorted(local.stdout.split()) == ["1", "1", "a", "b"]


def test_submit_a_job_from_a_spec_file(node: Node, tmp_path: Path) -> None:
    (tmp_path / "job.toml").write_text(
        f'module = "{ECHO}"\nargs = ["from", "the", "spec"]\nfuel = "1G"\ndeadline = "10m"\njson = true\n'
    )
    done = e31("submit", "--spec", str(tmp_path / "job.toml"), "--arg", "flag", data_dir=node.data_dir)
    assert done.returncode == 0, done.stderr
    job_id = json.loads(done.stdout)["job_id"]
    logs = e31("logs", "--follow", job_id, data_dir=node.data_dir)
    assert logs.stdout == "flag\n"  # the command line's --arg replaced the file's args
    (tmp_path / "bad.toml").write_text('module = "x.wasm"\ncolour = "blue"\n')
    bad = e31("submit", "--spec", str(tmp_path / "bad.toml"), data_dir=node.data_dir)
    _one_line_error(bad, 2, "unknown key 'colour'")
