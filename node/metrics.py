"""The node's counters and histograms, counted where things happen, shown as Prometheus text.

A metric here is a plain object the code that sees an event bumps: `inc` on a labelled counter is a
dict lookup and an add, `observe` on a histogram a bisect and three adds, with no lock (the node runs
its events on one trio thread; a store call's latency is observed there too, once the call is back).
Gauges (jobs by state, queue length, links) are read from the node's own state when the endpoint is
scraped (node/api/metrics.py), never kept up to date per event.

The values are per process (a node is one process), from its start. `render` writes the Prometheus
text exposition format 0.0.4; docs/operating.md, "Metrics", is the table of names, types and labels.
Label values that a peer could choose (a message's kind) are first mapped onto a fixed set, so a
stranger cannot grow the node's memory or the scrape by inventing kinds.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence

from e31.protocol.messages import KINDS

PREFIX = "e31_"
KNOWN_KINDS = frozenset(KINDS)


class Counter:
    """A monotonically growing total, optionally split by label values."""

    kind = "counter"
    __slots__ = ("help", "labels", "name", "values")

    def __init__(self, name: str, help: str, labels: Sequence[str] = ()) -> None:
        self.name = PREFIX + name
        self.help = help
        self.labels = tuple(labels)
        self.values: dict[tuple[str, ...], float] = {} if labels else {(): 0.0}

    def inc(self, amount: float = 1.0, *label_values: str) -> None:
        values = self.values
        values[label_values] = values.get(label_values, 0.0) + amount

    def value(self, *label_values: str) -> float:
        return self.values.get(label_values, 0.0)

    def samples(self) -> Iterable[tuple[str, tuple[tuple[str, str], ...], float]]:
        for key, v in sorted(self.values.items()):
            yield self.name + "_total", tuple(zip(self.labels, key, strict=True)), v


class Histogram:
    """Observations counted into cumulative buckets, with their sum and count."""

    kind = "histogram"
    __slots__ = ("bounds", "count", "counts", "help", "labels", "name", "sum")

    def __init__(self, name: str, help: str, bounds: Sequence[float]) -> None:
        self.name = PREFIX + name
        self.help = help
        self.labels: tuple[str, ...] = ()
        self.bounds = tuple(sorted(bounds))
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def samples(self) -> Iterable[tuple[str, tuple[tuple[str, str], ...], float]]:
        running = 0
        for bound, n in zip((*self.bounds, math.inf), self.counts, strict=True):
            running += n
            yield (
                self.name + "_bucket",
                (("le", "+Inf" if bound == math.inf else repr(float(bound))),),
                running,
            )
        yield self.name + "_sum", (), self.sum
        yield self.name + "_count", (), self.count


class Gauge:
    """A value read at scrape time (the endpoint builds these from the node's state)."""

    kind = "gauge"
    __slots__ = ("help", "labels", "name", "values")

    def __init__(
        self,
        name: str,
        help: str,
        labels: Sequence[str] = (),
        values: dict[tuple[str, ...], float] | None = None,
    ) -> None:
        self.name = PREFIX + name
        self.help = help
        self.labels = tuple(labels)
        self.values = values if values is not None else {}

    def samples(self) -> Iterable[tuple[str, tuple[tuple[str, str], ...], float]]:
        for key, v in sorted(self.values.items()):
            yield self.name, tuple(zip(self.labels, key, strict=True)), v


Metric = Counter | Histogram | Gauge

# --- what the node counts (docs/operating.md, "Metrics") ---

_SECONDS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 60.0, 300.0, 1800.0, 3600.0)
_STORE_SECONDS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0)

RUNS = Counter("runs", "Sandbox runs this node finished as an executor, by outcome status", ["status"])
FUEL_SERVED = Counter("fuel_served", "Fuel burned by the runs this node executed")
COMPUTE_SERVED = Counter("compute_seconds_served", "Compute seconds of the runs this node executed")
QUEUE_WAIT = Histogram("queue_wait_seconds", "Time a job waited in this node's run queue", _SECONDS)
MESSAGES_RECEIVED = Counter("messages_received", "Signed messages received on links, by kind", ["kind"])
BYTES_RECEIVED = Counter("message_bytes_received", "Bytes of signed messages received, by kind", ["kind"])
MESSAGES_SENT = Counter("messages_sent", "Signed messages sent on links, by kind", ["kind"])
BYTES_SENT = Counter("message_bytes_sent", "Bytes of signed messages sent, by kind", ["kind"])
VERIFICATION_FAILURES = Counter(
    "verification_failures", "Messages or results refused after a check failed, by what was checked", ["what"]
)
STORE_CALLS = Histogram(
    "store_call_seconds", "Store calls run in the store's thread, queue wait included", _STORE_SECONDS
)
API_REQUESTS = Counter("api_requests", "Local API requests answered, by status class", ["status"])

COUNTED: tuple[Counter | Histogram, ...] = (
    RUNS,
    FUEL_SERVED,
    COMPUTE_SERVED,
    QUEUE_WAIT,
    MESSAGES_RECEIVED,
    BYTES_RECEIVED,
    MESSAGES_SENT,
    BYTES_SENT,
    VERIFICATION_FAILURES,
    STORE_CALLS,
    API_REQUESTS,
)


def kind_label(kind: str | None) -> str:
    """A message kind as a label value: one of the protocol's kinds, else "other"."""
    if kind is not None and kind in KNOWN_KINDS:
        return kind
    return "other"


def message_received(kind: str | None, size: int) -> None:
    label = kind_label(kind)
    MESSAGES_RECEIVED.inc(1, label)
    BYTES_RECEIVED.inc(size, label)


def message_sent(kind: str | None, size: int) -> None:
    label = kind_label(kind)
    MESSAGES_SENT.inc(1, label)
    BYTES_SENT.inc(size, label)


# --- the text format ---


def _number(v: float) -> str:
    if v == math.inf:
        return "+Inf"
    if v == -math.inf:
        return "-Inf"
    if v != v:
        return "NaN"
    return repr(int(v)) if float(v).is_integer() and abs(v) < 2**53 else repr(float(v))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render(metrics: Iterable[Metric]) -> str:
    """The Prometheus text exposition (version 0.0.4) of `metrics`."""
    lines: list[str] = []
    for m in metrics:
        # the text format names a counter's family as its samples are named, with the _total suffix
        family = m.name + "_total" if m.kind == "counter" else m.name
        lines.append(f"# HELP {family} {m.help.replace(chr(92), chr(92) * 2).replace(chr(10), ' ')}")
        lines.append(f"# TYPE {family} {m.kind}")
        for name, labels, value in m.samples():
            text = ",".join(f'{k}="{_escape(v)}"' for k, v in labels)
            lines.append(f"{name}{{{text}}} {_number(value)}" if text else f"{name} {_number(value)}")
    return "\n".join(lines) + "\n"
