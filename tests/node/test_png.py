"""The PNG writer against a strict, independent decoder written here from the PNG specification."""

from __future__ import annotations

import random
import struct
import zlib
from pathlib import Path

import pytest
from e31.node.demo.png import GREY, RGB, SIGNATURE, PngError, encode_png, write_png


class Invalid(Exception):
    pass


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def decode(png: bytes) -> tuple[int, int, int, bytes]:
    """(width, height, colour type, pixels) of an 8-bit, non-interlaced PNG; raises Invalid otherwise."""
    if png[:8] != b"\x89PNG\r\n\x1a\n":
        raise Invalid("bad signature")
    pos, chunks = 8, []
    while pos < len(png):
        if pos + 8 > len(png):
            raise Invalid("truncated chunk header")
        (length,) = struct.unpack(">I", png[pos : pos + 4])
        kind = png[pos + 4 : pos + 8]
        data = png[pos + 8 : pos + 8 + length]
        if len(data) != length or pos + 12 + length > len(png):
            raise Invalid(f"truncated {kind!r} chunk")
        (crc,) = struct.unpack(">I", png[pos + 8 + length : pos + 12 + length])
        if crc != zlib.crc32(kind + data):
            raise Invalid(f"bad CRC in {kind!r}")
        chunks.append((kind, data))
        pos += 12 + length
    kinds = [k for k, _ in chunks]
    if kinds[0] != b"IHDR" or kinds[-1] != b"IEND" or kinds.count(b"IHDR") != 1 or kinds.count(b"IEND") != 1:
        raise Invalid(f"bad chunk order {kinds}")
    if chunks[-1][1]:
        raise Invalid("IEND carries data")
    idat_at = [i for i, k in enumerate(kinds) if k == b"IDAT"]
    if not idat_at or idat_at != list(range(idat_at[0], idat_at[-1] + 1)):
        raise Invalid("IDAT chunks missing or not consecutive")
    ihdr = chunks[0][1]
    if len(ihdr) != 13:
        raise Invalid("IHDR is not 13 bytes")
    width, height, depth, colour, compression, filtering, interlace = struct.unpack(">IIBBBBB", ihdr)
    if not (0 < width < 2**31 and 0 < height < 2**31):
        raise Invalid("bad size")
    if depth != 8 or colour not in (0, 2) or compression or filtering or interlace:
        raise Invalid(f"unsupported header {depth=} {colour=} {compression=} {filtering=} {interlace=}")
    bpp = 1 if colour == 0 else 3
    stride = width * bpp
    inflater = zlib.decompressobj()
    raw = inflater.decompress(b"".join(chunks[i][1] for i in idat_at))
    if not inflater.eof or inflater.unused_data:
        raise Invalid("the zlib stream is incomplete or followed by junk")
    if len(raw) != height * (stride + 1):
        raise Invalid(f"inflated {len(raw)} bytes, expected {height * (stride + 1)}")
    out = bytearray()
    prior = bytearray(stride)
    for y in range(height):
        ftype = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        if ftype > 4:
            raise Invalid(f"row {y}: filter type {ftype}")
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prior[i]
            c = prior[i - bpp] if i >= bpp else 0
            pred = (0, a, b, (a + b) // 2, _paeth(a, b, c))[ftype]
            line[i] = (line[i] + pred) & 0xFF
        out += line
        prior = line
    return width, height, colour, bytes(out)


def test_grey_round_trip() -> None:
    rng = random.Random(7)
    pixels = bytes(rng.randrange(256) for _ in range(13 * 5))
    png = encode_png(13, 5, pixels)
    assert png.startswith(SIGNATURE)
    assert decode(png) == (13, 5, GREY, pixels)


def test_rgb_round_trip() -> None:
    pixels = bytes((x * 40 + c * 90 + y) % 256 for y in range(7) for x in range(3) for c in range(3))
    assert decode(encode_png(3, 7, pixels, colour_type=RGB)) == (3, 7, RGB, pixels)


def test_one_pixel_and_extremes() -> None:
    assert decode(encode_png(1, 1, b"\x00")) == (1, 1, GREY, b"\x00")
    assert decode(encode_png(1, 1, b"\xff\x00\xff", colour_type=RGB)) == (1, 1, RGB, b"\xff\x00\xff")
    flat = bytes(500 * 400)
    png = encode_png(500, 400, flat)
    assert decode(png) == (500, 400, GREY, flat)
    assert len(png) < 2000  # zlib does its job on a flat image


def test_the_decoder_is_strict() -> None:
    png = bytearray(encode_png(4, 4, bytes(range(16))))
    flipped = bytearray(png)
    flipped[len(SIGNATURE) + 8 + 2] ^= 1  # a byte of IHDR's data: its CRC no longer matches
    with pytest.raises(Invalid, match="CRC"):
        decode(bytes(flipped))
    with pytest.raises(Invalid, match="signature"):
        decode(b"\x89PNG\r\n\x1a\x00" + bytes(png[8:]))


@pytest.mark.parametrize(
    ("width", "height", "pixels", "colour", "match"),
    [
        (0, 1, b"", GREY, "width"),
        (1, -1, b"", GREY, "height"),
        (2, 2, b"\x00" * 3, GREY, "expected 4 bytes"),
        (2, 2, b"\x00" * 4, RGB, "expected 12 bytes"),
        (1, 1, b"\x00", 6, "colour type"),
        (True, 1, b"\x00", GREY, "width"),
    ],
)
def test_bad_input_is_a_png_error(width: int, height: int, pixels: bytes, colour: int, match: str) -> None:
    with pytest.raises(PngError, match=match):
        encode_png(width, height, pixels, colour_type=colour)


def test_write_png_is_atomic_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "image.png"
    assert write_png(target, 2, 1, b"\x10\x20") == target
    assert decode(target.read_bytes()) == (2, 1, GREY, b"\x10\x20")
    with pytest.raises(PngError):
        write_png(tmp_path / "bad.png", 2, 1, b"\x10")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["image.png"]
