"""One real `e31 node run` process for integration tests and benchmarks, and the `e31` command beside it.

The node listens on 127.0.0.1 port 0 and may dial private addresses (every peer in a test is on
loopback); mDNS is off unless the arguments name an --mdns option. It sees no owner load unless the
caller set E31_TEST_OWNER_LOAD_FILE: on a shared machine other processes would otherwise count as the
owner working. Its log (stderr) goes to `log`, appended to, so a restarted node keeps one log and
readiness is read from what the new process wrote (or, when a --log-level above info hides the ready
line, from the node's GET /v1/status once it answers for this process).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from e31.node.api.client import ApiClient, ApiClientError

READY = re.compile(r"node (e31n[a-z2-7]{52}) on network (\S+) listening on (\S+)$", re.MULTILINE)
DEADLINE = 30.0


def e31(
    *args: str, data_dir: Path | None = None, env: dict[str, str] | None = None, timeout: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """Run the `e31` command line to its end (E31_DATA_DIR set to `data_dir` when given)."""
    full = dict(os.environ) | (env or {})
    if data_dir is not None:
        full["E31_DATA_DIR"] = str(data_dir)
    return subprocess.run(
        [sys.executable, "-m", "e31.node", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env=full,
    )


def wait_for(what: str, check: Callable[[], Any], deadline: float = DEADLINE) -> Any:
    """Poll `check` every 50 ms until it returns something true (returned), or fail after `deadline`."""
    end = time.monotonic() + deadline
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class NodeProcess:
    """A started node: `node_id`, `network` and `address` read from its ready line, `api` its local
    API client."""

    def __init__(
        self, data_dir: Path, *args: str, log: Path | None = None, start_deadline: float = DEADLINE
    ) -> None:
        self.data_dir = data_dir
        self.log = log or data_dir.with_suffix(".log")
        self.args = args
        env = dict(os.environ)
        if "E31_TEST_OWNER_LOAD_FILE" not in env:
            quiet = data_dir.with_suffix(".owner-load")
            quiet.write_text("")
            env["E31_TEST_OWNER_LOAD_FILE"] = str(quiet)
        mdns = () if any(a.startswith("--mdns") for a in args) else ("--no-mdns",)
        start = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as out:
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
                    "--dial-private",
                    *mdns,
                    *args,
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=out,
                env=env,
            )
        try:
            self.node_id, self.network, self.address = wait_for(
                f"{data_dir.name} to start", lambda: self._ready(start), start_deadline
            )
        except BaseException:
            self.kill()
            raise
        self.api = ApiClient(data_dir, timeout=60.0)

    def _ready(self, start: int) -> tuple[str, str, str] | None:
        if self.proc.poll() is not None:
            raise AssertionError(f"the node exited with {self.proc.returncode}:\n{self.log.read_text()}")
        match = READY.search(self.log.read_text()[start:])
        if match is not None:
            return match[1], match[2], match[3]
        level = self.args[self.args.index("--log-level") + 1] if "--log-level" in self.args[:-1] else "info"
        return self._status_ready() if level in ("warning", "error") else None

    def _status_ready(self) -> tuple[str, str, str] | None:
        try:
            with ApiClient(self.data_dir, timeout=5.0) as api:
                status: dict[str, Any] = api.get("/v1/status")
        except ApiClientError:
            return None
        if status.get("pid") != self.proc.pid:  # api.json of an earlier run
            return None
        return str(status["node_id"]), str(status["network"]), str(status["listen"])

    def api_document(self) -> dict[str, Any]:
        """api.json: the local API's port and token."""
        doc: dict[str, Any] = json.loads((self.data_dir / "api.json").read_text())
        return doc

    def peers(self) -> list[dict[str, Any]]:
        try:
            peers: list[dict[str, Any]] = ApiClient(self.data_dir, timeout=5.0).get("/v1/peers")
        except ApiClientError:
            return []
        return peers

    def connected(self, *states: str) -> set[str]:
        """The ids of the peers in one of `states` (default: connected)."""
        wanted = states or ("connected",)
        return {p["node_id"] for p in self.peers() if p["state"] in wanted}

    def stop(self, sig: int = signal.SIGTERM, timeout: float = DEADLINE) -> int | None:
        """Signal the node and wait for it (killed if it has not stopped within `timeout`); its exit
        code, or None when it had to be killed."""
        if self.proc.poll() is not None:
            return self.proc.returncode
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=DEADLINE)
