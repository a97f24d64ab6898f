"""The trio edges of an e31 link: dial, serve, and the established Connection.

The bytes are all handled by the sans-I/O machines in e31.protocol (handshake.Initiator/Responder,
session.Session); this module moves them over TCP under deadlines and caps, and carries opaque
byte messages, whatever they hold.

A Connection has one reader task, `run()`, which feeds received bytes to the Session and puts each
plaintext into a bounded memory channel. When the consumer falls behind, the channel fills, the reader
stops reading, the kernel buffers fill and the peer's sends stall: memory per connection stays bounded
(`inbox` messages or `inbox_bytes` bytes, whichever comes first, plus one partial frame). The reader
also closes the connection when no complete frame has arrived for `Timeouts.idle` seconds (a trickle
of partial bytes does not count) and on the first bytes that do not authenticate. Sends go through
one lock (frame counters are nonces: frames must hit the wire in the order they were sealed) with a
deadline; a send that times out or is cancelled part-way closes the connection, as the stream is then
mid-frame.

`serve` runs `run()` for each accepted connection beside the handler; a dialled connection's owner runs
it. Messages arrive only while `run()` runs:

    host, port = await nursery.start(partial(serve, handler, host="0.0.0.0", port=0,
                                             identity=key, network="main", limits=Limits()))
    conn = await dial(peer_host, peer_port, identity=key, network="main", expect=peer_key_or_None)
    nursery.start_soon(conn.run)
    await conn.send(b"...")
    async for message in conn: ...         # ends when the connection closes; see conn.close_reason

Everything the peer can cause ends in a TransportError subclass or in a closed connection with a
`close_reason`; no OSError leaves this module. Calling the API wrongly (a non-bytes message, bad
handshake arguments) raises TypeError / MessageTooLarge / LocalProtocolError, as bugs.
"""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import cast

import nacl.signing
import trio
from e31.protocol.envelope import claimed_kind
from e31.protocol.errors import NetworkMismatch as WrongNetworkNotice
from e31.protocol.errors import ProtocolError
from e31.protocol.handshake import HandshakeResult, Initiator, Responder, read_network_notice
from e31.protocol.session import MAX_PLAINTEXT, Session, SessionExhausted

from .. import metrics
from ..errors import PeerError, Unavailable, UsageError
from .limits import (
    DEFAULT_INBOX,
    DEFAULT_INBOX_BYTES,
    ConnectionCaps,
    Limits,
    Timeouts,
    check_positive,
)

__all__ = [
    "MAX_MESSAGE",
    "ConnectedToSelf",
    "Connection",
    "ConnectionCaps",
    "ConnectionClosed",
    "ConnectionStats",
    "DialFailed",
    "HandshakeAborted",
    "HandshakeTimeout",
    "Limits",
    "ListenFailed",
    "MessageTooLarge",
    "PeerRejected",
    "SendTimeout",
    "Timeouts",
    "TransportError",
    "dial",
    "establish",
    "serve",
]

log = logging.getLogger("e31.transport")

MAX_MESSAGE = MAX_PLAINTEXT
"""The largest message one frame carries (1 MiB minus the 16-byte tag)."""

_RECEIVE_SIZE = 1 << 16
_EPHEMERAL_SIZE = 32

Address = tuple[str, int]
Handler = Callable[["Connection"], Awaitable[object]]


class TransportError(PeerError):
    """Base of the errors this module raises about a peer or the network."""


class DialFailed(Unavailable, TransportError):
    """No TCP connection: refused, unreachable, unresolvable, bad port, or the connect timed out."""


class ListenFailed(UsageError, TransportError):
    """The listening socket could not be opened (address in use, not ours, permission)."""


class HandshakeTimeout(TransportError):
    """The handshake did not complete within Timeouts.handshake."""


class HandshakeAborted(TransportError):
    """The peer closed or reset the connection during the handshake (it refused us, or is over its caps)."""


