"""Python scripts as jobs, end to end through real node processes: `e31 submit --python` (one job, and a
batch with a zip of packages on sys.path) runs on a remote executor, which fetches the interpreter blob
once and compiles it once for all the jobs; `e31 audit --reexecute` re-runs every job to the same fuel.
And the interpreter's checks: a missing or damaged interpreter is one line and a typed exit code.

Node `a` submits (its owner is busy, so it runs nothing); node `b` executes.
"""

from __future__ import annotations

import hashlib
import json
import os
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from e31.node.cli import python_job, python_runtime
from e31.node.cli.main import main
from e31.protocol.blobs import blob_ref
from test_jobs_e2e import ROOT, Node, e31, wait_for

WC = ROOT / "sandbox" / "workloads" / "guests" / "python" / "wc.py"
FAST = ("--capacity-interval", "0.2", "--capacity-raise-after", "0", "--idle-seconds", "0")
HELLO = """\
import sys
import greet  # from the zip on sys.path

print(greet.hello(sys.argv[1]), sys.argv[0], sys.path[0], sep=" | ")
with open("/output/greeting.txt", "w") as f:
    f.write(greet.hello(sys.argv[1]) + "\\n")
"""


def interpreter_or_skip() -> Path:
    try:
        return python_runtime.interpreter()
    except python_runtime.InterpreterMissing:
        pytest.skip(f"the CPython WASI interpreter is not installed ({python_runtime.INSTALL_HINT})")


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Node, Node]]:
    interpreter_or_skip()
    tmp = tmp_path_factory.mktemp("py")
    busy, quiet = tmp / "busy-owner", tmp / "no-owner"
    busy.write_text(str(os.cpu_count() or 1))
    nodes: list[Node] = []
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("E31_TEST_OWNER_LOAD_FILE", str(busy))
            nodes.append(Node(tmp / "a", "--only-when-idle", *FAST))
            mp.setenv("E31_TEST_OWNER_LOAD_FILE", str(quiet))
            nodes.append(Node(tmp / "b", *FAST, "--bootstrap", nodes[0].address))
        a, b = nodes
        wait_for("the nodes to link", lambda: a.connected() == {b.node_id} and b.connected() == {a.node_id})
        yield a, b
    finally:
        for node in nodes:
            node.stop()


def _last_word(out: str) -> str:
    return out.strip().splitlines()[-1].split()[-1]


def _identity(path: Path) -> tuple[int, int, int]:
    st = path.stat()
    return st.st_ino, st.st_size, st.st_mtime_ns


def test_python_jobs_run_remotely_share_one_interpreter_and_reexecute_alike(
    pair: tuple[Node, Node], tmp_path: Path
) -> None:
    a, b = pair
    interpreter = python_runtime.interpreter()
    module = interpreter.read_bytes()
    root = blob_ref(module).root.hex()
    text = b"one two three\nfour  five\n"
    data = tmp_path / "input.txt"
    data.write_bytes(text)

    submitted = e31(
        "submit", "--python", str(WC), "--input", str(data), "--deadline", "10m", data_dir=a.data_dir
    )
    assert submitted.returncode == 0, submitted.stderr
    first = _last_word(submitted.stdout)
    waited = e31("wait", first, "--timeout", "300", data_dir=a.data_dir, timeout=330)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    doc = a.api.get(f"/v1/jobs/{first}")
    assert doc["state"] == "done" and doc["executor"] == b.node_id
    out = tmp_path / "first"
    got = e31("results", first, "--out", str(out), data_dir=a.data_dir)
    assert got.returncode == 0, got.stderr
    assert (out / "stdout").read_bytes() == b"python: 2 lines, 5 words, 25 bytes\n"
    summaries = list(out.rglob("summary.txt"))
    assert [p.read_bytes() for p in summaries] == [b"lines 2\nwords 5\nbytes 25\n"]

    # The executor holds the interpreter as one blob, and one compiled entry in its module cache.
    blob = b.data_dir / "blobs" / root[:2] / root[2:]
    assert blob.read_bytes() == module
    digest = hashlib.sha256(module).hexdigest()
    compiled = sorted((b.data_dir / "module-cache").glob(f"{digest}-*.cwasm"))
    assert len(compiled) == 1
    before = (_identity(blob), _identity(compiled[0]))

    # A batch of two more, with a zip of packages on sys.path: the interpreter is neither fetched
    # nor compiled again (same files, untouched).
    deps = tmp_path / "deps.zip"
    with zipfile.ZipFile(deps, "w") as z:
        z.writestr("greet/__init__.py", "def hello(name):\n    return f'hello, {name}'\n")
    script = tmp_path / "hello.py"
    script.write_text(HELLO)
    lines = tmp_path / "names.jsonl"
    lines.write_text('{"args": ["Ada"]}\n{"args": ["Grace"]}\n')
    batch = e31(
        "submit",
        "--python",
        str(script),
        "--python-path",
        str(deps),
        "--batch",
        str(lines),
        "--deadline",
        "10m",
        data_dir=a.data_dir,
    )
    assert batch.returncode == 0, batch.stderr
    batch_id = _last_word(batch.stdout)
    waited = e31("wait", batch_id, "--timeout", "300", data_dir=a.data_dir, timeout=330)
    assert waited.returncode == 0, waited.stdout + waited.stderr
    out = tmp_path / "batch"
    got = e31("results", batch_id, "--out", str(out), data_dir=a.data_dir)
    assert got.returncode == 0, got.stderr
    stdouts = sorted(p.read_text() for p in out.glob("*/stdout"))
    assert stdouts == [
        "hello, Ada | /input/hello.py | /input\n",
        "hello, Grace | /input/hello.py | /input\n",
    ]
    assert sorted(p.read_text() for p in out.rglob("greeting.txt")) == ["hello, Ada\n", "hello, Grace\n"]
    assert (_identity(blob), _identity(compiled[0])) == before
    assert len(list((b.data_dir / "module-cache").glob(f"{digest}-*.cwasm"))) == 1

    # Every receipt re-verifies: the auditor's own run gives the same outcome, outputs and fuel.
    bundle = tmp_path / "python.e31"
    exported = e31(
        "receipts",
        "export",
        "--job",
        first,
        "--job",
        batch_id,
        "--with-blobs",
        "--out",
        str(bundle),
        data_dir=a.data_dir,
    )
    assert exported.returncode == 0, exported.stderr
    audit = e31("audit", str(bundle), "--reexecute", "--json", timeout=600)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    report = json.loads(audit.stdout)
    assert report["sound"] and report["problems"] == []
    assert report["jobs"] == 3 and report["reexecuted"] == 3


