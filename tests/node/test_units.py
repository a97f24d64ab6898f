"""Sizes, counts and durations: what each form means, every way to get one wrong, and round trips."""

from __future__ import annotations

import pytest
from e31.node.errors import UsageError
from e31.node.units import (
    COUNT_FORMS,
    DURATION_FORMS,
    MAX_SECONDS,
    MAX_VALUE,
    SIZE_FORMS,
    UnitError,
    format_duration,
    format_size,
    parse_count,
    parse_duration,
    parse_size,
)
from hypothesis import given
from hypothesis import strategies as st

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (0, 0),
        (1234, 1234),
        ("0", 0),
        ("1234", 1234),
        (" 1234 ", 1234),
        ("1_048_576", MiB),
        ("10b", 10),
        ("10B", 10),
        ("1K", KiB),
        ("1k", KiB),
        ("64M", 64 * MiB),
        ("64m", 64 * MiB),
        ("2G", 2 * GiB),
        ("2g", 2 * GiB),
        ("3T", 3 * TiB),
        ("2Ki", 2 * KiB),
        ("64Mi", 64 * MiB),
        ("1KiB", KiB),
        ("64MiB", 64 * MiB),
        ("64mib", 64 * MiB),
        ("4GiB", 4 * GiB),
        ("3TiB", 3 * TiB),
        ("1KB", 1000),
        ("512MB", 512_000_000),
        ("512mb", 512_000_000),
        ("2GB", 2_000_000_000),
        ("3TB", 3 * 10**12),
        ("1.5G", 3 * GiB // 2),
        ("1.5 KiB", 1536),
        ("0.5K", 512),
        ("1.25GB", 1_250_000_000),
        ("1_024 K", MiB),
        (str(MAX_VALUE), MAX_VALUE),
        (MAX_VALUE, MAX_VALUE),
    ],
)
def test_sizes(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("-1", "negative"),
        ("-64M", "negative"),
        (-5, "negative"),
        ("1.5", "not a whole number of bytes"),
        ("0.1K", "not a whole number of bytes"),
        ("1.0000000001GB", "not a whole number of bytes"),
        (str(MAX_VALUE + 1), "more than 9,223,372,036,854,775,807"),
        ("8EiB", ""),
        ("9" * 20 + "T", "more than"),
        (MAX_VALUE + 1, "more than"),
        ("1" * 65, "too long"),
        ("GiB", ""),
        ("K", ""),
        ("4 parsecs", ""),
        ("4GiB extra", ""),
        ("4 GiB B", ""),
        ("1e9", ""),
        ("1KBB", ""),
        ("1Mib2", ""),
        ("0x10", ""),
        ("_1", ""),
        ("1_", ""),
        ("1__0", ""),
        ("1.", ""),
        (".5G", ""),
        ("+1", ""),
        ("1,024", ""),
        ("١٢", ""),
        ("nan", ""),
        ("inf", ""),
        (True, "a bool"),
        (1.5, "a float"),
        (None, "a NoneType"),
    ],
)
def test_bad_sizes_say_what_was_given_and_what_works(bad: object, why: str) -> None:
    with pytest.raises(UnitError) as err:
        parse_size(bad)  # type: ignore[arg-type]  # the wrong types are the point
    message = str(err.value)
    assert message.startswith(f"expected a size, got {bad!r}"[:40])
    assert why in message and message.endswith(SIZE_FORMS)
    assert isinstance(err.value, UsageError) and isinstance(err.value, ValueError)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (0, 0),
        (12345, 12345),
        ("0", 0),
        ("12345", 12345),
        ("10_000_000_000", 10**10),
        ("1k", 1000),
        ("1K", 1000),
        ("5M", 5_000_000),
        ("5m", 5_000_000),
        ("2G", 2 * 10**9),
        ("10g", 10**10),
        ("3T", 3 * 10**12),
        ("1.5k", 1500),
        ("2.5G", 2_500_000_000),
        ("2e9", 2 * 10**9),
        ("2E9", 2 * 10**9),
        ("1.5e3", 1500),
        ("2e+3", 2000),
        ("20e-1", 2),
        ("0e-5", 0),
        ("5 M", 5_000_000),
        (str(MAX_VALUE), MAX_VALUE),
    ],
)
def test_counts(text: str | int, expected: int) -> None:
    assert parse_count(text) == expected


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ("", "empty"),
        ("-1", "negative"),
        ("-2G", "negative"),
        (-1, "negative"),
        ("1.5", "not a whole number"),
        ("1.0001k", "not a whole number"),
        ("2.5e-1", "not a whole number"),
        ("1e-50", "exponent out of range"),
        ("1e99", "exponent out of range"),
        ("1e19", "more than"),
        ("9.3e18", "more than"),
        ("9223372036854775808", "more than"),
        ("10000000T", "more than"),
        ("lots", ""),
        ("G", ""),
        ("2Gi", ""),
        ("2GiB", ""),
        ("2KB", ""),
        ("2e9k", ""),
        ("2e", ""),
        ("e9", ""),
        ("2x", ""),
        ("1__000", ""),
        ("0x10", ""),
        (True, "a bool"),
        (2.0, "a float"),
    ],
)
def test_bad_counts(bad: object, why: str) -> None:
    with pytest.raises(UnitError) as err:
        parse_count(bad)  # type: ignore[arg-type]  # the wrong types are the point
    assert str(err.value).startswith(f"expected a count, got {bad!r}")
    assert why in str(err.value) and str(err.value).endswith(COUNT_FORMS)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (0, 0.0),
        (2.5, 2.5),
        ("0", 0.0),
        ("90", 90.0),
        ("2.5", 2.5),
        ("1_000", 1000.0),
        ("500ms", 0.5),
        ("1.5s", 1.5),
        ("10m", 600.0),
        ("2h", 7200.0),
        ("1.5d", 129600.0),
        ("1h30m", 5400.0),
        ("1h 30m", 5400.0),
        ("1m 30s", 90.0),
        ("1d2h3m4s5ms", 93784.005),
        ("2H", 7200.0),
        ("10M", 600.0),
        ("5MS", 0.005),
        (" 10 m ", 600.0),
        ("0s", 0.0),
        ("36500d", float(MAX_SECONDS)),
    ],
)
def test_durations(text: str | float, expected: float) -> None:
    assert parse_duration(text) == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ("", "empty"),
        ("-1", "negative"),
        ("-1s", "negative"),
        ("-1h30m", "negative"),
        (-1, "negative"),
        (-0.5, "negative"),
        (float("nan"), "not a number"),
        (float("inf"), "more than 100 years"),
        ("36501d", "more than 100 years"),
        (1e12, "more than 100 years"),
        ("soon", ""),
        ("1e3", ""),
        ("1w", ""),
        ("1 hour", ""),
        ("1min", ""),
        ("30m1h", ""),
        ("1h1h", ""),
        ("1s500ms500ms", ""),
        ("1h30", ""),
        ("h", ""),
        ("1.h", ""),
        ("1:30", ""),
        ("inf", ""),
        ("nan", ""),
        ("P1D", ""),
        (True, "a bool"),
        (None, "a NoneType"),
    ],
)
def test_bad_durations(bad: object, why: str) -> None:
    with pytest.raises(UnitError) as err:
        parse_duration(bad)  # type: ignore[arg-type]  # the wrong types are the point
    assert str(err.value).startswith(f"expected a number of seconds or a duration, got {bad!r}")
    assert why in str(err.value) and str(err.value).endswith(DURATION_FORMS)


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0"),
        (1023, "1023"),
        (1000, "1000"),
        (KiB, "1KiB"),
        (1536, "1.5KiB"),
        (1280, "1.25KiB"),
        (64 * MiB, "64MiB"),
        (256 * MiB, "256MiB"),
        (3 * GiB // 2, "1.5GiB"),
        (1024 * GiB, "1TiB"),
        (MiB + 1, "1048577"),
    ],
)
def test_format_size_is_short_and_exact(n: int, text: str) -> None:
    assert format_size(n) == text


@given(st.integers(0, MAX_VALUE))
def test_sizes_round_trip(n: int) -> None:
    assert parse_size(format_size(n)) == n


@given(st.integers(0, 8 * 1024), st.sampled_from([1, KiB, MiB, GiB, TiB]))
def test_round_sizes_round_trip(k: int, unit: int) -> None:
    assert parse_size(format_size(k * unit)) == k * unit


@given(st.integers(0, MAX_VALUE))
def test_counts_read_back_from_every_spelling(n: int) -> None:
    assert parse_count(str(n)) == n
    assert parse_count(f"{n:_}") == n
    assert parse_count(n) == n


@given(st.integers(0, 86400 - 1))
def test_durations_under_a_day_round_trip(seconds: int) -> None:
    assert parse_duration(format_duration(seconds)) == seconds


@given(st.floats(0, 100 * 86400, allow_nan=False))
def test_formatted_durations_read_back_to_at_most_the_value(seconds: float) -> None:
    """Beyond a day the format stops at minutes, and it never shows fractions: it can only round down."""
    back = parse_duration(format_duration(seconds))
    assert back <= seconds < back + (60 if seconds >= 86400 else 1)
