"""Signed envelopes: the one way any e31 message travels or is stored.

Wire form: the msgpack array [1, kind, body, signer, signature], minimally encoded, where body
is the msgpack array of the message's fields and signature is Ed25519 by `signer` over
SIGNING_PREFIX + kind + b"\\x00" + body. `verify` checks, in this order and before any body byte
is interpreted: canonical encoding, shape and types, version, known kind, the signature; then it
decodes the body (also canonical), validates the message and checks that the signer is the
message's issuer. Only `verify` builds a VerifiedEnvelope.

The message id is SHA-256(signed bytes || signer key): it covers exactly what was signed, so
nobody can mint a second id for one message by re-encoding it.

`verify` is the hot path of every node, so it reads a canonical envelope straight from its bytes,
assembles signature || signed bytes || signer once (libsodium checks the first two, the id hashes
the last two), calls libsodium's crypto_sign_open itself with no output buffer (PyNaCl's wrapper
allocates and copies the message out), and builds the result without its checking __init__.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, overload

import nacl.signing

from .codec import MAX_FRAME, pack, unpack, unpack_canonical
from .errors import (
    BadSignature,
    DecodeError,
    Expired,
    InvalidMessage,
    LocalProtocolError,
    ProtocolError,
    UnknownKind,
    WrongNetwork,
)
from .ids import ENVELOPE_VERSION, KEY_SIZE, SIGNATURE_SIZE, SIGNING_PREFIX, Digest, NodeId
from .messages import REGISTRY, AnyMessage
from .schema import Message, _mutable_twin, _slot_setter
from .sodium import signature_ok_trusted

M = TypeVar("M", bound=Message)

_SEAL = object()


def signed_bytes(kind: str, body: bytes) -> bytes:
    """The exact bytes an envelope's signature covers."""
    return SIGNING_PREFIX + kind.encode("ascii") + b"\x00" + body


def message_id(kind: str, body: bytes, signer: NodeId) -> Digest:
    return Digest(hashlib.sha256(signed_bytes(kind, body) + signer.raw).digest())


@dataclass(frozen=True, slots=True)
class VerifiedEnvelope(Generic[M]):
    """An envelope whose signature, encoding and message have all been checked. Built by `verify` only."""

    raw: bytes
    kind: str
    signer: NodeId
    message_id: Digest
    message: M
    _seal: object = field(repr=False, compare=False)

    def __post_init__(self) -> None:
        if self._seal is not _SEAL:
            raise LocalProtocolError("a VerifiedEnvelope comes only from verify()")

    @property
    def body(self) -> bytes:
        body: bytes = unpack_canonical(self.raw)[2]
        return body


_new = object.__new__
_set_digest_raw = _slot_setter(Digest, "raw")
_Builder = _mutable_twin(VerifiedEnvelope)
"""Filled with plain slot stores, then re-labelled a VerifiedEnvelope (see schema._mutable_twin)."""


class _Kind:
    """What verify needs to know about one registered kind, looked up once per envelope."""

    __slots__ = ("cls", "issuer", "name", "signing_prefix")

    def __init__(self, name: str, cls: type[Message]) -> None:
        self.name, self.cls = name, cls
        self.issuer = cls._GET_ISSUER
        self.signing_prefix = SIGNING_PREFIX + name.encode("ascii") + b"\x00"


_KINDS: dict[str, _Kind] = {}
_KINDS_BY_HEAD: dict[bytes, _Kind] = {}
"""Registered kinds by name, and by how a canonical envelope of the kind starts: fixarray(5), the
version and the kind's fixstr."""


def _kind(name: str) -> _Kind | None:
    entry = _KINDS.get(name)
    if entry is None and _refresh_kinds():
        entry = _KINDS.get(name)
    return entry


