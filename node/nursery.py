"""A service's own nursery, forgotten when it closes.

The market's roles start tasks from callbacks (a message from a link, an offer from gossip, this
node's own offer). While the node stops, a callback can still come after the role's tasks have all
ended, and `start_soon` on its closed nursery would raise and fail the whole node. Each role holds a
`TaskSlot`: its nursery while open, None once it has closed; the callbacks check for None and drop
what comes late (stored work resumes at the next start).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio


class TaskSlot:
    """The nursery of one service while it runs (None before and after)."""

    def __init__(self) -> None:
        self.nursery: trio.Nursery | None = None

    @asynccontextmanager
    async def open(self) -> AsyncIterator[trio.Nursery]:
        """A nursery kept as `nursery` while it is open, and None once it has closed."""
        try:
            async with trio.open_nursery() as nursery:
                self.nursery = nursery
                yield nursery
        finally:
            self.nursery = None