class PeerRejected(TransportError):
    """We refused the peer: invalid handshake bytes, a failed proof, a pin mismatch, or our own key."""


class ConnectedToSelf(PeerRejected):
    """The peer proved our own node key: the address dialled is this node's."""


class NetworkMismatch(PeerRejected):
    """The peer is a node of another network: `ours` and `theirs` name both (`theirs` as the peer's
    network notice claims it; None when it sent none). Both sides see it (docs/protocol.md §11.6)."""

    def __init__(self, message: str, ours: str, theirs: str | None, remote: Address) -> None:
        super().__init__(message)
        self.ours = ours
        self.theirs = theirs
        self.remote = remote


class ConnectionClosed(TransportError):
    """The connection is closed; `reason` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class SendTimeout(ConnectionClosed):
    """A send made no progress for Timeouts.send seconds; the connection has been closed."""


class MessageTooLarge(TransportError, ValueError):
    """A message above MAX_MESSAGE bytes (a local mistake: large data travels as chunks)."""


@dataclass(frozen=True, slots=True)
class ConnectionStats:
    """Counters of one connection. Times are trio.current_time() values; bytes count session frames."""

    opened_at: float
    last_received_at: float
    bytes_in: int
    bytes_out: int
    frames_in: int
    frames_out: int


def _fmt(address: Address) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Connection:
    """An authenticated, encrypted link to one peer, after a completed handshake.

    Made by `dial` and `serve`, not directly. `peer_key` is the peer's 32-byte Ed25519 node key,
    `remote_address` its (host, port), `local_address` our end's, `initiator` whether we dialled.
    Iterating yields messages until the connection closes, for any reason, and then stops; `receive()`
    raises ConnectionClosed instead.
    """

    def __init__(
        self,
        stream: trio.abc.Stream,
        result: HandshakeResult,
        *,
        remote_address: Address,
        leftover: bytes,
        timeouts: Timeouts,
        inbox: int,
        inbox_bytes: int,
    ) -> None:
        self.peer_key: bytes = result.peer_key
        self.transcript_hash: bytes = result.transcript_hash
        self.initiator: bool = result.initiator
        self.remote_address: Address = remote_address
        sock = getattr(stream, "socket", None)
        self.local_address: Address = (sock and _sock_address(sock.getsockname)) or ("", 0)
        self._stream = stream
        self._session = Session(result)
        self._leftover = leftover
        self._timeouts = timeouts
        self._send_lock = trio.Lock()
        self._inbox_in, self._inbox = trio.open_memory_channel[bytes](inbox)
        self._inbox_limit, self._inbox_bytes = inbox, inbox_bytes
        self._queued = self._buffered = 0
        self._drained = trio.lowlevel.ParkingLot()
        self._reason: str | None = None
        self._closed = trio.Event()
        self._reader_scope: trio.CancelScope | None = None
        self._started = False
        self._opened_at = self._last_received_at = trio.current_time()
        self._bytes_in = self._bytes_out = 0

    def __repr__(self) -> str:
        direction = "to" if self.initiator else "from"
        return f"<Connection {direction} {_fmt(self.remote_address)} peer {self.peer_key.hex()[:16]}>"

    @property
    def closed(self) -> bool:
        return self._reason is not None

    @property
    def close_reason(self) -> str | None:
        """Why the connection closed (None while it is open)."""
        return self._reason

    def stats(self) -> ConnectionStats:
        return ConnectionStats(
            self._opened_at,
            self._last_received_at,
            self._bytes_in,
            self._bytes_out,
            self._session.frames_received,
            self._session.frames_sent,
        )

    async def wait_closed(self) -> None:
        await self._closed.wait()

    # --- receiving ---

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The reader: runs until the connection closes, then returns (it raises only Cancelled)."""
        if self._started:
            raise RuntimeError("Connection.run() is already running or has run")
        self._started = True
        reason = "the reader was cancelled"
        try:
            with trio.CancelScope() as scope:
                self._reader_scope = scope
                if self.closed:
                    scope.cancel()
                task_status.started()
                reason = await self._read_loop()
        except BaseException as e:
            if not isinstance(e, trio.Cancelled):
                reason = f"internal error in the reader: {type(e).__name__}: {e}"
            raise
        finally:
            self._shutdown(reason)

    async def _read_loop(self) -> str:
        idle = self._timeouts.idle
        data, self._leftover = self._leftover, b""
        deadline = trio.current_time() + idle
        while True:
            if data:
                self._bytes_in += len(data)
                try:
                    self._session.receive_data(data)
                    for message in self._session.messages():
                        self._last_received_at = trio.current_time()
                        while self._inbox_full(len(message)):
                            await self._drained.park()
                        self._inbox_in.send_nowait(message)
                        self._queued += 1
                        self._buffered += len(message)
                        deadline = trio.current_time() + idle
                except ProtocolError as e:
                    return f"the peer broke the protocol: {e}"
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return "closed locally"
            with trio.move_on_at(deadline) as timer:
                try:
                    data = cast(bytes, await self._stream.receive_some(_RECEIVE_SIZE))
                except trio.BrokenResourceError as e:
                    return f"connection lost: {e.__cause__ or e}"
                except trio.ClosedResourceError:
                    return "closed locally"
                if not data:
                    return "the peer closed the connection"
            if timer.cancelled_caught:
                return f"no frame received for {idle:g} s"

    async def receive(self) -> bytes:
        """The next message; ConnectionClosed once the connection is closed and drained."""
        try:
            message = await self._inbox.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            raise ConnectionClosed(self._reason or "closed") from None
        self._queued -= 1
        self._buffered -= len(message)
        # Wake the reader only once the inbox is half empty, so that a slow consumer and the reader
        # take turns per batch of messages rather than per message.
        if self._queued <= self._inbox_limit // 2 and self._buffered <= self._inbox_bytes // 2:
            self._drained.unpark_all()
        return message

    def _inbox_full(self, size: int) -> bool:
        """Whether one more message of `size` bytes must wait (one message is always let through)."""
        return self._queued >= self._inbox_limit or (
            self._queued > 0 and self._buffered + size > self._inbox_bytes
        )

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await self.receive()
        except ConnectionClosed:
            raise StopAsyncIteration from None

    # --- sending ---

    async def send(self, message: bytes) -> None:
        """Send one message. Raises ConnectionClosed (SendTimeout if it stalled) when it cannot."""
        if not isinstance(message, (bytes, bytearray, memoryview)):
            raise TypeError(f"send takes bytes, not {type(message).__name__}")
        if len(message) > MAX_MESSAGE:
            raise MessageTooLarge(f"a message of {len(message)} bytes exceeds {MAX_MESSAGE}")
        metrics.message_sent(claimed_kind(bytes(message[:40])), len(message))
        try:
            self._send_lock.acquire_nowait()  # the common case; send_all below still checkpoints
        except trio.WouldBlock:
            await self._send_lock.acquire()
        try:
            await self._send_locked(message)
        finally:
            self._send_lock.release()

    async def _send_locked(self, message: bytes) -> None:
        if self._reason is not None:
            raise ConnectionClosed(self._reason)
        try:
            frame = self._session.encrypt(message)
        except SessionExhausted as e:
            self._shutdown(f"session exhausted: {e}")
            raise ConnectionClosed(self._reason or "closed") from None
        limit = self._timeouts.send
        try:
            with trio.move_on_after(limit) as timer:
                await self._stream.send_all(frame)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as e:
            self._shutdown(f"connection lost while sending: {e.__cause__ or e}")
            raise ConnectionClosed(self._reason or "closed") from None
        except BaseException:
            self._shutdown("a send was cancelled part-way through a frame")
            raise
        if timer.cancelled_caught:
            self._shutdown(f"a send made no progress for {limit:g} s")
            raise SendTimeout(self._reason or "closed")
        self._bytes_out += len(frame)

    # --- closing ---

    async def aclose(self) -> None:
        """Close now: pending and later receives and sends raise ConnectionClosed. Idempotent."""
        self._shutdown("closed locally")
        self._inbox.close()
        await trio.lowlevel.checkpoint()

    def _shutdown(self, reason: str) -> None:
        if self._reason is not None:
            return
        self._reason = reason
        log.debug("%r closed: %s", self, reason)
        self._inbox_in.close()
        if self._reader_scope is not None:
            self._reader_scope.cancel()
        _close_now(self._stream)
        self._closed.set()


