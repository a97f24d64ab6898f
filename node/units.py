"""Sizes, counts and durations as users type them: the one parser every command and config.toml share.

- A size is bytes. A plain number is bytes; K, M, G, T (also Ki, KiB, ...) are powers of 1024, as
  memory is sized in docker, Kubernetes and HTCondor; KB, MB, GB, TB are powers of 1000. Case does not
  matter; `1.5G` is fine because it is a whole number of bytes.
- A count (fuel) is a number of things, so its k, M, G, T are powers of 1000, and `2e9` works too.
- A duration is seconds: a plain number, or parts with ms, s, m, h, d, largest first (`1h30m`, `1m 30s`).

Numbers are read exactly (Decimal, in a context wide enough that nothing rounds), so `0.1K` is refused
as 102.4 bytes rather than quietly truncated. Every refusal is a UnitError naming the text and the
accepted forms; it is a ValueError too, so parsers that collect ValueErrors (config.py) need no glue.
"""

from __future__ import annotations

import decimal
import math
import re
from decimal import Decimal

from .errors import UsageError

MAX_VALUE = 2**63 - 1
"""The largest size or count accepted: what a signed 64-bit field on the wire holds."""
MAX_SECONDS = 100 * 365 * 86400
"""The longest duration accepted (a century): anything longer is a typo, not a plan."""
_MAX_TEXT = 64

SIZE_FORMS = (
    "a number of bytes, or one with a unit: K, M, G, T (or KiB, MiB, GiB, TiB) are powers of 1024, "
    "KB, MB, GB, TB powers of 1000, as in 4096, 64M, 1.5GiB, 500MB"
)
COUNT_FORMS = "a whole number, or one with k, M, G, T (powers of 1000) or an exponent, as in 5000000, 5M, 2e9"
DURATION_FORMS = "seconds, or parts with ms, s, m, h, d, largest first, as in 90, 1.5s, 500ms, 10m, 1h30m, 2d"


class UnitError(UsageError, ValueError):
    """A size, count or duration that cannot be read; the message says what was given and what works."""


_NUMBER = r"[0-9]+(?:_[0-9]+)*(?:\.[0-9]+(?:_[0-9]+)*)?"
_SIZE_RE = re.compile(rf"({_NUMBER})\s*([a-z]*)", re.IGNORECASE | re.ASCII)
_COUNT_RE = re.compile(rf"({_NUMBER})(?:e([+-]?[0-9]+))?\s*([a-z]?)", re.IGNORECASE | re.ASCII)
_PART_RE = re.compile(rf"({_NUMBER})\s*(ms|s|m|h|d)\s*", re.IGNORECASE | re.ASCII)

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    **{letter + tail: 1024**i for i, letter in enumerate("kmgt", 1) for tail in ("", "i", "ib")},
    **{letter + "b": 1000**i for i, letter in enumerate("kmgt", 1)},
}
_COUNT_UNITS = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4}
_SECONDS = {
    "d": Decimal(86400),
    "h": Decimal(3600),
    "m": Decimal(60),
    "s": Decimal(1),
    "ms": Decimal("0.001"),
}
_BINARY = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))

# A text of at most 64 digits times a unit of at most 13 needs 77 digits: with 80, no product rounds.
_EXACT = decimal.Context(prec=80, Emax=10**6, Emin=-(10**6))


def parse_size(text: str | int) -> int:
    """Bytes from `64M`, `1.5GiB`, `500MB`, `4096` or a non-negative int (a TOML value)."""
    if isinstance(text, int) and not isinstance(text, bool):
        return _checked(Decimal(text), text, "a size", SIZE_FORMS)
    m = _SIZE_RE.fullmatch(_clean(text, "a size", SIZE_FORMS))
    if m is None or m.group(2).lower() not in _SIZE_UNITS:
        raise _refuse("a size", text, "", SIZE_FORMS)
    number = _EXACT.multiply(_decimal(m.group(1)), Decimal(_SIZE_UNITS[m.group(2).lower()]))
    return _checked(number, text, "a size", SIZE_FORMS, whole="not a whole number of bytes")


