"""Partitions and churn on hosts in network namespaces, with real node processes: a pulled link and
a partition into two halves heal by themselves (liveness notices each cut, the dialer and gossip
restore the links, capacity adverts flow again), a node whose address changes is reached again, and
the job path works across each healed cut. Heartbeats are 0.5 s (a link is dead after 2 s): every
wait is on state, bounded."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import Topology
from netnodes import NetNode, all_linked, wait_until
from test_netns_lan import brief, ended, submit


def linked_to(node: NetNode, others: list[NetNode]) -> Callable[[], bool]:
    return lambda: node.connected() >= {o.node_id for o in others}


def cut_from(node: NetNode, others: list[NetNode]) -> Callable[[], bool]:
    return lambda: not node.connected() & {o.node_id for o in others}


def adverts(node: NetNode) -> dict[str, Any]:
    status = node.try_get("/v1/status") or {}
    table: dict[str, Any] = status.get("peer_capacity", {})
    return table


def run_on(submitter: NetNode, jobs: int, seed0: int) -> list[dict[str, Any]]:
    ids = [submit(submitter, seed0 + i) for i in range(jobs)]
    docs = [wait_until(f"job {j[:8]}", lambda j=j: ended(submitter, j), deadline=120) for j in ids]
    assert all(d["state"] == "done" and d["succeeded"] for d in docs), brief(docs)
    return docs


def lan_of(topology: Topology, nodes: Callable[..., NetNode], names: str, tmp: Path) -> list[NetNode]:
    """Nodes on one LAN, each bootstrapping from the first; the first's owner is at work for good (it
    runs no job itself, so its jobs must cross the network)."""
    lan = topology.segment("lan", "10.60.0.0/24")
    busy = tmp / "busy"
    busy.write_text("8")
    first = nodes(
        topology.host(names[0], lan),
        owner_load=busy,
        args=["--only-when-idle", "--capacity-interval", "0.2", "--capacity-raise-after", "0"],
    ).start()
    rest = [nodes(topology.host(n, lan), bootstrap=[first.address]).start() for n in names[1:]]
    group = [first, *rest]
    wait_until("every node to link to every other", all_linked(group), deadline=90)
    return group


def test_a_pulled_link_a_changed_address_and_a_partition_heal_by_themselves(
    nat_topology: Topology, nodes: Callable[..., NetNode], tmp_path: Path
) -> None:
    group = lan_of(nat_topology, nodes, "abcd", tmp_path)
    a, b, c, d = group
    # a pulled cable: liveness notices, the link comes back once it is plugged in again
    b.host.link_down()
    wait_until("the others to see b's link die", lambda: cut_from(a, [b])() and cut_from(c, [b])(), 60)
    b.host.link_up()
    wait_until("b to be linked again", all_linked(group), deadline=90)
    # a new address: c's old links die, and c is reached at the new one
    old = c.host.ip
    c.host.readdress()
    assert c.host.ip != old
    wait_until("c to be reached at its new address", all_linked(group), deadline=120)
    # two halves: each goes on alone (a's jobs run on b), then they join again by themselves
    nat_topology.partition([a.host, b.host], [c.host, d.host])
    wait_until("the halves to lose each other", lambda: cut_from(a, [c, d])() and cut_from(c, [a, b])(), 60)
    docs = run_on(a, 3, 200)
    assert {x["executor"] for x in docs} == {b.node_id}
    nat_topology.heal()
    wait_until("the halves to join again", all_linked(group), deadline=120)
    wait_until("c's and d's adverts to reach a", lambda: {c.node_id, d.node_id} <= set(adverts(a)), 60)
    docs = run_on(a, 6, 300)
    assert {x["executor"] for x in docs} <= {b.node_id, c.node_id, d.node_id}