def _refresh_kinds() -> bool:
    """Take in kinds registered since the last look; False if there were none."""
    if len(_KINDS) == len(REGISTRY):
        return False
    for name, cls in REGISTRY.items():
        if name not in _KINDS:
            head = pack((ENVELOPE_VERSION, name, b"", b"", b""))[:-6]  # less the three empty bins
            _KINDS[name] = _KINDS_BY_HEAD[head] = _Kind(name, cls)
    return True


def node_id_of(signing_key: nacl.signing.SigningKey) -> NodeId:
    return NodeId(bytes(signing_key.verify_key))


def sign(kind: str, message_or_body: Message | bytes, signing_key: nacl.signing.SigningKey) -> bytes:
    """Sign a message (or an already encoded body) as an envelope of `kind`.

    A message must be of that kind and name the signing key as its issuer (LocalProtocolError
    otherwise). A raw body is signed as given: use it only for tests and vectors.
    """
    signer = node_id_of(signing_key)
    if isinstance(message_or_body, Message):
        if kind != message_or_body.KIND:
            raise LocalProtocolError(
                f"a {type(message_or_body).__name__} is of kind {message_or_body.KIND!r}, not {kind!r}"
            )
        if message_or_body.issuer != signer:
            raise LocalProtocolError(
                f"the {kind} names issuer {message_or_body.issuer}, but the signing key is {signer}"
            )
        body = pack(message_or_body.to_wire())
    elif isinstance(message_or_body, bytes):
        body = message_or_body
    else:
        raise LocalProtocolError(f"cannot sign a {type(message_or_body).__name__}")
    return _seal(kind, body, signing_key, signer)


def _seal(kind: str, body: bytes, signing_key: nacl.signing.SigningKey, signer: NodeId) -> bytes:
    if not kind.isascii():
        raise LocalProtocolError(f"kind {kind!r} is not ASCII")
    signature = signing_key.sign(signed_bytes(kind, body)).signature
    envelope = pack((ENVELOPE_VERSION, kind, body, signer.raw, signature))
    if len(envelope) > MAX_FRAME:
        raise LocalProtocolError(
            f"the {kind} envelope is {len(envelope)} bytes, more than a frame holds ({MAX_FRAME})"
        )
    return envelope


def sign_message(message: Message, signing_key: nacl.signing.SigningKey) -> bytes:
    """`sign(message.KIND, message, signing_key)`."""
    return sign(message.KIND, message, signing_key)


def sign_verified(message: M, signing_key: nacl.signing.SigningKey) -> VerifiedEnvelope[M]:
    """Sign a message and return it as the VerifiedEnvelope `verify` would make of the bytes, without
    checking the signature just made: the message was checked when it was built, its issuer is the
    signing key (`sign` refuses anything else), and the body is its own canonical encoding."""
    signer = node_id_of(signing_key)
    if message.issuer != signer:
        raise LocalProtocolError(
            f"the {message.KIND} names issuer {message.issuer}, but the signing key is {signer}"
        )
    body = pack(message.to_wire())
    data = _seal(message.KIND, body, signing_key, signer)
    env = _Builder()
    env.raw = data
    env.kind = message.KIND
    env.signer = signer
    env.message_id = message_id(message.KIND, body, signer)
    env.message = message
    env._seal = _SEAL
    env.__class__ = VerifiedEnvelope
    return env  # type: ignore[no-any-return]


@overload
def verify(data: bytes, expect: None = None, *, max_len: int = MAX_FRAME) -> VerifiedEnvelope[AnyMessage]: ...
@overload
def verify(data: bytes, expect: type[M], *, max_len: int = MAX_FRAME) -> VerifiedEnvelope[M]: ...


def verify(
    data: bytes, expect: type[Any] | None = None, *, max_len: int = MAX_FRAME
) -> VerifiedEnvelope[Any]:
    """Check an envelope completely and return it verified; raise a ProtocolError subclass otherwise.

    With `expect`, the envelope must hold that message class (UnknownKind otherwise).
    Expiry and network are not checked here: see `check_fresh`.
    """
    return _open(data, expect, max_len, check_signature=True)