def parse_count(text: str | int) -> int:
    """A count from `5000000`, `5_000_000`, `5M`, `2G`, `2e9` or a non-negative int."""
    if isinstance(text, int) and not isinstance(text, bool):
        return _checked(Decimal(text), text, "a count", COUNT_FORMS)
    m = _COUNT_RE.fullmatch(_clean(text, "a count", COUNT_FORMS))
    if m is None or m.group(3).lower() not in _COUNT_UNITS or (m.group(2) and m.group(3)):
        raise _refuse("a count", text, "", COUNT_FORMS)
    number = _decimal(m.group(1))
    if m.group(2):
        if abs(int(m.group(2))) > 40:
            raise _refuse("a count", text, "exponent out of range", COUNT_FORMS)
        number = _EXACT.scaleb(number, int(m.group(2)))
    number = _EXACT.multiply(number, Decimal(_COUNT_UNITS[m.group(3).lower()]))
    return _checked(number, text, "a count", COUNT_FORMS, whole="not a whole number")


def parse_duration(text: str | float) -> float:
    """Seconds from `90`, `1.5s`, `500ms`, `10m`, `1h30m`, `2d` or a non-negative finite number."""
    what = "a number of seconds or a duration"
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        if not 0 <= text <= MAX_SECONDS:
            reason = "negative" if text < 0 else "not a number" if math.isnan(text) else "more than 100 years"
            raise _refuse(what, text, reason, DURATION_FORMS)
        return float(text)
    cleaned = _clean(text, what, DURATION_FORMS)
    if re.fullmatch(_NUMBER, cleaned):
        total = _decimal(cleaned)
    else:
        total, pos, order = Decimal(0), 0, list(_SECONDS)
        while pos < len(cleaned):
            m = _PART_RE.match(cleaned, pos)
            if m is None or m.group(2).lower() not in order:
                raise _refuse(what, text, "", DURATION_FORMS)
            unit = m.group(2).lower()
            order = order[order.index(unit) + 1 :]
            total = _EXACT.add(total, _EXACT.multiply(_decimal(m.group(1)), _SECONDS[unit]))
            pos = m.end()
    if total > MAX_SECONDS:
        raise _refuse(what, text, "more than 100 years", DURATION_FORMS)
    return float(total)


def format_size(n: int) -> str:
    """The shortest exact text for `n` bytes that parse_size reads back: 64MiB, 1.5GiB, 1000."""
    for suffix, unit in _BINARY:
        for places in range(3):
            scaled = n * 10**places
            if n >= unit and scaled % unit == 0:
                q, r = divmod(scaled // unit, 10**places)
                return f"{q}.{r:0{places}d}{suffix}" if places else f"{q}{suffix}"
    return str(n)


def format_duration(seconds: float) -> str:
    """Whole seconds as people read them (`1m 1s`, `5h 1m 2s`), down to minutes beyond a day."""
    whole = int(max(0.0, seconds))
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h {minutes}m"
    if hours:
        return f"{hours}h {minutes}m {secs}s"
    if minutes:
        return f"{minutes}m {secs}s"
    return f"{secs}s"


def _clean(text: object, what: str, forms: str) -> str:
    if not isinstance(text, str):
        raise _refuse(what, text, f"a {type(text).__name__}", forms)
    cleaned = text.strip()
    if not cleaned or len(cleaned) > _MAX_TEXT:
        raise _refuse(what, text, "empty" if not cleaned else "too long", forms)
    if cleaned.startswith("-"):
        raise _refuse(what, text, "negative", forms)
    return cleaned


def _decimal(digits: str) -> Decimal:
    return Decimal(digits.replace("_", ""))


def _checked(number: Decimal, given: object, what: str, forms: str, whole: str = "") -> int:
    if number < 0:
        raise _refuse(what, given, "negative", forms)
    if number > MAX_VALUE:
        raise _refuse(what, given, f"more than {MAX_VALUE:,}", forms)
    if number != number.to_integral_value():
        raise _refuse(what, given, whole, forms)
    return int(number)


def _refuse(what: str, given: object, reason: str, forms: str) -> UnitError:
    shown = repr(given) if len(repr(given)) <= 40 else repr(given)[:37] + "..."
    why = f" ({reason})" if reason else ""
    return UnitError(f"expected {what}, got {shown}{why}; {forms}")