def _close_now(stream: trio.abc.Stream) -> None:
    """Close without waiting: a TCP stream's socket, or a stream that offers `close_now` (a relayed
    circuit, node/net/circuits.py)."""
    sock = getattr(stream, "socket", None)
    if sock is not None:
        sock.close()
    else:
        close: Callable[[], None] = getattr(stream, "close_now")  # noqa: B009
        close()


# --- opening ---


async def _run_handshake(stream: trio.abc.Stream, machine: Initiator | Responder, first: bytes) -> bytes:
    if first:
        await stream.send_all(first)
    while not machine.done:
        data = cast(bytes, await stream.receive_some(_RECEIVE_SIZE))
        if not data:
            raise HandshakeAborted("the peer closed the connection during the handshake")
        reply = machine.receive_data(data)
        if reply:
            await stream.send_all(reply)
    return machine.unused_data


async def _establish(
    stream: trio.abc.Stream,
    machine: Initiator | Responder,
    first: bytes,
    *,
    own_key: bytes,
    remote: Address,
    timeouts: Timeouts,
    inbox: int,
    inbox_bytes: int,
) -> Connection:
    """Run the handshake on `stream` under the deadline; the caller closes the stream on failure."""
    limit = timeouts.handshake
    try:
        with trio.fail_after(limit):
            leftover = await _run_handshake(stream, machine, first)
    except trio.TooSlowError:
        raise HandshakeTimeout(f"no complete handshake within {limit:g} s") from None
    except WrongNetworkNotice as e:
        raise await _exchange_notices(stream, e, remote) from None
    except ProtocolError as e:
        raise PeerRejected(f"invalid handshake: {e}") from e
    except trio.BrokenResourceError as e:
        raise HandshakeAborted(f"connection lost during the handshake: {e.__cause__ or e}") from None
    result = machine.result
    if result.peer_key == own_key:
        raise ConnectedToSelf("the peer is this node itself")
    return Connection(
        stream,
        result,
        remote_address=remote,
        leftover=leftover,
        timeouts=timeouts,
        inbox=inbox,
        inbox_bytes=inbox_bytes,
    )


