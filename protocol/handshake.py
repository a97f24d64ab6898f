"""The transport handshake: three messages, mutual authentication, no key known in advance.

A SIGMA-I / Noise-XX style exchange over one X25519 ephemeral pair per side, with identities (Ed25519
node keys) sent encrypted and proven by signatures over the transcript hash:

    1. I -> R  [version, network_tag, e_I]
    2. R -> I  [e_R, seal(k_R, [id_R, sig_R(h2)])]
    3. I -> R  [seal(k_I, [id_I, sig_I(h3)])]

Each message is a canonical msgpack array in one frame (codec.encode_frame). The transcript hash starts
from the protocol name and the network name and absorbs every message, so two networks never agree on a
key, and each signature covers both ephemerals, the network, the version and everything said before it.
The initiator reveals its identity only after it has authenticated (and, if asked, pinned) the responder.
docs/protocol.md section 11 is the normative description.

Sans-I/O, shaped like h11: no sockets, no clock, no randomness. The caller supplies a fresh 32-byte
ephemeral secret per handshake (os.urandom(32) at the edge; reusing one breaks replay protection), feeds
received bytes to `receive_data`, and sends whatever bytes come back:

    ini = Initiator(identity, "main", os.urandom(32), expect=None)
    send(ini.initiate())
    while not ini.done: send(ini.receive_data(recv()))     # returns b"" until there is something to send
    result = ini.result                                      # HandshakeResult; ini.unused_data -> Session

Any bytes whatsoever raise only ProtocolError subclasses (HandshakeFailed, WrongNetwork, DecodeError,
FrameTooLarge, ...); after an error the machine is dead and every further call raises HandshakeFailed.
Two networks meeting raise NetworkMismatch (a WrongNetwork) carrying the network notice to send back:
the responder answers message 1 with its notice, the initiator replies with its own
(`read_network_notice` reads it), and then both close, each able to name both networks.
"""

from __future__ import annotations

import abc
import enum
import hashlib
import hmac
from dataclasses import dataclass
from typing import Any

import nacl.bindings as sodium
import nacl.exceptions
import nacl.signing

from .codec import encode_frame, pack, unpack_canonical
from .errors import FrameTooLarge, HandshakeFailed, LocalProtocolError, NetworkMismatch, ProtocolError

VERSION = 3
"""The protocol version carried in message 1: of the handshake, the session and the message kinds a
node sends on it. 2: executors deliver results in `results` carriers, which a version-1 node cannot
read. 3: submitters assign jobs in `assigns` sets, which a version-2 node cannot read. Nodes of
different versions never link (HandshakeFailed)."""

MAX_HANDSHAKE_FRAME = 512
"""The largest handshake frame either side accepts (the real payloads are 54, 154 and 120 bytes)."""

KEY_SIZE = 32
_PROTOCOL_NAME = b"e31/handshake/1"
_SIG_RESPONDER = b"e31/handshake/1/responder\x00"
_SIG_INITIATOR = b"e31/handshake/1/initiator\x00"
_ZERO_NONCE = bytes(12)
_NETWORK_TAG_SIZE = 16


def _h(*parts: bytes) -> bytes:
    return hashlib.sha256(b"".join(parts)).digest()


def hkdf_extract(salt: bytes, ikm: bytes) -> bytes:
    """HKDF-Extract with SHA-256 (RFC 5869)."""
    return hmac.digest(salt, ikm, "sha256")


def hkdf_expand(prk: bytes, info: bytes, length: int = KEY_SIZE) -> bytes:
    """HKDF-Expand with SHA-256 (RFC 5869), for lengths up to 32 * 255 bytes."""
    out, block = b"", b""
    counter = 1
    while len(out) < length:
        block = hmac.digest(prk, block + info + bytes([counter]), "sha256")
        out += block
        counter += 1
    return out[:length]


def network_tag(network: str) -> bytes:
    """The 16 bytes that name a network in message 1: SHA-256("e31/network\\x00" || name)[:16]."""
    return _h(b"e31/network\x00", network.encode())[:_NETWORK_TAG_SIZE]


NOTICE = 0
"""The first field of a network notice (an int: messages 2 and 3 begin with a bin)."""
NETWORK_NAME_MAX = 32


def network_notice(network: str) -> bytes:
    """The framed network notice `[0, network]`: a responder's answer to a message 1 of another
    network, and the initiator's reply to it, so both sides can say which two networks met."""
    return encode_frame(pack([NOTICE, network]))


