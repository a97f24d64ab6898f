"""Ed25519 verification that returns only the verdict.

PyNaCl's `crypto_sign_open` allocates a buffer, has libsodium copy the verified message into it and
copies it out again; a verifier that already holds the message needs only the verdict. libsodium's
crypto_sign_open accepts NULL for both of its outputs, so `signature_ok` calls it through PyNaCl's
own cffi binding (`nacl._sodium`, the module nacl.bindings wraps) with no buffer at all. Should a
PyNaCl release move that private module, the public wrapper is used instead, with the same verdicts.
"""

from __future__ import annotations

from collections.abc import Callable

import nacl.exceptions
from nacl.bindings import crypto_sign_BYTES, crypto_sign_open, crypto_sign_PUBLICKEYBYTES


def _public(sealed: bytes, length: int, key: bytes) -> bool:
    try:
        crypto_sign_open(sealed[:length], key)
    except nacl.exceptions.CryptoError:
        return False
    return True


def _direct() -> Callable[[bytes, int, bytes], bool] | None:
    try:
        from nacl._sodium import ffi, lib
        sign_open = lib.crypto_sign_open
        null = ffi.NULL
    except (ImportError, AttributeError):
        return None

    def direct(sealed: bytes, length: int, key: bytes) -> bool:
        ok: bool = sign_open(null, null, sealed, length, key) == 0
        return ok

    return direct


signature_ok_trusted: Callable[[bytes, int, bytes], bool] = _direct() or _public
"""`signature_ok` for callers that have established its argument checks themselves (libsodium reads
`length` bytes of `sealed` and 32 of `key` whatever their true lengths)."""


def signature_ok(sealed: bytes, length: int, key: bytes) -> bool:
    """Whether the first `length` bytes of `sealed` are a 64-byte Ed25519 signature by `key` (32 bytes)
    followed by the message it signs. Bytes after `length` are ignored."""
    if (type(sealed) is not bytes or type(key) is not bytes or len(key) != crypto_sign_PUBLICKEYBYTES
            or not crypto_sign_BYTES <= length <= len(sealed)):
        raise TypeError("signature_ok takes bytes, a length within them and a 32-byte key")
    return signature_ok_trusted(sealed, length, key)