@overload
def reopen_stored(data: bytes, expect: None = None) -> VerifiedEnvelope[AnyMessage]: ...
@overload
def reopen_stored(data: bytes, expect: type[M]) -> VerifiedEnvelope[M]: ...


def reopen_stored(data: bytes, expect: type[Any] | None = None) -> VerifiedEnvelope[Any]:
    """An envelope this node verified (or signed) before it stored it, read back from its own store:
    every check of `verify` but the signature's, which was made on the way in (a node re-reads its
    receipts and assignments on every job: an Ed25519 check each would be most of the cost).
    Never for bytes from a peer, a bundle or any file an auditor is given: use `verify`."""
    return _open(data, expect, MAX_FRAME, check_signature=False)


def _open(
    data: bytes, expect: type[Any] | None, max_len: int, *, check_signature: bool
) -> VerifiedEnvelope[Any]:
    if type(data) is not bytes:
        if not isinstance(data, (bytearray, memoryview)):
            raise DecodeError(f"an envelope is bytes, got {type(data).__name__}")
        data = bytes(data)
    if len(data) > max_len:
        raise DecodeError(f"envelope of {len(data)} bytes exceeds the limit of {max_len}")
    parts = _read_canonical(data)
    if parts is None:
        name, body, signer, signature = _split_generic(data, max_len)
        entry = _kind(name)
        if entry is None:
            raise UnknownKind(f"unknown message kind {name[:32]!r}")
    else:
        entry, body, signer, signature = parts
    kind, cls = entry.name, entry.cls
    if expect is not None and cls is not expect:
        raise UnknownKind(f"expected a {expect.KIND!r} envelope, got {kind!r}")
    sealed = b"".join((signature, entry.signing_prefix, body, signer))
    # the signer is 32 bytes (checked by the split), so the signed part is all but the last 32
    if check_signature and not signature_ok_trusted(sealed, len(sealed) - KEY_SIZE, signer):
        raise BadSignature(f"bad {kind} signature")
    try:
        message = cls.from_wire(unpack_canonical(body, max_len=max_len))
    except InvalidMessage as e:
        raise InvalidMessage(f"{kind}: {e}") from None
    issuer = entry.issuer(message)
    if issuer.raw != signer:
        raise BadSignature(f"the {kind} was signed by {NodeId(signer)}, not by its issuer {issuer}")
    message_id: Digest = _new(Digest)
    _set_digest_raw(message_id, hashlib.sha256(sealed[SIGNATURE_SIZE:]).digest())
    env = _Builder()
    env.raw = data
    env.kind = kind
    env.signer = issuer
    env.message_id = message_id
    env.message = message
    env._seal = _SEAL
    env.__class__ = VerifiedEnvelope
    return env  # type: ignore[no-any-return]


def _split_generic(data: bytes, max_len: int) -> tuple[str, bytes, bytes, bytes]:
    """Decode an envelope with msgpack and check every part, raising the precise error."""
    env = unpack_canonical(data, max_len=max_len)
    if type(env) is not tuple or len(env) != 5:
        raise DecodeError("an envelope is an array of 5 items")
    version, kind, body, signer, signature = env
    if type(version) is not int or version != ENVELOPE_VERSION:
        raise DecodeError(f"unsupported envelope version {version!r}")
    if type(kind) is not str:
        raise DecodeError("envelope kind is not a string")
    if not kind.isascii() or _kind(kind) is None:
        raise UnknownKind(f"unknown message kind {kind[:32]!r}")
    if type(body) is not bytes:
        raise DecodeError("envelope body is not bin")
    if type(signer) is not bytes or len(signer) != KEY_SIZE:
        raise DecodeError(f"envelope signer is not {KEY_SIZE} bytes of bin")
    if type(signature) is not bytes or len(signature) != SIGNATURE_SIZE:
        raise DecodeError(f"envelope signature is not {SIGNATURE_SIZE} bytes of bin")
    return kind, body, signer, signature


