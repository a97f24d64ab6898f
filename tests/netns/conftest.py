"""Fixtures for the network-namespace tests (harness.py): a topology per test, removed after it even
when the test fails, and the nodes started in it stopped first. Every test here is marked `netns`;
without root, or where namespaces cannot be made, they skip with the reason."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from harness import Host, Topology, sweep_stale, unsupported_reason
from netnodes import NetNode

_checked: dict[bool, str | None] = {}


def _reason(nat: bool) -> str | None:
    if nat not in _checked:
        _checked[nat] = unsupported_reason(nat=nat)
    return _checked[nat]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.netns)


@pytest.fixture
def topology() -> Iterator[Topology]:
    """An empty topology."""
    reason = _reason(False)
    if reason is not None:
        pytest.skip(reason)
    sweep_stale()
    with Topology() as topo:
        yield topo


@pytest.fixture
def nat_topology(topology: Topology) -> Topology:
    """An empty topology on a machine that has nftables (for NAT routers and partitions)."""
    reason = _reason(True)
    if reason is not None:
        pytest.skip(reason)
    return topology


@pytest.fixture
def nodes(topology: Topology, tmp_path: Path) -> Iterator[Callable[..., NetNode]]:
    """Make a NetNode on a host of the topology (`nodes(host, **kwargs)`, not started); all are stopped
    at the end, before the topology goes."""
    made: list[NetNode] = []

    def make(host: Host, **kwargs: object) -> NetNode:
        node = NetNode(host, tmp_path / host.name, **kwargs)  # type: ignore[arg-type]
        made.append(node)
        return node

    try:
        yield make
    finally:
        for node in made:
            node.kill()
