"""The transport over real sockets on 127.0.0.1: good links, bad peers, timeouts, caps, backpressure."""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial

import pytest
import trio
from e31.node.net.limits import ConnectionCaps, Limits, Timeouts, address_key
from e31.node.net.transport import (
    MAX_MESSAGE,
    ConnectedToSelf,
    Connection,
    ConnectionClosed,
    DialFailed,
    HandshakeAborted,
    HandshakeTimeout,
    ListenFailed,
    MessageTooLarge,
    NetworkMismatch,
    PeerRejected,
    SendTimeout,
    dial,
    serve,
)
from e31.protocol.handshake import Initiator, network_notice
from e31.protocol.session import Session
from nacl.signing import SigningKey

NET = "e31-test"
FAST = Timeouts(connect=5.0, handshake=0.5, idle=30.0, send=10.0)
SAFETY = 10.0
"""Upper bound for waits that should end much sooner: a hang fails the test instead of stalling it."""

Address = tuple[str, int]


class Server:
    """A running `serve` and what its handler saw."""

    def __init__(self, identity: SigningKey, address: Address) -> None:
        self.identity = identity
        self.address = address
        self.accepted: list[Connection] = []
        self.arrived = trio.Event()
        self._more = trio.Event()

    def add(self, conn: Connection) -> None:
        self.accepted.append(conn)
        self.arrived.set()
        self._more.set()
        self._more = trio.Event()

    async def nth(self, n: int) -> Connection:
        """The n-th accepted connection (from 1), once the handler has been given it."""
        with trio.fail_after(SAFETY):
            while len(self.accepted) < n:
                await self._more.wait()
        return self.accepted[n - 1]

    @property
    def key(self) -> bytes:
        return bytes(self.identity.verify_key)


async def echo(server: Server, conn: Connection) -> None:
    async for message in conn:
        await conn.send(b"echo:" + message)


@asynccontextmanager
async def running(
    handler: Callable[[Server, Connection], Awaitable[object]] = echo,
    *,
    limits: Limits | None = None,
    network: str = NET,
) -> AsyncIterator[Server]:
    identity = SigningKey.generate()
    server: Server | None = None

    async def on_connection(conn: Connection) -> None:
        assert server is not None
        server.add(conn)
        await handler(server, conn)

    async with trio.open_nursery() as nursery:
        address = await nursery.start(
            partial(
                serve,
                on_connection,
                host="127.0.0.1",
                port=0,
                identity=identity,
                network=network,
                limits=limits or Limits(timeouts=FAST),
            )
        )
        server = Server(identity, address)
        yield server
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def linked(
    address: Address, identity: SigningKey | None = None, **kw: object
) -> AsyncIterator[Connection]:
    kw.setdefault("timeouts", FAST)
    conn = await dial(*address, identity=identity or SigningKey.generate(), network=NET, **kw)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        await nursery.start(conn.run)
        try:
            yield conn
        finally:
            await conn.aclose()


async def roundtrip(conn: Connection, message: bytes) -> bytes:
    with trio.fail_after(SAFETY):
        await conn.send(message)
        return await conn.receive()


RawOpener = Callable[[Address], Awaitable[trio.SocketStream]]


@pytest.fixture
async def raw() -> AsyncIterator[RawOpener]:
    """Opens plain TCP connections (no handshake) and closes them after the test."""
    opened: list[trio.SocketStream] = []

    async def open_raw(address: Address) -> trio.SocketStream:
        stream = await trio.open_tcp_stream(*address)
        opened.append(stream)
        return stream

    yield open_raw
    for stream in opened:
        await stream.aclose()


async def until_closed_by_peer(stream: trio.SocketStream) -> bytes:
    """Read until the server closes or resets the socket; return what it sent before that."""
    got = b""
    with trio.fail_after(SAFETY):
        while True:
            try:
                data = await stream.receive_some(65536)
            except trio.BrokenResourceError:
                return got
            if not data:
                return got
            got += data


def drop_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "e31.transport"]


@pytest.fixture(autouse=True)
def transport_debug_log(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="e31.transport")


# --- good links ---