NOTICE_WAIT = 2.0
"""Seconds to send our network notice and (as responder) read the initiator's, after a mismatch."""


async def _exchange_notices(
    stream: trio.abc.Stream, e: WrongNetworkNotice, remote: Address
) -> NetworkMismatch:
    """Send our network notice; as the responder, read the initiator's (it names its network)."""
    theirs = e.theirs
    with trio.move_on_after(NOTICE_WAIT):
        try:
            await stream.send_all(e.notice)
            buf = bytearray()
            while theirs is None:
                data = await stream.receive_some(_RECEIVE_SIZE)
                if not data:
                    break
                buf += data
                theirs = read_network_notice(bytes(buf))
        except (trio.BrokenResourceError, trio.ClosedResourceError, ProtocolError):
            pass
    where = _fmt(remote)
    if e.theirs is not None:  # we dialled
        text = f"the node at {where} is on network {theirs!r}; this node is on {e.ours!r}"
    elif theirs is not None:
        text = f"a node at {where} on network {theirs!r} dialled this node, which is on {e.ours!r}"
    else:
        text = f"a node at {where} of another network (it did not say which) dialled this node, on {e.ours!r}"
    return NetworkMismatch(text, e.ours, theirs, remote)


def _sock_address(get: Callable[[], tuple[str, int] | tuple[str, int, int, int]]) -> Address | None:
    """An IPv4 socket names (host, port), an IPv6 one (host, port, flowinfo, scope_id)."""
    try:
        name = get()
    except OSError:  # reset in the meantime
        return None
    return str(name[0]), int(name[1])


