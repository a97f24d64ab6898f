from __future__ import annotations

import dataclasses
import typing
from typing import Any

import nacl.signing
import pytest
import vector_files as vectors
from e31.protocol.blobs import BlobRef, chunk_list
from e31.protocol.codec import unpack_canonical
from e31.protocol.envelope import node_id_of, sign_message, verify
from e31.protocol.errors import InvalidMessage
from e31.protocol.ids import Digest, sha256
from e31.protocol.jobs import EnvVar, FileRef, JobManifest, Limits, check_file_name
from e31.protocol.messages import (
    BY_JOB,
    MAX_SET,
    REGISTRY,
    AnyMessage,
    Assign,
    Bid,
    BidItem,
    BlobChunk,
    Capacity,
    Contact,
    Decline,
    Offer,
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


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("expires", True),  # bool is not an int
        ("expires", -1),
        ("expires", 2**64),
        ("expires", 1.0),
        ("nonce", b"x" * 15),
        ("nonce", bytearray(16)),
        ("nonce", "x" * 16),
        ("sender", ME.raw),  # raw bytes where a NodeId is expected
        ("network", ""),
        ("network", "Main"),
        ("network", "x" * 33),
        ("network", "a\x00"),
    ],
)
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


@pytest.mark.parametrize(
    "name", ["", "/abs", "a/", "a//b", ".", "..", "../x", "a/../b", "a/./b", "x/..", "a\\b", "a\nb", "a\x7fb"]
)
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
    offer = _sample("offer")
    man = offer.manifests[0]
    assert man.job_id == sha256(GEN.pack(man.to_wire()))
    later = dataclasses.replace(offer, expires=offer.expires + 1)
    assert [m.job_id for m in later.manifests] == [m.job_id for m in offer.manifests]
    alone = Offer(offer.network, offer.expires, offer.submitter, (man,))
    assert alone.manifest(man.job_id) == man
    assert _manifest(nonce=b"\xff" * 16).job_id != man.job_id


def test_decoded_offers_name_each_job_by_the_hash_of_its_manifest() -> None:
    """However a decoder finds a job id (it orders the set by them), it is the hash of the manifest."""
    offer = _sample("offer")
    wire = unpack_canonical(GEN.pack(offer.to_wire()))
    expected = [sha256(GEN.pack(m.to_wire())) for m in offer.manifests]
    for decoded in (Offer.from_wire(wire), Offer.from_wire_reference(wire)):
        assert [m.job_id for m in decoded.manifests] == expected
        changed = dataclasses.replace(decoded.manifests[0], retention_ms=1)
        assert changed.job_id == sha256(GEN.pack(changed.to_wire())) != expected[0]


def _sample(name: str) -> Any:
    return next(m for n, _, m in SAMPLES if n == name)


def _manifests(count: int) -> list[JobManifest]:
    """`count` distinct jobs of the sample submitter, in job-id order."""
    return sorted((_manifest(nonce=i.to_bytes(16, "big")) for i in range(count)), key=BY_JOB)


def _items(count: int) -> list[BidItem]:
    return sorted((BidItem(sha256(b"%d" % i), 10, 20 + i) for i in range(count)), key=BY_JOB)


def test_offer_holds_one_to_max_set_jobs_in_job_id_order() -> None:
    submitter = _manifest().submitter
    mans = _manifests(MAX_SET + 1)
    assert len(Offer("net", 1, submitter, tuple(mans[:MAX_SET])).manifests) == MAX_SET
    assert Offer("net", 1, submitter, (mans[0],)).manifests == (mans[0],)
    with pytest.raises(InvalidMessage, match=rf"Offer\.manifests: {MAX_SET + 1} items"):
        Offer("net", 1, submitter, tuple(mans))
    with pytest.raises(InvalidMessage, match=r"Offer\.manifests: 0 items"):
        Offer("net", 1, submitter, ())
    with pytest.raises(InvalidMessage, match=r"Offer\.manifests: \[1\]: items must be sorted and unique"):
        Offer("net", 1, submitter, (mans[1], mans[0]))
    with pytest.raises(InvalidMessage, match=r"Offer\.manifests: \[1\]: items must be sorted and unique"):
        Offer("net", 1, submitter, (mans[0], mans[0]))


