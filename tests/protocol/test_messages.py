from __future__ import annotations

import dataclasses
import typing
from typing import Any

import nacl.signing
import pytest
import vector_files as vectors
from e31.protocol.blobs import BlobRef, chunk_list
from e31.protocol.envelope import node_id_of, sign_message, verify
from e31.protocol.errors import InvalidMessage
from e31.protocol.ids import Digest, sha256
from e31.protocol.jobs import EnvVar, FileRef, JobManifest, Limits, check_file_name
from e31.protocol.messages import (
    REGISTRY,
    AnyMessage,
    Assign,
    Bid,
    BlobChunk,
    Capacity,
    Contact,
    Ping,
    check_address,
)
from e31.protocol.receipts import Outcome

GEN = vectors.generator()
SAMPLES = GEN.samples()
KEY = nacl.signing.SigningKey(b"\x05" * 32)
ME = node_id_of(KEY)
D = sha256(b"d")


def test_registry_and_union_agree() -> None:
    assert set(typing.get_args(AnyMessage)) == set(REGISTRY.values())
    for kind, cls in REGISTRY.items():
        assert kind == cls.KIND
        assert next(f.name for f in dataclasses.fields(cls)) == "network"


@pytest.mark.parametrize(("name", "key_name", "message"), SAMPLES, ids=[s[0] for s in SAMPLES])
def test_every_kind_round_trips(name: str, key_name: str, message: Any) -> None:
    env = verify(sign_message(message, GEN.key(key_name)))
    assert env.message == message
    assert type(env.message).from_wire(message.to_wire()) == message
    assert type(env.message).from_json(message.to_json()) == message
    with pytest.raises(dataclasses.FrozenInstanceError):
        env.message.network = "other"


@pytest.mark.parametrize(("field", "value"), [
    ("expires", True),            # bool is not an int
    ("expires", -1),
    ("expires", 2**64),
    ("expires", 1.0),
    ("nonce", b"x" * 15),
    ("nonce", bytearray(16)),
    ("nonce", "x" * 16),
    ("sender", ME.raw),           # raw bytes where a NodeId is expected
    ("network", ""),
    ("network", "Main"),
    ("network", "x" * 33),
    ("network", "a\x00"),
])
def test_construction_checks_every_field(field: str, value: object) -> None:
    fields = {"network": "net", "sender": ME, "nonce": b"n" * 16, "expires": 1}
    fields[field] = value
    with pytest.raises(InvalidMessage, match=f"Ping.{field}"):
        Ping(**fields)


def test_errors_name_the_nested_field() -> None:
    with pytest.raises(InvalidMessage, match=r"FileRef.blob: BlobRef.size"):
        FileRef.from_wire(("a", (D.raw, -1)))
    with pytest.raises(InvalidMessage, match=r"FileRef.blob: BlobRef.size"):
        FileRef.from_wire_reference(("a", (D.raw, -1)))
    limits_wire = (1, 1, 1, 1)
    with pytest.raises(InvalidMessage, match=r"Limits.fuel"):
        Limits.from_wire((0, *limits_wire[1:]))


@pytest.mark.parametrize("name", ["a", "a/b", ".hidden", "a..b", "...", "dir/file.txt", "ünïcode"])
def test_good_file_names(name: str) -> None:
    assert check_file_name(name) is None


@pytest.mark.parametrize("name", ["", "/abs", "a/", "a//b", ".", "..", "../x", "a/../b", "a/./b", "x/..",
                                  "a\\b", "a\nb", "a\x7fb"])
def test_bad_file_names(name: str) -> None:
    assert check_file_name(name) is not None
    with pytest.raises(InvalidMessage):
        FileRef(name, BlobRef(D, 0))


def _manifest(**changes: Any) -> JobManifest:
    return GEN.manifest(**changes)


def test_manifest_rules() -> None:
    ref = BlobRef(D, 1)
    with pytest.raises(InvalidMessage, match="sorted"):
        _manifest(inputs=(FileRef("b", ref), FileRef("a", ref)))
    with pytest.raises(InvalidMessage, match="sorted"):
        _manifest(inputs=(FileRef("a", ref), FileRef("a", ref)))
    with pytest.raises(InvalidMessage, match="lies under"):
        _manifest(inputs=(FileRef("a", ref), FileRef("a/b", ref)))
    with pytest.raises(InvalidMessage, match="sorted"):
        _manifest(env=(EnvVar("B", ""), EnvVar("A", "")))
    with pytest.raises(InvalidMessage, match="="):
        _manifest(env=(EnvVar("A=B", ""),))
    with pytest.raises(InvalidMessage, match="deadline"):
        _manifest(deadline=GEN.T0)
    with pytest.raises(InvalidMessage, match="replicas"):
        _manifest(replicas=0)
    with pytest.raises(InvalidMessage, match="inputs"):
        _manifest(inputs=[FileRef("a", ref)])  # a list, not a tuple


