"""A relayed circuit as a trio byte stream, so the ordinary handshake and session run over it.

Bytes written go out as `relaydata` messages on the link to the relay (`send_chunk`, at most
RELAY_CHUNK bytes each); bytes the relay forwards are `feed`-ed in by the relay service and read
with `receive_some`. `end(reason)` is the far side's close (or the relay's refusal); `close_now()`
(also what transport.Connection calls when it shuts down) closes our side and tells the owner, which
sends `relayclose`.

Flow control is end to end, by credit: each end may send CIRCUIT_WINDOW bytes before the other grants
more. A writer waits for credit (`credit(n)` adds what the far end granted); a reader, once it has
read a quarter of the window since its last grant, grants that much back (`grant(n)`, which the owner
sends as `relaycredit`). So at most a window of unread bytes is ever buffered at an end, and the
relay, whose links carry no more than the ends allow, never stalls one circuit behind another. A far
end that sends beyond its credit breaks the circuit (`feed` returns False).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio
from e31.protocol.relay import CIRCUIT_WINDOW, RELAY_CHUNK

from .transport import ConnectionClosed


class RelayStream(trio.abc.Stream):
    def __init__(
        self,
        circuit: bytes,
        *,
        send_chunk: Callable[[bytes], Awaitable[None]],
        grant: Callable[[int], None],
        on_close: Callable[[RelayStream], None],
        window: int = CIRCUIT_WINDOW,
    ) -> None:
        """`send_chunk` sends one relaydata (raises ConnectionClosed when the relay link is gone);
        `grant(n)` sends a relaycredit of n bytes; `on_close` is called once, when this side closes."""
        self.circuit = circuit
        self._send_chunk = send_chunk
        self._grant = grant
        self._on_close = on_close
        self._window = window
        self._credit = window
        """Bytes this end may still send."""
        self._unacknowledged = 0
        """Bytes read since the last grant."""
        self._buffer = bytearray()
        self._ended: str | None = None
        self._closed = False
        self._readable = trio.lowlevel.ParkingLot()
        self._writable = trio.lowlevel.ParkingLot()

    @property
    def ended(self) -> str | None:
        """Why the far side or the relay closed the circuit; None while it is open."""
        return self._ended

    @property
    def closed(self) -> bool:
        return self._closed

    def feed(self, data: bytes) -> bool:
        """Bytes arrived from the relay; False (and the circuit ended) if they exceed the credit given."""
        if self._ended is not None or self._closed:
            return True
        if len(self._buffer) + self._unacknowledged + len(data) > self._window:
            self.end(f"the far end sent more than the {self._window} bytes of credit it had")
            return False
        self._buffer += data
        self._readable.unpark_all()
        return True

    def credit(self, n: int) -> None:
        """The far end granted `n` more bytes."""
        self._credit += n
        self._writable.unpark_all()

    def end(self, reason: str) -> None:
        """The far side (or the relay) closed the circuit: reads drain what is buffered, then stop."""
        if self._ended is None:
            self._ended = reason
            self._readable.unpark_all()
            self._writable.unpark_all()

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        while not self._buffer and self._ended is None and not self._closed:
            await self._readable.park()
        if self._closed:
            raise trio.ClosedResourceError("the circuit is closed")
        if self._buffer:
            n = len(self._buffer) if max_bytes is None else min(max_bytes, len(self._buffer))
            out = bytes(self._buffer[:n])
            del self._buffer[:n]
            self._unacknowledged += n
            if self._unacknowledged >= self._window // 4 and self._ended is None:
                self._grant(self._unacknowledged)
                self._unacknowledged = 0
            await trio.lowlevel.checkpoint()
            return out
        await trio.lowlevel.checkpoint()
        if self._ended == "closed":
            return b""
        raise trio.BrokenResourceError(f"the circuit ended: {self._ended}")

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        view = memoryview(bytes(data))
        try:
            while True:
                self._check_writable()
                if not view:
                    break
                if self._credit <= 0:
                    await self._writable.park()
                    continue
                n = min(len(view), RELAY_CHUNK, self._credit)
                self._credit -= n
                await self._send_chunk(bytes(view[:n]))
                view = view[n:]
        except ConnectionClosed as e:
            self.end(f"the link to the relay closed: {e.reason}")
            raise trio.BrokenResourceError(f"the circuit ended: {self._ended}") from None
        await trio.lowlevel.checkpoint()

    def _check_writable(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the circuit is closed")
        if self._ended is not None:
            raise trio.BrokenResourceError(f"the circuit ended: {self._ended}")

    async def wait_send_all_might_not_block(self) -> None:
        while self._credit <= 0 and self._ended is None and not self._closed:
            await self._writable.park()
        await trio.lowlevel.checkpoint()

    def close_now(self) -> None:
        if not self._closed:
            self._closed = True
            self._readable.unpark_all()
            self._writable.unpark_all()
            self._on_close(self)

    async def aclose(self) -> None:
        self.close_now()
        await trio.lowlevel.checkpoint()
