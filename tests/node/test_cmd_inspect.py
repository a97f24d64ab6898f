from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import nacl.signing
import pytest
from e31.node.cli.main import main
from e31.protocol.blobs import blob_ref
from e31.protocol.envelope import node_id_of, sign_message, verify
from e31.protocol.ids import Digest
from e31.protocol.jobs import JobManifest, Limits
from e31.protocol.messages import BY_JOB, Bid, BidItem, Decline, Offer

ROOT = Path(__file__).resolve().parent.parent.parent
VECTORS = json.loads((ROOT / "tests" / "vectors" / "envelopes.json").read_text())
VALID = [v for v in VECTORS if v["valid"]]
INVALID = [v for v in VECTORS if not v["valid"]]


def _write(tmp_path: Path, data: bytes) -> str:
    path = tmp_path / "envelope.bin"
    path.write_bytes(data)
    return str(path)


@pytest.mark.parametrize("vector", VALID, ids=[v["name"] for v in VALID])
def test_every_valid_vector_is_printed_as_json(
    vector: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, bytes.fromhex(vector["envelope"]))
    assert main(["inspect", "--now", "0", path]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kind"] == vector["kind"]
    assert out["signer"] == vector["signer"]
    assert out["message_id"] == vector["message_id"]
    assert out["fields"] == vector["fields"]
    assert out["expired"] is False


@pytest.mark.parametrize("vector", INVALID, ids=[v["name"] for v in INVALID])
def test_every_invalid_vector_is_one_line_and_exit_1(
    vector: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, bytes.fromhex(vector["envelope"]))
    assert main(["inspect", path]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith("e31: error: invalid envelope")
    assert vector["error"] in captured.err


def test_expired_messages_are_reported_not_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ping = next(v for v in VALID if v["kind"] == "ping")
    receipt = next(v for v in VALID if v["kind"] == "receipt")
    assert main(["inspect", "--now", str(2**62), _write(tmp_path, bytes.fromhex(ping["envelope"]))]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["expired"] is True and out["expires"] == ping["fields"]["expires"]
    assert main(["inspect", "--now", str(2**62), _write(tmp_path, bytes.fromhex(receipt["envelope"]))]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["expired"] is False and out["expires"] is None and out["job_id"] == receipt["fields"]["job_id"]


def test_hex_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    vector = VALID[0]
    path = tmp_path / "envelope.hex"
    text = vector["envelope"]
    path.write_text(text[:40] + "\n" + text[40:] + "\n")
    assert main(["inspect", "--hex", str(path)]) == 0
    assert json.loads(capsys.readouterr().out)["message_id"] == vector["message_id"]
    path.write_text("not hex")
    assert main(["inspect", "--hex", str(path)]) == 1
    assert "not hex" in capsys.readouterr().err


def test_missing_file_and_oversized_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(tmp_path / "absent")]) == 1
    assert "cannot read" in capsys.readouterr().err
    big = tmp_path / "big"
    big.write_bytes(b"\x00" * ((1 << 20) + 1))
    assert main(["inspect", str(big)]) == 1
    assert "larger than" in capsys.readouterr().err


def _run(args: list[str], stdin: bytes) -> subprocess.CompletedProcess[bytes]:
    code = f"import sys; from e31.node.cli.main import main; sys.exit(main({args!r}))"
    return subprocess.run([sys.executable, "-c", code], input=stdin, capture_output=True, timeout=60)


def test_stdin_in_a_real_process_and_no_traceback() -> None:
    vector = next(v for v in VALID if v["kind"] == "offer")
    data = bytes.fromhex(vector["envelope"])
    ok = _run(["inspect", "-"], data)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["message_id"] == vector["message_id"]
    bad = _run(["inspect", "-"], data[:-3] + b"\x00\x00\x00")
    assert bad.returncode == 1
    assert bad.stdout == b""
    assert bad.stderr.count(b"\n") == 1 and b"Traceback" not in bad.stderr


def test_inspect_imports_neither_trio_nor_wasmtime() -> None:
    code = (
        "import sys; from e31.node.cli.main import main; rc = main(['inspect', '-']); "
        "print(sorted(m for m in ('trio', 'wasmtime', 'zeroconf', 'sqlite3') if m in sys.modules), "
        "file=sys.stderr); sys.exit(rc)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        input=bytes.fromhex(VALID[0]["envelope"]),
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == b"[]"


def test_messages_of_a_set_of_jobs_name_every_job(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    submitter, executor = nacl.signing.SigningKey(b"s" * 32), nacl.signing.SigningKey(b"e" * 32)
    limits = Limits(fuel=10**6, memory_bytes=1 << 20, wall_ms=1_000, max_output_bytes=1 << 10)
    manifests = sorted(
        (
            JobManifest(
                module=blob_ref(b"module"),
                inputs=(),
                args=(str(n),),
                env=(),
                stdin=None,
                limits=limits,
                deadline=2_000_000,
                retention_ms=1_000,
                replicas=1,
                profile=Digest(bytes(32)),
                submitter=node_id_of(submitter),
                nonce=bytes(16),
                created_at=1_000,
            )
            for n in range(3)
        ),
        key=BY_JOB,
    )
    job_ids = [m.job_id for m in manifests]
    offer = sign_message(Offer("net", 1_500_000, node_id_of(submitter), tuple(manifests)), submitter)
    offer_id = verify(offer).message_id
    bid = sign_message(
        Bid(
            "net",
            offer_id,
            node_id_of(executor),
            1_200_000,
            tuple(BidItem(j, 1_100_000, 1_200_000) for j in job_ids[:2]),
        ),
        executor,
    )
    decline = sign_message(
        Decline("net", (job_ids[2],), offer_id, node_id_of(executor), 1_200_000, "busy", ""), executor
    )
    for raw, named in ((offer, job_ids), (bid, job_ids[:2]), (decline, job_ids[2:])):
        assert main(["inspect", "--now", "0", _write(tmp_path, raw)]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["job_ids"] == [j.hex() for j in named] and "job_id" not in out, out["kind"]
