"""The relayed circuit as a byte stream (node/net/circuits.py): what the relay service feeds in is read
in order, a far close is an end of stream, a refusal or an overflow breaks it, writes go out in
chunks of at most RELAY_CHUNK bytes, and our side's close is reported once."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from e31.node.net.circuits import RelayStream
from e31.node.net.transport import ConnectionClosed
from e31.protocol.relay import RELAY_CHUNK


class Wire:
    def __init__(self, *, broken: bool = False) -> None:
        self.chunks: list[bytes] = []
        self.closed: list[RelayStream] = []
        self.broken = broken

    async def send(self, data: bytes) -> None:
        if self.broken:
            raise ConnectionClosed("the link to the relay is gone")
        self.chunks.append(data)

    def stream(self, limit: int = 1 << 20) -> RelayStream:
        return RelayStream(bytes(16), send_chunk=self.send, on_close=self.closed.append, buffer_limit=limit)


async def test_fed_bytes_are_read_in_order_and_a_clean_far_close_ends_the_stream() -> None:
    s = Wire().stream()
    assert s.feed(b"hello ") and s.feed(b"world")
    assert await s.receive_some(3) == b"hel"
    assert await s.receive_some() == b"lo world"
    s.end("closed")
    assert await s.receive_some() == b""


async def test_a_reader_waits_for_bytes() -> None:
    s = Wire().stream()
    got: list[bytes] = []

    async def read() -> None:
        got.append(await s.receive_some())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read)
        await trio.testing.wait_all_tasks_blocked()
        assert got == []
        s.feed(b"late")
    assert got == [b"late"]


async def test_a_refusal_breaks_the_stream_after_what_was_buffered() -> None:
    s = Wire().stream()
    s.feed(b"last")
    s.end("no_reservation: the target holds no reservation")
    assert await s.receive_some() == b"last"
    with pytest.raises(trio.BrokenResourceError, match="no_reservation"):
        await s.receive_some()
    with pytest.raises(trio.BrokenResourceError):
        await s.send_all(b"x")


async def test_a_reader_that_falls_behind_breaks_the_circuit_instead_of_growing_memory() -> None:
    s = Wire().stream(limit=10)
    assert s.feed(b"12345678")
    assert not s.feed(b"abc")
    assert s.ended is not None and "behind" in s.ended
    assert await s.receive_some() == b"12345678"
    with pytest.raises(trio.BrokenResourceError):
        await s.receive_some()


async def test_writes_go_out_in_relay_chunks() -> None:
    wire = Wire()
    s = wire.stream()
    await s.send_all(b"a" * (2 * RELAY_CHUNK + 5))
    assert [len(c) for c in wire.chunks] == [RELAY_CHUNK, RELAY_CHUNK, 5]


async def test_a_lost_relay_link_breaks_a_write() -> None:
    s = Wire(broken=True).stream()
    with pytest.raises(trio.BrokenResourceError, match="relay"):
        await s.send_all(b"x")
    assert s.ended is not None


async def test_our_close_is_reported_once_and_then_reads_and_writes_fail() -> None:
    wire = Wire()
    s = wire.stream()
    s.close_now()
    await s.aclose()
    assert wire.closed == [s]
    with pytest.raises(trio.ClosedResourceError):
        await s.receive_some()
    with pytest.raises(trio.ClosedResourceError):
        await s.send_all(b"x")
