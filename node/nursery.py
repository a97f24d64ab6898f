"""A service's own nursery, forgotten when it closes.

The market's roles start tasks from callbacks (a message from a link, an offer from gossip, this
node's own offer). While the node stops, a callback can still come after the role's tasks have all
ended, and `start_soon` on its closed nursery would raise and fail the whole node. Each role keeps its
nursery in `_nursery` through `own_nursery`, which sets it back to None once the nursery has closed;
the callbacks check for None and drop what comes late (stored work resumes at the next start).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import trio


@asynccontextmanager
async def own_nursery(owner: Any) -> AsyncIterator[trio.Nursery]:
    """A nursery kept as `owner._nursery` while it is open, and None once it has closed."""
    try:
        async with trio.open_nursery() as nursery:
            owner._nursery = nursery
            yield nursery
    finally:
        owner._nursery = None