def test_every_job_of_an_offer_is_the_issuers() -> None:
    mine, theirs = _manifest(), _manifest(submitter=ME)
    offer = Offer("net", 1, ME, (theirs,))
    assert offer.issuer == ME
    with pytest.raises(InvalidMessage, match="another submitter"):
        Offer("net", 1, mine.submitter, tuple(sorted((mine, theirs), key=BY_JOB)))
    with pytest.raises(InvalidMessage, match="another submitter"):
        Offer("net", 1, ME, (mine,))
    with pytest.raises(InvalidMessage, match="another submitter"):  # the decoder runs the same rule
        Offer.from_wire(("net", 1, ME.raw, (mine.to_wire(),)))


def test_offer_finds_its_jobs_by_id() -> None:
    mans = _manifests(5)
    offer = Offer("net", 1, mans[0].submitter, tuple(mans))
    for man in mans:
        assert offer.manifest(man.job_id) is man
    assert offer.manifest(_manifest(nonce=b"\xee" * 16).job_id) is None
    assert offer.manifest(D) is None


def test_bid_items_and_their_lookup() -> None:
    items = _items(MAX_SET + 1)
    bid = Bid("net", D, ME, 1, tuple(items[:MAX_SET]))
    assert all(bid.item(item.job_id) is item for item in items[:MAX_SET])
    assert bid.item(items[MAX_SET].job_id) is None
    assert BidItem(D, 5, 5).expected_finish == 5  # a job expected to take no time
    with pytest.raises(InvalidMessage, match="BidItem: expected_finish is before expected_start"):
        BidItem(D, 10, 9)
    with pytest.raises(InvalidMessage, match=rf"Bid\.items: {MAX_SET + 1} items"):
        Bid("net", D, ME, 1, tuple(items))
    with pytest.raises(InvalidMessage, match=r"Bid\.items: 0 items"):
        Bid("net", D, ME, 1, ())
    with pytest.raises(InvalidMessage, match="sorted and unique"):
        Bid("net", D, ME, 1, (items[1], items[0]))
    with pytest.raises(InvalidMessage, match="sorted and unique"):  # one job twice, even on other terms
        Bid("net", D, ME, 1, (items[0], dataclasses.replace(items[0], expected_finish=99)))


def test_a_decline_names_one_to_max_set_jobs_in_order() -> None:
    ids = sorted((sha256(b"%d" % i) for i in range(MAX_SET + 1)), key=lambda d: d.raw)
    assert Decline("net", tuple(ids[:MAX_SET]), D, ME, 1, "busy", "").job_ids == tuple(ids[:MAX_SET])
    for bad in ((), tuple(ids), (ids[1], ids[0]), (ids[0], ids[0])):
        with pytest.raises(InvalidMessage, match=r"Decline\.job_ids"):
            Decline("net", bad, D, ME, 1, "busy", "")


def test_the_sample_bid_and_decline_answer_the_sample_offer() -> None:
    offer, bid, decline = _sample("offer"), _sample("bid"), _sample("decline")
    env = verify(GEN.sign_message(offer, GEN.key("submitter")))
    assert len(offer.manifests) == 2 and bid.offer_id == env.message_id == decline.offer_id
    assert [i.job_id for i in bid.items] == [m.job_id for m in offer.manifests] == list(decline.job_ids)


@pytest.mark.parametrize(
    "addr", ["192.0.2.1:7531", "node.example:1", "[::1]:65535", "[2001:db8::1]:80", "h:1"]
)
def test_good_addresses(addr: str) -> None:
    assert check_address(addr) is None


@pytest.mark.parametrize(
    "addr",
    ["192.0.2.1", ":80", "h:0", "h:65536", "h:08", "::1:80", "[::1:80", "[]:1", "a b:1", "h:+1", "h:１"],
)
def test_bad_addresses(addr: str) -> None:
    assert check_address(addr) is not None
    with pytest.raises(InvalidMessage):
        Contact("net", ME, (addr,), 1)


def test_contact_needs_an_address() -> None:
    with pytest.raises(InvalidMessage):
        Contact("net", ME, (), 1)


def test_relations_between_fields() -> None:
    with pytest.raises(InvalidMessage, match="expected_finish"):
        Bid("net", D, ME, 1, (BidItem(D, 10, 9),))
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


@pytest.mark.parametrize(
    ("status", "exit_code", "trap", "ok"),
    [
        ("exited", 0, None, True),
        ("exited", None, None, False),
        ("trap", None, "unreachable", True),
        ("trap", None, None, False),
        ("timeout", 1, None, False),
        ("out_of_fuel", None, None, True),
        ("crashed", None, None, False),
    ],
)
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
            Ping.from_wire((*wire[:i], bad, *wire[i + 1 :]))
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
