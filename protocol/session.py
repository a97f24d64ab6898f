"""An established connection: every frame sealed with ChaCha20-Poly1305, one key per direction.

Each direction numbers its frames 0, 1, 2, ... The number is never sent: it is the nonce
(4 zero bytes || 8-byte big-endian counter), so a frame that is replayed, reordered, dropped or
altered fails authentication at the receiver, and that kills the receiving direction for good.
Every REKEY_INTERVAL frames a direction's key is replaced by HKDF-Expand(key, "e31/1 rekey"), without
a message (both ends count), so a key stolen later does not open older traffic; the counter runs on
across rekeys, and at MAX_FRAMES the direction refuses to go on (the caller reconnects) long before
the 64-bit counter could wrap.

A session frame is the usual 4-byte length prefix followed by ciphertext + 16-byte tag, so one
plaintext is at most MAX_PLAINTEXT = MAX_FRAME - 16 bytes. Sans-I/O:

    session = Session(handshake.result)
    send(session.encrypt(b"hello"))
    session.receive_data(handshake.unused_data)
    session.receive_data(recv())          # any split
    for plaintext in session.messages(): ...
"""

from __future__ import annotations

from collections.abc import Iterator

from .codec import MAX_FRAME, FrameDecoder, encode_frame
from .errors import LocalProtocolError, ProtocolError
from .handshake import HandshakeResult, hkdf_expand
from .sodium import TAG, aead_open, aead_seal

TAG_SIZE = TAG
MAX_PLAINTEXT = MAX_FRAME - TAG_SIZE
REKEY_INTERVAL = 1 << 20
MAX_FRAMES = 1 << 62
"""Frames per direction before the session must be replaced (far below the 2^64 nonce space)."""


class BadCiphertext(ProtocolError):
    """A session frame that fails authentication: tampered, replayed, reordered, dropped or truncated."""


class SessionExhausted(LocalProtocolError):
    """This direction has used up its frame budget; open a new connection."""


class _Direction:
    """One direction's key, counter and rekey schedule."""

    def __init__(self, key: bytes, rekey_interval: int, max_frames: int) -> None:
        self.key = key
        self.counter = 0
        self._rekey_interval = rekey_interval
        self._max_frames = max_frames

    def next_nonce(self) -> tuple[bytes, bytes]:
        """The key and nonce for the next frame; advances the counter and rekeys on schedule."""
        if self.counter >= self._max_frames:
            raise SessionExhausted(f"{self.counter} frames sent in one direction: reconnect")
        key, nonce = self.key, bytes(4) + self.counter.to_bytes(8, "big")
        self.counter += 1
        if self.counter % self._rekey_interval == 0:
            self.key = hkdf_expand(self.key, b"e31/1 rekey")
        return key, nonce


class Session:
    """Encrypts outgoing frames and authenticates incoming ones, after a completed handshake.

    `rekey_interval` and `max_frames` are part of the protocol: both ends must use the same values.
    They are parameters so that tests can reach the schedule; nodes use the defaults.
    """

    def __init__(
        self, keys: HandshakeResult, *, rekey_interval: int = REKEY_INTERVAL, max_frames: int = MAX_FRAMES
    ) -> None:
        if not isinstance(keys, HandshakeResult):
            raise LocalProtocolError("a Session starts from a HandshakeResult")
        if rekey_interval < 1 or not 1 <= max_frames <= MAX_FRAMES:
            raise LocalProtocolError("rekey_interval and max_frames must be positive (max_frames <= 2^62)")
        self.peer_key = keys.peer_key
        self.transcript_hash = keys.transcript_hash
        self._send = _Direction(keys.send_key, rekey_interval, max_frames)
        self._recv = _Direction(keys.recv_key, rekey_interval, max_frames)
        self._frames = FrameDecoder(MAX_FRAME)
        self._broken: ProtocolError | None = None

    @property
    def frames_sent(self) -> int:
        return self._send.counter

    @property
    def frames_received(self) -> int:
        return self._recv.counter

    def encrypt(self, plaintext: bytes) -> bytes:
        """Seal one plaintext; return the complete frame to send."""
        if not isinstance(plaintext, (bytes, bytearray, memoryview)):
            raise LocalProtocolError(f"encrypt takes bytes, not {type(plaintext).__name__}")
        if len(plaintext) > MAX_PLAINTEXT:
            raise LocalProtocolError(f"plaintext of {len(plaintext)} bytes exceeds {MAX_PLAINTEXT}")
        key, nonce = self._send.next_nonce()
        sealed = aead_seal(bytes(plaintext), nonce, key)
        return encode_frame(sealed)

    def receive_data(self, data: bytes) -> None:
        """Buffer received bytes, in any split. Only the length prefix is checked here."""
        self._check_alive()
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise LocalProtocolError(f"receive_data takes bytes, not {type(data).__name__}")
        try:
            self._frames.feed(bytes(data))
        except ProtocolError as e:
            self._broken = e
            raise

    def next_message(self) -> bytes | None:
        """The next authenticated plaintext, or None until more bytes arrive."""
        self._check_alive()
        sealed = self._frames.next_frame()
        if sealed is None:
            return None
        try:
            key, nonce = self._recv.next_nonce()
        except SessionExhausted as e:
            self._broken = BadCiphertext("the peer sent more frames than one session allows")
            raise self._broken from e
        plaintext = aead_open(sealed, nonce, key)
        if plaintext is None:
            self._broken = BadCiphertext(
                f"session frame {self._recv.counter - 1} does not authenticate "
                "(tampered, replayed, reordered or dropped)"
            )
            raise self._broken
        return plaintext

    def messages(self) -> Iterator[bytes]:
        """Every plaintext complete so far, in order."""
        while (plaintext := self.next_message()) is not None:
            yield plaintext

    def _check_alive(self) -> None:
        if self._broken is not None:
            raise type(self._broken)(f"the session's receiving side is broken: {self._broken}")
