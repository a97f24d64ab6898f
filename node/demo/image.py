"""The demo's picture: how the Mandelbrot image splits into tile jobs, and how the tiles come back together.

The guest (sandbox/workloads/mandelbrot.c) renders one tile of a WIDTH x HEIGHT view of the whole set as a
binary PGM whose pixel is 0 inside the set and 1 + 254 * n / MAX_ITER for a point that escapes after n
iterations. With MAX_ITER = 254 that is exactly 1 + n, so the grey level carries the full iteration count
and a 256-entry palette can colour every band. Everything here is pure: bytes in, bytes out.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from ..errors import UsageError

# The guest's view is re in [-2.5, 1.0] x im in [-1.25, 1.25]: aspect 1.4, kept so pixels stay square.
WIDTH = 1120
HEIGHT = 800
MAX_ITER = 254
MAX_TILES = 256


class ImageError(UsageError, ValueError):
    """A tile that does not fit the plan (bad PGM, wrong size, unknown or repeated tile)."""


@dataclass(frozen=True, slots=True)
class Tile:
    index: int
    x: int
    y: int
    width: int
    height: int

    def guest_args(
        self, image_width: int = WIDTH, image_height: int = HEIGHT, max_iter: int = MAX_ITER
    ) -> list[str]:
        """The mandelbrot guest's arguments; it writes the tile to stdout."""
        values = (image_width, image_height, self.x, self.y, self.width, self.height, max_iter)
        return [str(v) for v in values]

    @property
    def name(self) -> str:
        return f"tile {self.index} at ({self.x},{self.y}) {self.width}x{self.height}"


def grid(count: int, width: int = WIDTH, height: int = HEIGHT) -> tuple[int, int]:
    """(columns, rows) with columns * rows == count whose tiles are closest to square."""
    if not 1 <= count <= min(MAX_TILES, width * height):
        raise ImageError(f"the tile count must be from 1 to {min(MAX_TILES, width * height)}, got {count}")
    best: tuple[float, int, int] | None = None
    for cols in range(1, count + 1):
        if count % cols:
            continue
        rows = count // cols
        if cols > width or rows > height:
            continue
        skew = abs(math.log((width / cols) / (height / rows)))
        if best is None or skew < best[0]:
            best = (skew, cols, rows)
    assert best is not None  # 1 x count or count x 1 always fits within the bound above
    return best[1], best[2]


def _cuts(total: int, parts: int) -> list[int]:
    return [total * i // parts for i in range(parts + 1)]


def plan_tiles(count: int, width: int = WIDTH, height: int = HEIGHT) -> list[Tile]:
    """`count` tiles covering the image exactly, row by row; sizes differ by at most one pixel."""
    cols, rows = grid(count, width, height)
    xs, ys = _cuts(width, cols), _cuts(height, rows)
    return [
        Tile(r * cols + c, xs[c], ys[r], xs[c + 1] - xs[c], ys[r + 1] - ys[r])
        for r in range(rows)
        for c in range(cols)
    ]


def parse_pgm(data: bytes) -> tuple[int, int, bytes]:
    """(width, height, pixels) of a binary 8-bit PGM (P5, maxval 255, comments allowed in the header)."""
    fields: list[bytes] = []
    pos = 0
    while len(fields) < 4:
        while pos < len(data) and data[pos : pos + 1].isspace():
            pos += 1
        if data[pos : pos + 1] == b"#":
            end = data.find(b"\n", pos)
            pos = len(data) if end < 0 else end + 1
            continue
        start = pos
        while pos < len(data) and not data[pos : pos + 1].isspace() and data[pos : pos + 1] != b"#":
            pos += 1
        if start == pos:
            raise ImageError("not a PGM file: the header ends early")
        fields.append(data[start:pos])
    if fields[0] != b"P5":
        raise ImageError(f"not a binary PGM file (magic {fields[0][:8]!r}, expected b'P5')")
    if not all(f.isdigit() for f in fields[1:]):
        raise ImageError("not a PGM file: the width, height and maxval must be decimal numbers")
    width, height, maxval = (int(f) for f in fields[1:])
    if maxval != 255:
        raise ImageError(f"only 8-bit PGM files are supported (maxval {maxval})")
    if width < 1 or height < 1:
        raise ImageError(f"the PGM's size must be positive, got {width}x{height}")
    if pos >= len(data) or not data[pos : pos + 1].isspace():
        raise ImageError("not a PGM file: no whitespace after the header")
    pixels = data[pos + 1 :]
    if len(pixels) != width * height:
        raise ImageError(
            f"the PGM holds {len(pixels)} pixel bytes, expected {width}x{height} = {width * height}"
        )
    return width, height, pixels


class Mosaic:
    """The image being assembled from tiles, each pasted once, checked against the plan."""

    def __init__(self, tiles: list[Tile], width: int = WIDTH, height: int = HEIGHT) -> None:
        self.width = width
        self.height = height
        self.tiles = {t.index: t for t in tiles}
        self.pixels = bytearray(width * height)
        self.pasted: set[int] = set()

    def paste(self, index: int, pgm: bytes) -> None:
        tile = self.tiles.get(index)
        if tile is None:
            raise ImageError(f"no tile {index} in this image")
        if index in self.pasted:
            raise ImageError(f"{tile.name} was already pasted")
        try:
            width, height, pixels = parse_pgm(pgm)
        except ImageError as e:
            raise ImageError(f"{tile.name}: {e}") from None
        if (width, height) != (tile.width, tile.height):
            raise ImageError(f"{tile.name}: the job's output is {width}x{height}")
        for row in range(height):
            at = (tile.y + row) * self.width + tile.x
            self.pixels[at : at + width] = pixels[row * width : (row + 1) * width]
        self.pasted.add(index)

    @property
    def complete(self) -> bool:
        return len(self.pasted) == len(self.tiles)

    def missing(self) -> list[Tile]:
        return [t for i, t in sorted(self.tiles.items()) if i not in self.pasted]


# A classic fractal gradient (deep blue, light blue, white, orange, black), cycled along the iteration
# count on a square-root scale so the thin bands near the set stay apart.
_STOPS = (
    (0.0, (0, 7, 100)),
    (0.16, (32, 107, 203)),
    (0.42, (237, 255, 255)),
    (0.6425, (255, 170, 0)),
    (0.8575, (0, 2, 0)),
    (1.0, (0, 7, 100)),
)
_CYCLE = 6.0


def _gradient(t: float) -> tuple[int, int, int]:
    for (t0, c0), (t1, c1) in itertools.pairwise(_STOPS):
        if t <= t1:
            f = (t - t0) / (t1 - t0)
            return (
                round(c0[0] + (c1[0] - c0[0]) * f),
                round(c0[1] + (c1[1] - c0[1]) * f),
                round(c0[2] + (c1[2] - c0[2]) * f),
            )
    return _STOPS[-1][1]


def palette() -> list[tuple[int, int, int]]:
    """RGB for each grey level: 0 (inside the set) is black, level 1 + n is coloured by n."""
    colours = [(0, 0, 0)]
    for n in range(255):
        colours.append(_gradient((math.sqrt(max(n, 1)) - 1.0) / _CYCLE % 1.0))
    return colours


def colourise(grey: bytes | bytearray) -> bytes:
    """The RGB pixels (3 bytes each) for grey pixels, through `palette()`."""
    colours = palette()
    out = bytearray(len(grey) * 3)
    for channel in range(3):
        table = bytes(c[channel] for c in colours)
        out[channel::3] = bytes(grey).translate(table)
    return bytes(out)
