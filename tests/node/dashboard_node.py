"""One real `e31 node run` process for the dashboard and metrics tests (port 0, no mDNS, one core).

A lone node runs the jobs it submits itself, so one process gives a sweep, receipts, a receipt log and
served totals. The node sees no owner load (E31_TEST_OWNER_LOAD_FILE names an empty file): on a
shared 2-core machine other processes would otherwise count as the owner working.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from e31.node.api.client import ApiClient

ROOT = Path(__file__).resolve().parents[2]
MONTECARLO = ROOT / "sandbox" / "workloads" / "montecarlo.wasm"
READY = re.compile(r"node (e31n[a-z2-7]{52}) on network (\S+) listening on (\S+)$", re.MULTILINE)
DEADLINE = 60.0


def wait_for(what: str, check: Callable[[], Any], deadline: float = DEADLINE) -> Any:
    end = time.monotonic() + deadline
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class NodeProcess:
    def __init__(self, data_dir: Path, *args: str) -> None:
        self.data_dir = data_dir
        self.log = data_dir.with_suffix(".log")
        quiet = data_dir.with_suffix(".owner-load")
        quiet.write_text("")
        env = dict(os.environ, E31_TEST_OWNER_LOAD_FILE=str(quiet))
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "e31.node",
                    "node",
                    "run",
                    "--data-dir",
                    str(data_dir),
                    "--listen",
                    "127.0.0.1:0",
                    "--no-mdns",
                    "--dial-private",
                    "--cores",
                    "1",
                    *args,
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=out,
                env=env,
            )
        try:
            self.node_id = wait_for(f"{data_dir.name} to start", self._ready)
            doc = json.loads((data_dir / "api.json").read_text())
        except BaseException:
            self.stop()
            raise
        self.port: int = doc["port"]
        self.token: str = doc["token"]
        self.url = f"http://127.0.0.1:{self.port}"
        self.api = ApiClient(data_dir, timeout=60.0)

    def _ready(self) -> str | None:
        if self.proc.poll() is not None:
            raise AssertionError(f"the node exited with {self.proc.returncode}:\n{self.log.read_text()}")
        match = READY.search(self.log.read_text())
        return None if match is None else match[1]

    def sweep(self, jobs: int, samples: int) -> dict[str, Any]:
        """Submit a batch of montecarlo jobs (seeds 1..jobs); the answer has batch_id and job_ids."""
        answer: dict[str, Any] = self.api.post(
            "/v1/batches",
            {
                "module": str(MONTECARLO),
                "limits": {"fuel": 200_000_000_000, "timeout": 600},
                "deadline": int(time.time() * 1000) + 30 * 60 * 1000,
                "jobs": [{"args": [str(seed), str(samples)]} for seed in range(1, jobs + 1)],
            },
        )
        return answer

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
