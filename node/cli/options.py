"""argparse `type=` functions for sizes, counts and durations, so every command reads them alike.

Each is a node/units.py parser whose UnitError becomes argparse.ArgumentTypeError with the same
message: a bad value gets argparse's usual one-line error and exit status 2. Ranges belong to whoever
owns the limit (the sandbox's Limits, the node's API), so `--fuel 0` is read here and refused there,
with that owner's reason; only options that are meaningless at zero (a poll interval, a hand-off
timeout) refuse it here.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeVar

from ..units import UnitError, parse_count, parse_duration, parse_size

T = TypeVar("T", int, float)

SIZE = "SIZE"
COUNT = "N"
DURATION = "DURATION"


def _argument(parse: Callable[[str], T], name: str, *, positive: bool = False) -> Callable[[str], T]:
    def convert(text: str) -> T:
        try:
            value = parse(text)
        except UnitError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        if positive and not value > 0:
            raise argparse.ArgumentTypeError(f"must be more than 0, got {text!r}")
        return value

    convert.__name__ = name
    return convert


size = _argument(parse_size, "size")
count = _argument(parse_count, "count")
positive_count = _argument(parse_count, "count", positive=True)
duration = _argument(parse_duration, "duration")
positive_duration = _argument(parse_duration, "duration", positive=True)