async def establish(
    stream: trio.abc.Stream,
    *,
    initiator: bool,
    identity: nacl.signing.SigningKey,
    network: str,
    remote: Address,
    expect: bytes | None = None,
    timeouts: Timeouts | None = None,
    inbox: int = DEFAULT_INBOX,
    inbox_bytes: int = DEFAULT_INBOX_BYTES,
) -> Connection:
    """Run the handshake over any byte stream (a relayed circuit) as initiator or responder, and
    return the Connection over it; `remote` names the far end for logs. The caller closes `stream`
    when this raises (HandshakeTimeout, HandshakeAborted, PeerRejected) and runs `conn.run()`."""
    timeouts = timeouts or Timeouts()
    machine: Initiator | Responder
    if initiator:
        machine = Initiator(identity, network, os.urandom(_EPHEMERAL_SIZE), expect=expect)
        first = machine.initiate()
    else:
        machine, first = Responder(identity, network, os.urandom(_EPHEMERAL_SIZE)), b""
    return await _establish(
        stream,
        machine,
        first,
        own_key=bytes(identity.verify_key),
        remote=remote,
        timeouts=timeouts,
        inbox=inbox,
        inbox_bytes=inbox_bytes,
    )


async def dial(
    host: str,
    port: int,
    *,
    identity: nacl.signing.SigningKey,
    network: str,
    expect: bytes | None = None,
    timeouts: Timeouts | None = None,
    inbox: int = DEFAULT_INBOX,
    inbox_bytes: int = DEFAULT_INBOX_BYTES,
    local_address: str | None = None,
) -> Connection:
    """Connect over TCP and complete the handshake as initiator.

    `expect` pins the peer's node key; `inbox` and `inbox_bytes` bound what the connection buffers for
    a slow consumer (as in Limits); `local_address` binds the local end. The caller runs `conn.run()` in
    a nursery to receive messages, and closes the connection.
    Raises DialFailed, HandshakeTimeout, HandshakeAborted or PeerRejected.
    """
    timeouts = timeouts or Timeouts()
    check_positive("inbox", inbox)
    check_positive("inbox_bytes", inbox_bytes)
    machine = Initiator(identity, network, os.urandom(_EPHEMERAL_SIZE), expect=expect)
    target = _fmt((host, port))
    if type(port) is not int or not 0 < port < 65536:
        raise DialFailed(f"{target}: not a TCP port")
    try:
        with trio.fail_after(timeouts.connect):
            stream = await trio.open_tcp_stream(host, port, local_address=local_address)
    except trio.TooSlowError:
        raise DialFailed(f"{target}: no TCP connection within {timeouts.connect:g} s") from None
    except OSError as e:
        raise DialFailed(f"{target}: {e.strerror or e}") from e
    try:
        remote = _sock_address(stream.socket.getpeername) or (host, port)
        conn = await _establish(
            stream,
            machine,
            machine.initiate(),
            own_key=bytes(identity.verify_key),
            remote=remote,
            timeouts=timeouts,
            inbox=inbox,
            inbox_bytes=inbox_bytes,
        )
    except BaseException:
        stream.socket.close()
        raise
    log.debug("dialled %r", conn)
    return conn