def _notice_name(payload: bytes) -> str | None:
    """The network name of a network notice payload, or None if the payload is not one."""
    value = unpack_canonical(payload, max_len=MAX_HANDSHAKE_FRAME)
    if not (isinstance(value, tuple) and len(value) == 2 and type(value[0]) is int and value[0] == NOTICE):
        return None
    name = value[1]
    if (
        not isinstance(name, str)
        or not 0 < len(name) <= NETWORK_NAME_MAX
        or name.strip("abcdefghijklmnopqrstuvwxyz0123456789-._")
    ):
        raise HandshakeFailed("a network notice must name a network (1..32 of a-z 0-9 - . _)")
    return name


def read_network_notice(data: bytes) -> str | None:
    """The network name in the network notice `data` begins with, None while the frame is incomplete;
    HandshakeFailed (or another ProtocolError) for anything else. For the responder after it sent its
    own notice: the initiator answers with one (docs/protocol.md §11.6)."""
    if len(data) < 4:
        return None
    n = int.from_bytes(data[:4], "big")
    if n > MAX_HANDSHAKE_FRAME:
        raise FrameTooLarge(f"handshake frame of {n} bytes announced; the limit is {MAX_HANDSHAKE_FRAME}")
    if len(data) < 4 + n:
        return None
    name = _notice_name(bytes(data[4 : 4 + n]))
    if name is None:
        raise HandshakeFailed("expected a network notice")
    return name


def _initial_hash(network: str) -> bytes:
    return _h(_PROTOCOL_NAME, b"\x00", network.encode())


@dataclass(frozen=True, slots=True)
class HandshakeResult:
    """What a completed handshake establishes.

    `peer_key` is the peer's authenticated Ed25519 node key. `send_key` and `recv_key` are this side's
    ChaCha20-Poly1305 session keys (the initiator's send key is the responder's receive key).
    `transcript_hash` names this one connection: both sides compute the same 32 bytes.
    """

    peer_key: bytes
    send_key: bytes
    recv_key: bytes
    transcript_hash: bytes
    initiator: bool

    def __repr__(self) -> str:
        return (
            f"HandshakeResult(peer_key={self.peer_key.hex()}, initiator={self.initiator}, "
            f"transcript_hash={self.transcript_hash.hex()})"
        )


class State(enum.Enum):
    START = "start"  # initiator: initiate() not called yet
    AWAIT_HELLO = "await_hello"  # responder: waiting for message 1
    AWAIT_REPLY = "await_reply"  # initiator: waiting for message 2
    AWAIT_FINISH = "await_finish"  # responder: waiting for message 3
    DONE = "done"
    FAILED = "failed"


def _check_init(identity: object, network: object, ephemeral_secret: object) -> None:
    if not isinstance(identity, nacl.signing.SigningKey):
        raise LocalProtocolError("identity must be a nacl.signing.SigningKey")
    if not isinstance(network, str) or not network:
        raise LocalProtocolError("network must be a non-empty string")
    if not isinstance(ephemeral_secret, bytes) or len(ephemeral_secret) != KEY_SIZE:
        raise LocalProtocolError("ephemeral_secret must be 32 bytes (fresh randomness per handshake)")


def _seal(key: bytes, ad: bytes, plaintext: bytes) -> bytes:
    out: bytes = sodium.crypto_aead_chacha20poly1305_ietf_encrypt(plaintext, ad, _ZERO_NONCE, key)
    return out


def _open(key: bytes, ad: bytes, ciphertext: bytes, what: str) -> bytes:
    try:
        if len(ciphertext) < 16:
            raise ValueError("shorter than the tag")
        out: bytes = sodium.crypto_aead_chacha20poly1305_ietf_decrypt(ciphertext, ad, _ZERO_NONCE, key)
    except (nacl.exceptions.CryptoError, ValueError) as e:
        raise HandshakeFailed(f"{what} does not decrypt: wrong network, replayed or tampered") from e
    return out


def _dh(secret: bytes, public: bytes) -> bytes:
    try:
        out: bytes = sodium.crypto_scalarmult(secret, public)
    except nacl.exceptions.CryptoError as e:
        raise HandshakeFailed("the peer's ephemeral key is a low-order point") from e
    return out


def _fields(payload: bytes, shape: tuple[type, ...], what: str) -> tuple[Any, ...]:
    value = unpack_canonical(payload, max_len=MAX_HANDSHAKE_FRAME)
    if not isinstance(value, tuple) or len(value) != len(shape):
        raise HandshakeFailed(f"{what} must be an array of {len(shape)} fields")
    for i, (field, kind) in enumerate(zip(value, shape, strict=True)):
        if type(field) is not kind:
            raise HandshakeFailed(f"{what} field {i} must be {kind.__name__}, not {type(field).__name__}")
    return value


