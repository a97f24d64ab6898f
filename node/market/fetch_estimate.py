"""How long an executor will spend fetching a job's blobs before it can run it: the bytes of the
module, inputs and stdin it does not hold yet, over the rate its fetches have run at.

A bid's finish (bidding.py) counts this time on top of the runs' estimates, each blob's fetch once per
core however many of the offered jobs need it (`fetch_shares`), so a node that already holds a large
blob (a model shared by a batch of inference jobs, docs/inference.md) bids an earlier finish than an
otherwise equal node that would have to fetch it first, and wins the job outright, not only on a tie.
The rate is ASSUMED_RATE until this node has fetched a blob of at least MEASURED_MIN_BYTES; from then
on it is a moving average of what its fetches measured (transfer.py times each multi-chunk fetch, from
its chunk list to the blob installed). One rate serves every peer: it is a planning figure, not a
promise about any one link. A peer that serves slowly lowers it, which only makes this node's bids for
jobs it would have to fetch more cautious (never below MIN_RATE), and later fetches move it back.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

from e31.protocol.jobs import JobManifest

from .policy import Task

ASSUMED_RATE = 1_250_000.0
"""Bytes per second planned for before any fetch is measured (10 Mbit/s: a modest uplink)."""
MEASURED_MIN_BYTES = 512 * 1024
"""A fetch this large or larger is measured (a smaller one is mostly round trips, not bandwidth)."""
COUNTED_MIN_BYTES = MEASURED_MIN_BYTES
"""A blob smaller than this is not counted in a bid (a small module's fetch is a round trip or two;
counting it made the node that submitted a sweep of tiny jobs, holding its module, win all of them)."""
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


def blob_sizes(manifest: JobManifest) -> dict[bytes, int]:
    """The job's blobs (module, inputs, stdin), each once: root -> size."""
    refs = (manifest.module, *(f.blob for f in manifest.inputs), manifest.stdin)
    return {r.root.raw: r.size for r in refs if r}


def fetch_shares(
    manifests: Sequence[JobManifest], has: Callable[[bytes], bool], rate: FetchRate, cores: int
) -> dict[bytes, int]:
    """Job id -> the milliseconds of fetching to count in its estimate. Each blob this node lacks
    (`has(root)` False) is fetched once, before the first job that needs it can start, and the `n`
    offered jobs that need it run `cores` at a time, ceil(n / cores) one after another on a core: each
    bears that share of the blob's fetch time, so the last of them finishes as late as the fetch makes
    it, a lone job bears all of it, and a batch sharing a model is not charged its fetch once a job."""
    needed: dict[bytes, list[bytes]] = {}
    sizes: dict[bytes, int] = {}
    held: dict[bytes, bool] = {}
    for manifest in manifests:
        for root, size in blob_sizes(manifest).items():
            if size < COUNTED_MIN_BYTES:  # a round trip or two: not worth moving work to its holder
                continue
            if root not in held:
                held[root] = has(root)
            if not held[root]:
                needed.setdefault(root, []).append(manifest.job_id.raw)
                sizes[root] = size
    shares = dict.fromkeys((m.job_id.raw for m in manifests), 0.0)
    for root, jobs in needed.items():
        rounds = math.ceil(len(jobs) / max(1, cores))
        for job in jobs:
            shares[job] += sizes[root] * 1000 / rate.rate / rounds
    return {job: math.ceil(ms) for job, ms in shares.items()}


def with_fetches(
    tasks: Sequence[Task],
    manifests: Sequence[JobManifest],
    has: Callable[[bytes], bool],
    rate: FetchRate,
    cores: int,
) -> list[Task]:
    """The offered jobs' tasks (in the order of `manifests`) with their fetch shares (fetch_shares)
    added to their estimates."""
    shares = fetch_shares(manifests, has, rate, cores)
    return [replace(t, estimate_ms=t.estimate_ms + shares.get(t.key, 0)) for t in tasks]
