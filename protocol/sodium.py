"""libsodium calls on a link's hot path, without PyNaCl's per-call overhead.

- Ed25519 verification that returns only the verdict. PyNaCl's `crypto_sign_open` allocates a buffer,
  has libsodium copy the verified message into it and copies it out again; a verifier that already
  holds the message needs only the verdict. libsodium's crypto_sign_open accepts NULL for both of its
  outputs, so `signature_ok` calls it with no buffer at all.
- ChaCha20-Poly1305 (IETF) sealing and opening of a session frame (`aead_seal`, `aead_open`). PyNaCl's
  wrappers check every argument and format their error texts eagerly, on every call: about 20 µs a
  frame each way here, against 1-2 µs of cipher. The session (protocol/session.py) owns its keys and
  nonces, so those checks are its own.

Both call libsodium through PyNaCl's own cffi binding (`nacl._sodium`, the module nacl.bindings wraps).
Should a PyNaCl release move that private module, the public wrappers are used instead, with the same
results.
"""

from __future__ import annotations

from collections.abc import Callable

import nacl.exceptions
from nacl.bindings import (
    crypto_aead_chacha20poly1305_ietf_ABYTES,
    crypto_aead_chacha20poly1305_ietf_decrypt,
    crypto_aead_chacha20poly1305_ietf_encrypt,
    crypto_sign_BYTES,
    crypto_sign_open,
    crypto_sign_PUBLICKEYBYTES,
)

TAG = crypto_aead_chacha20poly1305_ietf_ABYTES
"""Bytes a sealed frame has beyond its plaintext (the Poly1305 tag)."""


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
    if (
        type(sealed) is not bytes
        or type(key) is not bytes
        or len(key) != crypto_sign_PUBLICKEYBYTES
        or not crypto_sign_BYTES <= length <= len(sealed)
    ):
        raise TypeError("signature_ok takes bytes, a length within them and a 32-byte key")
    return signature_ok_trusted(sealed, length, key)


def _public_seal(message: bytes, nonce: bytes, key: bytes) -> bytes:
    sealed: bytes = crypto_aead_chacha20poly1305_ietf_encrypt(message, None, nonce, key)
    return sealed


def _public_open(sealed: bytes, nonce: bytes, key: bytes) -> bytes | None:
    if len(sealed) < TAG:
        return None
    try:
        plaintext: bytes = crypto_aead_chacha20poly1305_ietf_decrypt(sealed, None, nonce, key)
    except nacl.exceptions.CryptoError:
        return None
    return plaintext


def _direct_aead() -> (
    tuple[Callable[[bytes, bytes, bytes], bytes], Callable[[bytes, bytes, bytes], bytes | None]] | None
):
    try:
        from nacl._sodium import ffi, lib

        encrypt = lib.crypto_aead_chacha20poly1305_ietf_encrypt
        decrypt = lib.crypto_aead_chacha20poly1305_ietf_decrypt
        null = ffi.NULL
        from_buffer = ffi.from_buffer
    except (ImportError, AttributeError):
        return None

    def seal(message: bytes, nonce: bytes, key: bytes) -> bytes:
        out = bytearray(len(message) + TAG)
        encrypt(from_buffer("unsigned char[]", out), null, message, len(message), null, 0, null, nonce, key)
        return bytes(out)

    def open_(sealed: bytes, nonce: bytes, key: bytes) -> bytes | None:
        size = len(sealed) - TAG
        if size < 0:
            return None
        out = bytearray(size)
        if decrypt(from_buffer("unsigned char[]", out), null, null, sealed, len(sealed), null, 0, nonce, key):
            return None
        return bytes(out)

    return seal, open_


_seal_open = _direct_aead()
aead_seal: Callable[[bytes, bytes, bytes], bytes] = _seal_open[0] if _seal_open else _public_seal
"""ChaCha20-Poly1305 (IETF, no associated data) of `message` under `nonce` (12 bytes) and `key` (32
bytes, both the caller's to check): the ciphertext followed by the tag."""
aead_open: Callable[[bytes, bytes, bytes], bytes | None] = _seal_open[1] if _seal_open else _public_open
"""The plaintext of `sealed` (ciphertext and tag) under `nonce` and `key`; None when it does not
authenticate (tampered, wrong key or nonce, shorter than a tag)."""
