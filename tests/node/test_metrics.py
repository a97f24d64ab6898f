"""GET /metrics: the text parses with prometheus_client's own parser, and the counters move with real
jobs on two real `e31 node run` processes linked on 127.0.0.1 (runs, fuel and compute served, queue
wait, messages and bytes by kind, store calls, jobs by state, links); a forged message on a real link
moves the verification failures (in process)."""

from __future__ import annotations

import http.client
import math
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from dashboard_node import NodeProcess, wait_for
from e31.node import metrics, version
from e31.node.api.client import ApiClientError
from e31.protocol.envelope import node_id_of, sign_message
from e31.protocol.messages import Ping
from nacl.signing import SigningKey
from test_peers import raw_link, running, until

parser = pytest.importorskip("prometheus_client.parser", reason="prometheus_client is not installed")

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> tuple[dict[str, str], Samples]:
    """The families' types and every sample, by (name, sorted labels)."""
    types: dict[str, str] = {}
    samples: Samples = {}
    for family in parser.text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return types, samples


def total(samples: Samples, name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


def test_the_text_format_parses_with_the_reference_parser() -> None:
    c = metrics.Counter("test_things", "Things\\ counted\nhere", ["kind", "who"])
    c.inc(2, "a", 'quote " back \\ slash\nnewline')
    c.inc(0.5, "b", "x")
    h = metrics.Histogram("test_seconds", "Latency", [0.1, 1.0])
    for v in (0.05, 0.1, 0.5, 7.0):
        h.observe(v)
    g = metrics.Gauge("test_level", "A level", ["state"], {("up",): 3, ("down",): 0})
    types, samples = parse(metrics.render([c, h, g]))
    assert types == {"e31_test_things": "counter", "e31_test_seconds": "histogram", "e31_test_level": "gauge"}
    assert samples[("e31_test_things_total", (("kind", "a"), ("who", 'quote " back \\ slash\nnewline')))] == 2
    assert samples[("e31_test_things_total", (("kind", "b"), ("who", "x")))] == 0.5
    buckets = {ls[0][1]: v for (n, ls), v in samples.items() if n == "e31_test_seconds_bucket"}
    assert buckets == {"0.1": 2, "1.0": 3, "+Inf": 4}
    assert samples[("e31_test_seconds_count", ())] == 4
    assert math.isclose(samples[("e31_test_seconds_sum", ())], 7.65)
    assert samples[("e31_test_level", (("state", "up"),))] == 3


def test_a_peer_cannot_invent_label_values() -> None:
    before = dict(metrics.MESSAGES_RECEIVED.values)
    for i in range(100):
        metrics.message_received(f"made-up-{i}", 10)
    metrics.message_received(None, 10)
    grown = set(metrics.MESSAGES_RECEIVED.values) - set(before)
    assert grown <= {("other",)}
    assert metrics.kind_label("offer") == "offer"


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NodeProcess, NodeProcess]]:
    tmp = tmp_path_factory.mktemp("metrics")
    a = NodeProcess(tmp / "a", "--heartbeat", "0.5")
    b = None
    try:
        b = NodeProcess(tmp / "b", "--heartbeat", "0.5", "--bootstrap", f"127.0.0.1:{_listen_port(a)}")
        for n in (a, b):
            wait_for("the link", lambda n=n: _connected(n) == 1)
        yield a, b
    finally:
        for n in (a, b):
            if n is not None:
                n.stop()


def _listen_port(node: NodeProcess) -> int:
    return int(node.api.get("/v1/status")["listen"].rsplit(":", 1)[1])


def _connected(node: NodeProcess) -> int:
    try:
        return int(node.api.get("/v1/status")["peers"]["connected"])
    except ApiClientError:
        return 0


def scrape(node: NodeProcess, token: str | None = None) -> tuple[int, str, str]:
    conn = http.client.HTTPConnection("127.0.0.1", node.port, timeout=30)
    try:
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        conn.request("GET", "/metrics", headers=headers)
        r = conn.getresponse()
        return r.status, r.getheader("content-type") or "", r.read().decode()
    finally:
        conn.close()


def test_metrics_need_the_token(pair: tuple[NodeProcess, NodeProcess]) -> None:
    a, _ = pair
    status, _, body = scrape(a)
    assert status == 401 and "e31_" not in body
    assert scrape(a, "wrong")[0] == 401


