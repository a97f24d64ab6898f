"""The harness itself (harness.py), with plain TCP sockets and no node: hosts on a bridge reach each
other, a NAT router lets its home dial out and nothing dial in, a pulled link and a partition cut what
they should and heal, and everything a topology made is gone after it, even when the test fails."""

from __future__ import annotations

import socket
import subprocess

import pytest
from harness import PREFIX, Host, Topology, netem_available, sweep_stale


def listen(host: Host, port: int = 9000) -> socket.socket:
    def make() -> socket.socket:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", port))
        s.listen(8)
        s.settimeout(5)
        return s

    return host.call(make)


def reaches(src: Host, ip: str, port: int = 9000, timeout: float = 2.0) -> str | None:
    """Connect from `src` to ip:port; the address the far end saw, or None when it could not."""

    def dial() -> bool:
        try:
            with socket.create_connection((ip, port), timeout=timeout):
                return True
        except OSError:
            return False

    return "ok" if src.call(dial) else None


def peer_seen(server: socket.socket) -> str:
    conn, (addr, _) = server.accept()
    conn.close()
    return str(addr)


def names() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.startswith(PREFIX)}


def test_hosts_on_one_segment_reach_each_other(topology: Topology) -> None:
    lan = topology.segment("lan", "10.60.0.0/24")
    a, b = topology.host("a", lan), topology.host("b", lan)
    server = listen(b)
    assert reaches(a, b.ip)
    assert peer_seen(server) == a.ip


def test_a_home_behind_nat_dials_out_and_takes_nothing_in(nat_topology: Topology) -> None:
    topo = nat_topology
    public = topo.segment("public", "10.61.0.0/24")
    home = topo.segment("home1", "10.62.1.0/24")
    router = topo.nat_router("r1", public, home)
    server = topo.host("server", public)
    inside = topo.host("inside", home, gateway=router.lan_ip)
    listening = listen(server)
    assert reaches(inside, server.ip)
    assert peer_seen(listening) == router.wan_ip  # masqueraded
    kept = listen(inside)
    assert reaches(server, inside.ip) is None  # no route in, and no port forwarding
    assert reaches(server, router.wan_ip) is None
    kept.close()


def test_a_pulled_link_and_a_partition_cut_and_heal(nat_topology: Topology) -> None:
    topo = nat_topology
    lan = topo.segment("lan", "10.60.0.0/24")
    a, b, c = (topo.host(n, lan) for n in "abc")
    servers = [listen(b), listen(c)]  # (kept open)
    a.link_down()
    assert reaches(a, b.ip, timeout=1.0) is None
    a.link_up()
    assert reaches(a, b.ip)
    topo.partition([a], [b, c])
    assert reaches(a, b.ip, timeout=1.0) is None and reaches(a, c.ip, timeout=1.0) is None
    assert reaches(b, c.ip)
    topo.heal()
    assert reaches(a, b.ip) and reaches(a, c.ip)
    old = a.ip
    new = a.readdress()
    assert new != old
    server = listen(b, 9001)
    assert reaches(a, b.ip, 9001)
    assert peer_seen(server) == new
    for s in servers:
        s.close()


def test_a_lossy_slow_link_still_carries_a_connection(nat_topology: Topology) -> None:
    lan = nat_topology.segment("lan", "10.60.0.0/24")
    a, b = nat_topology.host("a", lan), nat_topology.host("b", lan)
    a.shape(loss_pct=5, rate="2mbit", **({"delay_ms": 20, "jitter_ms": 5} if netem_available() else {}))
    server = listen(b)
    assert reaches(a, b.ip, timeout=10.0)
    server.close()
    a.shape(loss_pct=100)  # every packet lost: nothing gets through
    assert reaches(a, b.ip, timeout=1.0) is None
    a.unshape()
    server = listen(b)
    assert reaches(a, b.ip)
    server.close()


def test_everything_made_is_removed_even_when_the_test_fails() -> None:
    from harness import unsupported_reason

    reason = unsupported_reason()
    if reason is not None:
        pytest.skip(reason)
    with pytest.raises(RuntimeError, match="a failing test"), Topology() as topo:
        lan = topo.segment("lan", "10.60.0.0/24")
        host = topo.host("a", lan)
        sleeper = host.exec(["sleep", "600"])
        made = set(topo.namespaces)
        assert made <= names()
        raise RuntimeError("a failing test")
    assert sleeper.wait(timeout=10) != 0  # killed with its namespace
    assert not made & names()
    assert sweep_stale() == []  # nothing of a live run is swept
