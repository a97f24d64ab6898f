"""Fixtures for the node tests: an in-memory network (market_nodes.Net) and nodes on it, each built
through the daemon's own job-path wiring (market/service.build_job_path)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import trio
from market_nodes import Net, RealNode


@pytest.fixture
async def net(nursery: trio.Nursery) -> Net:
    n = Net()
    n.nursery = nursery
    return n


@pytest.fixture
def node(net: Net, tmp_path: Path) -> Callable[[str, int], RealNode]:
    """Make a node of `net` named `name` whose key is made from `seed` (not started: market_nodes.start)."""

    def make(name: str, seed: int) -> RealNode:
        return RealNode(net, tmp_path, name, seed)

    return make