def test_bad_python_submissions_are_one_line_each(pair: tuple[Node, Node], tmp_path: Path) -> None:
    a, _ = pair
    script = tmp_path / "x.py"
    script.write_text("print(1)\n")
    for argv, code, words in (
        (["--python", str(tmp_path / "absent.py")], 2, "absent.py: no such file"),
        (["--python", str(script), "--python-path", str(tmp_path / "absent.zip")], 2, "absent.zip"),
        ([str(ROOT / "sandbox" / "workloads" / "echo.wasm"), "--python", str(script)], 2, "not both"),
        (
            ["--python-path", str(tmp_path / "deps.zip"), str(ROOT / "sandbox" / "workloads" / "echo.wasm")],
            2,
            "only with --python",
        ),
        ([], 2, "--python SCRIPT.py"),
    ):
        done = e31("submit", *argv, data_dir=a.data_dir)
        assert done.returncode == code, (argv, done.returncode, done.stderr)
        assert words in done.stderr and "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr


# --- the interpreter's checks, without a node ------------------------------------------------------


def test_the_installed_interpreter_is_the_pinned_build() -> None:
    path = interpreter_or_skip()
    assert path.name == python_runtime.FILE_NAME
    assert path.stat().st_size == python_runtime.SIZE
    assert hashlib.sha256(path.read_bytes()).hexdigest() == python_runtime.SHA256


def test_a_damaged_or_absent_interpreter_is_refused(tmp_path: Path) -> None:
    short = tmp_path / "short.wasm"
    short.write_bytes(b"\0asm\1\0\0\0")
    with pytest.raises(python_runtime.InterpreterDamaged, match="bytes, not the pinned"):
        python_runtime.check(short)
    forged = tmp_path / "forged.wasm"
    with open(forged, "wb") as f:
        f.truncate(python_runtime.SIZE)  # the right size, the wrong bytes
    with pytest.raises(python_runtime.InterpreterDamaged, match="SHA-256"):
        python_runtime.check(forged)
    link = tmp_path / "link.wasm"
    link.symlink_to(forged)
    with pytest.raises(python_runtime.InterpreterDamaged, match="cannot read"):
        python_runtime.check(link)
    with pytest.raises(python_runtime.InterpreterMissing, match="e31-node\\[python\\]"):
        python_runtime.check(tmp_path / "absent.wasm")
    assert python_runtime.InterpreterDamaged.exit_code == 74
    assert python_runtime.InterpreterMissing.exit_code == 2


def test_submit_refuses_a_damaged_interpreter_before_reaching_the_node(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    forged = tmp_path / "python-3.12.0.wasm"
    with open(forged, "wb") as f:
        f.truncate(python_runtime.SIZE)
    monkeypatch.setattr(python_runtime, "installed_path", lambda: forged)
    script = tmp_path / "x.py"
    script.write_text("print(1)\n")
    # no node runs in this data dir: the check comes first, so the answer is the check's
    code = main(["submit", "--data-dir", str(tmp_path / "none"), "--python", str(script)])
    err = capsys.readouterr().err
    assert code == 74 and "SHA-256" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_a_python_job_body_carries_the_script_zips_and_arguments(tmp_path: Path) -> None:
    import argparse

    script, deps = tmp_path / "job.py", tmp_path / "deps.zip"
    args = argparse.Namespace(python=script, python_path=[deps])
    single = python_job.apply(
        args,
        {"module": "m", "inputs": [{"name": "data.csv", "path": "/d"}], "args": ["x"], "env": [["K", "V"]]},
    )
    assert single["inputs"] == [
        {"name": "job.py", "path": str(script)},
        {"name": "deps.zip", "path": str(deps)},
        {"name": "data.csv", "path": "/d"},
    ]
    assert single["args"] == ["/input/job.py", "x"]
    assert single["env"] == [["PYTHONPATH", "/input/deps.zip"], ["K", "V"]]
    batch = python_job.apply(
        args, {"module": "m", "jobs": [{"args": ["1"], "env": [["PYTHONPATH", "/input/more.zip"]]}, {}]}
    )
    first, second = batch["jobs"]
    assert first["args"] == ["/input/job.py", "1"]
    assert first["env"] == [["PYTHONPATH", "/input/deps.zip:/input/more.zip"]]
    assert second["args"] == ["/input/job.py"] and len(second["inputs"]) == 2
