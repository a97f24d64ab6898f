"""Encrypted sessions after a handshake: round trips in any split, and every kind of interference fails."""

from __future__ import annotations

import hashlib

import pytest
from e31.protocol.codec import MAX_FRAME, encode_frame
from e31.protocol.errors import FrameTooLarge, LocalProtocolError, ProtocolError
from e31.protocol.handshake import HandshakeResult, Initiator, Responder
from e31.protocol.session import MAX_PLAINTEXT, TAG_SIZE, BadCiphertext, Session, SessionExhausted
from hypothesis import given, settings
from hypothesis import strategies as st
from nacl.signing import SigningKey


def results(tag: str = "") -> tuple[HandshakeResult, HandshakeResult]:
    a = SigningKey(hashlib.sha256(b"a").digest())
    b = SigningKey(hashlib.sha256(b"b").digest())
    ini = Initiator(a, "main", hashlib.sha256(b"i" + tag.encode()).digest())
    resp = Responder(b, "main", hashlib.sha256(b"r" + tag.encode()).digest())
    resp.receive_data(ini.receive_data(resp.receive_data(ini.initiate())))
    return ini.result, resp.result


def pair(**kwargs: int) -> tuple[Session, Session]:
    a, b = results()
    return Session(a, **kwargs), Session(b, **kwargs)


def deliver(receiver: Session, data: bytes) -> list[bytes]:
    receiver.receive_data(data)
    return list(receiver.messages())


def test_round_trip_both_ways() -> None:
    a, b = pair()
    assert deliver(b, a.encrypt(b"ping")) == [b"ping"]
    replies = [b"pong", b"", b"x" * 1000]
    assert deliver(a, b"".join(b.encrypt(m) for m in replies)) == replies
    assert a.frames_sent == 1 and a.frames_received == 3 and b.frames_sent == 3
    assert a.peer_key != b.peer_key and a.transcript_hash == b.transcript_hash


def test_frames_are_ciphertext_and_distinct() -> None:
    a, _ = pair()
    f1, f2 = a.encrypt(b"same plaintext"), a.encrypt(b"same plaintext")
    assert f1 != f2 and b"same plaintext" not in f1
    assert len(f1) == 4 + len(b"same plaintext") + TAG_SIZE
    assert int.from_bytes(f1[:4], "big") == len(f1) - 4


@settings(max_examples=60, deadline=None)
@given(messages=st.lists(st.binary(max_size=300), max_size=12), data=st.data())
def test_round_trips_in_random_splits(messages: list[bytes], data: st.DataObject) -> None:
    a, b = pair()
    wire = b"".join(a.encrypt(m) for m in messages)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=20), label="cuts"))
    got: list[bytes] = []
    for lo, hi in zip([0, *cuts], [*cuts, len(wire)], strict=True):
        got += deliver(b, wire[lo:hi])
    assert got == messages


