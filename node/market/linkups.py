"""The work a role does when a peer's link comes up, queued per peer instead of a task per link.

The submitter answers each new link with store queries (the pull of its assignments, the inclusion
proofs it lacks). Started as two tasks per link, they queued on the store's one thread: under a flood
of short-lived links from strangers (tests/bench/bench_strangers.py) the store fell behind, hundreds
of tasks (about 10 KB each) were waiting after a few seconds and thousands over a long flood, and the
node's resident memory kept their high-water mark. Here each peer is waiting at most once, a peer
whose link goes down before its turn is dropped, and at most `cap` peers wait (the oldest dropped
first): the memory is bounded by the links, not by how many ever came up.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

log = logging.getLogger("e31.market")

WAITING_KEPT = 1024
"""Peers waiting for their link-up work at most (more are dropped, the oldest first)."""
WORKERS = 4
"""Peers whose link-up work runs at once (a send to a slow peer holds only one of them)."""


class LinkUps:
    """Peers whose link came up, each waiting once for `work(peer)`, run by a few workers."""

    def __init__(
        self, work: Callable[[bytes], Awaitable[None]], *, cap: int = WAITING_KEPT, workers: int = WORKERS
    ) -> None:
        if cap < 1 or workers < 1:
            raise ValueError(f"cap and workers must be positive, got {cap} and {workers}")
        self._work = work
        self._cap = cap
        self._workers = workers
        self._waiting: dict[bytes, None] = {}
        """The peers waiting, in the order their links came up (a dict: an ordered set)."""
        self._wake = trio.Event()
        self.dropped = 0
        """Peers dropped because `cap` were waiting."""

    def __len__(self) -> int:
        return len(self._waiting)

    def up(self, peer: bytes) -> None:
        """`peer`'s link came up: its work runs once, unless its link goes down first."""
        self._waiting.pop(peer, None)
        self._waiting[peer] = None
        if len(self._waiting) > self._cap:
            del self._waiting[next(iter(self._waiting))]
            self.dropped += 1
        self._wake.set()

    def down(self, peer: bytes) -> None:
        """`peer`'s link went down: its work, if still waiting, is dropped."""
        self._waiting.pop(peer, None)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the waiting peers' work until cancelled."""
        async with trio.open_nursery() as nursery:
            for _ in range(self._workers):
                nursery.start_soon(self._worker)
            task_status.started()

    async def _worker(self) -> None:
        while True:
            if not self._waiting:
                if self._wake.is_set():
                    self._wake = trio.Event()
                await self._wake.wait()
                continue
            peer = next(iter(self._waiting))
            del self._waiting[peer]
            await self._work(peer)
