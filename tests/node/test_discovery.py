"""mDNS discovery: record checks and address choice as pure functions, then real zeroconf on loopback."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable

import pytest
import trio
from e31.node.net.discovery import (
    MAX_ADDRESSES,
    SERVICE_TYPE,
    BadRecord,
    DiscoveryError,
    PeerRecord,
    _host_addresses,
    advertised_addresses,
    parse_record,
    run_discovery,
    txt_record,
)
from e31.protocol.ids import NodeId

LOOPBACK = ["127.0.0.1"]
DEADLINE = 10.0
# Each run uses its own network names, so nodes of other tests on this host never mix in.
NET, OTHER = f"test-{os.urandom(4).hex()}", f"other-{os.urandom(4).hex()}"


def new_id() -> str:
    return str(NodeId(os.urandom(32)))


def props(node_id: str, network: str = "main", version: str = "1") -> dict[bytes, bytes | None]:
    txt = txt_record(node_id, network) | {"v": version}
    return {k.encode(): v.encode() for k, v in txt.items()}


# --- records ----------------------------------------------------------------------------------------


def test_parse_record_accepts_a_good_record() -> None:
    node = new_id()
    record = parse_record(props(node), ["127.0.0.1", "fd00::2"], 7531)
    assert record == PeerRecord(node, "main", (("127.0.0.1", 7531), ("fd00::2", 7531)))


def test_parse_record_filters_addresses() -> None:
    node = new_id()
    addresses = ["0.0.0.0", "224.0.0.251", "::", "junk", "10.0.0.1", "10.0.0.1", "ff02::fb"]
    assert parse_record(props(node), addresses, 9).addresses == (("10.0.0.1", 9),)
    many = [f"10.0.0.{i}" for i in range(1, 40)]
    assert len(parse_record(props(node), many, 9).addresses) == MAX_ADDRESSES
    with pytest.raises(BadRecord, match="no usable address"):
        parse_record(props(node), ["0.0.0.0", "nonsense"], 9)


@pytest.mark.parametrize(
    ("properties", "port", "why"),
    [
        (props(new_id(), version="2"), 1, "protocol version '2'"),
        ({b"net": b"main", b"id": new_id().encode()}, 1, "protocol version None"),
        ({b"v": b"1", b"id": new_id().encode()}, 1, "network name None"),
        ({b"v": b"1", b"net": b"main"}, 1, "node id"),
        ({b"v": b"1", b"net": b"main", b"id": None}, 1, "node id"),
        ({b"v": b"1", b"net": b"main", b"id": b"e31nnot-an-id"}, 1, "node id"),
        ({b"v": b"1", b"net": b"main", b"id": new_id().upper().encode()}, 1, "node id"),
        ({b"v": b"1", b"net": b"\xff\xfe", b"id": new_id().encode()}, 1, "not UTF-8"),
        ({b"v": b"1", b"net": b"x" * 65, b"id": new_id().encode()}, 1, "network name"),
        (props(new_id()), 0, "port 0"),
        (props(new_id()), None, "port None"),
        (props(new_id()), 70000, "port 70000"),
    ],
)
def test_parse_record_rejects_bad_records(
    properties: dict[bytes, bytes | None], port: int | None, why: str
) -> None:
    with pytest.raises(BadRecord, match=why.replace("(", r"\(")):
        parse_record(properties, ["127.0.0.1"], port)


def test_advertised_addresses() -> None:
    host = ["192.0.2.2", "fd00::2", "198.51.100.7"]
    assert advertised_addresses([("127.0.0.1", 7531)], host) == [("127.0.0.1", 7531)]
    assert advertised_addresses([("0.0.0.0", 7531)], host) == [("192.0.2.2", 7531), ("198.51.100.7", 7531)]
    assert advertised_addresses([("::", 1)], host) == [("fd00::2", 1)]
    assert advertised_addresses([("0.0.0.0", 5), ("192.0.2.2", 5)], host) == [
        ("192.0.2.2", 5),
        ("198.51.100.7", 5),
    ]
    assert advertised_addresses([("0.0.0.0", 5)], ["127.0.0.1"]) == [("127.0.0.1", 5)]
    assert advertised_addresses([("0.0.0.0", 5)], []) == []


def test_host_addresses() -> None:
    assert _host_addresses(["127.0.0.1"]) == (["127.0.0.1"], ["127.0.0.1"])
    everything = _host_addresses(None)[1]
    assert "127.0.0.1" not in everything and "::1" not in everything
    with pytest.raises(DiscoveryError, match="no network interface or address 'nosuch0'"):
        _host_addresses(["nosuch0"])
    with pytest.raises(DiscoveryError, match="no network interface selected"):
        _host_addresses([])


def test_host_addresses_by_interface_name() -> None:
    import ifaddr

    if not any(a.nice_name == "lo" and a.ips for a in ifaddr.get_adapters()):
        pytest.skip("no interface named lo with an address")
    assert _host_addresses(["lo"]) == (["127.0.0.1"], ["127.0.0.1"])


@pytest.mark.parametrize(
    ("kw", "why"),
    [
        ({"node_id": "e31nbogus"}, "not a node id"),
        ({"network": ""}, "not a network name"),
        ({"interfaces": "127.0.0.1"}, "not one string"),
        ({"interfaces": ["203.0.113.99"]}, "203.0.113.99 is not an address of any network interface"),
        ({"interfaces": ["nosuch0"]}, "no network interface or address"),
        ({"addresses": [("127.0.0.1", 0)]}, "cannot advertise port 0"),
    ],
)
async def test_start_failures_are_typed(kw: dict[str, object], why: str) -> None:
    args: dict[str, object] = {
        "node_id": new_id(),
        "network": "main",
        "addresses": [("127.0.0.1", 7531)],
        "interfaces": LOOPBACK,
        "on_found": print,
    } | kw
    with pytest.raises(DiscoveryError, match=why):
        await run_discovery(**args)  # type: ignore[arg-type]


async def test_a_socket_error_at_start_is_typed(monkeypatch: pytest.MonkeyPatch) -> None:
    import zeroconf

    def refuse(**kw: object) -> None:
        raise OSError(19, "No such device")

    monkeypatch.setattr(zeroconf, "Zeroconf", refuse)
    with pytest.raises(DiscoveryError, match=r"cannot open mDNS sockets on 127.0.0.1: \[Errno 19\]"):
        await run_discovery(
            node_id=new_id(),
            network="main",
            addresses=[("127.0.0.1", 1)],
            interfaces=LOOPBACK,
            on_found=print,
        )


# --- real zeroconf on loopback ----------------------------------------------------------------------


class Node:
    """One discovery service under test and what it reported."""

    def __init__(self, network: str, port: int) -> None:
        self.node_id = new_id()
        self.network = network
        self.port = port
        self.found: list[tuple[str, str, list[tuple[str, int]]]] = []
        self.lost: list[str] = []
        self.scope = trio.CancelScope()
        self.stopped = trio.Event()

    def on_found(self, node_id: str, network: str, addresses: list[tuple[str, int]]) -> None:
        self.found.append((node_id, network, addresses))

    def found_ids(self) -> set[str]:
        return {f[0] for f in self.found}

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with self.scope:
            await run_discovery(
                node_id=self.node_id,
                network=self.network,
                addresses=[("127.0.0.1", self.port)],
                interfaces=LOOPBACK,
                on_found=self.on_found,
                on_lost=self.lost.append,
                task_status=task_status,
            )
        self.stopped.set()


async def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = trio.current_time() + DEADLINE
    while trio.current_time() < deadline:
        if condition():
            return
        await trio.sleep(0.05)
    raise AssertionError(f"not within {DEADLINE} s: {what}")


def ignored(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    return any(
        r.name == "e31.discovery" and "ignoring" in r.getMessage() and text in r.getMessage()
        for r in caplog.records
    )


async def test_two_nodes_find_each_other_ignore_other_networks_and_see_withdrawal(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="e31.discovery")
    a, b, c = Node(NET, 40001), Node(NET, 40002), Node(OTHER, 40003)
    async with trio.open_nursery() as nursery:
        for node in (a, b, c):
            await nursery.start(node.run)
        await wait_for(lambda: b.node_id in a.found_ids() and a.node_id in b.found_ids(), "A and B meet")
        await wait_for(lambda: ignored(caplog, c.node_id), "A and B hear C's record")
        assert a.found == [(b.node_id, NET, [("127.0.0.1", 40002)])]
        assert b.found == [(a.node_id, NET, [("127.0.0.1", 40001)])]
        assert c.found == [] and a.lost == []
        b.scope.cancel()
        await b.stopped.wait()
        await wait_for(lambda: a.lost == [b.node_id], "A sees B's record withdrawn")
        assert a.found == [(b.node_id, NET, [("127.0.0.1", 40002)])]  # reported once, no duplicates
        nursery.cancel_scope.cancel()


async def _with_publisher(body: Callable[[Callable[..., Awaitable[object]]], Awaitable[None]]) -> None:
    """Run `body(publish)` where `publish(name, properties, port, address)` registers a raw record."""
    from zeroconf import ServiceInfo, Zeroconf

    zc = await trio.to_thread.run_sync(lambda: Zeroconf(interfaces=LOOPBACK))
    infos: dict[str, ServiceInfo] = {}

    def publish(name: str, properties: dict[bytes, bytes | None], port: int, address: str) -> None:
        info = ServiceInfo(
            SERVICE_TYPE,
            f"{name}.{SERVICE_TYPE}",
            port=port,
            properties=properties,
            server=f"{name}.local.",
            parsed_addresses=[address],
        )
        if name in infos:
            zc.update_service(info)
        else:
            zc.register_service(info)
        infos[name] = info

    try:
        await body(lambda *a: trio.to_thread.run_sync(publish, *a))
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(zc.close)


async def test_malformed_records_are_ignored_and_changes_are_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="e31.discovery")
    watcher = Node(NET, 40010)
    good = new_id()
    tag = os.urandom(3).hex()
    bad = {
        "badversion": props(new_id(), NET, version="9"),
        "badid": {b"v": b"1", b"net": NET.encode(), b"id": b"e31n" + b"a" * 51 + b"b"},  # stray low bits
        "noid": {b"v": b"1", b"net": NET.encode()},
        "badutf": {b"v": b"1", b"net": b"\xc3\x28", b"id": new_id().encode()},
    }

    async def body(publish: Callable[..., Awaitable[object]]) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(watcher.run)
            async with trio.open_nursery() as publishers:
                for name, properties in [("good", props(good, NET)), *bad.items()]:
                    publishers.start_soon(publish, f"{name}-{tag}", properties, 40011, "127.0.0.1")
            await wait_for(lambda: good in watcher.found_ids(), "the good record is found")
            await wait_for(
                lambda: all(ignored(caplog, f"'{n}-{tag}.{SERVICE_TYPE}'") for n in bad),
                "every bad record is heard and ignored",
            )
            await publish(f"good-{tag}", props(good, NET), 40012, "127.0.0.1")
            await wait_for(lambda: len(watcher.found) == 2, "the new port is reported")
            assert watcher.found == [(good, NET, [("127.0.0.1", 40011)]), (good, NET, [("127.0.0.1", 40012)])]
            nursery.cancel_scope.cancel()

    await _with_publisher(body)


async def test_listening_on_a_wildcard_publishes_the_interface_addresses() -> None:
    a, b = Node(NET, 40020), Node(NET, 40021)
    found: list[tuple[str, str, list[tuple[str, int]]]] = []

    async with trio.open_nursery() as nursery:
        await nursery.start(b.run)
        await nursery.start(
            lambda task_status: run_discovery(
                node_id=a.node_id,
                network=NET,
                addresses=[("0.0.0.0", 40020)],
                interfaces=LOOPBACK,
                on_found=lambda *f: found.append(f),
                task_status=task_status,
            )
        )
        await wait_for(lambda: a.node_id in b.found_ids(), "B finds A")
        assert b.found == [(a.node_id, NET, [("127.0.0.1", 40020)])]
        await wait_for(lambda: bool(found), "A finds B")
        nursery.cancel_scope.cancel()


async def test_cancelled_while_registering_shuts_down_and_answers_no_more() -> None:
    from zeroconf import Zeroconf

    node = Node(NET, 40030)
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            await nursery.start(node.run)  # ready while the record is still being probed
            await trio.sleep(0.5)
            nursery.cancel_scope.cancel()

    def ask() -> object:
        zc = Zeroconf(interfaces=LOOPBACK)
        try:
            return zc.get_service_info(SERVICE_TYPE, f"{node.node_id}.{SERVICE_TYPE}", timeout=1500)
        finally:
            zc.close()

    assert await trio.to_thread.run_sync(ask) is None


async def test_a_browser_failure_at_start_is_typed(monkeypatch: pytest.MonkeyPatch) -> None:
    import zeroconf

    def refuse(*a: object, **kw: object) -> None:
        raise zeroconf.BadTypeInNameException("refused")

    monkeypatch.setattr(zeroconf, "ServiceBrowser", refuse)
    with pytest.raises(DiscoveryError, match=r"cannot browse for _e31\._tcp\.local\.: refused"):
        await run_discovery(
            node_id=new_id(), network=NET, addresses=[("127.0.0.1", 1)], interfaces=LOOPBACK, on_found=print
        )


CHILD = """
import sys, trio
from e31.node.net.discovery import run_discovery

