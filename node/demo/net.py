"""A throwaway network of real `e31 node run` processes on 127.0.0.1, for `e31 demo` and its tests.

Each node is a child process (`python -m e31.node node run`) with its own data dir under one root, its log
(stdout and stderr) in DATA/node.log, listening on 127.0.0.1, with mDNS off and a private network name,
so the demo never meets (or disturbs) real nodes. The others bootstrap to the first node and peer exchange
links them to each other. Readiness and links are read
through each node's local control API (DATA/api.json), polled under deadlines. `stop()` sends SIGTERM to
every node, waits, and kills only what did not stop.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import NodeError

if TYPE_CHECKING:  # the client (and http.client) load on first use: `e31 demo --help` stays quick
    from ..api.client import ApiClient

LOG_FILE = "node.log"
MAX_NODES = 16
HEARTBEAT = 0.5
"""Seconds between link heartbeats (the hidden `--heartbeat` flag): short, so links form quickly."""


class NetworkError(NodeError):
    """A node failed to start, died, or the nodes did not link up; the message names the node and its log."""


@dataclass
class LocalNode:
    name: str
    data_dir: Path
    process: subprocess.Popen[bytes]
    node_id: str = ""
    listen: str = ""
    stopped_with: int | None = None

    @property
    def log_path(self) -> Path:
        return self.data_dir / LOG_FILE

    @property
    def pid(self) -> int:
        return self.process.pid

    def api(self, timeout: float = 5.0) -> ApiClient:
        from ..api.client import ApiClient

        return ApiClient(self.data_dir, timeout=timeout)

    def ask(self, path: str) -> Any:
        """GET `path` from the node's control API; None when it cannot answer (yet)."""
        from ..api.client import ApiClientError

        try:
            return self.api().get(path)
        except ApiClientError:
            return None

    def log_tail(self, lines: int = 5) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join("    " + line for line in text.splitlines()[-lines:])

    def failure(self, what: str) -> NetworkError:
        tail = self.log_tail()
        text = f"{self.name}: {what}; its log is {self.log_path}"
        return NetworkError(text + (f"\n{tail}" if tail else ""))