def _bytes_len(value: bytes, size: int, what: str) -> bytes:
    if len(value) != size:
        raise HandshakeFailed(f"{what} must be {size} bytes, not {len(value)}")
    return value


def _identity_proof(identity: nacl.signing.SigningKey, label: bytes, transcript: bytes) -> bytes:
    signature: bytes = identity.sign(label + transcript).signature
    return pack([bytes(identity.verify_key), signature])


def _check_identity_proof(plaintext: bytes, label: bytes, transcript: bytes, who: str) -> bytes:
    fields = _fields(plaintext, (bytes, bytes), f"the {who}'s identity proof")
    key: bytes = fields[0]
    signature: bytes = fields[1]
    _bytes_len(key, 32, f"the {who}'s node key")
    _bytes_len(signature, 64, f"the {who}'s signature")
    try:
        nacl.signing.VerifyKey(key).verify(label + transcript, signature)
    except (nacl.exceptions.CryptoError, ValueError, TypeError) as e:
        raise HandshakeFailed(f"the {who}'s identity signature does not verify") from e
    return key


class _Machine(abc.ABC):
    """The parts both roles share: framing, state, the transcript and failure handling."""

    _is_initiator: bool

    def __init__(
        self, identity: nacl.signing.SigningKey, network: str, ephemeral_secret: bytes, state: State
    ) -> None:
        _check_init(identity, network, ephemeral_secret)
        self._identity = identity
        self._network = network
        self._secret = ephemeral_secret
        self._public: bytes = sodium.crypto_scalarmult_base(ephemeral_secret)
        self._hash = _initial_hash(network)
        self._buf = bytearray()
        self._state = state
        self._result: HandshakeResult | None = None
        self._unused = b""
        self._chain = b""

    @property
    def state(self) -> State:
        return self._state

    @property
    def done(self) -> bool:
        return self._state is State.DONE

    @property
    def result(self) -> HandshakeResult:
        if self._result is None:
            raise LocalProtocolError(f"the handshake is not complete (state {self._state.value})")
        return self._result

    @property
    def unused_data(self) -> bytes:
        """Bytes received after the last handshake frame: the first bytes of the session."""
        return self._unused

    def receive_data(self, data: bytes) -> bytes:
        """Feed received bytes; return the bytes to send now (b"" when there are none)."""
        if self._state is State.FAILED:
            raise HandshakeFailed("the handshake already failed")
        if self._state is State.DONE:
            raise LocalProtocolError("the handshake is complete: feed further bytes to the Session")
        if self._state is State.START:
            raise LocalProtocolError("call initiate() before feeding bytes to an Initiator")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise LocalProtocolError(f"receive_data takes bytes, not {type(data).__name__}")
        self._buf += data
        try:
            out = b""
            while not self.done:
                frame = self._next_frame()
                if frame is None:
                    break
                out += self._on_frame(frame)
        except ProtocolError:
            self._fail()
            raise
        except Exception as e:  # a bug or a library surprise must still look like a failed handshake
            self._fail()
            raise HandshakeFailed(f"internal error in the handshake: {type(e).__name__}: {e}") from e
        if self.done:
            self._unused, self._buf = bytes(self._buf), bytearray()
        return out

    def _next_frame(self) -> bytes | None:
        # Frames are parsed here rather than by a FrameDecoder: the bytes after the last handshake
        # frame belong to the session (whose frames may be far larger) and must be handed over raw.
        if len(self._buf) < 4:
            return None
        n = int.from_bytes(self._buf[:4], "big")
        if n > MAX_HANDSHAKE_FRAME:
            raise FrameTooLarge(f"handshake frame of {n} bytes announced; the limit is {MAX_HANDSHAKE_FRAME}")
        if len(self._buf) < 4 + n:
            return None
        frame = bytes(self._buf[4 : 4 + n])
        del self._buf[: 4 + n]
        return frame

    def _fail(self) -> None:
        self._state = State.FAILED
        self._secret = b""
        self._chain = b""
        self._buf = bytearray()

    def _mix(self, data: bytes) -> None:
        self._hash = _h(self._hash, data)

    @abc.abstractmethod
    def _on_frame(self, frame: bytes) -> bytes:
        """Handle one handshake frame in the current state; return the framed reply, if any."""

    def _keys(self, peer_key: bytes) -> HandshakeResult:
        prk = hkdf_extract(self._hash, self._chain)
        i2r = hkdf_expand(prk, b"e31/1 session initiator->responder")
        r2i = hkdf_expand(prk, b"e31/1 session responder->initiator")
        send, recv = (i2r, r2i) if self._is_initiator else (r2i, i2r)
        self._secret = b""
        self._chain = b""
        return HandshakeResult(peer_key, send, recv, self._hash, self._is_initiator)


