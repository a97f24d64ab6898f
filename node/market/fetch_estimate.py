"""How long an executor will spend fetching a job's blobs before it can run it: the bytes of the
module, inputs and stdin it does not hold yet, over the rate its fetches have run at.

A bid's finish (bidding.py) counts this time on top of the run's estimate, so a node that already
holds a large blob (a model shared by a batch of inference jobs, docs/inference.md) bids an earlier
finish than an otherwise equal node that would have to fetch it first, and wins the job outright,
not only on a tie. The rate is ASSUMED_RATE until this node has fetched a blob of at least
MEASURED_MIN_BYTES; from then on it is a moving average of what its fetches measured (transfer.py
times each multi-chunk fetch, from its chunk list to the blob installed). One rate serves every peer:
it is a planning figure, not a promise about any one link. A peer that serves slowly lowers it, which
only makes this node's bids for jobs it would have to fetch more cautious (never below MIN_RATE), and
later fetches move it back.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from e31.protocol.jobs import JobManifest

ASSUMED_RATE = 1_250_000.0
"""Bytes per second planned for before any fetch is measured (10 Mbit/s: a modest uplink)."""
MEASURED_MIN_BYTES = 512 * 1024
"""A fetch this large or larger is measured (a smaller one is mostly round trips, not bandwidth)."""
WEIGHT = 0.3
"""How much a new measurement moves the average."""
MIN_RATE = 10_000.0
"""The rate never planned below (bytes per second), whatever was measured."""


class FetchRate:
    """The bytes per second this node plans its fetches at: assumed, then measured."""

    def __init__(self, assumed: float = ASSUMED_RATE) -> None:
        self.rate = max(MIN_RATE, assumed)
        self.measured = 0
        """How many fetches have been measured."""

    def observe(self, nbytes: int, seconds: float) -> None:
        """A fetch of `nbytes` took `seconds` (ignored when too small to say anything)."""
        if nbytes < MEASURED_MIN_BYTES or not seconds > 0:
            return
        sample = max(MIN_RATE, nbytes / seconds)
        self.rate = sample if self.measured == 0 else (1 - WEIGHT) * self.rate + WEIGHT * sample
        self.measured += 1


def missing_bytes(manifest: JobManifest, has: Callable[[bytes], bool]) -> int:
    """Bytes of the job's blobs (each counted once) for which `has(root)` is False."""
    refs = {
        r.root.raw: r.size for r in (manifest.module, *(f.blob for f in manifest.inputs), manifest.stdin) if r
    }
    return sum(size for root, size in refs.items() if not has(root))


def fetch_ms(manifest: JobManifest, has: Callable[[bytes], bool], rate: FetchRate) -> int:
    """Milliseconds to fetch the job's blobs this node does not hold, at `rate`."""
    missing = missing_bytes(manifest, has)
    return 0 if missing == 0 else math.ceil(missing * 1000 / rate.rate)
