"""A reachability probe: does the node that holds key K answer at HOST:PORT?

For dial-backs (relay.py): dial, send handshake message 1, and check message 2, in which the
responder proves its key (pinned to K), then close without message 3. The far end never completes a
handshake, so no link comes up and no peer is added there, and the prober's own key is never shown
(the initiator reveals its identity only in message 3, docs/protocol.md section 11); a throwaway key
is used all the same.
"""

from __future__ import annotations

import os

import nacl.signing
import trio
from e31.protocol.errors import ProtocolError
from e31.protocol.handshake import Initiator

from .addresses import join_address
from .transport import DialFailed, HandshakeAborted, HandshakeTimeout, PeerRejected

_RECEIVE_SIZE = 4096


async def probe(host: str, port: int, *, network: str, expect: bytes, seconds: float) -> None:
    """Return if the node with key `expect` answers at host:port within `seconds`; else raise
    DialFailed, HandshakeTimeout, HandshakeAborted or PeerRejected."""
    target = join_address(host, port)
    machine = Initiator(nacl.signing.SigningKey.generate(), network, os.urandom(32), expect=expect)
    try:
        with trio.fail_after(seconds):
            stream = await trio.open_tcp_stream(host, port)
    except trio.TooSlowError:
        raise DialFailed(f"{target}: no TCP connection within {seconds:g} s") from None
    except OSError as e:
        raise DialFailed(f"{target}: {e.strerror or e}") from e
    try:
        with trio.fail_after(seconds):
            await stream.send_all(machine.initiate())
            while not machine.done:
                data = await stream.receive_some(_RECEIVE_SIZE)
                if not data:
                    raise HandshakeAborted(f"{target} closed the connection during the handshake")
                machine.receive_data(data)  # message 3, returned here, is never sent
    except trio.TooSlowError:
        raise HandshakeTimeout(f"{target}: no handshake within {seconds:g} s") from None
    except ProtocolError as e:
        raise PeerRejected(f"{target}: {e}") from e
    except (trio.BrokenResourceError, trio.ClosedResourceError) as e:
        raise HandshakeAborted(
            f"{target}: connection lost during the handshake: {e.__cause__ or e}"
        ) from None
    finally:
        stream.socket.close()