def test_the_largest_plaintext_fits_one_frame() -> None:
    a, b = pair()
    big = bytes(range(256)) * (MAX_PLAINTEXT // 256) + b"z" * (MAX_PLAINTEXT % 256)
    frame = a.encrypt(big)
    assert len(frame) == 4 + MAX_FRAME
    assert deliver(b, frame) == [big]
    with pytest.raises(LocalProtocolError):
        a.encrypt(big + b"!")


def test_handshake_leftovers_start_the_session() -> None:
    a = SigningKey(hashlib.sha256(b"a").digest())
    b = SigningKey(hashlib.sha256(b"b").digest())
    ini = Initiator(a, "main", bytes(range(32)))
    resp = Responder(b, "main", bytes(range(1, 33)))
    m3 = ini.receive_data(resp.receive_data(ini.initiate()))
    sender = Session(ini.result)
    resp.receive_data(m3 + sender.encrypt(b"early") + sender.encrypt(b"x" * 4000)[:100])
    receiver = Session(resp.result)
    assert deliver(receiver, resp.unused_data) == [b"early"]


def test_a_tampered_frame_breaks_the_receiving_side() -> None:
    for pos in range(4, 4 + 5 + TAG_SIZE):
        a, b = pair()
        frame = bytearray(a.encrypt(b"hello"))
        frame[pos] ^= 0x01
        with pytest.raises(BadCiphertext):
            deliver(b, bytes(frame))
        with pytest.raises(BadCiphertext):
            deliver(b, a.encrypt(b"next"))
        assert deliver(a, b.encrypt(b"other direction")) == [b"other direction"]


def test_a_replayed_frame_fails() -> None:
    a, b = pair()
    frame = a.encrypt(b"pay 1")
    assert deliver(b, frame) == [b"pay 1"]
    with pytest.raises(BadCiphertext):
        deliver(b, frame)


def test_reordered_or_dropped_frames_fail() -> None:
    a, b = pair()
    f0, f1 = a.encrypt(b"first"), a.encrypt(b"second")
    with pytest.raises(BadCiphertext):
        deliver(b, f1 + f0)
    a, b = pair()
    a.encrypt(b"dropped")
    with pytest.raises(BadCiphertext):
        deliver(b, a.encrypt(b"after the gap"))


def test_earlier_good_frames_are_delivered_before_a_bad_one() -> None:
    a, b = pair()
    good = a.encrypt(b"good")
    bad = bytearray(a.encrypt(b"bad"))
    bad[-1] ^= 0x80
    b.receive_data(good + bytes(bad))
    assert b.next_message() == b"good"
    with pytest.raises(BadCiphertext):
        b.next_message()


def test_a_reflected_frame_fails() -> None:
    a, _ = pair()
    with pytest.raises(BadCiphertext):
        deliver(a, a.encrypt(b"echo"))


def test_a_frame_from_another_session_fails() -> None:
    a, _ = pair()
    other = Session(results("other")[0])
    _, b = pair()
    assert deliver(b, a.encrypt(b"mine")) == [b"mine"]
    with pytest.raises(BadCiphertext):
        deliver(b, other.encrypt(b"theirs"))


def test_short_and_oversized_frames_fail() -> None:
    _, b = pair()
    with pytest.raises(BadCiphertext):
        deliver(b, encode_frame(b"x" * (TAG_SIZE - 1)))
    _, b = pair()
    with pytest.raises(FrameTooLarge):
        b.receive_data((MAX_FRAME + 1).to_bytes(4, "big"))
    with pytest.raises(FrameTooLarge, match="broken"):
        b.receive_data(b"")


def test_rekeying_changes_the_key_on_schedule() -> None:
    a, b = pair(rekey_interval=3)
    msgs = [b"m%d" % i for i in range(10)]
    assert deliver(b, b"".join(a.encrypt(m) for m in msgs)) == msgs
    # A receiver that does not rekey reads frames 0..2 and fails at frame 3: the key really changed.
    ra, _ = results()
    sender = Session(ra, rekey_interval=3)
    _, rb = results()
    stale = Session(rb, rekey_interval=1000)
    wire = [sender.encrypt(m) for m in msgs[:4]]
    assert deliver(stale, b"".join(wire[:3])) == msgs[:3]
    with pytest.raises(BadCiphertext):
        deliver(stale, wire[3])


def test_the_frame_cap_stops_both_directions() -> None:
    a, b = pair(max_frames=4)
    frames = [a.encrypt(b"%d" % i) for i in range(4)]
    with pytest.raises(SessionExhausted) as e:
        a.encrypt(b"one too many")
    assert isinstance(e.value, LocalProtocolError)
    assert deliver(b, b"".join(frames)) == [b"0", b"1", b"2", b"3"]
    ra, rb = results()
    eager, capped = Session(ra, max_frames=10), Session(rb, max_frames=2)
    with pytest.raises(BadCiphertext) as e2:
        deliver(capped, b"".join(eager.encrypt(b"x") for _ in range(3)))
    assert e2.value.remote


def test_wrong_use_is_a_local_error() -> None:
    a, _ = pair()
    with pytest.raises(LocalProtocolError):
        a.encrypt("text")  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError):
        a.receive_data(["bytes"])  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError):
        Session(b"keys")  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError):
        pair(rekey_interval=0)
    with pytest.raises(LocalProtocolError):
        pair(max_frames=1 << 63)


@settings(max_examples=150, deadline=None)
@given(data=st.binary(max_size=600), framed=st.booleans())
def test_arbitrary_bytes_raise_only_protocol_errors(data: bytes, framed: bool) -> None:
    _, b = pair()
    try:
        got = deliver(b, encode_frame(data) if framed else data)
    except ProtocolError as e:
        assert e.remote
    else:
        assert got == []
