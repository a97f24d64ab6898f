"""Real node processes on hosts in network namespaces (harness.py, netnodes.py).

A flat LAN where the nodes find each other by mDNS alone, over the hosts' real interfaces (no
bootstrap address, no loopback), and run a small sweep; and a public segment with two homes behind NAT
routers, where the nodes at home (one of them on a lossy, slow line) dial out to a public submitter and
run its jobs over the links they opened (the homes only dial out; reaching a home from outside is
part B's).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import Topology, netem_available
from netnodes import NetNode, all_linked, wait_until

ROOT = Path(__file__).resolve().parents[2]
MONTECARLO = ROOT / "sandbox" / "workloads" / "montecarlo.wasm"


def submit(node: NetNode, seed: int, samples: int = 200_000, **extra: Any) -> str:
    body = {"module": str(MONTECARLO), "args": [str(seed), str(samples)], **extra}
    job: str = node.post("/v1/jobs", body)["job_id"]
    return job


def brief(docs: list[dict[str, Any]]) -> list[tuple[str, str, Any, Any]]:
    return [(d["job_id"][:8], d["state"], d.get("succeeded"), d.get("reason")) for d in docs]


def ended(node: NetNode, job: str) -> dict[str, Any] | None:
    doc: dict[str, Any] | None = node.try_get(f"/v1/jobs/{job}")
    return doc if doc is not None and doc["state"] in ("done", "failed", "expired", "cancelled") else None


def test_nodes_on_a_lan_find_each_other_by_mdns_and_share_a_sweep(
    topology: Topology, nodes: Callable[..., NetNode]
) -> None:
    lan = topology.segment("lan", "10.60.0.0/24")
    group = [nodes(topology.host(name, lan), mdns=True) for name in ("a", "b", "c")]
    for node in group:
        node.start()
    wait_until("the three to find each other by mDNS", all_linked(group), deadline=90)
    for node in group:  # found by mDNS, at the address of its interface on the LAN
        peers = node.get("/v1/peers")
        for peer in peers:
            assert any(a.startswith("10.60.0.") for a in peer["addresses"]), peer
    a = group[0]
    jobs = [submit(a, seed) for seed in range(12)]
    docs = [wait_until(f"job {j[:8]}", lambda j=j: ended(a, j), deadline=120) for j in jobs]
    assert all(d["state"] == "done" and d["succeeded"] for d in docs), brief(docs)
    ran = Counter(d["executor"] for d in docs)
    assert set(ran) <= {n.node_id for n in group}


def test_nodes_behind_two_nats_dial_out_and_run_a_public_submitters_jobs(
    nat_topology: Topology, nodes: Callable[..., NetNode]
) -> None:
    topo = nat_topology
    public = topo.segment("public", "10.61.0.0/24")
    homes = [topo.segment(f"home{i}", f"10.62.{i}.0/24") for i in (1, 2)]
    routers = [topo.nat_router(f"r{i}", public, home) for i, home in enumerate(homes, 1)]
    # submit-only: a submitter that holds the module would win every bid for these small jobs itself
    submitter = nodes(topo.host("pub", public), args=["--cores", "0"]).start()
    inside = [
        nodes(topo.host(f"h{i}", home, gateway=router.lan_ip), bootstrap=[submitter.address]).start()
        for i, (home, router) in enumerate(zip(homes, routers, strict=True), 1)
    ]
    # one home's line is poor: packets lost at random, a low rate (and a delay where netem is there)
    slow = {"delay_ms": 40, "jitter_ms": 10} if netem_available() else {}
    inside[0].host.shape(loss_pct=2, rate="4mbit", **slow)
    ids = {n.node_id for n in inside}
    wait_until("both homes to link to the public node", lambda: submitter.connected() >= ids, deadline=60)
    for peer in submitter.get("/v1/peers"):
        if peer["node_id"] in ids:  # the homes dialled out; nothing dialled in
            assert peer["direction"] == "inbound", peer
    jobs = [submit(submitter, seed) for seed in range(8)]
    docs = [wait_until(f"job {j[:8]}", lambda j=j: ended(submitter, j), deadline=120) for j in jobs]
    assert all(d["state"] == "done" and d["succeeded"] for d in docs), brief(docs)
    assert {d["executor"] for d in docs} <= ids, "every job ran behind a NAT"