def test_job_id_is_the_hash_of_the_manifest_not_the_offer() -> None:
    offers = [m for n, _, m in SAMPLES if n == "offer"]
    man = offers[0].manifest
    assert man.job_id == sha256(GEN.pack(man.to_wire()))
    later = dataclasses.replace(offers[0], expires=offers[0].expires + 1)
    assert later.job_id == offers[0].job_id
    assert _manifest(nonce=b"\xff" * 16).job_id != man.job_id


@pytest.mark.parametrize("addr", ["192.0.2.1:7531", "node.example:1", "[::1]:65535", "[2001:db8::1]:80",
                                  "h:1"])
def test_good_addresses(addr: str) -> None:
    assert check_address(addr) is None


@pytest.mark.parametrize("addr", ["192.0.2.1", ":80", "h:0", "h:65536", "h:08", "::1:80", "[::1:80", "[]:1",
                                  "a b:1", "h:+1", "h:１"])
def test_bad_addresses(addr: str) -> None:
    assert check_address(addr) is not None
    with pytest.raises(InvalidMessage):
        Contact("net", ME, (addr,), 1)


def test_contact_needs_an_address() -> None:
    with pytest.raises(InvalidMessage):
        Contact("net", ME, (), 1)


def test_relations_between_fields() -> None:
    with pytest.raises(InvalidMessage, match="expected_finish"):
        Bid("net", D, D, ME, 1, 10, 9)
    with pytest.raises(InvalidMessage, match="attempt"):
        Assign("net", D, D, ME, ME, 0, 1)
    with pytest.raises(InvalidMessage, match="digests"):
        BlobChunk("net", ME, D, None, b"x" * 33)
    with pytest.raises(InvalidMessage, match="at most"):
        BlobChunk("net", ME, D, 0, b"x" * (256 * 1024 + 1))
    with pytest.raises(InvalidMessage, match="sorted"):
        Capacity("net", ME, 1, 1, 1, (D, D), 0, 0)
    with pytest.raises(InvalidMessage, match="profiles"):
        Capacity("net", ME, 1, 1, 1, (), 0, 0)


@pytest.mark.parametrize(("status", "exit_code", "trap", "ok"), [
    ("exited", 0, None, True),
    ("exited", None, None, False),
    ("trap", None, "unreachable", True),
    ("trap", None, None, False),
    ("timeout", 1, None, False),
    ("out_of_fuel", None, None, True),
    ("crashed", None, None, False),
])
def test_outcome_rules(status: str, exit_code: int | None, trap: str | None, ok: bool) -> None:
    if ok:
        assert Outcome(status, exit_code, trap).status == status
    else:
        with pytest.raises(InvalidMessage):
            Outcome(status, exit_code, trap)


def test_decoding_refuses_a_wire_value_of_the_wrong_type() -> None:
    ping = Ping("net", ME, b"n" * 16, 1)
    wire = ping.to_wire()
    for i, bad in [(0, b"net"), (1, str(ME)), (2, None), (3, "1"), (3, (1,))]:
        with pytest.raises(InvalidMessage):
            Ping.from_wire((*wire[:i], bad, *wire[i + 1:]))
    with pytest.raises(InvalidMessage, match="4 fields"):
        Ping.from_wire(wire[:3])
    with pytest.raises(InvalidMessage, match="array"):
        Ping.from_wire(list(wire))


def test_json_form_uses_text_ids_and_hex_bytes() -> None:
    j = Ping("net", ME, b"\x01" * 16, 1).to_json()
    assert j == {"network": "net", "sender": str(ME), "nonce": "01" * 16, "expires": 1}
    with pytest.raises(InvalidMessage):
        Ping.from_json({**j, "extra": 1})
    with pytest.raises(InvalidMessage):
        Ping.from_json({**j, "sender": "e31nbogus"})
    assert isinstance(Digest.parse(sha256(b"").hex()), Digest)
    assert chunk_list(b"").ref.size == 0
