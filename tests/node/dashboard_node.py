"""One real `e31 node run` process for the dashboard and metrics tests (port 0, no mDNS, one core).

A lone node runs the jobs it submits itself, so one process gives a sweep, receipts, a receipt log and
served totals. The node sees no owner load (E31_TEST_OWNER_LOAD_FILE names an empty file): on a
shared 2-core machine other processes would otherwise count as the owner working.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import node_process
from node_process import wait_for

__all__ = ["MONTECARLO", "NodeProcess", "wait_for"]

ROOT = Path(__file__).resolve().parents[2]
MONTECARLO = ROOT / "sandbox" / "workloads" / "montecarlo.wasm"
DEADLINE = 60.0


class NodeProcess(node_process.NodeProcess):
    """A lone node, one core; `url`, `port` and `token` of its local API."""

    def __init__(self, data_dir: Path, *args: str) -> None:
        super().__init__(data_dir, "--cores", "1", *args, start_deadline=DEADLINE)
        doc = self.api_document()
        self.port: int = doc["port"]
        self.token: str = doc["token"]
        self.url = f"http://127.0.0.1:{self.port}"

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
