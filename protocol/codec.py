"""Framing and strict msgpack.

A frame is a 4-byte big-endian length followed by that many payload bytes. FrameDecoder is a
sans-I/O buffer: feed it bytes in any split, pull complete payloads out. The length is checked
against the decoder's limit as soon as the 4 prefix bytes are there, before any payload is kept.

`unpack` is the only place that calls msgpack.unpackb: it decodes with raw=False,
strict_map_key=True, use_list=False, refuses trailing bytes, and turns every msgpack failure into
DecodeError. `pack` is the one encoder; msgpack's packer always chooses the minimal form, so
`pack(unpack(b)) == b` exactly when b is minimally encoded (see `unpack_canonical`).

`unpack_canonical` re-encodes with one shared Packer instead of a new one per call: what it packs
comes from unpackb, so holds only exact built-in types, for which the packer runs no Python code
and a pack() call completes under the GIL without interleaving.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import msgpack

from .errors import DecodeError, FrameTooLarge, LocalProtocolError, NonCanonical

MAX_FRAME = 1 << 20
"""Largest frame payload in bytes (1 MiB). Larger blobs travel as chunks."""

_LEN = struct.Struct(">I")
_REPACK = msgpack.Packer(use_bin_type=True).pack


def pack(obj: Any) -> bytes:
    """Encode with msgpack's minimal forms (bin for bytes, str for text)."""
    try:
        out: bytes = msgpack.packb(obj, use_bin_type=True, strict_types=False)
    except (TypeError, ValueError, OverflowError) as e:
        raise LocalProtocolError(f"cannot encode {type(obj).__name__}: {e}") from e
    return out


def unpack(data: bytes, *, max_len: int = MAX_FRAME) -> Any:
    """Decode exactly one msgpack value filling all of `data`; raise DecodeError otherwise."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise DecodeError(f"expected bytes, got {type(data).__name__}")
    return _unpack(data, max_len)


def unpack_canonical(data: bytes, *, max_len: int = MAX_FRAME) -> Any:
    """Decode like `unpack`, and also refuse any encoding but the minimal one."""
    if type(data) is not bytes:
        if not isinstance(data, (bytearray, memoryview)):
            raise DecodeError(f"expected bytes, got {type(data).__name__}")
        data = bytes(data)
    value = _unpack(data, max_len)
    try:
        again = _REPACK(value)
    except (TypeError, ValueError, OverflowError) as e:  # cannot happen for decoded values
        raise DecodeError(f"cannot re-encode the decoded value: {e}") from e
    if again != data:
        raise NonCanonical("msgpack value is not minimally encoded")
    return value


def _unpack(data: bytes | bytearray | memoryview, max_len: int) -> Any:
    try:
        return msgpack.unpackb(
            data,
            raw=False,
            strict_map_key=True,
            use_list=False,
            max_bin_len=max_len,
            max_str_len=max_len,
            max_array_len=max_len,
            max_map_len=max_len,
            max_ext_len=0,
        )
    except msgpack.ExtraData as e:
        raise DecodeError("trailing bytes after the msgpack value") from e
    except Exception as e:  # msgpack raises many types (ValueError, UnpackValueError, ...)
        raise DecodeError(f"invalid msgpack: {type(e).__name__}: {e}") from e


def encode_frame(payload: bytes, *, max_frame: int = MAX_FRAME) -> bytes:
    """Prefix a payload with its 4-byte big-endian length."""
    if len(payload) > max_frame:
        raise LocalProtocolError(f"frame of {len(payload)} bytes exceeds the limit of {max_frame}")
    return _LEN.pack(len(payload)) + payload


class FrameDecoder:
    """Collects bytes in any split and yields complete frame payloads."""

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self._max = max_frame
        self._buf = bytearray()
        self._need: int | None = None

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> None:
        self._buf += data
        self._check_prefix()

    def _check_prefix(self) -> None:
        if self._need is None and len(self._buf) >= 4:
            (n,) = _LEN.unpack_from(self._buf)
            if n > self._max:
                self._buf.clear()
                raise FrameTooLarge(f"frame of {n} bytes announced; the limit is {self._max}")
            self._need = n

    def next_frame(self) -> bytes | None:
        """Return the next complete payload, or None if more bytes are needed."""
        if self._need is None or len(self._buf) < 4 + self._need:
            return None
        end = 4 + self._need
        payload = bytes(self._buf[4:end])
        del self._buf[:end]
        self._need = None
        self._check_prefix()
        return payload

    def frames(self) -> Iterator[bytes]:
        while (f := self.next_frame()) is not None:
            yield f