async def test_pair_exchanges_messages_both_ways() -> None:
    async def greet_then_echo(server: Server, conn: Connection) -> None:
        await conn.send(b"welcome")
        await echo(server, conn)

    client_key = SigningKey.generate()
    async with running(greet_then_echo) as server, linked(server.address, client_key) as conn:
        with trio.fail_after(SAFETY):
            assert await conn.receive() == b"welcome"
        messages = (b"hello", b"", os.urandom(300), os.urandom(MAX_MESSAGE - len(b"echo:")))
        for message in messages:
            assert await roundtrip(conn, message) == b"echo:" + message

        (inbound,) = server.accepted
        assert conn.peer_key == server.key and conn.initiator
        assert inbound.peer_key == bytes(client_key.verify_key) and not inbound.initiator
        assert inbound.transcript_hash == conn.transcript_hash
        assert inbound.remote_address[0] == "127.0.0.1" and conn.remote_address == server.address
        assert inbound.local_address == server.address and conn.local_address == inbound.remote_address
        stats = conn.stats()
        assert (stats.frames_out, stats.frames_in) == (4, 5)
        overhead = 4 + 16  # length prefix and tag
        assert stats.bytes_out == sum(len(m) + overhead for m in messages)
        assert (
            stats.bytes_in == len(b"welcome") + sum(len(b"echo:" + m) + overhead for m in messages) + overhead
        )
        assert stats.opened_at <= stats.last_received_at <= trio.current_time()
        assert not conn.closed and conn.close_reason is None


async def test_many_messages_in_order_both_directions_at_once() -> None:
    count = 300

    async def blast(server: Server, conn: Connection) -> None:
        async with trio.open_nursery() as nursery:

            async def send_all() -> None:
                for i in range(count):
                    await conn.send(b"s%d" % i)

            nursery.start_soon(send_all)
            got = [await conn.receive() for _ in range(count)]
            assert got == [b"c%d" % i for i in range(count)]
        await conn.send(b"done")

    async with running(blast) as server, linked(server.address) as conn:
        with trio.fail_after(SAFETY):
            async with trio.open_nursery() as nursery:

                async def send_all() -> None:
                    for i in range(count):
                        await conn.send(b"c%d" % i)

                nursery.start_soon(send_all)
                got = [await conn.receive() for _ in range(count + 1)]
        assert got == [b"s%d" % i for i in range(count)] + [b"done"]


async def test_concurrent_senders_share_one_link() -> None:
    tasks, each = 8, 50

    async def send_mine(conn: Connection, t: int) -> None:
        for i in range(each):
            await conn.send(b"%d:%d" % (t, i))

    async with running() as server, linked(server.address) as conn, trio.open_nursery() as nursery:
        for t in range(tasks):
            nursery.start_soon(send_mine, conn, t)
        with trio.fail_after(SAFETY):
            got = [await conn.receive() for _ in range(tasks * each)]
    for t in range(tasks):
        mine = [m for m in got if m.startswith(b"echo:%d:" % t)]
        assert mine == [b"echo:%d:%d" % (t, i) for i in range(each)]


async def test_pinning_accepts_the_right_key_and_rejects_another() -> None:
    async with running() as server:
        async with linked(server.address, expect=server.key) as conn:
            assert await roundtrip(conn, b"pinned") == b"echo:pinned"
        with pytest.raises(PeerRejected, match="not the pinned"):
            await dial(
                *server.address,
                identity=SigningKey.generate(),
                network=NET,
                timeouts=FAST,
                expect=bytes(SigningKey.generate().verify_key),
            )
    assert len(server.accepted) == 1


async def test_closing_one_side_ends_the_other_sides_iteration() -> None:
    finished = trio.Event()
    reasons: list[str | None] = []

    async def collect(server: Server, conn: Connection) -> None:
        got = [m async for m in conn]
        reasons.append(conn.close_reason)
        assert got == [b"one", b"two"]
        with pytest.raises(ConnectionClosed):
            await conn.send(b"too late")
        finished.set()

    async with running(collect) as server:
        async with linked(server.address) as conn:
            await conn.send(b"one")
            await conn.send(b"two")
        with trio.fail_after(SAFETY):
            await finished.wait()
        assert reasons and reasons[0] is not None and "closed the connection" in reasons[0]

    async def leave(server: Server, conn: Connection) -> None:
        return

    # and the other way round: the server's handler returns, the client's iteration ends.
    async with running(leave) as server, linked(server.address) as conn:
        with trio.fail_after(SAFETY):
            assert [m async for m in conn] == []
            await conn.wait_closed()
        with pytest.raises(ConnectionClosed):
            await conn.receive()


