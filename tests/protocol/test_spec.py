"""docs/protocol.md lists every message kind and record with its fields in wire order; hold it to the code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from e31.protocol import blobs, gossip, jobs, messages, receipts
from e31.protocol.messages import REGISTRY
from e31.protocol.schema import Record

SPEC = (Path(__file__).resolve().parent.parent.parent / "docs" / "protocol.md").read_text()
RECORDS = [
    blobs.BlobRef,
    jobs.FileRef,
    jobs.EnvVar,
    jobs.Limits,
    jobs.JobManifest,
    messages.BidItem,
    receipts.Outcome,
    receipts.Meter,
]


def field_table(cls: type[Record]) -> str:
    """The table docs/protocol.md gives for a record (also how the spec's tables were written)."""
    rows = ["| # | field | type |", "|---|---|---|"]
    rows += [f"| {i} | `{name}` | {codec.describe()} |" for i, (name, codec) in enumerate(cls._FIELDS)]
    return "\n".join(rows)


def section(title: str) -> str:
    match = re.search(rf"^#+ {re.escape(title)}\n(.*?)(?=^#)", SPEC, re.S | re.M)
    assert match is not None, f"docs/protocol.md has no section {title!r}"
    return match.group(1)


@pytest.mark.parametrize("kind", sorted(REGISTRY))
def test_every_kind_is_specified_with_its_fields(kind: str) -> None:
    cls = REGISTRY[kind]
    text = section(f"`{kind}`")
    assert field_table(cls) in text
    assert f"Issuer: `{cls.ISSUER}`" in text


@pytest.mark.parametrize("cls", RECORDS, ids=[c.__name__ for c in RECORDS])
def test_every_record_is_specified_with_its_fields(cls: type[Record]) -> None:
    assert field_table(cls) in section(f"`{cls.__name__}`")


def test_constants_in_the_spec() -> None:
    assert f"`CHUNK_SIZE` = {blobs.CHUNK_SIZE:,} bytes" in SPEC
    assert "`MAX_BLOB_SIZE` = 4 GiB" in SPEC and blobs.MAX_BLOB_SIZE == 4 << 30
    assert 'b"e31/1/" || kind (ASCII) || 0x00 || body' in SPEC
    assert f"`MAX_SET` = {messages.MAX_SET} job manifests" in section("`offer`")


def test_gossip_size_caps_in_the_spec() -> None:
    table = section("12.1 What travels")
    for kind, cap in gossip.DEFAULT_KINDS.items():
        assert cap % 1024 == 0 and f"| `{kind}` | {cap // 1024} KiB |" in table