class Initiator(_Machine):
    """The dialing side. `expect`, if given, pins the responder's 32-byte node key."""

    _is_initiator = True

    def __init__(
        self,
        identity: nacl.signing.SigningKey,
        network: str,
        ephemeral_secret: bytes,
        expect: bytes | None = None,
    ) -> None:
        if expect is not None and (not isinstance(expect, bytes) or len(expect) != 32):
            raise LocalProtocolError("expect must be a 32-byte node key or None")
        super().__init__(identity, network, ephemeral_secret, State.START)
        self._expect = expect

    def initiate(self) -> bytes:
        """Message 1, framed: the bytes to send first."""
        if self._state is not State.START:
            raise LocalProtocolError("initiate() may be called once, before anything else")
        payload = pack([VERSION, network_tag(self._network), self._public])
        self._mix(payload)
        self._state = State.AWAIT_REPLY
        return encode_frame(payload)

    def _on_frame(self, frame: bytes) -> bytes:
        theirs = _notice_name(frame)
        if theirs is not None:
            if theirs == self._network:
                raise HandshakeFailed(f"the responder claims network {theirs!r}, ours, in a network notice")
            raise NetworkMismatch(
                f"the responder is on network {theirs!r}, this node on {self._network!r}",
                self._network,
                theirs,
                network_notice(self._network),
            )
        peer_ephemeral, sealed = _fields(frame, (bytes, bytes), "handshake message 2")
        _bytes_len(peer_ephemeral, 32, "the responder's ephemeral key")
        self._mix(peer_ephemeral)
        self._chain = hkdf_extract(self._hash, _dh(self._secret, peer_ephemeral))
        h2 = self._hash
        plaintext = _open(
            hkdf_expand(self._chain, b"e31/1 handshake responder"), h2, sealed, "handshake message 2"
        )
        peer_key = _check_identity_proof(plaintext, _SIG_RESPONDER, h2, "responder")
        if self._expect is not None and peer_key != self._expect:
            raise HandshakeFailed(f"the responder is {peer_key.hex()}, not the pinned {self._expect.hex()}")
        self._mix(sealed)
        h3 = self._hash
        proof = _identity_proof(self._identity, _SIG_INITIATOR, h3)
        sealed3 = _seal(hkdf_expand(self._chain, b"e31/1 handshake initiator"), h3, proof)
        payload = pack([sealed3])
        self._mix(sealed3)
        self._result = self._keys(peer_key)
        self._state = State.DONE
        return encode_frame(payload)


class Responder(_Machine):
    """The accepting side: learns and authenticates the initiator's node key from message 3."""

    _is_initiator = False

    def __init__(self, identity: nacl.signing.SigningKey, network: str, ephemeral_secret: bytes) -> None:
        super().__init__(identity, network, ephemeral_secret, State.AWAIT_HELLO)

    def _on_frame(self, frame: bytes) -> bytes:
        if self._state is State.AWAIT_HELLO:
            return self._on_hello(frame)
        return self._on_finish(frame)

    def _on_hello(self, frame: bytes) -> bytes:
        version, tag, peer_ephemeral = _fields(frame, (int, bytes, bytes), "handshake message 1")
        if version != VERSION:
            raise HandshakeFailed(f"the initiator speaks handshake version {version}; we speak {VERSION}")
        if tag != network_tag(self._network):
            raise NetworkMismatch(
                f"the initiator is not on network {self._network!r} (its network tag {tag.hex()[:32]})",
                self._network,
                None,
                network_notice(self._network),
            )
        _bytes_len(peer_ephemeral, 32, "the initiator's ephemeral key")
        self._mix(frame)
        self._mix(self._public)
        self._chain = hkdf_extract(self._hash, _dh(self._secret, peer_ephemeral))
        h2 = self._hash
        proof = _identity_proof(self._identity, _SIG_RESPONDER, h2)
        sealed = _seal(hkdf_expand(self._chain, b"e31/1 handshake responder"), h2, proof)
        self._mix(sealed)
        self._state = State.AWAIT_FINISH
        return encode_frame(pack([self._public, sealed]))

    def _on_finish(self, frame: bytes) -> bytes:
        (sealed,) = _fields(frame, (bytes,), "handshake message 3")
        h3 = self._hash
        plaintext = _open(
            hkdf_expand(self._chain, b"e31/1 handshake initiator"), h3, sealed, "handshake message 3"
        )
        peer_key = _check_identity_proof(plaintext, _SIG_INITIATOR, h3, "initiator")
        self._mix(sealed)
        self._result = self._keys(peer_key)
        self._state = State.DONE
        return b""