@dataclass
class LocalNetwork:
    """`count` nodes under `root` (root/node1, root/node2, ...); use as a context manager or call stop()."""

    root: Path
    count: int
    startup_timeout: float = 30.0
    link_timeout: float = 30.0
    heartbeat: float = HEARTBEAT
    extra_args: tuple[str, ...] = ()
    network: str = field(default_factory=lambda: f"demo-{secrets.token_hex(4)}")
    nodes: list[LocalNode] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 1 <= self.count <= MAX_NODES:
            raise ValueError(f"a local network has 1 to {MAX_NODES} nodes, got {self.count}")

    def __enter__(self) -> LocalNetwork:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, on_event: Callable[[str], None] = lambda _: None) -> None:
        """Start every node and wait until each runs its control API and the first links to all others.

        All nodes start at once: the first listens on a port picked here, the others bootstrap to it and
        retry (with backoff) until it answers. Python start-up dominates, so this about halves the wait.
        """
        address = f"127.0.0.1:{_free_port()}"
        self._spawn(1, ("--listen", address))
        for i in range(2, self.count + 1):
            self._spawn(i, ("--listen", "127.0.0.1:0", "--bootstrap", address))
        for node in self.nodes:
            self._wait_ready(node)
            on_event(f"{node.name} {node.node_id} listening on {node.listen}")
        if self.count > 1:
            self._wait_linked()
            on_event(f"{self.count} nodes linked")

    def _spawn(self, index: int, args: tuple[str, ...]) -> LocalNode:
        name = f"node{index}"
        data_dir = self.root / name
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        command = [
            sys.executable,
            "-m",
            "e31.node",
            "node",
            "run",
            "--data-dir",
            str(data_dir),
            "--no-mdns",
            "--dial-private",
            "--network",
            self.network,
            "--heartbeat",
            str(self.heartbeat),
            *args,
            *self.extra_args,
        ]
        with open(data_dir / LOG_FILE, "ab") as log:
            try:
                process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
            except OSError as e:
                raise NetworkError(f"{name}: cannot start {sys.executable}: {e.strerror or e}") from None
        node = LocalNode(name, data_dir, process)
        self.nodes.append(node)
        return node

    def _wait_ready(self, node: LocalNode) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while True:
            if node.process.poll() is not None:
                raise node.failure(f"exited with status {node.process.returncode} while starting")
            status = node.ask("/v1/status")
            if isinstance(status, dict) and status.get("node_id") and status.get("listen"):
                node.node_id, node.listen = str(status["node_id"]), str(status["listen"])
                return
            if time.monotonic() > deadline:
                raise node.failure(f"did not start within {self.startup_timeout:g} s")
            time.sleep(0.05)

    def connected(self, node: LocalNode) -> set[str]:
        """The node ids `node` has a live link to (empty if it cannot be asked)."""
        peers = node.ask("/v1/peers")
        if not isinstance(peers, list):
            return set()
        return {
            str(p.get("node_id"))
            for p in peers
            if isinstance(p, dict) and p.get("state") in ("connected", "suspect")
        }

    def _wait_linked(self) -> None:
        """Until the first node links to every other one and each other one links to the first."""
        first, rest = self.nodes[0], self.nodes[1:]
        deadline = time.monotonic() + self.link_timeout
        while True:
            self.check_alive()
            missing = {n.node_id for n in rest} - self.connected(first)
            lonely = [n for n in rest if first.node_id not in self.connected(n)]
            if not missing and not lonely:
                return
            if time.monotonic() > deadline:
                names = sorted({n.name for n in rest if n.node_id in missing} | {n.name for n in lonely})
                raise NetworkError(
                    f"{', '.join(names)} did not link to {first.name} within "
                    f"{self.link_timeout:g} s; the logs are in {self.root}/NODE/{LOG_FILE}"
                )
            time.sleep(0.1)

    @property
    def degree(self) -> int:
        """The peers each node dials: its `--target-degree` when given, else PeerSettings'."""
        from ..net.peers import PeerSettings  # (here: `e31 demo --help` loads no more than it needs)

        args = list(self.extra_args)
        if "--target-degree" in args[:-1]:
            return int(args[args.index("--target-degree") + 1])
        return PeerSettings().target_degree

    @property
    def can_mesh(self) -> bool:
        """Whether every node can link to every other: no more nodes than one dials, plus itself."""
        return self.count - 1 <= self.degree

    def wait_mesh(self, timeout: float | None = None) -> float:
        """Until every running node links to every other one; returns the seconds waited. `start` waits
        only for the links to the first node: the others link to each other as peer exchange tells them
        about one another, over the next few heartbeats. A benchmark waits for this so that it measures
        a settled network, not links, handshakes and fresh capacity adverts made during its first run.
        A node dials up to `degree` peers, so a network of more nodes is refused (ValueError), as is one
        not started."""
        if not self.can_mesh:
            raise ValueError(
                f"a node dials at most {self.degree} peers: {self.count} nodes may never form a full mesh"
            )
        if len(self.nodes) != self.count or any(not n.node_id for n in self.nodes):
            raise ValueError("the network is not started: start() first")
        began = time.monotonic()
        deadline = began + (self.link_timeout if timeout is None else timeout)
        running = [n for n in self.nodes if n.stopped_with is None]
        everyone = {n.node_id for n in running}
        while True:
            self.check_alive()
            unlinked = [n.name for n in running if everyone - {n.node_id} - self.connected(n)]
            if not unlinked:
                return time.monotonic() - began
            if time.monotonic() > deadline:
                raise NetworkError(
                    f"{', '.join(unlinked)} did not link to every other node within "
                    f"{deadline - began:g} s; the logs are in {self.root}/NODE/{LOG_FILE}"
                )
            time.sleep(0.1)

    def check_alive(self) -> None:
        for node in self.nodes:
            if node.process.poll() is not None and node.stopped_with is None:
                raise node.failure(f"exited unexpectedly with status {node.process.returncode}")

    def stop(self, grace: float = 10.0) -> list[str]:
        """SIGTERM every node, wait up to `grace` seconds in all, SIGKILL the rest; returns the problems.
        A second Ctrl-C meanwhile is ignored: it must not leave nodes running."""
        with _interrupts_ignored():
            return self._stop(grace)

    def _stop(self, grace: float) -> list[str]:
        problems: list[str] = []
        for node in self.nodes:
            if node.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    node.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for node in self.nodes:
            if node.stopped_with is not None:
                continue
            try:
                node.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                node.process.kill()
                node.process.wait()
                problems.append(
                    f"{node.name} did not stop within {grace:g} s of SIGTERM and was killed; "
                    f"its log is {node.log_path}"
                )
            node.stopped_with = node.process.returncode
        return problems

    def rss_bytes(self) -> int | None:
        """Resident memory of the nodes and all their descendants (worker processes), from /proc; None
        where /proc is not there."""
        return process_tree_rss([n.pid for n in self.nodes if n.process.poll() is None])


def _free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (another process could take it before the node binds
    it: then the node fails to start and says so in its log)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@contextlib.contextmanager
def _interrupts_ignored() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _proc_children() -> dict[int, list[int]] | None:
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def process_tree_rss(roots: list[int]) -> int | None:
    """Sum of VmRSS over `roots` and their descendants."""
    children = _proc_children()
    if children is None:
        return None
    total, todo, seen = 0, list(roots), set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += _rss(pid)
        todo.extend(children.get(pid, ()))
    return total
