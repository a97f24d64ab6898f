"""Real `e31 node run` processes on 127.0.0.1: start-up, the local API, peers, restarts, clean stops.

Each node is a child process (`python -m e31.node node run`) listening on port 0; the test reads
its node id and listen address from its log. Heartbeats are shortened with the hidden --heartbeat
flag. Every wait polls under a deadline, and every process is killed in a finally.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import node_process
import pytest
from e31.node.api.client import ApiClient
from e31.node.cli.tables import format_ago, format_bytes, format_duration, format_peers, format_status
from node_process import wait_for

HEARTBEAT = "0.2"
DEADLINE = 20.0


def e31(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return node_process.e31(*args, env=env, timeout=30.0)


class NodeProcess(node_process.NodeProcess):
    """A node of these tests: heartbeats every 0.2 s; its log given, kept across restarts."""

    def __init__(self, data_dir: Path, log: Path, *args: str) -> None:
        super().__init__(data_dir, "--heartbeat", HEARTBEAT, *args, log=log, start_deadline=DEADLINE)

    def connected(self, *states: str) -> set[str]:
        return super().connected(*(states or ("connected", "suspect")))


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., NodeProcess]]:
    nodes: list[NodeProcess] = []

    def start(name: str, *args: str) -> NodeProcess:
        node = NodeProcess(tmp_path / name, tmp_path / f"{name}.log", *args)
        nodes.append(node)
        return node

    try:
        yield start
    finally:
        for node in nodes:
            node.kill()


def test_a_bootstrap_chain_converges_and_every_node_stops_cleanly(spawn: Callable[..., NodeProcess]) -> None:
    a = spawn("a")
    b = spawn("b", "--bootstrap", a.address)
    c = spawn("c", "--bootstrap", f"{b.node_id}@{b.address}")
    nodes = (a, b, c)
    for node in nodes:
        others = {n.node_id for n in nodes if n is not node}
        wait_for(
            f"{node.data_dir.name} to link to the other two", lambda n=node, o=others: n.connected() == o
        )

    listed = e31("peers", "--data-dir", str(c.data_dir), "--json")
    assert listed.returncode == 0, listed.stderr
    peers = {p["node_id"]: p for p in json.loads(listed.stdout)}
    assert set(peers) == {a.node_id, b.node_id}
    assert peers[b.node_id]["source"] == "bootstrap"
    assert peers[a.node_id]["source"] == "exchange"  # learned from b, never configured
    assert peers[a.node_id]["address"] == a.address
    for p in peers.values():
        assert p["state"] == "connected" and isinstance(p["last_seen"], float)

    table = e31("peers", "--data-dir", str(c.data_dir))
    assert table.returncode == 0
    assert "NODE ID" in table.stdout and a.node_id in table.stdout and b.node_id in table.stdout

    status = e31("node", "status", "--data-dir", str(b.data_dir), "--json")
    assert status.returncode == 0, status.stderr
    doc = json.loads(status.stdout)
    assert doc["node_id"] == b.node_id
    assert doc["network"] == "main"
    assert doc["listen"] == b.address and doc["addresses"] == [b.address]
    assert doc["peer_count"] == 2 and doc["uptime_seconds"] >= 0
    assert doc["capacity"]["cores"] >= 1 and doc["capacity"]["memory_bytes"] > 0
    readable = e31("node", "status", "--data-dir", str(b.data_dir))
    assert readable.returncode == 0 and b.node_id in readable.stdout and "2 connected" in readable.stdout

    for node in nodes:
        assert node.stop(signal.SIGTERM) == 0
        assert not (node.data_dir / "api.json").exists()
        assert "Traceback" not in node.log.read_text()
    gone = e31("node", "status", "--data-dir", str(a.data_dir))
    assert gone.returncode == 1
    assert gone.stderr.strip().splitlines() == [f"e31: error: no node is running with data dir {a.data_dir}"]


def test_restart_keeps_identity_and_known_peers(spawn: Callable[..., NodeProcess]) -> None:
    a = spawn("a")
    (a.data_dir.parent / "b").mkdir(mode=0o700)  # a data dir open to others is refused
    (a.data_dir.parent / "b" / "config.toml").write_text('cores = 3\nmemory = "64MiB"\n')
    b = spawn("b", "--bootstrap", a.address, "--cores", "1")  # the flag overrides the file
    wait_for("b to link to a", lambda: b.connected() == {a.node_id})
    assert ApiClient(b.data_dir).get("/v1/status")["capacity"] == {"cores": 1, "memory_bytes": 64 << 20}
    assert b.stop(signal.SIGINT) == 0
    wait_for("a to notice", lambda: a.node_id not in a.connected() and not a.connected())

    # no --bootstrap: a comes from the store; --cores again: the file's 3 may be more than this machine has
    again = spawn("b", "--cores", "1")
    assert again.node_id == b.node_id
    wait_for("b to redial a from its store", lambda: again.connected() == {a.node_id})
    wait_for("a to see b again", lambda: a.connected() == {b.node_id})
    assert (again.data_dir / "identity.key").stat().st_mode & 0o777 == 0o600


def test_kill_9_leaves_a_store_that_restarts_cleanly(spawn: Callable[..., NodeProcess]) -> None:
    a = spawn("a")
    b = spawn("b", "--bootstrap", a.address)
    wait_for("b to link to a", lambda: b.connected() == {a.node_id})
    b.proc.send_signal(signal.SIGKILL)
    b.proc.wait(timeout=DEADLINE)
    assert (b.data_dir / "api.json").exists()  # left behind by the killed node
    stale = e31("peers", "--data-dir", str(b.data_dir))
    assert stale.returncode == 1 and "no node is running" in stale.stderr
    wait_for("a to drop the dead link", lambda: not a.connected())
    unfinished = b.data_dir / "blobs" / "ab" / ".tmp-crashed"  # as a blob write cut off by the kill
    unfinished.parent.mkdir(parents=True, exist_ok=True)
    unfinished.write_bytes(b"half a blob")

    again = spawn("b")
    assert again.node_id == b.node_id
    wait_for("b to redial a from its store", lambda: again.connected() == {a.node_id})
    assert not unfinished.exists()
    assert "Traceback" not in again.log.read_text()


def test_two_nodes_find_each_other_on_the_local_network_without_bootstrap(
    spawn: Callable[..., NodeProcess],
) -> None:
    network = f"t{os.getpid()}-{time.monotonic_ns() % 10**6}"  # no other test's nodes on it
    a = spawn("a", "--network", network, "--mdns-interfaces", "127.0.0.1")
    b = spawn("b", "--network", network, "--mdns-interfaces", "127.0.0.1")
    wait_for(
        "a and b to find each other", lambda: a.connected() == {b.node_id} and b.connected() == {a.node_id}
    )
    assert "mdns" in {p["source"] for p in a.peers() + b.peers()}


def test_a_peer_of_another_network_is_never_listed(spawn: Callable[..., NodeProcess]) -> None:
    a = spawn("a")
    x = spawn("x", "--network", "other", "--bootstrap", a.address)
    b = spawn("b", "--bootstrap", a.address)
    wait_for("x's dial to fail", lambda: "is on network 'main'; this node is on 'other'" in x.log.read_text())
    wait_for("b to link to a", lambda: b.connected() == {a.node_id})
    wait_for("a to list b", lambda: a.connected() == {b.node_id})
    assert x.node_id not in {p["node_id"] for p in a.peers()}
    assert x.node_id not in {p["node_id"] for p in b.peers()}
    assert a.node_id not in x.connected()
    assert b.node_id not in {p["node_id"] for p in x.peers()}


def test_a_pinned_bootstrap_peer_with_another_key_is_refused(spawn: Callable[..., NodeProcess]) -> None:
    a = spawn("a")
    b = spawn("b")
    impostor = spawn("c", "--bootstrap", f"{b.node_id}@{a.address}")
    wait_for("the pin to fail", lambda: "cannot reach" in impostor.log.read_text())
    assert impostor.connected() == set()
    assert impostor.node_id not in {p["node_id"] for p in a.peers()}


# --- start-up failures: one line on stderr, non-zero exit, no traceback ---------------------------------


def _one_line_failure(proc: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("e31: error:")]
    assert len(errors) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


def test_a_port_in_use_is_one_line_and_a_non_zero_exit(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = e31(
            "node", "run", "--data-dir", str(tmp_path / "n"), "--listen", f"127.0.0.1:{port}", "--no-mdns"
        )
    _one_line_failure(proc, "cannot listen", str(port))
    assert not (tmp_path / "n" / "api.json").exists()


def test_a_second_node_on_the_same_data_dir_is_refused(spawn: Callable[..., NodeProcess]) -> None:
    a = spawn("a")
    proc = e31("node", "run", "--data-dir", str(a.data_dir), "--listen", "127.0.0.1:0", "--no-mdns")
    _one_line_failure(proc, "already running")
    assert a.proc.poll() is None
    assert ApiClient(a.data_dir).get("/v1/status")["node_id"] == a.node_id


@pytest.mark.parametrize(
    ("setup", "needle"),
    [
        (lambda d: (d / "config.toml").write_text("listen = 7\n"), "config.toml"),
        (lambda d: (d / "config.toml").write_text("lissen = '127.0.0.1:0'\n"), "unknown key"),
        (
            lambda d: (d / "identity.key").write_text("not a key\n") and os.chmod(d / "identity.key", 0o600),
            "identity.key",
        ),
        (lambda d: (d / "identity.key").write_text("x") and os.chmod(d / "identity.key", 0o644), "chmod 600"),
        (lambda d: (d / "node.sqlite").write_bytes(b"this is not a database" * 100), "node.sqlite"),
    ],
    ids=["bad-value", "unknown-key", "malformed-key", "key-readable-by-others", "not-a-database"],
)
def test_bad_local_state_is_one_line_and_a_non_zero_exit(
    tmp_path: Path, setup: Callable[[Path], object], needle: str
) -> None:
    data = tmp_path / "n"
    data.mkdir(mode=0o700)
    setup(data)
    before = {p.name: p.read_bytes() for p in data.iterdir()}
    proc = e31("node", "run", "--data-dir", str(data), "--listen", "127.0.0.1:0", "--no-mdns")
    _one_line_failure(proc, needle)
    assert {p.name: p.read_bytes() for p in data.iterdir() if p.name in before} == before


def test_a_data_dir_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    proc = e31("node", "run", "--data-dir", str(tmp_path / "file"), "--listen", "127.0.0.1:0")
    assert "not a directory" in _one_line_failure(proc).lower()


def test_bad_flags_are_usage_errors(tmp_path: Path) -> None:
    proc = e31("node", "run", "--data-dir", str(tmp_path), "--bootstrap", "nonsense")
    _one_line_failure(proc, "--bootstrap")
    proc = e31("node", "run", "--data-dir", str(tmp_path), "--heartbeat", "-1")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr


def test_status_and_peers_without_a_node_say_so(tmp_path: Path) -> None:
    for args in (("node", "status"), ("node", "status", "--json"), ("peers",), ("peers", "--json")):
        proc = e31(*args, "--data-dir", str(tmp_path))
        assert proc.returncode == 1
        assert proc.stderr.splitlines() == [f"e31: error: no node is running with data dir {tmp_path}"]
        assert proc.stdout == ""
    env_dir = tmp_path / "env"
    from_env = e31("peers", env={"E31_DATA_DIR": str(env_dir)})
    assert from_env.stderr.splitlines() == [f"e31: error: no node is running with data dir {env_dir}"]


# --- the readable tables -------------------------------------------------------------------------------


def test_durations_sizes_and_ages_read_naturally() -> None:
    assert [format_duration(s) for s in (0, 59.9, 61, 3600 * 5 + 62, 86400 * 3 + 3700)] == [
        "0s",
        "59s",
        "1m 1s",
        "5h 1m 2s",
        "3d 1h 1m",
    ]
    assert [format_bytes(n) for n in (512, 64 << 20, 3 << 30)] == ["512 B", "64.0 MiB", "3.0 GiB"]
    assert format_ago(None) == "never"
    assert format_ago(100.0, now=100.5) == "just now"
    assert format_ago(100.0, now=190.0) == "1m 30s ago"


def test_the_status_table_shows_every_field_it_is_given() -> None:
    text = format_status(
        {
            "node_id": "e31nabc",
            "network": "main",
            "listen": "127.0.0.1:1",
            "addresses": ["127.0.0.1:1"],
            "uptime_seconds": 75,
            "version": "0.1.0",
            "peer_count": 2,
            "peers": {"connected": 2, "suspect": 0, "known": 3},
            "capacity": {"cores": 4, "memory_bytes": 1 << 30},
            "data_dir": "/d",
        }
    )
    lines = dict(line.split(":", 1) for line in text.splitlines())
    assert lines["node id"].strip() == "e31nabc"
    assert lines["uptime"].strip() == "1m 15s"
    assert lines["peers"].strip() == "2 connected, 3 known"
    assert lines["cores offered"].strip() == "4" and lines["memory offered"].strip() == "1.0 GiB"


def test_the_peers_table_has_a_row_per_peer_in_aligned_columns() -> None:
    assert format_peers([]) == "no known peers"
    text = format_peers(
        [
            {
                "node_id": "e31naaaa",
                "state": "connected",
                "address": "10.0.0.1:7531",
                "source": "bootstrap",
                "last_seen": 1000.0,
                "rtt_ms": 1.25,
            },
            {
                "node_id": "e31nb",
                "state": "backoff",
                "address": None,
                "source": "exchange",
                "last_seen": None,
                "rtt_ms": None,
            },
        ],
        now=1010.0,
    )
    header, first, second = text.splitlines()
    assert header.split() == ["NODE", "ID", "STATE", "ADDRESS", "SOURCE", "LAST", "SEEN", "RTT"]
    assert first.split() == ["e31naaaa", "connected", "10.0.0.1:7531", "bootstrap", "10s", "ago", "1.2", "ms"]
    assert second.split() == ["e31nb", "backoff", "-", "exchange", "never", "-"]
    assert header.index("STATE") == first.index("connected") == second.index("backoff")


def test_a_store_that_fails_under_the_node_stops_it_with_one_line() -> None:
    from e31.node.api.server import ControlError
    from e31.node.daemon import _expected
    from e31.node.errors import StoreError

    failed = StoreError("the database could not be synced to disk (fsync failed): stop the node")
    error = _expected(BaseExceptionGroup("tasks", [ExceptionGroup("inner", [failed])]))
    assert error is failed and error.exit_code == 74  # printed as one line with its own exit code
    refused = ControlError("cannot write api.json: Permission denied")  # any NodeError, not only some
    assert _expected(BaseExceptionGroup("tasks", [ExceptionGroup("inner", [refused])])) is refused
    other = _expected(BaseExceptionGroup("tasks", [failed, ValueError("bug")]))
    assert isinstance(other, BaseExceptionGroup)  # anything unexpected still shows as what it is
