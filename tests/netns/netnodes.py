"""Real `e31 node run` processes in the hosts of a harness topology, and what tests ask of them.

A `NetNode` runs in its host's namespace (`ip netns exec`), with its own data dir, listening on
0.0.0.0:7531 there (so it keeps listening when the host's address changes), with private addresses
dialled (`--dial-private`: every address in a topology is private), one worker, short heartbeats, and
mDNS on or off. Its control API listens on the namespace's own 127.0.0.1 and is reached through the
host (`Host.call`). It can be killed (SIGKILL), stopped (SIGTERM) and started again on its data dir.

Reads of a node's store for invariant checks open its SQLite file read-only (`store_rows`), so they
work on a node that is running, stopped or killed.
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from e31.node.api.client import ApiClient, ApiClientError
from harness import Host

PORT = 7531
READY = re.compile(r"node (e31n[a-z2-7]{52}) on network (\S+) listening on (\S+)$", re.MULTILINE)
START_WAIT = 90.0


def wait_until(what: str, check: Callable[[], Any], deadline: float = 60.0, every: float = 0.1) -> Any:
    """Poll `check` until it returns something true (returned) or `deadline` seconds pass (an
    AssertionError naming `what`). A wait on state, bounded; the bound is a failure, not a figure."""
    end = time.monotonic() + deadline
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {deadline:.0f} s waiting for {what}")
        time.sleep(every)


class NetNode:
    def __init__(
        self,
        host: Host,
        data_dir: Path,
        *,
        mdns: bool = False,
        bootstrap: Sequence[str] = (),
        args: Sequence[str] = (),
        owner_load: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.host = host
        self.data_dir = data_dir
        self.mdns = mdns
        self.bootstrap = list(bootstrap)
        self.args = list(args)
        self.owner_load = owner_load
        self.env = dict(env or {})
        """Extra environment for the process (test knobs such as E31_TEST_MARKET_TIMING)."""
        self.log = data_dir.with_suffix(".log")
        self.proc: subprocess.Popen[bytes] | None = None
        self.node_id = ""
        self.starts = 0
        self._api: ApiClient | None = None

    @property
    def name(self) -> str:
        return self.host.name

    @property
    def address(self) -> str:
        """Where peers dial it (its host's current address)."""
        return f"{self.host.ip}:{PORT}"

    def argv(self) -> list[str]:
        argv = [sys.executable, "-m", "e31.node", "node", "run", "--data-dir", str(self.data_dir)]
        argv += ["--listen", f"0.0.0.0:{PORT}", "--dial-private", "--heartbeat", "0.5", "--cores", "1"]
        argv += ["--mdns", "--mdns-interfaces", "e0"] if self.mdns else ["--no-mdns"]
        for peer in self.bootstrap:
            argv += ["--bootstrap", peer]
        return argv + self.args

    def start(self, *, wait: bool = True) -> NetNode:
        """Start the node (again, on its data dir); with `wait`, until it says it listens."""
        if self.running():
            raise RuntimeError(f"{self.name} is running")
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        load = self.owner_load
        if load is None:  # no owner at work: the machine's own load must not make it offer nothing
            load = self.data_dir.with_suffix(".owner-load")
            load.write_text("")
        env = dict(os.environ, E31_TEST_OWNER_LOAD_FILE=str(load), E31_DEBUG="1", **self.env)
        self.starts += 1
        with open(self.log, "ab") as out:
            out.write(f"--- start {self.starts}\n".encode())
            out.flush()
            self.proc = self.host.exec(
                self.argv(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=out, env=env
            )
        self._api = None
        if wait:
            self.wait_ready()
        return self

    def ready(self) -> bool:
        """Whether this start of the node has said it listens (its API answers from then on)."""
        if self.proc is None or self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited ({self.exit_code()}):\n{self.log_tail()}")
        text = self.log.read_text(errors="replace").rsplit(f"--- start {self.starts}\n", 1)[-1]
        match = READY.search(text)
        if match is not None:
            self.node_id = match[1]
        return match is not None

    def wait_ready(self) -> None:
        wait_until(f"{self.name} to start", self.ready, START_WAIT)

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def kill(self) -> None:
        """kill -9, and wait for it to be gone."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def stop(self) -> None:
        """SIGTERM (a clean stop), then SIGKILL if it does not go within 30 s."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)

    # --- the control API, inside the host's namespace ---

    def _client(self) -> ApiClient:
        if self._api is None:
            self._api = ApiClient(self.data_dir, timeout=60.0)
        return self._api

    def get(self, path: str) -> Any:
        client = self._client()
        return self.host.call(client.get, path)

    def post(self, path: str, body: Any) -> Any:
        client = self._client()
        return self.host.call(client.post, path, body)

    def try_get(self, path: str) -> Any:
        """GET, or None while the node cannot answer (starting, stopped, killed)."""
        if not self.running():
            return None
        try:
            return self.get(path)
        except (ApiClientError, OSError):
            return None

    def connected(self) -> set[str]:
        peers = self.try_get("/v1/peers") or []
        return {p["node_id"] for p in peers if p["state"] == "connected"}

    def export(self, out: Path) -> dict[str, Any]:
        """Have the node write its receipts bundle (every job it knows) to `out`."""
        answer: dict[str, Any] = self.post("/v1/receipts/export", {"out": str(out), "overwrite": True})
        return answer

    # --- the store, read-only ---

    def store_rows(self, sql: str, *params: object) -> list[tuple[Any, ...]]:
        with sqlite3.connect(f"file:{self.data_dir / 'node.sqlite'}?mode=ro", uri=True, timeout=30) as db:
            return db.execute(sql, params).fetchall()


def all_linked(nodes: Sequence[NetNode]) -> Callable[[], bool]:
    """A check: every node is connected to every other."""

    def check() -> bool:
        ids = {n.node_id for n in nodes}
        return all(n.connected() >= ids - {n.node_id} for n in nodes)

    return check


def audit(bundle: Path) -> subprocess.CompletedProcess[str]:
    """`e31 audit` of a bundle (offline: in the test's own namespace, no network needed)."""
    return subprocess.run(
        [sys.executable, "-m", "e31.node", "audit", str(bundle)],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
