"""The relay floor (issue 22) with real node processes: two homes behind two NAT routers (nftables
masquerade, nothing let in) and a reachable relay on the public segment. Each home node learns that
nobody can dial it (its dial-backs fail), stops advertising addresses, reserves at the relay and
gossips a `via` record; the submitter's node opens a circuit through the relay to the executor's and
the two run the ordinary handshake over it. A job submitted behind one NAT runs behind the other, its
result and ack travel over the relayed link, and its receipt passes `e31 audit`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness import Topology
from netnodes import NetNode, audit, wait_until
from test_netns_lan import brief, ended, submit


def reach(node: NetNode) -> dict[str, Any]:
    status = node.try_get("/v1/status") or {}
    doc: dict[str, Any] = status.get("reachability", {})
    return doc


def test_a_job_from_behind_one_nat_runs_behind_the_other_through_a_relay_and_its_receipt_verifies(
    nat_topology: Topology, nodes: Callable[..., NetNode], tmp_path: Path
) -> None:
    topo = nat_topology
    public = topo.segment("public", "10.63.0.0/24")
    homes = [topo.segment(f"home{i}", f"10.64.{i}.0/24") for i in (1, 2)]
    routers = [topo.nat_router(f"r{i}", public, home) for i, home in enumerate(homes, 1)]
    relay = nodes(topo.host("relay", public), args=["--relay", "--cores", "0"]).start()
    submitter = nodes(
        topo.host("sub", homes[0], gateway=routers[0].lan_ip),
        bootstrap=[relay.address],
        args=["--cores", "0"],
    ).start()
    executor = nodes(topo.host("exe", homes[1], gateway=routers[1].lan_ip), bootstrap=[relay.address]).start()

    # each home learns it cannot be dialled and holds a reservation at the relay; the relay is public
    for home in (submitter, executor):
        wait_until(
            f"{home.name} to reserve at the relay",
            lambda h=home: relay.node_id in reach(h).get("reservations", {}),
            deadline=60,
        )
        doc = reach(home)
        assert doc["status"] == "private" and home.get("/v1/status")["addresses"] == [], doc
    assert reach(relay)["status"] == "public" and reach(relay)["relay"]

    # the two homes link through the relay (never directly: neither can dial the other)
    wait_until(
        "the homes to link through the relay",
        lambda: executor.node_id in submitter.connected() and submitter.node_id in executor.connected(),
        deadline=90,
    )
    assert executor.node_id in reach(submitter)["relayed_links"]
    (peer,) = [p for p in submitter.get("/v1/peers") if p["node_id"] == executor.node_id]
    assert peer["via"] == relay.node_id, peer

    jobs = [submit(submitter, seed) for seed in range(3)]
    docs = [wait_until(f"job {j[:8]}", lambda j=j: ended(submitter, j), deadline=120) for j in jobs]
    assert all(d["state"] == "done" and d["succeeded"] for d in docs), brief(docs)
    assert {d["executor"] for d in docs} == {executor.node_id}

    def acked() -> bool:  # the submitter's acks came back to the executor over the relayed link
        rows = executor.store_rows(
            "SELECT job_id, delivered FROM receipts WHERE executor = ?", executor.node_id
        )
        done = {bytes(job).hex() for job, delivered in rows if delivered is not None}
        return set(jobs) <= done

    wait_until("the executor to hold an ack of every receipt", acked, deadline=60)
    relayed = reach(relay)
    assert relayed["circuits_relayed"] >= 1 and relayed["bytes_relayed"] > 0, relayed

    # the receipts verify offline, from the submitter's export and from the executor's
    for node in (submitter, executor):
        bundle = tmp_path / f"{node.name}.bundle"
        node.export(bundle)
        done = audit(bundle)
        assert done.returncode == 0, done.stdout + done.stderr