async def serve(
    handler: Handler,
    *,
    host: str,
    port: int,
    identity: nacl.signing.SigningKey,
    network: str,
    limits: Limits | None = None,
    caps: ConnectionCaps | None = None,
    task_status: trio.TaskStatus[Address] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Listen on host:port and run `handler(conn)` for each authenticated inbound connection.

    For `nursery.start`: reports the bound (host, port) (port 0 picks a free one). Runs until
    cancelled. Each connection lives in its own task; when its handler returns or raises, the
    connection is closed; nothing one connection does reaches another. Peers that fail the caps or
    the handshake are dropped without an answer and logged at debug level. `caps` may be shared with
    other code that opens connections; by default serve counts its own. Raises ListenFailed.
    """
    limits = limits or Limits()
    caps = caps or ConnectionCaps(limits)
    try:
        listeners = await trio.open_tcp_listeners(port, host=host)
    except OSError as e:
        raise ListenFailed(f"cannot listen on {_fmt((host, port))}: {e.strerror or e}") from e
    bound = [listener.socket.getsockname() for listener in listeners]
    address: Address = (str(bound[0][0]), int(bound[0][1]))
    log.info("listening on %s", ", ".join(_fmt((str(b[0]), int(b[1]))) for b in bound))
    accept = partial(_accepted, handler=handler, identity=identity, network=network, limits=limits, caps=caps)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, accept, listeners)
            task_status.started(address)
    finally:
        for listener in listeners:
            listener.socket.close()


async def _accepted(
    stream: trio.SocketStream,
    *,
    handler: Handler,
    identity: nacl.signing.SigningKey,
    network: str,
    limits: Limits,
    caps: ConnectionCaps,
) -> None:
    remote = _sock_address(stream.socket.getpeername)
    if remote is None:
        stream.socket.close()
        return
    refusal = caps.admit(remote[0])
    if refusal is not None:
        log.debug("refused %s: %s", _fmt(remote), refusal)
        stream.socket.close()
        return
    try:
        await _handle(stream, remote, handler, identity, network, limits)
    except Exception:
        log.exception("connection from %s failed", _fmt(remote))
    finally:
        caps.release(remote[0])
        stream.socket.close()


_MISMATCHES: dict[tuple[str, str | None], float] = {}
"""When each (remote host, its network) that dialled us from another network was last shown."""
MISMATCH_QUIET = 600.0
MISMATCH_KEPT = 256


def _first_mismatch(e: NetworkMismatch) -> bool:
    """Whether to show this mismatch at WARNING: once per remote host and network per MISMATCH_QUIET
    seconds (a misconfigured node retries; a stranger could dial in a loop), in bounded memory."""
    key, now = (e.remote[0], e.theirs), trio.current_time()
    last = _MISMATCHES.get(key)
    if last is not None and now - last < MISMATCH_QUIET:
        return False
    if len(_MISMATCHES) >= MISMATCH_KEPT:
        _MISMATCHES.pop(min(_MISMATCHES, key=_MISMATCHES.__getitem__))
    _MISMATCHES[key] = now
    return True


async def _handle(
    stream: trio.SocketStream,
    remote: Address,
    handler: Handler,
    identity: nacl.signing.SigningKey,
    network: str,
    limits: Limits,
) -> None:
    machine = Responder(identity, network, os.urandom(_EPHEMERAL_SIZE))
    try:
        conn = await _establish(
            stream,
            machine,
            b"",
            own_key=bytes(identity.verify_key),
            remote=remote,
            timeouts=limits.timeouts,
            inbox=limits.inbox,
            inbox_bytes=limits.inbox_bytes,
        )
    except NetworkMismatch as e:
        level = logging.WARNING if _first_mismatch(e) else logging.DEBUG
        log.log(level, "%s: nodes of different networks never connect (the `network` setting)", e)
        return
    except TransportError as e:
        log.debug("dropped %s during the handshake: %s", _fmt(remote), e)
        return
    log.debug("accepted %r", conn)
    async with trio.open_nursery() as nursery:
        await nursery.start(conn.run)
        try:
            await handler(conn)
        finally:
            await conn.aclose()