async def main():
    async with trio.open_nursery() as nursery:
        await nursery.start(lambda task_status: run_discovery(
            node_id=sys.argv[1], network=sys.argv[2], addresses=[("127.0.0.1", int(sys.argv[3]))],
            interfaces=["127.0.0.1"], on_found=lambda n, net, a: print(n, flush=True),
            task_status=task_status))
        await trio.to_thread.run_sync(sys.stdin.read)  # until the parent closes our stdin
        nursery.cancel_scope.cancel()

trio.run(main)
"""


async def test_a_node_in_another_process_is_found_and_withdraws_on_stop() -> None:
    me, child_id = Node(NET, 40040), new_id()
    async with trio.open_nursery() as nursery:
        await nursery.start(me.run)
        proc = await trio.lowlevel.open_process(
            [sys.executable, "-c", CHILD, child_id, NET, "40041"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        try:
            assert proc.stdin is not None and proc.stdout is not None
            with trio.fail_after(DEADLINE):
                heard = await proc.stdout.receive_some()
            assert heard.decode().split() == [me.node_id]
            await wait_for(lambda: child_id in me.found_ids(), "the child is found")
            assert me.found == [(child_id, NET, [("127.0.0.1", 40041)])]
            await proc.stdin.aclose()
            with trio.fail_after(DEADLINE):
                assert await proc.wait() == 0
            await wait_for(lambda: me.lost == [child_id], "the child's record is withdrawn")
        finally:
            proc.kill()
            nursery.cancel_scope.cancel()
