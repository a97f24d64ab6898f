from __future__ import annotations

import struct

import msgpack
import pytest
from e31.protocol.codec import MAX_FRAME, FrameDecoder, encode_frame, pack, unpack, unpack_canonical
from e31.protocol.errors import DecodeError, FrameTooLarge, LocalProtocolError, NonCanonical, ProtocolError
from hypothesis import given, settings
from hypothesis import strategies as st


@settings(max_examples=100)
@given(st.lists(st.binary(max_size=300), max_size=8), st.data())
def test_frames_survive_any_split(payloads: list[bytes], data: st.DataObject) -> None:
    stream = b"".join(encode_frame(p) for p in payloads)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    decoder = FrameDecoder()
    got: list[bytes] = []
    last = 0
    for cut in [*cuts, len(stream)]:
        decoder.feed(stream[last:cut])
        last = cut
        got += list(decoder.frames())
    assert got == payloads
    assert decoder.buffered == 0


def test_oversized_frame_is_refused_from_its_prefix() -> None:
    decoder = FrameDecoder(max_frame=100)
    with pytest.raises(FrameTooLarge):
        decoder.feed(struct.pack(">I", 101))
    assert decoder.buffered == 0
    with pytest.raises(LocalProtocolError):
        encode_frame(b"x" * 101, max_frame=100)
    assert MAX_FRAME == 1 << 20


def test_unpack_decodes_arrays_as_tuples_and_refuses_trailing_bytes() -> None:
    assert unpack(pack([1, "a", b"b"])) == (1, "a", b"b")
    with pytest.raises(DecodeError, match="trailing"):
        unpack(pack(1) + b"\x00")


@pytest.mark.parametrize(
    "encoded",
    [
        b"\xcc\x05",  # 5 as uint8 (fixint is minimal)
        b"\xcd\x00\x05",  # 5 as uint16
        b"\xcf" + struct.pack(">Q", 300),
        b"\xd0\x05",  # positive number as int8
        b"\xc5\x00\x01x",  # bin16 holding 1 byte (bin8 is minimal)
        b"\xd9\x01x",  # str8 holding 1 byte (fixstr is minimal)
        b"\xdc\x00\x01\x01",  # array16 of one item (fixarray is minimal)
        b"\xca\x3f\x80\x00\x00",  # float32: we always write float64
    ],
)
def test_non_minimal_encodings_are_refused(encoded: bytes) -> None:
    unpack(encoded)  # well-formed msgpack...
    with pytest.raises(NonCanonical):
        unpack_canonical(encoded)  # ...but not the one encoding we accept


@pytest.mark.parametrize(
    "encoded",
    [
        b"\xc1",  # never used
        b"\xd4\x01\x00",  # ext
        b"\x81\x91\x01\x01",  # map with an array key
        b"\xa2\xff\xfe",  # str that is not UTF-8
        b"\xdb\xff\xff\xff\xff",  # str32 longer than the input
        b"\x91" * 100_000 + b"\x00",  # nesting deeper than the decoder's stack
    ],
)
def test_malformed_msgpack_is_a_decode_error(encoded: bytes) -> None:
    with pytest.raises(DecodeError):
        unpack(encoded)


def test_length_limits_apply_before_allocation() -> None:
    with pytest.raises(DecodeError):
        unpack(b"\xc6" + struct.pack(">I", 1000) + b"x" * 1000, max_len=999)


@settings(max_examples=300)
@given(st.binary(max_size=64))
def test_any_bytes_give_a_value_or_our_errors(data: bytes) -> None:
    try:
        value = unpack_canonical(data)
    except ProtocolError:
        return
    assert pack(value) == data


@settings(max_examples=100)
@given(
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers(-(2**63), 2**64 - 1)
        | st.binary(max_size=40)
        | st.text(max_size=20),
        lambda inner: st.lists(inner, max_size=4).map(tuple),
        max_leaves=12,
    )
)
def test_pack_is_canonical(value: object) -> None:
    data = pack(value)
    assert unpack_canonical(data) == value
    assert data == msgpack.packb(value, use_bin_type=True)
