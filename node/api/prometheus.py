"""GET /metrics: the node's metrics in the Prometheus text format, behind the API token.

The counters and histograms are those the node bumps where things happen (node/metrics.py); the
gauges are read here, at scrape time, from the node's state: jobs by role and state (one grouped
query), the run queue, links by state, offered and advertised capacity, the receipt log's size, and
the gossip layer's own counters. docs/operating.md, "Metrics", lists every name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from .. import metrics
from ..metrics import Counter, Gauge, Metric
from ..store import overview
from ..store.async_store import AsyncStore
from ..store.receiptlog import ReceiptLog
from .server import Handler, RawResponse, Request

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def metrics_handler(
    store: AsyncStore,
    status: Callable[[], dict[str, Any]],
    queue: Callable[[], tuple[int, float] | None],
    receipt_log: Callable[[], ReceiptLog | None],
) -> Handler:
    """The handler of GET /metrics. `status` is the node's /v1/status document, `queue` the run
    queue's (length, backlog seconds) once the scheduler runs, `receipt_log` the log once open."""

    async def handle(request: Request) -> RawResponse:
        counts = await store.run(overview.job_counts)
        doc = status()
        log = receipt_log()
        log_size = 0 if log is None else await trio.to_thread.run_sync(lambda: log.size)
        text = metrics.render([*scraped(doc, counts, queue(), log_size), *metrics.COUNTED])
        return RawResponse(text.encode(), CONTENT_TYPE)

    return handle


def scraped(
    doc: dict[str, Any],
    counts: dict[tuple[str, str], int],
    queue: tuple[int, float] | None,
    log_size: int,
) -> list[Metric]:
    """The gauges (and the gossip counters) read from the node's state at scrape time."""
    offered = doc.get("offered") or {}
    peer_capacity = doc.get("peer_capacity") or {}
    length, backlog = queue if queue is not None else (0, 0.0)
    jobs: dict[tuple[str, ...], float] = {key: n for key, n in counts.items()}
    gossip = Counter("gossip_events", "The gossip layer's counters since start, by event", ["event"])
    for event, n in sorted((doc.get("gossip") or {}).items()):
        if isinstance(n, int | float):
            gossip.inc(n, str(event))
    reach = doc.get("reachability") or {}
    relay = Counter("relay_events", "Reachability and relaying since start, by event", ["event"])
    for event in ("circuits_relayed", "bytes_relayed", "relayed_links_opened", "refusals"):
        if isinstance(reach.get(event), int):
            relay.inc(reach[event], event)
    return [
        Gauge(
            "info",
            "Constant 1, labelled with the node's id, network and version",
            ["node_id", "network", "version"],
            {(str(doc.get("node_id")), str(doc.get("network")), str(doc.get("version"))): 1},
        ),
        Gauge("uptime_seconds", "Seconds since the node started", values={(): doc.get("uptime_seconds", 0)}),
        Gauge("jobs", "Jobs in the store, by role and state", ["role", "state"], jobs),
        Gauge("run_queue_length", "Jobs waiting for or holding a sandbox worker", values={(): length}),
        Gauge("run_queue_backlog_seconds", "Estimated run time of the run queue", values={(): backlog}),
        Gauge(
            "links",
            "Peers by link state (connected, suspect, dialing, known, backoff)",
            ["state"],
            {(str(k),): v for k, v in (doc.get("peers") or {}).items()},
        ),
        Gauge("offered_cores", "Cores this node offers now", values={(): offered.get("cores", 0)}),
        Gauge(
            "offered_memory_bytes", "Memory this node offers now", values={(): offered.get("memory_bytes", 0)}
        ),
        Gauge(
            "peer_offered_cores",
            "Cores the peers' unexpired capacity adverts offer, summed",
            values={(): sum(int(p.get("cores", 0)) for p in peer_capacity.values())},
        ),
        Gauge("receipt_log_size", "Receipts in this node's receipt log", values={(): log_size}),
        gossip,
        relay,
    ]
