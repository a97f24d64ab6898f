"""A relayed circuit as a trio byte stream, so the ordinary handshake and session run over it.

Bytes written go out as `relaydata` messages on the link to the relay (`send_chunk`, at most
RELAY_CHUNK bytes each); bytes the relay forwards are `feed`-ed in by the relay service and read
with `receive_some`. `end(reason)` is the far side's close (or the relay's refusal); `close_now()`
(also what transport.Connection calls when it shuts down) closes our side and tells the owner, which
sends `relayclose`. What is fed and not yet read is bounded by `buffer_limit`: a reader that falls
that far behind breaks the circuit (`feed` returns False) rather than let the relay's link stall.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio
from e31.protocol.relay import RELAY_CHUNK

from .transport import ConnectionClosed

BUFFER_LIMIT = 8 << 20
"""Bytes a circuit holds for a slow reader (its connection's inbox is bounded far lower)."""


class RelayStream(trio.abc.Stream):
    def __init__(
        self,
        circuit: bytes,
        *,
        send_chunk: Callable[[bytes], Awaitable[None]],
        on_close: Callable[[RelayStream], None],
        buffer_limit: int = BUFFER_LIMIT,
    ) -> None:
        """`send_chunk` sends one relaydata (raises ConnectionClosed when the relay link is gone);
        `on_close` is called once, when this side closes."""
        self.circuit = circuit
        self._send_chunk = send_chunk
        self._on_close = on_close
        self._limit = buffer_limit
        self._buffer = bytearray()
        self._ended: str | None = None
        self._closed = False
        self._lot = trio.lowlevel.ParkingLot()

    @property
    def ended(self) -> str | None:
        """Why the far side or the relay closed the circuit; None while it is open."""
        return self._ended

    @property
    def closed(self) -> bool:
        return self._closed

    def feed(self, data: bytes) -> bool:
        """Bytes arrived from the relay; False (and the circuit ended) if the reader fell too far behind."""
        if self._ended is not None or self._closed:
            return True
        if len(self._buffer) + len(data) > self._limit:
            self.end(f"the reader fell {self._limit} bytes behind")
            return False
        self._buffer += data
        self._lot.unpark_all()
        return True

    def end(self, reason: str) -> None:
        """The far side (or the relay) closed the circuit: reads drain what is buffered, then stop."""
        if self._ended is None:
            self._ended = reason
            self._lot.unpark_all()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        while not self._buffer and self._ended is None and not self._closed:
            await self._lot.park()
        if self._closed:
            raise trio.ClosedResourceError("the circuit is closed")
        if self._buffer:
            n = len(self._buffer) if max_bytes is None else min(max_bytes, len(self._buffer))
            out = bytes(self._buffer[:n])
            del self._buffer[:n]
            await trio.lowlevel.checkpoint()
            return out
        await trio.lowlevel.checkpoint()
        if self._ended == "closed":
            return b""
        raise trio.BrokenResourceError(f"the circuit ended: {self._ended}")

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the circuit is closed")
        if self._ended is not None:
            raise trio.BrokenResourceError(f"the circuit ended: {self._ended}")
        view = memoryview(bytes(data))
        try:
            for start in range(0, len(view), RELAY_CHUNK):
                await self._send_chunk(bytes(view[start : start + RELAY_CHUNK]))
        except ConnectionClosed as e:
            self.end(f"the link to the relay closed: {e.reason}")
            raise trio.BrokenResourceError(f"the circuit ended: {self._ended}") from None
        await trio.lowlevel.checkpoint()

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.checkpoint()

    def close_now(self) -> None:
        if not self._closed:
            self._closed = True
            self._lot.unpark_all()
            self._on_close(self)

    async def aclose(self) -> None:
        self.close_now()
        await trio.lowlevel.checkpoint()
