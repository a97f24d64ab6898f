"""`e31 audit` and `e31 receipts export` through the CLI's main(), and one real process."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from e31.node.api.export import export_handler
from e31.node.api.server import Router, serve_control
from e31.node.audit.bundle import Bundle, encode_bundle, read_bundle, write_bundle
from e31.node.cli.main import main
from e31.node.config import load_config
from e31.node.store.async_store import AsyncStore
from e31.node.store.blobs import BlobStore
from e31.node.store.db import Store
from e31.node.store.receiptlog import ReceiptLog
from e31.protocol.envelope import verify
from receipt_fixtures import NET, T0, key, mandelbrot, mandelbrot_file, montecarlo, resign_receipt


def write(path: Path, jobs: list, log: ReceiptLog | None = None) -> Path:  # type: ignore[type-arg]
    envelopes = [e for j in jobs for e in j.envelopes]
    if log is not None:
        for j in jobs:
            log.append(j.receipt)
        envelopes += [log.inclusion(j.receipt_id.raw, T0) for j in jobs]
    blobs = {k: v for j in jobs for k, v in j.blobs.items()}
    write_bundle(path, encode_bundle(Bundle(tuple(envelopes), blobs)))
    return path


@pytest.fixture
def log(tmp_path: Path) -> Iterator[ReceiptLog]:
    store = Store(tmp_path / "node.sqlite")
    yield ReceiptLog(store, key("executor"), NET)
    store.close()


def test_sound_bundle_exits_0(tmp_path: Path, log: ReceiptLog, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "ok.e31", [mandelbrot(), montecarlo()], log)
    assert main(["audit", str(path), "--reexecute"]) == 0
    out = capsys.readouterr().out
    assert "result: sound (2 receipts checked, 2 jobs re-executed)" in out
    assert main(["audit", str(path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["sound"] is True and doc["receipts"] == 2 and doc["problems"] == []
    assert doc["nodes"][0]["jobs"] == 2


def test_problems_exit_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    job = mandelbrot_file()
    real = verify(job.receipt).message.fuel_used
    path = write(tmp_path / "bad.e31", [resign_receipt(job, fuel_used=real - 1)])
    assert main(["audit", str(path)]) == 0
    capsys.readouterr()
    assert main(["audit", str(path), "--reexecute", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["sound"] is False
    assert [p["check"] for p in doc["problems"]] == ["reexecute"]
    assert doc["problems"][0]["job"] == job.job_id.hex()


@pytest.mark.parametrize("content", [b"", b"garbage", None])
def test_unreadable_input_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: bytes | None
) -> None:
    path = tmp_path / "x.e31"
    if content is None:
        good = encode_bundle(Bundle(tuple(mandelbrot().envelopes)))
        content = good[: len(good) // 2]
    path.write_bytes(content)
    assert main(["audit", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("e31: error: cannot audit: ") and err.count("\n") == 1
    assert main(["audit", str(tmp_path / "missing.e31")]) == 2


def test_a_real_process_never_shows_a_traceback(tmp_path: Path) -> None:
    good = encode_bundle(Bundle(tuple(montecarlo().envelopes)))
    (tmp_path / "cut.e31").write_bytes(good[:-7])
    proc = subprocess.run(
        [sys.executable, "-m", "e31.node", "audit", str(tmp_path / "cut.e31")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "cannot audit" in proc.stderr
    (tmp_path / "ok.e31").write_bytes(good)
    proc = subprocess.run(
        [sys.executable, "-m", "e31.node", "audit", "--json", str(tmp_path / "ok.e31")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["sound"] is True


def test_export_without_a_node_is_one_clear_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["receipts", "export", "--data-dir", str(tmp_path), "--out", str(tmp_path / "x.e31")])
    assert code == 1
    err = capsys.readouterr().err
    assert "no node is running" in err and err.count("\n") == 1


def test_export_refuses_a_bad_job_id_and_out_dir(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["receipts", "export", "--job", "xyz", "--out", str(tmp_path / "x.e31")])
    assert info.value.code == 2
    assert main(["receipts", "export", "--data-dir", str(tmp_path), "--out", str(tmp_path)]) == 1
    assert "is a directory" in capsys.readouterr().err


async def test_export_through_the_running_nodes_api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = load_config(tmp_path / "data", environ={})
    store = Store(config.data_dir / "node.sqlite")
    blobs = BlobStore(config.data_dir / "blobs")
    log = ReceiptLog(store, key("executor"), NET)
    jobs = [mandelbrot(), montecarlo()]
    for job in jobs:
        for raw in job.envelopes:
            env = verify(raw)
            store.put_envelope(env.message_id.raw, env.kind, raw, 1.0, job.job_id.raw)
        for data in job.blobs.values():
            blobs.put(data)
        log.append(job.receipt)
    router = Router()
    router.add("POST", "/v1/receipts/export", export_handler(AsyncStore(store), blobs, log))
    monkeypatch.chdir(tmp_path)
    async with trio.open_nursery() as nursery:
        await nursery.start(functools.partial(serve_control, router, config))
        argv = [
            "receipts",
            "export",
            "--data-dir",
            str(config.data_dir),
            "--job",
            jobs[1].job_id.hex(),
            "--out",
            "one.e31",
            "--with-blobs",
        ]
        assert await trio.to_thread.run_sync(main, argv) == 0
        argv = ["receipts", "export", "--data-dir", str(config.data_dir), "--out", "all.e31"]
        assert await trio.to_thread.run_sync(main, argv) == 0
        argv = [
            "receipts",
            "export",
            "--data-dir",
            str(config.data_dir),
            "--job",
            "ab" * 32,
            "--out",
            "no.e31",
        ]
        assert await trio.to_thread.run_sync(main, argv) == 1
        nursery.cancel_scope.cancel()
    one = read_bundle(tmp_path / "one.e31")
    assert set(jobs[1].envelopes) <= set(one.envelopes) and set(one.blobs) == set(jobs[1].blobs)
    assert not set(jobs[0].envelopes) & set(one.envelopes)
    assert await trio.to_thread.run_sync(main, ["audit", str(tmp_path / "one.e31"), "--reexecute"]) == 0
    everything = read_bundle(tmp_path / "all.e31")
    assert everything.blobs == {} and all(e in everything.envelopes for j in jobs for e in j.envelopes)
    assert not (tmp_path / "no.e31").exists()
    store.close()
