"""The fast paths of verification agree with the plain ones they stand in for.

- the generated decoders (schema.Codec.inline) with the reference decoders, on wire values built to
  hit the edges of their quick tests (file names, network names, env names, non-ASCII and lone
  surrogates, order of arrays);
- the byte-level reader of canonical envelopes is what verify uses for every golden vector;
- libsodium called with no output buffer (sodium.signature_ok) with PyNaCl's public wrapper, and
  libsodium's AEAD called directly (sodium.aead_seal, aead_open) with PyNaCl's wrappers;
- decoded records are the frozen classes themselves, equal to constructed ones.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import nacl.bindings
import nacl.exceptions
import nacl.signing
import pytest
import vector_files as vectors
from decoding import same_outcome
from e31.protocol import errors, sodium
from e31.protocol.envelope import _read_canonical, sign_message, verify
from e31.protocol.ids import Digest, NodeId
from e31.protocol.jobs import EnvVar, FileRef, JobManifest, check_file_name
from e31.protocol.messages import Capacity, Contact, Ping
from e31.protocol.schema import NETWORK
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

KEY = nacl.signing.SigningKey(b"\x07" * 32)
ME = NodeId(bytes(KEY.verify_key))
BLOB = (b"\x11" * 32, 5)

# characters that decide the quick tests: separators, dots, backslash, controls, '=', non-ASCII
# (C1 controls, an accent, a lone surrogate), letters
_EDGY = st.sampled_from(
    [
        "/",
        ".",
        "\\",
        "\x00",
        "\x01",
        "\x1f",
        "\x7f",
        "\x85",
        "=",
        "-",
        "_",
        "é",
        "\ud800",
        "a",
        "b",
        "Z",
        "0",
        " ",
    ]
)
_EDGY_TEXT = st.lists(_EDGY, max_size=8).map("".join)


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
@given(_EDGY_TEXT)
def test_file_names_decode_as_the_reference_decodes_them(name: str) -> None:
    same_outcome(FileRef, (name, BLOB))
    if check_file_name(name) is None and "\ud800" not in name:
        assert FileRef.from_wire((name, BLOB)).name == name


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(_EDGY_TEXT, _EDGY_TEXT)
def test_env_vars_decode_as_the_reference_decodes_them(name: str, value: str) -> None:
    same_outcome(EnvVar, (name, value))


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(_EDGY_TEXT | st.text(max_size=40))
def test_network_names_decode_as_the_reference_decodes_them(network: str) -> None:
    same_outcome(Ping, (network, ME.raw, b"\x01" * 16, 5))
    accepted = True
    try:
        NETWORK.check(network)
    except errors.InvalidMessage:
        accepted = False
    try:
        Ping.from_wire((network, ME.raw, b"\x01" * 16, 5))
    except errors.InvalidMessage:
        assert not accepted
    else:
        assert accepted


def test_text_limits_count_utf8_bytes_and_refuse_lone_surrogates() -> None:
    for value in ("é" * 2048, "é" * 2049, "a" * 4096, "a" * 4097, "\ud800", "ok\udfffok"):
        same_outcome(EnvVar, ("NAME", value))
    assert EnvVar.from_wire(("NAME", "é" * 2048)).value == "é" * 2048
    for bad in ("é" * 2049, "\ud800"):
        with pytest.raises(errors.InvalidMessage):
            EnvVar.from_wire(("NAME", bad))


@pytest.mark.parametrize("names", [("a", "a"), ("b", "a"), ("a", "b", "b"), ("a", "c", "b")])
def test_arrays_out_of_order_or_repeated_are_refused_by_both(names: tuple[str, ...]) -> None:
    with pytest.raises(errors.InvalidMessage, match="sorted and unique"):
        _decode_inputs(tuple((n, BLOB) for n in names))


def _decode_inputs(inputs: tuple[Any, ...]) -> JobManifest:
    manifest = (BLOB, inputs, (), (), None, (1, 1, 1, 0), 2, 0, 1, b"\x22" * 32, ME.raw, b"\x00" * 16, 1)
    same_outcome(JobManifest, manifest)
    return JobManifest.from_wire(manifest)


def test_digests_in_an_array_must_increase() -> None:
    low, high = b"\x01" * 32, b"\x02" * 32
    base = ("net", ME.raw, 10, 1, 1)
    ok = Capacity.from_wire((*base, (low, high), 0, 1))
    assert ok.profiles == (Digest(low), Digest(high))
    for profiles in ((high, low), (low, low)):
        wire = (*base, profiles, 0, 1)
        same_outcome(Capacity, wire)
        with pytest.raises(errors.InvalidMessage):
            Capacity.from_wire(wire)


def test_contact_addresses_go_through_their_rule() -> None:
    for addresses in (("192.0.2.1:80",), ("192.0.2.1:0",), ("[::1]:80", "host"), ()):
        same_outcome(Contact, ("net", ME.raw, addresses, 10))


def test_decoded_records_are_the_frozen_classes_and_equal_to_constructed_ones() -> None:
    ping = Ping("net", ME, b"\x01" * 16, 5)
    decoded = Ping.from_wire(ping.to_wire())
    assert type(decoded) is Ping and type(decoded.sender) is NodeId
    assert decoded == ping and hash(decoded) == hash(ping)
    with pytest.raises(dataclasses.FrozenInstanceError):
        decoded.network = "other"  # type: ignore[misc]
    manifest = _decode_inputs((("a", BLOB), ("b/c", BLOB)))
    assert type(manifest) is JobManifest and type(manifest.inputs[0]) is FileRef
    assert manifest == JobManifest.from_wire_reference(manifest.to_wire())
    with pytest.raises(dataclasses.FrozenInstanceError):
        manifest.inputs[0].name = "z"  # type: ignore[misc]


def test_every_valid_vector_takes_the_canonical_fast_path() -> None:
    for vector in vectors.valid():
        data = bytes.fromhex(vector["envelope"])
        parts = _read_canonical(data)
        assert parts is not None, vector
        assert parts[0].name == vector["kind"] == verify(data).kind


def _public_verdict(sealed: bytes, length: int, key: bytes) -> bool:
    try:
        nacl.bindings.crypto_sign_open(sealed[:length], key)
    except nacl.exceptions.CryptoError:
        return False
    return True


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.binary(max_size=300),
    st.integers(0, 200),
    st.integers(0, 7),
    st.sampled_from(["sig", "msg", "key", "none"]),
    st.binary(max_size=8),
)
def test_signature_ok_agrees_with_pynacl(
    message: bytes, where: int, bit: int, flip: str, tail: bytes
) -> None:
    sealed = bytearray(KEY.sign(message))
    key = bytearray(KEY.verify_key.encode())
    if flip == "sig":
        sealed[where % 64] ^= 1 << bit
    elif flip == "msg" and message:
        sealed[64 + where % len(message)] ^= 1 << bit
    elif flip == "key":
        key[where % 32] ^= 1 << bit
    length = len(sealed)
    args = (bytes(sealed) + tail, length, bytes(key))
    assert sodium.signature_ok(*args) == _public_verdict(*args) == sodium._public(*args)
    assert sodium.signature_ok(*args) == (flip == "none" or (flip == "msg" and not message))


def test_signature_ok_refuses_bad_arguments() -> None:
    sealed = bytes(KEY.sign(b"x"))
    key = KEY.verify_key.encode()
    for args in (
        (sealed, len(sealed) + 1, key),
        (sealed, 63, key),
        (sealed, len(sealed), key[:31]),
        (bytearray(sealed), len(sealed), key),
        (sealed, len(sealed), "k" * 32),
    ):
        with pytest.raises(TypeError):
            sodium.signature_ok(*args)  # type: ignore[arg-type]
    assert sodium.signature_ok(sealed, len(sealed), key)


def test_small_order_and_malformed_keys_are_refused() -> None:
    data = sign_message(Ping("net", ME, b"\x01" * 16, 5), KEY)
    sealed = bytes(KEY.sign(b"m"))
    for key in (b"\x00" * 32, b"\x01" + b"\x00" * 31, b"\xff" * 32):
        assert not sodium.signature_ok(sealed, len(sealed), key)
        forged = data[:-98] + key + data[-66:]
        with pytest.raises(errors.BadSignature):
            verify(forged)


def test_sign_verified_is_what_verify_makes_of_the_signed_bytes() -> None:
    import importlib.util
    from pathlib import Path

    from e31.protocol.envelope import sign_verified, verify
    from e31.protocol.errors import LocalProtocolError
    from e31.protocol.schema import Message

    spec = importlib.util.spec_from_file_location(
        "e31_vectors_gen", Path(__file__).resolve().parents[1] / "vectors" / "make_vectors.py"
    )
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    for _name, key_name, msg in gen.samples():
        if not isinstance(msg, Message):
            continue
        made = sign_verified(msg, gen.key(key_name))
        checked = verify(made.raw)
        assert (made.kind, made.signer, made.message_id, made.message) == (
            checked.kind,
            checked.signer,
            checked.message_id,
            checked.message,
        )
        assert made.raw == checked.raw
    _name, key_name, msg = gen.samples()[0]
    other = "executor" if key_name != "executor" else "submitter"
    with pytest.raises(LocalProtocolError):
        sign_verified(msg, gen.key(other))


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.binary(max_size=2000),
    st.binary(min_size=12, max_size=12),
    st.binary(min_size=32, max_size=32),
    st.integers(0, 4000),
    st.integers(0, 7),
    st.sampled_from(["none", "sealed", "nonce", "key", "cut"]),
)
def test_aead_seal_and_open_agree_with_pynacl(
    message: bytes, nonce: bytes, key: bytes, where: int, bit: int, change: str
) -> None:
    sealed = sodium.aead_seal(message, nonce, key)
    assert sealed == sodium._public_seal(message, nonce, key)
    assert len(sealed) == len(message) + sodium.TAG
    bad, n, k = bytearray(sealed), bytearray(nonce), bytearray(key)
    if change == "sealed":
        bad[where % len(bad)] ^= 1 << bit
    elif change == "nonce":
        n[where % 12] ^= 1 << bit
    elif change == "key":
        k[where % 32] ^= 1 << bit
    elif change == "cut":
        del bad[where % len(bad) :]
    args = (bytes(bad), bytes(n), bytes(k))
    opened = sodium.aead_open(*args)
    assert opened == sodium._public_open(*args)
    assert opened == (message if change == "none" else None)