async def test_local_close_and_misuse() -> None:
    async with running() as server, linked(server.address) as conn:
        with pytest.raises(MessageTooLarge):
            await conn.send(bytes(MAX_MESSAGE + 1))
        with pytest.raises(TypeError):
            await conn.send("text")  # type: ignore[arg-type]
        assert await roundtrip(conn, b"still fine") == b"echo:still fine"
        await conn.aclose()
        await conn.aclose()
        assert conn.closed and conn.close_reason == "closed locally"
        with pytest.raises(ConnectionClosed):
            await conn.send(b"after close")
        with pytest.raises(ConnectionClosed):
            await conn.receive()
        with pytest.raises(RuntimeError):
            await conn.run()


# --- bad peers ---


async def test_another_network_is_refused_and_both_sides_name_both_networks(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with running() as server:
        with pytest.raises(NetworkMismatch) as refused:
            await dial(*server.address, identity=SigningKey.generate(), network="another", timeouts=FAST)
        assert (refused.value.ours, refused.value.theirs) == ("another", NET)
        assert f"is on network {NET!r}; this node is on 'another'" in str(refused.value)
        for _ in range(int(SAFETY / 0.01)):  # the responder logs once the initiator's notice is in
            if any(r.levelno == logging.WARNING for r in caplog.records if r.name == "e31.transport"):
                break
            await trio.sleep(0.01)
        (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert f"on network 'another' dialled this node, which is on {NET!r}" in warning
        # the same node again: the responder says it at debug level only (no flood of warnings)
        with pytest.raises(NetworkMismatch):
            await dial(*server.address, identity=SigningKey.generate(), network="another", timeouts=FAST)
        async with linked(server.address) as conn:
            assert await roundtrip(conn, b"ok") == b"echo:ok"
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
    assert len(server.accepted) == 1


async def test_a_responder_of_another_network_answers_with_its_notice_only(
    caplog: pytest.LogCaptureFixture, raw: RawOpener
) -> None:
    async with running() as server:
        stream = await raw(server.address)
        ini = Initiator(SigningKey.generate(), "another", os.urandom(32))
        await stream.send_all(ini.initiate())
        await stream.send_all(b"\x00\x00\x00\x02\x91\xc0")  # not a network notice: the responder stops
        assert await until_closed_by_peer(stream) == network_notice(NET)
    assert any("did not say which" in line for line in drop_lines(caplog))
    assert server.accepted == []


async def test_a_node_dialling_itself_is_rejected() -> None:
    async with running() as server:
        with pytest.raises(ConnectedToSelf, match="itself"):
            await dial(*server.address, identity=server.identity, network=NET, timeouts=FAST)
    assert server.accepted == []


@pytest.mark.parametrize(
    "garbage",
    [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",  # a length prefix of about 1.2 GB
        b"\xff\xff\xff\xff",  # the largest length prefix
        b"\x00\x00\x00\x05hello",  # a frame that is not msgpack
        b"\x00\x00\x00\x03\x93\x01\xc4",  # truncated msgpack
        b"\x00\x00\x00\x00" * 3,  # empty frames
    ],
    ids=["http", "max-length", "not-msgpack", "truncated", "empty"],
)
async def test_garbage_is_dropped_while_a_good_link_keeps_working(garbage: bytes, raw: RawOpener) -> None:
    async with running() as server, linked(server.address) as good:
        assert await roundtrip(good, b"before") == b"echo:before"
        stream = await raw(server.address)
        await stream.send_all(garbage)
        assert await until_closed_by_peer(stream) == b""
        assert await roundtrip(good, b"after") == b"echo:after"
        async with linked(server.address) as fresh:
            assert await roundtrip(fresh, b"new") == b"echo:new"
    assert len(server.accepted) == 2


async def handshake_raw(stream: trio.SocketStream, identity: SigningKey) -> tuple[Initiator, list[bytes]]:
    """Run an initiator by hand over a raw socket; return it and the messages it sent."""
    ini = Initiator(identity, NET, os.urandom(32))
    sent = [ini.initiate()]
    await stream.send_all(sent[0])
    with trio.fail_after(SAFETY):
        while not ini.done:
            data = await stream.receive_some(65536)
            assert data
            if reply := ini.receive_data(data):
                await stream.send_all(reply)
                sent.append(reply)
    return ini, sent


async def test_oversized_and_forged_session_frames_close_only_that_connection(raw: RawOpener) -> None:
    async with running() as server, linked(server.address) as good:
        for n, bad_frame in enumerate((b"\x7f\xff\xff\xff", b"\x00\x00\x00\x20" + os.urandom(32)), 2):
            stream = await raw(server.address)
            await handshake_raw(stream, SigningKey.generate())
            await stream.send_all(bad_frame)
            assert await until_closed_by_peer(stream) == b""
            victim = await server.nth(n)
            with trio.fail_after(SAFETY):
                await victim.wait_closed()
            assert victim.close_reason is not None and "broke the protocol" in victim.close_reason
            assert await roundtrip(good, b"unaffected") == b"echo:unaffected"
    assert len(server.accepted) == 3


async def test_a_raw_initiator_interoperates(raw: RawOpener) -> None:
    async with running() as server:
        stream = await raw(server.address)
        ini, _ = await handshake_raw(stream, SigningKey.generate())
        session = Session(ini.result)
        session.receive_data(ini.unused_data)
        await stream.send_all(session.encrypt(b"by hand"))
        with trio.fail_after(SAFETY):
            while (reply := session.next_message()) is None:
                session.receive_data(await stream.receive_some(65536))
        assert reply == b"echo:by hand"
        await stream.aclose()


async def test_a_replayed_handshake_fails(caplog: pytest.LogCaptureFixture, raw: RawOpener) -> None:
    async with running() as server:
        stream = await raw(server.address)
        _, (hello, finish) = await handshake_raw(stream, SigningKey.generate())
        with trio.fail_after(SAFETY):
            await server.arrived.wait()

        # all the recorded bytes at once: dropped without an answer
        replay = await raw(server.address)
        await replay.send_all(hello + finish)
        assert await until_closed_by_peer(replay) == b""

        # step by step: the server answers message 1 with a fresh message 2, and message 3 fails
        replay = await raw(server.address)
        await replay.send_all(hello)
        with trio.fail_after(SAFETY):
            answer = await replay.receive_some(65536)
        await replay.send_all(finish)
        assert answer + await until_closed_by_peer(replay) == answer
        assert len(answer) == 4 + 154
        await stream.aclose()
    assert len(server.accepted) == 1
    drops = [line for line in drop_lines(caplog) if "does not decrypt" in line]
    assert len(drops) == 2


async def test_a_silent_peer_is_dropped_at_the_handshake_timeout(
    caplog: pytest.LogCaptureFixture, raw: RawOpener
) -> None:
    async with running() as server:
        stream = await raw(server.address)
        await stream.send_all(b"\x00\x00")  # half a length prefix, then nothing
        assert await until_closed_by_peer(stream) == b""
    assert any("no complete handshake within 0.5 s" in line for line in drop_lines(caplog))
    assert server.accepted == []


async def test_dialling_a_silent_listener_times_out() -> None:
    (listener,) = await trio.open_tcp_listeners(0, host="127.0.0.1")

    async def accept_and_stay_silent() -> None:
        async with await listener.accept():
            await trio.sleep_forever()

    async with listener, trio.open_nursery() as nursery:
        nursery.start_soon(accept_and_stay_silent)
        port = listener.socket.getsockname()[1]
        with pytest.raises(HandshakeTimeout):
            await dial("127.0.0.1", port, identity=SigningKey.generate(), network=NET, timeouts=FAST)
        nursery.cancel_scope.cancel()


async def test_an_idle_connection_is_closed() -> None:
    limits = Limits(timeouts=Timeouts(handshake=5.0, idle=0.3))
    async with running(limits=limits) as server, linked(server.address) as conn:
        with trio.fail_after(SAFETY):
            assert [m async for m in conn] == []
        (inbound,) = server.accepted
        assert inbound.close_reason == "no frame received for 0.3 s"


async def test_a_trickle_of_partial_frames_does_not_keep_a_connection_open(raw: RawOpener) -> None:
    limits = Limits(timeouts=Timeouts(handshake=5.0, idle=0.4))
    async with running(limits=limits) as server:
        stream = await raw(server.address)
        await handshake_raw(stream, SigningKey.generate())
        inbound = await server.nth(1)
        with trio.fail_after(SAFETY):
            for _ in range(200):  # a 1 MiB frame, announced and then sent one byte per 20 ms
                if inbound.closed:
                    break
                await stream.send_all(b"\x00\x10\x00\x00" if _ == 0 else b"\x00")
                await trio.sleep(0.02)
            await inbound.wait_closed()
        assert inbound.close_reason == "no frame received for 0.4 s"
        await stream.aclose()


# --- dialling errors ---


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest.mark.parametrize("port", [None, 0, 70000], ids=["closed", "zero", "too-large"])
async def test_dialling_nothing_gives_dial_failed(port: int | None) -> None:
    with pytest.raises(DialFailed):
        await dial(
            "127.0.0.1",
            closed_port() if port is None else port,
            identity=SigningKey.generate(),
            network=NET,
            timeouts=FAST,
        )


async def test_a_busy_port_gives_listen_failed() -> None:
    async with running() as server:
        with pytest.raises(ListenFailed, match="cannot listen"):
            await serve(
                Connection.aclose,
                host="127.0.0.1",
                port=server.address[1],
                identity=SigningKey.generate(),
                network=NET,
            )


# --- caps ---


async def dial_until_admitted(address: Address) -> Connection:
    with trio.fail_after(SAFETY):
        while True:
            try:
                return await dial(*address, identity=SigningKey.generate(), network=NET, timeouts=FAST)
            except HandshakeAborted:
                await trio.sleep(0.02)


async def test_total_cap() -> None:
    async with running(limits=Limits(max_connections=2, timeouts=FAST)) as server:
        async with linked(server.address) as a, linked(server.address) as b:
            with pytest.raises(HandshakeAborted):
                await dial(*server.address, identity=SigningKey.generate(), network=NET, timeouts=FAST)
            assert await roundtrip(a, b"a") == b"echo:a"
            assert await roundtrip(b, b"b") == b"echo:b"
        # once the server has seen those close, slots are free again
        third = await dial_until_admitted(server.address)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(third.run)
            assert await roundtrip(third, b"c") == b"echo:c"
            await third.aclose()


def loopback_alias_missing() -> bool:
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.2", 0))
    except OSError:
        return True
    return False


@pytest.mark.skipif(loopback_alias_missing(), reason="127.0.0.2 is not a local address here")
async def test_per_address_cap_counts_each_loopback_address() -> None:
    limits = Limits(max_connections=10, max_per_loopback=1, timeouts=FAST)
    async with running(limits=limits) as server, linked(server.address, local_address="127.0.0.1") as a:
        with pytest.raises(HandshakeAborted):
            await dial(
                *server.address,
                identity=SigningKey.generate(),
                network=NET,
                timeouts=FAST,
                local_address="127.0.0.1",
            )
        async with linked(server.address, local_address="127.0.0.2") as b:
            assert await roundtrip(a, b"a") == b"echo:a"
            assert await roundtrip(b, b"b") == b"echo:b"


async def test_loopback_is_not_held_to_the_per_address_cap_by_default() -> None:
    limits = Limits(max_connections=6, max_per_address=1, timeouts=FAST)
    async with running(limits=limits) as server, trio.open_nursery() as nursery:
        conns = [
            await dial(*server.address, identity=SigningKey.generate(), network=NET, timeouts=FAST)
            for _ in range(6)
        ]
        for conn in conns:
            nursery.start_soon(conn.run)
        for i, conn in enumerate(conns):
            assert await roundtrip(conn, b"%d" % i) == b"echo:%d" % i
        for conn in conns:
            await conn.aclose()


def test_caps_per_address_and_prefix() -> None:
    caps = ConnectionCaps(Limits(max_connections=5, max_per_address=2, max_per_loopback=3))
    assert caps.admit("192.0.2.1") is None
    assert caps.admit("::ffff:192.0.2.1") is None  # the same host, IPv4-mapped
    assert "cap is 2" in (caps.admit("192.0.2.1") or "")
    assert caps.admit("2001:db8::1") is None
    assert caps.admit("2001:db8::2") is None  # the same /64
    assert "2001:db8::/64" in (caps.admit("2001:db8::ffff") or "")
    assert caps.admit("127.0.0.1") is None
    assert "5 connections open" in (caps.admit("198.51.100.1") or "")
    assert (caps.total, caps.count("192.0.2.1"), caps.count("2001:db8::7")) == (5, 2, 2)
    caps.release("192.0.2.1")
    assert caps.admit("198.51.100.1") is None
    for host in ("::ffff:192.0.2.1", "2001:db8::1", "2001:db8::2", "127.0.0.1", "198.51.100.1"):
        caps.release(host)
    assert caps.total == 0
    with pytest.raises(RuntimeError):
        caps.release("192.0.2.1")


def test_address_keys_and_settings_validation() -> None:
    assert address_key("127.8.9.10") == ("127.8.9.10", True)
    assert address_key("::1") == ("::1", True)
    assert address_key("fe80::1%eth0") == ("fe80::/64", False)
    assert address_key("not-an-ip") == ("not-an-ip", False)
    with pytest.raises(ValueError, match="max_connections"):
        Limits(max_connections=0)
    with pytest.raises(ValueError, match="max_per_loopback"):
        Limits(max_per_loopback=True)
    with pytest.raises(ValueError, match="idle"):
        Timeouts(idle=0)


# --- failures stay inside one connection ---


async def test_a_failing_handler_does_not_affect_other_connections(caplog: pytest.LogCaptureFixture) -> None:
    async def fragile(server: Server, conn: Connection) -> None:
        async for message in conn:
            if message == b"boom":
                raise ValueError("handler bug")
            await conn.send(b"echo:" + message)

    async with running(fragile) as server, linked(server.address) as good:
        async with linked(server.address) as doomed:
            await doomed.send(b"boom")
            with trio.fail_after(SAFETY):
                assert [m async for m in doomed] == []
        assert await roundtrip(good, b"alive") == b"echo:alive"
        async with linked(server.address) as fresh:
            assert await roundtrip(fresh, b"new") == b"echo:new"
    assert any(r.exc_info and "handler bug" in repr(r.exc_info[1]) for r in caplog.records)


# --- backpressure ---


async def test_a_send_that_stalls_times_out_and_closes_the_connection() -> None:
    async def never_read(server: Server, conn: Connection) -> None:
        await trio.sleep_forever()

    stalls = Timeouts(send=0.3)
    async with running(never_read) as server, linked(server.address, timeouts=stalls) as conn:
        with trio.fail_after(SAFETY), pytest.raises(SendTimeout):
            while True:
                await conn.send(bytes(1 << 16))
        assert conn.closed and conn.close_reason == "a send made no progress for 0.3 s"
        with pytest.raises(ConnectionClosed):
            await conn.send(b"after the timeout")


@pytest.mark.parametrize(
    "limits",
    [
        Limits(inbox=4, timeouts=FAST),  # bounded by count: 4 messages
        Limits(inbox=1000, inbox_bytes=4 << 16, timeouts=FAST),  # bounded by bytes: 4 x 64 KiB
    ],
    ids=["count", "bytes"],
)
async def test_a_consumer_that_does_not_read_stalls_the_sender(limits: Limits) -> None:
    size, count, held = 1 << 16, 1000, 4  # 64 MB: more than loopback's socket buffers hold
    consume, consumed = trio.Event(), trio.Event()
    received: list[bytes] = []

    async def slow(server: Server, conn: Connection) -> None:
        await consume.wait()
        received.extend([m async for m in conn])
        consumed.set()

    sent = 0
    async with running(slow, limits=limits) as server:
        async with linked(server.address, timeouts=Timeouts(send=SAFETY)) as conn:

            async def send_everything() -> None:
                nonlocal sent
                for i in range(count):
                    await conn.send(i.to_bytes(4, "big") * (size // 4))
                    sent += 1

            async with trio.open_nursery() as nursery:
                nursery.start_soon(send_everything)
                with trio.fail_after(SAFETY):
                    await server.arrived.wait()
                    stalled_at = -1
                    while sent != stalled_at:  # wait until the sender stops making progress
                        stalled_at = sent
                        await trio.sleep(0.2)
                assert 0 < sent < count
                (inbound,) = server.accepted
                stats = inbound.stats()
                assert stats.frames_in <= held + 1  # the held messages, and one waiting for room
                assert stats.bytes_in <= (held + 3) * (size + 20) + (1 << 16)
                consume.set()
        with trio.fail_after(SAFETY):
            await consumed.wait()
    assert len(received) == count
    assert all(m == i.to_bytes(4, "big") * (size // 4) for i, m in enumerate(received))


async def test_a_node_of_protocol_version_1_is_refused_at_its_first_message(
    caplog: pytest.LogCaptureFixture, raw: RawOpener
) -> None:
    """Version 1 nodes cannot read `results` carriers (nor version 2 ones `assigns` sets): their
    handshake is refused with a logged reason
    (HandshakeFailed inside the transport), no link forms, and good peers are not affected."""
    from e31.protocol.codec import encode_frame, pack
    from e31.protocol.handshake import network_tag

    async with running() as server:
        stream = await raw(server.address)
        await stream.send_all(encode_frame(pack([1, network_tag(NET), os.urandom(32)])))
        assert await until_closed_by_peer(stream) == b""
        async with linked(server.address) as conn:
            assert await roundtrip(conn, b"ok") == b"echo:ok"
    assert any("version 1; we speak 3" in line for line in drop_lines(caplog))
    assert len(server.accepted) == 1
