from __future__ import annotations

import hashlib
from typing import Any

import nacl.signing
import pytest
import vector_files as vectors
from decoding import same_outcome
from e31.protocol import errors
from e31.protocol.codec import pack, unpack
from e31.protocol.envelope import (
    VerifiedEnvelope,
    _split_canonical,
    _split_generic,
    check_fresh,
    is_expired,
    message_id,
    node_id_of,
    reopen_stored,
    sign,
    sign_message,
    signed_bytes,
    verify,
)
from e31.protocol.errors import ProtocolError
from e31.protocol.ids import SIGNING_PREFIX, sha256
from e31.protocol.messages import REGISTRY, BlobChunk, Offer, Peers, Ping, UsageReceipt
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

VALID = vectors.valid()
INVALID = vectors.invalid()
KEY = nacl.signing.SigningKey(b"\x07" * 32)
ME = node_id_of(KEY)


def test_vectors_cover_every_kind() -> None:
    assert {v["kind"] for v in VALID} == set(REGISTRY)


def test_vector_file_is_what_the_script_generates() -> None:
    assert vectors.VECTOR_FILE.read_text() == vectors.generator().render()


@pytest.mark.parametrize("vector", VALID, ids=[v["name"] for v in VALID])
def test_valid_vector_is_reproduced_byte_for_byte(vector: dict[str, Any]) -> None:
    cls = REGISTRY[vector["kind"]]
    message = cls.from_json(vector["fields"])
    key = nacl.signing.SigningKey(bytes.fromhex(vector["seed"]))
    data = sign(vector["kind"], message, key)
    assert data.hex() == vector["envelope"]
    env = verify(data)
    assert env.message == message
    assert env.kind == vector["kind"]
    assert str(env.signer) == vector["signer"]
    assert env.message_id.hex() == vector["message_id"]
    assert env.message.to_json() == vector["fields"]
    assert env.raw == data


@pytest.mark.parametrize("vector", INVALID, ids=[v["name"] for v in INVALID])
def test_invalid_vector_is_refused_with_its_error(vector: dict[str, Any]) -> None:
    expected = getattr(errors, vector["error"])
    with pytest.raises(expected):
        verify(bytes.fromhex(vector["envelope"]))


def test_envelope_layout_and_signing_rule() -> None:
    ping = Ping("net", ME, b"n" * 16, 99)
    data = sign_message(ping, KEY)
    version, kind, body, signer, signature = unpack(data)
    assert (version, kind, signer) == (1, "ping", ME.raw)
    assert body == pack(("net", ME.raw, b"n" * 16, 99))
    assert signed_bytes("ping", body) == SIGNING_PREFIX + b"ping\x00" + body
    KEY.verify_key.verify(b"e31/1/ping\x00" + body, signature)
    expected_id = hashlib.sha256(b"e31/1/ping\x00" + body + ME.raw).digest()
    assert verify(data).message_id.raw == expected_id == message_id("ping", body, ME).raw


def test_sign_refuses_a_message_whose_issuer_is_not_the_key() -> None:
    other = node_id_of(nacl.signing.SigningKey(b"\x08" * 32))
    with pytest.raises(errors.LocalProtocolError, match="issuer"):
        sign_message(Ping("net", other, b"n" * 16, 1), KEY)
    with pytest.raises(errors.LocalProtocolError, match="kind"):
        sign("pong", Ping("net", ME, b"n" * 16, 1), KEY)


def test_only_verify_builds_a_verified_envelope() -> None:
    env = verify(sign_message(Ping("net", ME, b"n" * 16, 1), KEY))
    with pytest.raises(errors.LocalProtocolError):
        VerifiedEnvelope(env.raw, env.kind, env.signer, env.message_id, env.message, object())


def test_reopen_stored_is_verify_without_the_signature_check() -> None:
    data = sign_message(Ping("net", ME, b"n" * 16, 1), KEY)
    env, again = verify(data, Ping), reopen_stored(data, Ping)
    assert (again.raw, again.kind, again.signer, again.message_id, again.message) == (
        env.raw,
        env.kind,
        env.signer,
        env.message_id,
        env.message,
    )
    forged = data[:-40] + bytes([data[-40] ^ 1]) + data[-39:]  # a flipped signature byte
    with pytest.raises(errors.BadSignature):
        verify(forged)
    assert reopen_stored(forged).message == env.message  # what a node's own store holds is not re-checked
    with pytest.raises(errors.UnknownKind):
        reopen_stored(data, Offer)
    for vector in INVALID:  # everything but the signature is checked as verify checks it
        if vector["error"] != "BadSignature":
            with pytest.raises(ProtocolError):
                reopen_stored(bytes.fromhex(vector["envelope"]))