def test_e31_metrics_prints_the_same_families(pair: tuple[NodeProcess, NodeProcess]) -> None:
    a, _ = pair
    printed = subprocess.run(
        [sys.executable, "-m", "e31.node", "metrics", "--data-dir", str(a.data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert printed.returncode == 0, printed.stderr
    types, samples = parse(printed.stdout)
    assert types == parse(scrape(a, a.token)[2])[0]
    assert samples[("e31_info", (("network", "main"), ("node_id", a.node_id), ("version", version())))] == 1


def test_counters_move_with_real_jobs(pair: tuple[NodeProcess, NodeProcess], tmp_path: Path) -> None:
    a, b = pair
    before = {n: parse(scrape(n, n.token)[2])[1] for n in (a, b)}
    sweep = a.sweep(4, 2_000_000)
    wait_for(
        "the sweep",
        lambda: a.api.get(f"/v1/batches/{sweep['batch_id']}?brief=1")["ended"] == 4,
    )
    docs = [a.api.get(f"/v1/jobs/{j}") for j in sweep["job_ids"]]
    assert all(d["succeeded"] for d in docs)

    status, ctype, text = scrape(a, a.token)
    assert status == 200 and ctype.startswith("text/plain; version=0.0.4")
    types, after_a = parse(text)
    after = {a: after_a, b: parse(scrape(b, b.token)[2])[1]}
    assert types["e31_runs"] == "counter" and types["e31_queue_wait_seconds"] == "histogram"
    assert types["e31_jobs"] == "gauge"

    def grew(name: str, **labels: str) -> float:
        return sum(total(after[n], name, **labels) - total(before[n], name, **labels) for n in (a, b))

    # Every run happened on one of the two, and what they served is what the receipts say.
    assert grew("e31_runs_total", status="exited") == 4
    assert grew("e31_fuel_served_total") == sum(d["receipt"]["fuel_used"] for d in docs)
    assert grew("e31_compute_seconds_served_total") == pytest.approx(
        sum(d["receipt"]["compute_ms"] for d in docs) / 1000
    )
    assert grew("e31_queue_wait_seconds_count") == 4
    # The submitter's store shows the jobs done; the link is up on both sides, with messages both ways.
    assert total(after_a, "e31_jobs", role="submitter", state="done") >= 4
    assert total(after_a, "e31_links", state="connected") == 1
    assert total(after_a, "e31_messages_sent_total", kind="offer") > total(
        before[a], "e31_messages_sent_total", kind="offer"
    )
    assert total(after[b], "e31_messages_received_total", kind="offer") >= 1
    assert total(after[b], "e31_message_bytes_received_total", kind="offer") > 0

    def heartbeats() -> float:  # every 0.5 s on the link: a fast sweep may end before the first
        samples = parse(scrape(a, a.token)[2])[1]
        pings = total(samples, "e31_messages_received_total", kind="ping")
        return pings + total(samples, "e31_messages_received_total", kind="pong")

    assert wait_for("a heartbeat counted on the link", heartbeats) > 0
    assert total(after_a, "e31_store_call_seconds_count") > 0
    assert total(after_a, "e31_api_requests_total", status="2xx") > 0
    assert total(after_a, "e31_info", node_id=a.node_id) == 1


async def test_a_forged_message_on_a_link_is_counted_as_a_verification_failure(tmp_path: Path) -> None:
    """In process, over a real transport link (tests/node/test_peers.py's hand-driven peer): a ping
    whose signature does not verify costs its sender the link and moves the counters at the event."""
    failures = metrics.VERIFICATION_FAILURES.value("link_message")
    pings = metrics.MESSAGES_RECEIVED.value("ping")
    async with running(tmp_path, "a") as a:
        key = SigningKey.generate()
        async with raw_link(a, key) as conn:
            forged = bytearray(
                sign_message(Ping("main", node_id_of(key), b"n" * 16, int((time.time() + 60) * 1000)), key)
            )
            forged[-1] ^= 1  # the last byte of the signature
            await conn.send(bytes(forged))
            await until(lambda: conn.closed, "the link closed")
    assert metrics.VERIFICATION_FAILURES.value("link_message") == failures + 1
    assert metrics.MESSAGES_RECEIVED.value("ping") >= pings + 1
    text = metrics.render(metrics.COUNTED)
    _, samples = parse(text)
    assert samples[("e31_verification_failures_total", (("what", "link_message"),))] >= 1
