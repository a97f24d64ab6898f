"""A full disk under a real node: clear errors, the node keeps running, and it recovers by itself.

A small tmpfs (16 MiB) is mounted as the node's data dir (root only: skipped, with the reason, where
mounting is not allowed) and filled with a file until writes fail. Then a submission is refused with
507 disk_full (the CLI prints one line), reads still work, the node keeps running and logs no traceback;
once the file is deleted a new job succeeds without a restart. A start on the full disk exits with one
line naming the store's file and the EX_IOERR code, never "internal error" (70), whatever few bytes are
left; once there is space again it starts normally, with its jobs.
"""

from __future__ import annotations

import errno
import hashlib
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from e31.node.api.client import ApiError
from e31.node.store.blobs import BlobDiskFull, BlobStore
from e31.node.store.connection import DiskFull
from test_jobs_e2e import MONTECARLO, READY, Node, e31, wait_for

pytestmark = pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0, reason="mounting a tmpfs needs root"
)

FILLER = "filler"
EX_IOERR = 74
NODE_RUN = (sys.executable, "-m", "e31.node", "node", "run", "--cores", "1")


@contextmanager
def tmpfs(where: Path, size: str = "16m") -> Iterator[Path]:
    """A tmpfs of `size` mounted at `where` (mode 0700, as a data dir must be), unmounted afterwards."""
    where.mkdir(parents=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip() or mounted.returncode}")
    try:
        yield where
    finally:
        if subprocess.run(["umount", str(where)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(where)], check=True)


def fill(disk: Path, leave: int = 0) -> None:
    """Write a file on `disk` until the disk refuses, then give back `leave` bytes of it."""
    fd = os.open(disk / FILLER, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for block in (1 << 20, 4096, 512, 1):
            try:
                while True:
                    os.write(fd, b"\0" * block)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
        os.ftruncate(fd, max(0, os.fstat(fd).st_size - leave))
    finally:
        os.close(fd)


def free(disk: Path) -> None:
    (disk / FILLER).unlink()


def submit(node: Node, seed: int) -> str:
    job: str = node.api.post("/v1/jobs", {"module": str(MONTECARLO), "args": [str(seed), "1000"]})["job_id"]
    return job


def done(node: Node, job: str) -> bool:
    doc = node.api.get(f"/v1/jobs/{job}")
    assert doc["state"] not in ("failed", "expired"), doc
    return bool(doc["state"] == "done" and doc["succeeded"])


def start_on_full_disk(data_dir: Path, log: Path) -> tuple[int | None, str]:
    """Start a node; return (its exit code, or None when it started and was stopped), and its stderr."""
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*NODE_RUN, "--data-dir", str(data_dir), "--listen", "127.0.0.1:0", "--no-mdns"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=out,
        )
    try:
        wait_for(
            "the node to exit or start", lambda: proc.poll() is not None or READY.search(log.read_text())
        )
        if proc.poll() is None:
            proc.terminate()
            assert proc.wait(timeout=30) == 0, log.read_text()
            return None, log.read_text()
        return proc.returncode, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_node_on_a_full_disk_refuses_writes_clearly_keeps_running_and_recovers(tmp_path: Path) -> None:
    with tmpfs(tmp_path / f"disk-{secrets.token_hex(4)}" / "node") as disk:
        node = Node(disk)  # its log is next to the tmpfs, not on it
        try:
            before = submit(node, 1)
            wait_for("the first job", lambda: done(node, before))

            fill(disk, leave=4096)
            with pytest.raises(ApiError) as refused:
                submit(node, 2)  # a new module: its blob needs room
            assert (refused.value.status, refused.value.code) == (507, "disk_full")
            assert "disk is full" in refused.value.message and str(disk) in refused.value.message
            cli = e31("submit", str(MONTECARLO), "--", "3", "1000", data_dir=disk)
            assert cli.returncode != 0 and cli.stdout == ""
            assert len(cli.stderr.strip().splitlines()) == 1 and "disk is full" in cli.stderr, cli.stderr
            assert "HTTP 507" in cli.stderr

            # Reads still work and the node keeps running.
            assert node.api.get("/v1/status")["data_dir"] == str(disk)
            assert [j["job_id"] for j in node.api.get("/v1/jobs")] == [before]
            assert node.proc.poll() is None

            free(disk)  # space is back: the next write works, no restart
            after = submit(node, 4)
            wait_for("a job after the disk had room again", lambda: done(node, after))
            assert node.proc.poll() is None
        finally:
            node.stop()
        assert node.proc.returncode == 0
        log = node.log.read_text()
        assert "Traceback" not in log and "internal error" not in log, log
        assert "disk is full" in log  # the refusals left a warning line each

        # A start on the full disk: one clear line, EX_IOERR, never "internal error" (70).
        fill(disk)
        code, err = start_on_full_disk(disk, tmp_path / "full-start.log")
        assert code == EX_IOERR, err
        last = err.strip().splitlines()[-1]
        assert last.startswith("e31: error: ") and "disk is full" in last and str(disk) in last, err
        assert "Traceback" not in err
        free(disk)

        # With only a few KiB left a start either fails the same way or runs; it never crashes.
        for leave in range(4096, 64 * 1024 + 1, 2 * 1024):
            fill(disk, leave)
            code, err = start_on_full_disk(disk, tmp_path / f"start-{leave}.log")
            assert "Traceback" not in err and "internal error" not in err, (leave, err)
            if code is not None:
                assert code == EX_IOERR and "disk is full" in err.strip().splitlines()[-1], (leave, err)
            free(disk)

        # Space is back: it starts normally, with its jobs.
        node = Node(disk)
        try:
            jobs = {j["job_id"]: j for j in node.api.get("/v1/jobs")}
            assert set(jobs) == {before, after}
            assert all(j["state"] == "done" for j in jobs.values())
        finally:
            node.stop()
        assert node.proc.returncode == 0


def test_the_blob_store_on_a_full_disk_raises_disk_full_and_keeps_nothing(tmp_path: Path) -> None:
    with tmpfs(tmp_path / f"disk-{secrets.token_hex(4)}", size="1m") as disk:
        blobs = BlobStore(disk / "blobs")
        fill(disk)
        data = secrets.token_bytes(64 * 1024)
        with pytest.raises(BlobDiskFull) as full:
            blobs.put(data)
        assert isinstance(full.value, DiskFull) and "disk is full" in str(full.value)
        with pytest.raises(BlobDiskFull):
            blobs.partial("ab" * 32, len(data)).write_chunk(0, data, hashlib.sha256(data).digest())
        assert list(blobs.hashes()) == [] and not list((disk / "blobs").glob("*/.tmp-*"))
        free(disk)
        assert blobs.read(blobs.put(data)) == data