def test_expect_narrows_the_kind() -> None:
    data = sign_message(Ping("net", ME, b"n" * 16, 1), KEY)
    assert verify(data, Ping).message.nonce == b"n" * 16
    with pytest.raises(errors.UnknownKind):
        verify(data, Offer)


def test_check_fresh_and_is_expired() -> None:
    env = verify(sign_message(Ping("net", ME, b"n" * 16, 1_000), KEY))
    check_fresh(env, 999, network="net")
    assert not is_expired(env, 999) and is_expired(env, 1_000)
    with pytest.raises(errors.Expired):
        check_fresh(env, 1_000)
    with pytest.raises(errors.WrongNetwork):
        check_fresh(env, 0, network="other")
    with pytest.raises(errors.Expired, match="live"):
        check_fresh(env, 0, max_ttl=500)


def test_messages_without_expiry_never_expire() -> None:
    vector = next(v for v in VALID if v["kind"] == "receipt")
    env = verify(bytes.fromhex(vector["envelope"]), UsageReceipt)
    assert env.message.expires is None and not is_expired(env, 2**63)
    check_fresh(env, 2**63)


def test_signer_must_be_the_issuer_named_inside_the_offer() -> None:
    vector = next(v for v in VALID if v["kind"] == "offer")
    env = verify(bytes.fromhex(vector["envelope"]))
    forged = sign("offer", env.body, KEY)  # a valid signature, but by someone who is not the submitter
    with pytest.raises(errors.BadSignature, match="issuer"):
        verify(forged)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_arbitrary_bytes_raise_only_protocol_errors(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        verify(data)


ENVELOPES = [bytes.fromhex(v["envelope"]) for v in VALID]


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(ENVELOPES)))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]))
        i = draw(st.integers(0, max(0, len(data) - 1)))
        if op == "flip" and data:
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and data:
            data[i] = draw(st.integers(0, 255))
        elif op == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=3))
        elif op == "delete" and data:
            del data[i]
        elif op == "truncate":
            del data[i:]
    return bytes(data)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_envelopes_raise_only_protocol_errors(data: bytes) -> None:
    if data in ENVELOPES:
        return
    with pytest.raises(ProtocolError):
        verify(data)


def _wire_mutations(draw: st.DrawFn, wire: Any) -> Any:
    """Replace one random leaf of a decoded body with another msgpack value."""
    if isinstance(wire, tuple) and wire and draw(st.booleans()):
        i = draw(st.integers(0, len(wire) - 1))
        return (*wire[:i], _wire_mutations(draw, wire[i]), *wire[i + 1 :])
    return draw(
        st.none()
        | st.booleans()
        | st.integers(-2, 2**64 - 1)
        | st.binary(max_size=40)
        | st.text(max_size=8)
        | st.tuples()
        | st.floats(allow_nan=False)
    )


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_compiled_decoder_matches_the_reference(data: st.DataObject) -> None:
    """The fast decoder accepts exactly what construction accepts, and raises only InvalidMessage."""
    env = verify(data.draw(st.sampled_from(ENVELOPES)))
    cls = type(env.message)
    same_outcome(cls, _wire_mutations(data.draw, unpack(env.body)))


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_fast_envelope_split_agrees_with_msgpack(data: bytes) -> None:
    """The byte-level reader of canonical envelopes accepts exactly what msgpack decoding accepts."""
    fast = _split_canonical(data)
    try:
        slow = _split_generic(data, 1 << 20)
    except errors.UnknownKind:
        assert fast is None or fast[0] not in REGISTRY
        return
    except ProtocolError:
        assert fast is None
        return
    assert fast == slow


def test_sign_refuses_an_envelope_no_frame_can_hold() -> None:
    big = Peers("net", ME, tuple(b"c" * 4096 for _ in range(32)), 1)
    assert len(sign_message(big, KEY)) < 1 << 20
    listing = BlobChunk("net", ME, sha256(b""), None, b"\x00" * (16384 * 32))
    assert len(sign_message(listing, KEY)) < 1 << 20
    with pytest.raises(errors.LocalProtocolError, match="frame"):
        sign("ping", b"\x00" * (1 << 20), KEY)


def test_a_value_nested_a_thousand_deep_is_refused_with_a_protocol_error() -> None:
    """msgpack allows 1,024 levels; explaining why such a value is refused must not overflow the stack."""
    deep: Any = ()
    for _ in range(1000):
        deep = (deep,)
    body = pack(("net", b"\x01" * 32, ME.raw, 1, deep, "text"))  # a cancel whose reason is an array
    with pytest.raises(errors.InvalidMessage):
        verify(sign("cancel", body, KEY))
