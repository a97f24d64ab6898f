"""A minimal PNG encoder (stdlib only): 8-bit greyscale or RGB, no interlace, one IDAT.

A PNG is the 8-byte signature and chunks, each `length (4, big-endian) | type (4) | data | CRC-32 of type
and data`: IHDR (size, bit depth, colour type), IDAT (the zlib stream of the scanlines, each preceded by
its filter type byte) and IEND. Scanlines use filter type 0 (None); zlib alone compresses flat images such
as rendered fractals well, and a decoder must accept any of the five filter types anyway.
"""

from __future__ import annotations

import os
import struct
import zlib
from pathlib import Path

from ..errors import UsageError

SIGNATURE = b"\x89PNG\r\n\x1a\n"
GREY = 0
RGB = 2
_CHANNELS = {GREY: 1, RGB: 3}
# The PNG spec limits width and height to 2**31 - 1; far beyond anything this encoder should buffer.
MAX_SIDE = (1 << 31) - 1


class PngError(UsageError, ValueError):
    """The pixels cannot be encoded as asked (sizes or buffer length wrong)."""


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def encode_png(
    width: int,
    height: int,
    pixels: bytes | bytearray | memoryview,
    *,
    colour_type: int = GREY,
    level: int = 9,
) -> bytes:
    """The PNG file for `pixels`: rows top to bottom, one byte per sample (grey, or R G B)."""
    if colour_type not in _CHANNELS:
        raise PngError(f"unsupported colour type {colour_type}; expected {GREY} (grey) or {RGB} (RGB)")
    for name, side in (("width", width), ("height", height)):
        if isinstance(side, bool) or not isinstance(side, int) or not 1 <= side <= MAX_SIDE:
            raise PngError(f"the {name} must be a whole number from 1 to {MAX_SIDE}, got {side!r}")
    stride = width * _CHANNELS[colour_type]
    data = memoryview(pixels).cast("B")
    if len(data) != stride * height:
        raise PngError(
            f"expected {stride * height} bytes for {width}x{height} "
            f"({_CHANNELS[colour_type]} per pixel), got {len(data)}"
        )
    compressor = zlib.compressobj(level)
    parts = []
    row_filter = b"\x00"
    for y in range(height):
        parts.append(compressor.compress(row_filter))
        parts.append(compressor.compress(data[y * stride : (y + 1) * stride]))
    parts.append(compressor.flush())
    header = struct.pack(">IIBBBBB", width, height, 8, colour_type, 0, 0, 0)
    return b"".join(
        (SIGNATURE, _chunk(b"IHDR", header), _chunk(b"IDAT", b"".join(parts)), _chunk(b"IEND", b""))
    )


def write_png(
    path: str | os.PathLike[str],
    width: int,
    height: int,
    pixels: bytes | bytearray | memoryview,
    *,
    colour_type: int = GREY,
) -> Path:
    """Encode and write atomically (a temporary file in the same directory, then a rename)."""
    encoded = encode_png(width, height, pixels, colour_type=colour_type)
    target = Path(path)
    temp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with open(temp, "wb") as f:
            f.write(encoded)
        os.replace(temp, target)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return target