_TAIL = 2 + KEY_SIZE + 2 + SIGNATURE_SIZE


def _read_canonical(data: bytes) -> tuple[_Kind, bytes, bytes, bytes] | None:
    """The parts of an envelope of a registered kind already in its one canonical form, read straight
    from the bytes: fixarray(5), fixint 1, fixstr kind, bin body (minimal header), bin8 signer,
    bin8 signature. Anything else returns None and goes through `_split_generic`, which names the
    error."""
    end = len(data) - _TAIL  # where the body ends, if this is canonical
    if end < 5:
        return None
    pos = data[2] - 0x9D  # past the kind, if data[2] is its fixstr header
    entry = _KINDS_BY_HEAD.get(data[:pos])
    if entry is None:
        if not _refresh_kinds():
            return None
        entry = _KINDS_BY_HEAD.get(data[:pos])
        if entry is None:
            return None
    tag = data[pos]
    if tag == 0xC4:
        start = pos + 2
        size = data[pos + 1]
    elif tag == 0xC5:
        start = pos + 3
        size = data[pos + 1] << 8 | data[pos + 2]
        if size < 0x100:
            return None
    elif tag == 0xC6:
        start = pos + 5
        size = int.from_bytes(data[pos + 1 : start], "big")
        if size < 0x10000:
            return None
    else:
        return None
    if (
        end - start != size
        or data[end : end + 2] != _SIGNER_HEADER
        or data[end + 34 : end + 36] != _SIG_HEADER
    ):
        return None
    return entry, data[start:end], data[end + 2 : end + 34], data[end + 36 :]


_SIGNER_HEADER = bytes((0xC4, KEY_SIZE))
_SIG_HEADER = bytes((0xC4, SIGNATURE_SIZE))


def _split_canonical(data: bytes) -> tuple[str, bytes, bytes, bytes] | None:
    """`_read_canonical` with the kind by name, as `_split_generic` returns it (for tests)."""
    parts = _read_canonical(data)
    if parts is None:
        return None
    entry, body, signer, signature = parts
    return entry.name, body, signer, signature


def check_fresh(
    env: VerifiedEnvelope[Any], now: int, *, network: str | None = None, max_ttl: int | None = None
) -> None:
    """Refuse a message arriving from the network that has expired (`now` in ms since the epoch),
    belongs to another network, or (with max_ttl) claims a life longer than max_ttl ms from now.
    Stored or archived messages are never checked for expiry (inspect, audit)."""
    msg: Message = env.message
    if network is not None and msg.network_name != network:
        raise WrongNetwork(f"{env.kind} is for network {msg.network_name!r}, not {network!r}")
    expires = msg.expires
    if expires is None:
        return
    if expires <= now:
        raise Expired(f"{env.kind} expired {now - expires} ms ago")
    if max_ttl is not None and expires - now > max_ttl:
        raise Expired(f"{env.kind} claims to live {expires - now} ms, more than the allowed {max_ttl} ms")


def is_expired(env: VerifiedEnvelope[Any], now: int) -> bool:
    expires: int | None = env.message.expires
    return expires is not None and expires <= now


def claimed_kind(raw: bytes) -> str | None:
    """The kind an envelope claims, read without checking anything else; None if it is no envelope.
    Reads the canonical layout straight from the bytes and decodes only other layouts."""
    if len(raw) > 3 and raw[0] == 0x95 and raw[1] == ENVELOPE_VERSION and 0xA1 <= raw[2] <= 0xBF:
        kind = raw[3 : 3 + raw[2] - 0xA0]
        return kind.decode("ascii") if kind.isascii() else None
    try:
        outer = unpack(raw)
    except ProtocolError:
        return None
    if type(outer) is not tuple or len(outer) != 5 or type(outer[1]) is not str:
        return None
    kind_text: str = outer[1]
    return kind_text
