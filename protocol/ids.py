"""Identifiers and constants of the wire format: node ids, SHA-256 digests.

A node id is a 32-byte Ed25519 public key. Its one text form, used in the CLI, logs, JSON and
discovery records, is "e31n" followed by the RFC 4648 base32 encoding of the key in lower case
without padding: 56 characters in all. Parsing accepts only that exact form (the canonical
encoding, so one key has one text), nothing else.
A digest is a 32-byte SHA-256 value; its text form is 64 lower-case hex digits.
"""

from __future__ import annotations

import base64
import functools
import hashlib
from dataclasses import dataclass

from .errors import DecodeError

ENVELOPE_VERSION = 1
SIGNING_PREFIX = b"e31/1/"
NODE_ID_PREFIX = "e31n"
KEY_SIZE = 32
SIGNATURE_SIZE = 64
DIGEST_SIZE = 32

_NODE_ID_TEXT_LEN = len(NODE_ID_PREFIX) + 52
_B32_ALPHABET = frozenset("abcdefghijklmnopqrstuvwxyz234567")


class InvalidId(DecodeError):
    """A node id or digest in text or binary form that is malformed."""


@dataclass(frozen=True, slots=True)
class NodeId:
    """A node's Ed25519 public key (32 bytes)."""

    raw: bytes

    def __post_init__(self) -> None:
        if type(self.raw) is not bytes or len(self.raw) != KEY_SIZE:
            raise InvalidId(f"a node id is {KEY_SIZE} bytes, got {_describe(self.raw)}")

    @classmethod
    def parse(cls, text: str) -> NodeId:
        """Parse the text form "e31n<52 base32 chars>"; raise InvalidId otherwise."""
        if not isinstance(text, str):
            raise InvalidId(f"a node id is text, got {type(text).__name__}")
        if not text.startswith(NODE_ID_PREFIX):
            raise InvalidId(f"a node id starts with {NODE_ID_PREFIX!r}: {_clip(text)!r}")
        if len(text) != _NODE_ID_TEXT_LEN:
            raise InvalidId(f"a node id is {_NODE_ID_TEXT_LEN} characters, got {len(text)}: {_clip(text)!r}")
        body = text[len(NODE_ID_PREFIX) :]
        if not set(body) <= _B32_ALPHABET:
            raise InvalidId(f"a node id uses lower-case base32 (a-z, 2-7) only: {_clip(text)!r}")
        raw = base64.b32decode(body.upper() + "====")
        node = cls(raw)
        if str(node) != text:
            raise InvalidId(f"not the canonical text of a node id (stray low bits): {_clip(text)!r}")
        return node

    def __str__(self) -> str:
        return _node_id_text(self.raw)

    def __repr__(self) -> str:
        return f"NodeId({str(self)!r})"


@functools.lru_cache(maxsize=4096)
def _node_id_text(raw: bytes) -> str:
    """The text form of a node id (memoized: a node formats the same few peers' ids on every job)."""
    return NODE_ID_PREFIX + base64.b32encode(raw).decode("ascii").rstrip("=").lower()


@dataclass(frozen=True, slots=True)
class Digest:
    """A SHA-256 digest (32 bytes)."""

    raw: bytes

    def __post_init__(self) -> None:
        if type(self.raw) is not bytes or len(self.raw) != DIGEST_SIZE:
            raise InvalidId(f"a digest is {DIGEST_SIZE} bytes, got {_describe(self.raw)}")

    @classmethod
    def parse(cls, text: str) -> Digest:
        """Parse 64 lower-case hex digits; raise InvalidId otherwise."""
        if not isinstance(text, str):
            raise InvalidId(f"a digest is text, got {type(text).__name__}")
        if len(text) != 2 * DIGEST_SIZE or text != text.lower():
            raise InvalidId(f"a digest is {2 * DIGEST_SIZE} lower-case hex digits: {_clip(text)!r}")
        try:
            return cls(bytes.fromhex(text))
        except ValueError as e:
            raise InvalidId(f"a digest is {2 * DIGEST_SIZE} lower-case hex digits: {_clip(text)!r}") from e

    def hex(self) -> str:
        return self.raw.hex()

    def __str__(self) -> str:
        return self.raw.hex()

    def __repr__(self) -> str:
        return f"Digest({self.raw.hex()!r})"


def sha256(data: bytes | bytearray | memoryview) -> Digest:
    return _digest(hashlib.sha256(data).digest())


_new = object.__new__
_set_node_raw = NodeId.__dict__["raw"].__set__
_set_digest_raw = Digest.__dict__["raw"].__set__


def _node_id(raw: bytes) -> NodeId:
    """A NodeId from bytes the caller has checked are exactly 32 (skips __init__ on hot paths)."""
    node: NodeId = _new(NodeId)
    _set_node_raw(node, raw)
    return node


def _digest(raw: bytes) -> Digest:
    """A Digest from bytes the caller has checked are exactly 32."""
    digest: Digest = _new(Digest)
    _set_digest_raw(digest, raw)
    return digest


def _describe(value: object) -> str:
    if isinstance(value, bytes):
        return f"{len(value)} bytes"
    return type(value).__name__


def _clip(text: str, n: int = 80) -> str:
    return text if len(text) <= n else text[:n] + "..."


__all__ = [
    "DIGEST_SIZE",
    "ENVELOPE_VERSION",
    "KEY_SIZE",
    "NODE_ID_PREFIX",
    "SIGNATURE_SIZE",
    "SIGNING_PREFIX",
    "Digest",
    "InvalidId",
    "NodeId",
    "sha256",
]
