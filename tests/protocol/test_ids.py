from __future__ import annotations

import hashlib

import pytest
from e31.protocol.errors import DecodeError, ProtocolError
from e31.protocol.ids import Digest, InvalidId, NodeId, sha256
from hypothesis import given, settings
from hypothesis import strategies as st

KEY = bytes(range(32))


def test_node_id_text_form_round_trips() -> None:
    node = NodeId(KEY)
    text = str(node)
    assert text.startswith("e31n") and len(text) == 56 and text == text.lower()
    assert NodeId.parse(text) == node


@settings(max_examples=200)
@given(st.binary(min_size=32, max_size=32))
def test_every_key_has_one_text(raw: bytes) -> None:
    assert NodeId.parse(str(NodeId(raw))).raw == raw


@pytest.mark.parametrize(
    "text",
    [
        "",
        "e31n",
        "e31x" + "a" * 52,
        "E31N" + "a" * 52,
        "e31n" + "A" * 52,
        "e31n" + "a" * 51,
        "e31n" + "a" * 53,
        "e31n" + "1" * 52,  # 1 is not base32
        "e31n" + "a" * 51 + "b",  # stray low bits: not the canonical text of any key
        " e31n" + "a" * 52,
    ],
)
def test_malformed_node_ids_are_refused(text: str) -> None:
    with pytest.raises(InvalidId) as info:
        NodeId.parse(text)
    assert isinstance(info.value, DecodeError)
    assert "node id" in str(info.value)


def test_node_id_parse_refuses_non_text() -> None:
    with pytest.raises(InvalidId):
        NodeId.parse(KEY)  # type: ignore[arg-type]


@pytest.mark.parametrize("raw", [b"", KEY[:31], KEY + b"\x00", bytearray(KEY), "x" * 32])
def test_node_id_needs_32_bytes(raw: object) -> None:
    with pytest.raises(InvalidId):
        NodeId(raw)  # type: ignore[arg-type]


@settings(max_examples=200)
@given(st.text(max_size=70))
def test_any_text_parses_or_raises_invalid_id(text: str) -> None:
    for parse in (NodeId.parse, Digest.parse):
        try:
            parse(text)
        except ProtocolError as e:
            assert isinstance(e, InvalidId)


def test_digest_hex_and_sha256() -> None:
    d = sha256(b"abc")
    assert d.raw == hashlib.sha256(b"abc").digest()
    assert d.hex() == str(d) == hashlib.sha256(b"abc").hexdigest()
    assert Digest.parse(d.hex()) == d
    for bad in (d.hex().upper(), d.hex()[:-1], d.hex() + "0", "zz" * 32):
        with pytest.raises(InvalidId):
            Digest.parse(bad)
