"""The relayed circuit as a byte stream (node/net/circuits.py): what the relay service feeds in is read
in order, a far close is an end of stream, a refusal breaks it, writes go out in chunks of at most
RELAY_CHUNK bytes and only as far as the far end's credit allows, a reader grants credit back as it
reads, a far end that sends beyond its credit breaks the circuit, and our side's close is reported
once."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from e31.node.net.circuits import RelayStream
from e31.node.net.transport import ConnectionClosed
from e31.protocol.relay import CIRCUIT_WINDOW, RELAY_CHUNK


class Wire:
    def __init__(self, *, broken: bool = False) -> None:
        self.chunks: list[bytes] = []
        self.grants: list[int] = []
        self.closed: list[RelayStream] = []
        self.broken = broken

    async def send(self, data: bytes) -> None:
        if self.broken:
            raise ConnectionClosed("the link to the relay is gone")
        self.chunks.append(data)

    def stream(self, window: int = CIRCUIT_WINDOW) -> RelayStream:
        return RelayStream(
            bytes(16),
            send_chunk=self.send,
            grant=self.grants.append,
            on_close=self.closed.append,
            window=window,
        )


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


async def test_a_reader_grants_credit_as_it_reads_and_a_far_end_beyond_its_credit_breaks_the_circuit() -> (
    None
):
    wire = Wire()
    s = wire.stream(window=16)
    assert s.feed(b"12345678") and s.feed(b"abcd")
    assert await s.receive_some(3) == b"123"
    assert wire.grants == []  # less than a quarter of the window read since the last grant
    assert await s.receive_some(2) == b"45"
    assert wire.grants == [5]
    assert s.feed(b"ABCDE")  # 7 unread + 5 = 12 of the 16 it may have outstanding
    assert not s.feed(b"XYZWV")  # 12 + 5 > 16: more than it was granted
    assert s.ended is not None and "credit" in s.ended
    assert await s.receive_some() == b"678abcdABCDE"
    with pytest.raises(trio.BrokenResourceError):
        await s.receive_some()


async def test_a_writer_sends_relay_chunks_within_its_credit_and_waits_for_more() -> None:
    wire = Wire()
    s = wire.stream(window=2 * RELAY_CHUNK + 100)
    await s.send_all(b"a" * (2 * RELAY_CHUNK + 5))
    assert [len(c) for c in wire.chunks] == [RELAY_CHUNK, RELAY_CHUNK, 5]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(s.send_all, b"b" * 300)
        await trio.testing.wait_all_tasks_blocked()
        assert [len(c) for c in wire.chunks][3:] == [95]  # the credit left, then it waits
        s.credit(1000)
    assert [len(c) for c in wire.chunks][3:] == [95, 205]


async def test_a_writer_waiting_for_credit_is_released_by_the_far_close() -> None:
    s = Wire().stream(window=4)
    await s.send_all(b"1234")
    errors: list[Exception] = []

    async def write() -> None:
        try:
            await s.send_all(b"5")
        except trio.BrokenResourceError as e:
            errors.append(e)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(write)
        await trio.testing.wait_all_tasks_blocked()
        assert errors == []
        s.end("closed")
    assert len(errors) == 1


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
