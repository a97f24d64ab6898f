"""The protocol's errors: one base class, flat subclasses.

Every decoder in e31.protocol raises only ProtocolError subclasses, whatever bytes it is fed.
`remote` says whose fault the error is (as in h11): True when the bytes came from a peer that
sent something invalid, False when local code misused the API.
"""

from __future__ import annotations


class ProtocolError(Exception):
    """Base of every error raised by e31.protocol."""

    remote: bool = True


class DecodeError(ProtocolError):
    """Bytes that are not valid msgpack, or not of the expected shape and types."""


class FrameTooLarge(ProtocolError):
    """A frame length prefix above MAX_FRAME (checked before anything is buffered)."""


class NonCanonical(ProtocolError):
    """A value encoded in a form other than the one minimal encoding we accept."""


class BadSignature(ProtocolError):
    """An Ed25519 signature that does not verify, or a signer that is not who the body names."""


class UnknownKind(ProtocolError):
    """An envelope kind with no registered message class."""


class InvalidMessage(ProtocolError):
    """A decoded message whose fields break the rules (lengths, ranges, relations)."""


class Expired(ProtocolError):
    """A message whose expiry has passed (checked only where messages arrive from the network)."""


class WrongNetwork(ProtocolError):
    """A message or handshake for a different network name."""


class NetworkMismatch(WrongNetwork):
    """A handshake with a node of another network (docs/protocol.md §11.6): `ours` is this side's
    network name, `theirs` the peer's as its network notice claims it (None where only its network
    tag is known: the responder, before the initiator's notice), and `notice` the frame to send back
    before closing (this side's own network notice)."""

    def __init__(self, message: str, ours: str, theirs: str | None, notice: bytes) -> None:
        super().__init__(message)
        self.ours = ours
        self.theirs = theirs
        self.notice = notice


class BadProof(ProtocolError):
    """A Merkle inclusion or consistency proof that does not verify."""


class HandshakeFailed(ProtocolError):
    """A handshake that cannot complete: bad proof, replay, pinning mismatch, wrong state."""


class LocalProtocolError(ProtocolError):
    """Local code used the protocol API wrongly (a bug on our side, not the peer's)."""

    remote = False


class BadBlob(ProtocolError):
    """A blob chunk or chunk list that does not match the hash or size it was announced with."""


class Mismatch(ProtocolError):
    """A valid message that does not match what it answers (a receipt vs. its manifest or assignment)."""
