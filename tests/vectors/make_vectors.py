"""Regenerate the golden wire vectors: `python tests/vectors/make_vectors.py` writes envelopes.json.

Every valid vector holds the seed that signed it, the complete envelope (hex), its signer and
message id, and the decoded fields in the JSON form `e31 inspect` prints; the tests rebuild each
envelope from seed and fields and must get the same bytes. Invalid vectors (`"valid": false`)
name the ProtocolError subclass a conforming decoder raises. Ed25519 signatures are
deterministic, so running this script twice gives the same file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import struct
import sys
from pathlib import Path
from typing import Any

import nacl.signing
from e31.protocol.blobs import PUSH_MAX, BlobRef, chunk_list
from e31.protocol.codec import pack
from e31.protocol.envelope import message_id, node_id_of, sign, sign_message, verify
from e31.protocol.ids import Digest, NodeId, sha256
from e31.protocol.jobs import EnvVar, FileRef, JobManifest, Limits
from e31.protocol.merkle import MerkleLog
from e31.protocol.messages import (
    BY_ENTRY,
    BY_JOB,
    MAX_PUSHED,
    MAX_RESULTS,
    MAX_SET,
    Accepted,
    Ack,
    Assign,
    Award,
    Bid,
    BidItem,
    BlobChunk,
    BlobRequest,
    Cancel,
    Capacity,
    Contact,
    Decline,
    InclusionProof,
    Offer,
    Peers,
    Ping,
    Pong,
    ProofEntry,
    ProofRequest,
    Release,
    Result,
    ResultEntry,
    Results,
    TreeHead,
    UsageReceipt,
)
from e31.protocol.receipts import Meter, Outcome
from e31.protocol.schema import BY_RAW, Message

OUT = Path(__file__).with_name("envelopes.json")
NET = "e31-test"
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z in ms


def seed(name: str) -> bytes:
    return hashlib.sha256(b"e31 vector key " + name.encode()).digest()


def key(name: str) -> nacl.signing.SigningKey:
    return nacl.signing.SigningKey(seed(name))


def nid(name: str) -> NodeId:
    return node_id_of(key(name))


def blob(text: bytes) -> BlobRef:
    return chunk_list(text).ref


def digest(label: str) -> Digest:
    return sha256(label.encode())


PROFILE = digest("profile: wasmtime 50.0.1 x86_64 fuel")
LIMITS = Limits(fuel=5_000_000_000, memory_bytes=256 << 20, wall_ms=600_000, max_output_bytes=64 << 20)


def manifest(**changes: Any) -> JobManifest:
    fields: dict[str, Any] = dict(
        module=blob(b"\x00asm\x01\x00\x00\x00 example module"),
        inputs=(FileRef("data/points.csv", blob(b"1,2\n3,4\n")), FileRef("params.txt", blob(b"n=3\n"))),
        args=("kmeans", "--k", "3", "data/points.csv"),
        env=(EnvVar("LANG", "C.UTF-8"), EnvVar("SEED", "42")),
        stdin=None,
        limits=LIMITS,
        deadline=T0 + 86_400_000,
        retention_ms=7 * 86_400_000,
        replicas=1,
        profile=PROFILE,
        submitter=nid("submitter"),
        nonce=bytes(range(16)),
        created_at=T0,
    )
    fields.update(changes)
    return JobManifest(**fields)


def samples() -> list[tuple[str, str, Message]]:
    """(vector name, key name, message) for every kind, several for the richer ones."""
    man = manifest()
    second = manifest(args=("kmeans", "--k", "4", "data/points.csv"), nonce=bytes(range(16, 32)))
    offer = Offer(NET, T0 + 300_000, nid("submitter"), tuple(sorted((man, second), key=BY_JOB)))
    offer_env = sign_message(offer, key("submitter"))
    offer_id = verify(offer_env).message_id
    items = (BidItem(man.job_id, T0 + 5_000, T0 + 65_000), BidItem(second.job_id, T0 + 65_000, T0 + 125_000))
    bid = Bid(NET, offer_id, nid("executor"), T0 + 60_000, tuple(sorted(items, key=BY_JOB)))
    bid_id = verify(sign_message(bid, key("executor"))).message_id
    assign = Assign(NET, man.job_id, bid_id, nid("submitter"), nid("executor"), 1, T0 + 700_000)
    assignment_id = verify(sign_message(assign, key("submitter"))).message_id
    receipt = UsageReceipt(
        network=NET,
        job_id=man.job_id,
        assignment_id=assignment_id,
        submitter=nid("submitter"),
        executor=nid("executor"),
        module=man.module,
        inputs=man.inputs,
        stdin=man.stdin,
        stdout=blob(b"centroids: (1,2) (3,4)\n"),
        stderr=blob(b""),
        outputs=(FileRef("out/centroids.json", blob(b"[[1,2],[3,4]]")),),
        profile=PROFILE,
        limits=LIMITS,
        outcome=Outcome("exited", 0, None),
        fuel_used=123_456_789,
        peak_memory=3 << 20,
        compute_ms=1_234,
        queued_at=T0 + 10_000,
        started_at=T0 + 70_000,
        finished_at=T0 + 71_300,
    )
    trap = dataclasses.replace(
        receipt, outcome=Outcome("trap", None, "unreachable"), outputs=(), fuel_used=77
    )
    receipt_raw = sign_message(receipt, key("executor"))
    receipt_id = verify(receipt_raw).message_id
    trap_id = verify(sign_message(trap, key("executor"))).message_id
    contact = Contact(NET, nid("executor"), ("127.0.0.1:7531", "[::1]:7531"), T0 + 3_600_000)
    contact_env = sign_message(contact, key("executor"))
    chunks = chunk_list(b"x" * 1000)
    return [
        ("ping", "executor", Ping(NET, nid("executor"), b"\x01" * 16, T0 + 30_000)),
        ("pong", "submitter", Pong(NET, nid("submitter"), b"\x01" * 16, T0 + 30_000)),
        ("contact", "executor", contact),
        ("peers", "submitter", Peers(NET, nid("submitter"), (contact_env,), T0 + 60_000)),
        ("peers-empty", "submitter", Peers(NET, nid("submitter"), (), T0 + 60_000)),
        (
            "capacity",
            "executor",
            Capacity(
                NET,
                nid("executor"),
                T0 + 120_000,
                8,
                16 << 30,
                tuple(sorted((PROFILE, digest("profile: other")), key=lambda d: d.raw)),
                2,
                900_000_000,
            ),
        ),
        ("offer", "submitter", offer),
        (
            "offer-one-job-stdin-no-inputs",
            "submitter",
            Offer(
                NET,
                T0 + 300_001,
                nid("submitter"),
                (manifest(inputs=(), env=(), args=(), stdin=blob(b"stdin bytes"), replicas=3),),
            ),
        ),
        ("bid", "executor", bid),
        (
            "bid-holding-blobs",
            "executor",
            dataclasses.replace(
                bid, held=tuple(sorted((man.module.root, man.inputs[0].blob.root), key=lambda d: d.raw))
            ),
        ),
        (
            "decline",
            "arm-executor",
            Decline(
                NET,
                tuple(sorted((man.job_id, second.job_id), key=BY_RAW)),
                offer_id,
                nid("arm-executor"),
                T0 + 60_000,
                "no_profile",
                "this node runs only aarch64 profiles",
            ),
        ),
        ("assign", "submitter", assign),
        # the submitter gave this bidder one of its bid's two jobs (the other went elsewhere), or none
        ("award", "submitter", Award(NET, bid_id, nid("submitter"), nid("executor"), (man.job_id,))),
        ("award-none", "submitter", Award(NET, bid_id, nid("submitter"), nid("executor"), ())),
        ("blobreq-list", "executor", BlobRequest(NET, nid("executor"), man.module.root, None, T0 + 30_000)),
        ("blobreq-chunk", "executor", BlobRequest(NET, nid("executor"), man.module.root, 0, T0 + 30_000)),
        (
            "blobchunk-list",
            "submitter",
            BlobChunk(NET, nid("submitter"), chunks.root, None, chunks.to_bytes()),
        ),
        ("blobchunk", "submitter", BlobChunk(NET, nid("submitter"), chunks.root, 0, b"x" * 1000)),
        (
            "result",
            "executor",
            Result(
                NET,
                man.job_id,
                assignment_id,
                nid("executor"),
                receipt_raw,
                T0 + 7 * 86_400_000,
                (b"[[1,2],[3,4]]",),
            ),
        ),
        (
            "result-no-outputs",
            "executor",
            Result(NET, man.job_id, assignment_id, nid("executor"), receipt_raw, T0 + 7 * 86_400_000, ()),
        ),
        ("receipt", "executor", receipt),
        ("receipt-trap", "executor", trap),
        (
            "receipt-timeout",
            "executor",
            dataclasses.replace(receipt, outcome=Outcome("timeout", None, None), fuel_used=LIMITS.fuel),
        ),
        # version 2: the meter (paused while holding its core; fetching its inputs), neither billed
        ("receipt-metered", "executor", dataclasses.replace(receipt, meter=Meter(600, 2_500))),
        ("accepted", "executor", Accepted(NET, man.job_id, assignment_id, nid("executor"))),
        (
            "release",
            "executor",
            Release(
                NET,
                man.job_id,
                assignment_id,
                nid("executor"),
                "unknown",
                "no bid or job here for that assignment",
            ),
        ),
        (
            "release-deadline",
            "executor",
            Release(
                NET,
                man.job_id,
                assignment_id,
                nid("executor"),
                "deadline",
                "its deadline passed before it could start here: it was never started",
            ),
        ),
        ("ack", "submitter", Ack(NET, nid("submitter"), nid("executor"), T0 + 80_000, (receipt_id,))),
        (
            "ack-two-receipts",
            "submitter",
            Ack(
                NET,
                nid("submitter"),
                nid("executor"),
                T0 + 80_000,
                tuple(sorted((receipt_id, trap_id), key=BY_RAW)),
            ),
        ),
        ("cancel", "submitter", Cancel(NET, man.job_id, nid("submitter"), T0 + 60_000, "withdrawn", "")),
        ("treehead", "executor", TreeHead(NET, nid("executor"), 42, digest("root"), T0 + 90_000)),
        (
            "proofreq",
            "submitter",
            ProofRequest(NET, nid("submitter"), nid("executor"), receipt_id, T0 + 120_000),
        ),
        ("proof", "executor", inclusion_proof(receipt)),
        ("proof-two-receipts", "executor", inclusion_proof(receipt, trap)),
    ]


def relay_samples() -> list[tuple[str, str, Message]]:
    """Reachability and relays (docs/protocol.md section 17): a behind NAT, r a relay, b a target."""
    from e31.protocol.relay import (
        Circuit,
        Dialback,
        Dialed,
        Observed,
        RelayClose,
        RelayCredit,
        RelayData,
        Reserve,
        Reserved,
        Via,
    )

    circuit = bytes(range(0x40, 0x50))
    nonce = bytes(range(0x60, 0x70))
    return [
        ("observed", "relay", Observed(NET, nid("relay"), "127.0.0.7:40312", True, T0 + 60_000)),
        ("observed-v6", "relay", Observed(NET, nid("relay"), "[2001:db8::7]:7531", False, T0 + 60_000)),
        ("dialback", "behindnat", Dialback(NET, nid("behindnat"), 7531, nonce, T0 + 60_000)),
        (
            "dialed",
            "relay",
            Dialed(NET, nid("relay"), nonce, "127.0.0.7:7531", False, False, T0 + 60_000),
        ),
        ("reserve", "behindnat", Reserve(NET, nid("behindnat"), T0 + 60_000)),
        ("reserved", "relay", Reserved(NET, nid("relay"), nid("behindnat"), T0 + 600_000, "")),
        ("reserved-refused", "relay", Reserved(NET, nid("relay"), nid("behindnat"), T0 + 60_000, "limit")),
        (
            "circuit",
            "submitter",
            Circuit(NET, nid("submitter"), circuit, nid("submitter"), nid("behindnat"), T0 + 60_000),
        ),
        ("relaydata", "relay", RelayData(NET, nid("relay"), circuit, b"\x00\x00\x00\x60" + bytes(96))),
        ("relaycredit", "relay", RelayCredit(NET, nid("relay"), circuit, 1 << 20)),
        (
            "relayclose",
            "relay",
            RelayClose(NET, nid("relay"), circuit, "no_reservation", "the target holds no reservation"),
        ),
        (
            "via",
            "behindnat",
            Via(
                NET, nid("behindnat"), tuple(sorted((nid("relay"), nid("relay2")), key=BY_RAW)), T0 + 600_000
            ),
        ),
    ]


def sample(name: str) -> Message:
    return next(m for n, _, m in samples() if n == name)


def inclusion_proof(*receipts: UsageReceipt) -> InclusionProof:
    """The proof placing receipts that are leaves 1, 2... of a log whose leaf 0 is another entry, against
    that log's signed head."""
    log = MerkleLog()
    log.append(b"an earlier receipt envelope")
    placed = []
    for receipt in receipts:
        raw = sign_message(receipt, key("executor"))
        placed.append((verify(raw).message_id, log.append(raw)))
    head = sign_message(
        TreeHead(NET, nid("executor"), log.size, Digest(log.root()), T0 + 95_000), key("executor")
    )
    entries = sorted(
        (
            ProofEntry(rid, index, tuple(Digest(h) for h in log.inclusion_proof(index)))
            for rid, index in placed
        ),
        key=lambda e: e.receipt_id.raw,
    )
    return InclusionProof(NET, nid("executor"), log.size, head, tuple(entries))


def _env(version: bytes, kind: str, body: bytes, signer: bytes, sig: bytes) -> bytes:
    return b"\x95" + version + pack(kind) + pack(body) + pack(signer) + pack(sig)


def _resign(kind: str, body: bytes, k: nacl.signing.SigningKey) -> bytes:
    return sign(kind, body, k)


def invalid() -> list[dict[str, Any]]:
    """Envelopes a decoder must refuse, each with the error class it must raise.

    The bodies that break a message rule (a receipt whose fuel exceeds its limit, offers, bids and
    declines whose sets are out of order, empty or too long...) are signed by the key their kind
    expects, so the signature holds and the failure is the body's."""
    k = key("executor")
    ping = Ping(NET, nid("executor"), b"\x01" * 16, T0 + 30_000)
    good = sign_message(ping, k)
    body = pack(ping.to_wire())
    signer = bytes(k.verify_key)
    sig = k.sign(b"e31/1/ping\x00" + body).signature

    def body_variant(wire: tuple[Any, ...]) -> bytes:
        return _resign("ping", pack(wire), k)

    # an `expires` of 1000 written as uint64 (0xcf) instead of uint16 (0xcd): non-minimal
    wide_body = b"\x94" + b"".join(pack(x) for x in ping.to_wire()[:3]) + b"\xcf" + struct.pack(">Q", 1000)
    flipped = bytearray(good)
    flipped[-1] ^= 0x01
    cases: list[tuple[str, str, bytes]] = [
        ("trailing-byte", "DecodeError", good + b"\x00"),
        ("truncated", "DecodeError", good[:-1]),
        ("empty", "DecodeError", b""),
        ("not-an-array", "DecodeError", pack({"kind": "ping"})),
        ("four-items", "DecodeError", pack((1, "ping", body, signer))),
        ("version-2", "DecodeError", _env(b"\x02", "ping", body, signer, sig)),
        ("version-true", "DecodeError", _env(b"\xc3", "ping", body, signer, sig)),
        ("version-uint8", "NonCanonical", _env(b"\xcc\x01", "ping", body, signer, sig)),
        (
            "body-bin16",
            "NonCanonical",
            b"\x95\x01"
            + pack("ping")
            + b"\xc5"
            + struct.pack(">H", len(body))
            + body
            + pack(signer)
            + pack(sig),
        ),
        ("kind-str8", "NonCanonical", b"\x95\x01\xd9\x04ping" + pack(body) + pack(signer) + pack(sig)),
        ("body-is-str", "DecodeError", _env(b"\x01", "ping", body.decode("latin-1"), signer, sig)),
        ("unknown-kind", "UnknownKind", _resign("pingx", body, k)),
        ("signer-31-bytes", "DecodeError", _env(b"\x01", "ping", body, signer[:31], sig)),
        ("signature-63-bytes", "DecodeError", _env(b"\x01", "ping", body, signer, sig[:63])),
        ("bad-signature", "BadSignature", bytes(flipped)),
        ("signed-by-other", "BadSignature", _resign("ping", body, key("submitter"))),
        ("body-non-minimal-uint", "NonCanonical", _resign("ping", wide_body, k)),
        ("body-trailing-byte", "DecodeError", _resign("ping", body + b"\xc0", k)),
        ("body-bool-for-int", "InvalidMessage", body_variant((NET, signer, b"\x01" * 16, True))),
        ("body-negative-expiry", "InvalidMessage", body_variant((NET, signer, b"\x01" * 16, -1))),
        ("body-float-expiry", "InvalidMessage", body_variant((NET, signer, b"\x01" * 16, 1.5))),
        ("body-short-nonce", "InvalidMessage", body_variant((NET, signer, b"\x01" * 15, T0))),
        ("body-extra-field", "InvalidMessage", body_variant((NET, signer, b"\x01" * 16, T0, 0))),
        ("body-map", "InvalidMessage", body_variant({"network": NET})),
        ("body-bad-network", "InvalidMessage", body_variant(("E31 Test", signer, b"\x01" * 16, T0))),
    ]
    # The kind each envelope claims and the key that signed it (most are a ping by "executor").
    claims = {"unknown-kind": ("pingx", "executor"), "signed-by-other": ("ping", "submitter")}

    def signed(name: str, kind: str, key_name: str, wire: tuple[Any, ...]) -> None:
        """A body that breaks a rule, under a valid signature by the key its kind expects."""
        cases.append((name, "InvalidMessage", _resign(kind, pack(wire), key(key_name))))
        claims[name] = (kind, key_name)

    rw = list(sample("receipt").to_wire())
    rw[14] = LIMITS.fuel + 1
    signed("receipt-fuel-over-limit", "receipt", "executor", tuple(rw))
    mw2 = sample("receipt-metered").to_wire()
    signed("receipt-meter-nil", "receipt", "executor", (*mw2[:20], None))  # version 1 is 20 fields
    signed("receipt-meter-and-more", "receipt", "executor", (*mw2, 0))
    signed("receipt-paused-past-run", "receipt", "executor", (*mw2[:20], (1_301, 0)))  # ran 1,300 ms
    # Offers: a manifest that breaks its own rules, then the set's rules.
    ow = sample("offer").to_wire()
    first, second = ow[3]

    def offer(*manifests: tuple[Any, ...]) -> tuple[Any, ...]:
        return (*ow[:3], manifests)

    mw = list(first)
    mw[1] = tuple(reversed(mw[1]))
    signed("offer-unsorted-inputs", "offer", "submitter", offer(tuple(mw)))
    mw[1] = (("../etc/passwd", mw[1][0][1]),)
    signed("offer-input-dotdot", "offer", "submitter", offer(tuple(mw)))
    signed("offer-manifests-unsorted", "offer", "submitter", offer(second, first))
    signed("offer-manifest-twice", "offer", "submitter", offer(first, first))
    signed("offer-no-manifests", "offer", "submitter", offer())
    stranger = manifest(submitter=nid("stranger")).to_wire()
    signed(
        "offer-manifest-of-another-submitter",
        "offer",
        "submitter",
        offer(*sorted((first, stranger), key=lambda m: sha256(pack(m)).raw)),
    )
    # Bids and declines.
    bw = sample("bid").to_wire()
    one, two = bw[4]
    signed("bid-finish-before-start", "bid", "executor", (*bw[:4], ((one[0], one[2], one[1]), two), ()))
    signed("bid-no-items", "bid", "executor", (*bw[:4], (), ()))
    signed("bid-items-unsorted", "bid", "executor", (*bw[:4], (two, one), ()))
    too_many = tuple(sorted((digest(f"job {i}").raw, T0, T0 + 1) for i in range(MAX_SET + 1)))
    signed(f"bid-{MAX_SET + 1}-items", "bid", "executor", (*bw[:4], too_many, ()))
    held = sample("bid-holding-blobs").to_wire()[5]
    signed("bid-held-unsorted", "bid", "executor", (*bw[:5], tuple(reversed(held))))
    signed("bid-held-twice", "bid", "executor", (*bw[:5], (held[0], held[0])))
    signed("bid-without-held", "bid", "executor", bw[:5])
    pw = sample("proof-two-receipts").to_wire()
    signed("proof-entries-unsorted", "proof", "executor", (*pw[:4], tuple(reversed(pw[4]))))
    signed("proof-no-entries", "proof", "executor", (*pw[:4], ()))
    aw = sample("ack-two-receipts").to_wire()
    signed("ack-receipts-unsorted", "ack", "submitter", (*aw[:4], tuple(reversed(aw[4]))))
    signed("ack-no-receipts", "ack", "submitter", (*aw[:4], ()))
    signed("proof-leaf-beyond-tree-size", "proof", "executor", (pw[0], pw[1], 2, *pw[3:]))
    res = sample("result").to_wire()
    signed("result-output-over-push-max", "result", "executor", (*res[:6], (b"x" * (PUSH_MAX + 1),)))
    signed("result-empty-output", "result", "executor", (*res[:6], (b"",)))
    signed(
        f"result-{MAX_PUSHED + 1}-outputs",
        "result",
        "executor",
        (*res[:6], tuple(bytes([i]) for i in range(MAX_PUSHED + 1))),
    )
    signed("result-no-receipt", "result", "executor", (*res[:4], b"", *res[5:]))
    dw = sample("decline").to_wire()
    signed("decline-job-ids-unsorted", "decline", "arm-executor", (dw[0], tuple(reversed(dw[1])), *dw[2:]))
    signed("decline-no-job-ids", "decline", "arm-executor", (dw[0], (), *dw[2:]))
    out = []
    for name, error, data in cases:
        kind, key_name = claims.get(name, ("ping", "executor"))
        out.append(
            {
                "name": name,
                "valid": False,
                "kind": kind,
                "seed": seed(key_name).hex(),
                "error": error,
                "envelope": data.hex(),
            }
        )
    return out


def results_samples() -> list[tuple[str, str, Message]]:
    """`results` carriers (issue 24): the sample `result` with a second job's, and a carrier whose
    second entry holds a receipt signed by another key (the carrier is sound; that entry is refused
    alone)."""
    res = sample("result")
    assert isinstance(res, Result)
    first = ResultEntry(res.job_id, res.assignment_id, res.receipt, res.available_until, res.outputs)
    receipt = sample("receipt")
    assert isinstance(receipt, UsageReceipt)
    other = manifest(args=("kmeans", "--k", "4", "data/points.csv"), nonce=bytes(range(16, 32)))
    bid_id = digest("results: bid")
    assign = Assign(NET, other.job_id, bid_id, nid("submitter"), nid("executor"), 2, T0 + 700_000)
    assignment_id = verify(sign_message(assign, key("submitter"))).message_id
    second = dataclasses.replace(
        receipt, job_id=other.job_id, assignment_id=assignment_id, outputs=(), stdout=blob(b"4 clusters\n")
    )
    entry = ResultEntry(
        other.job_id, assignment_id, sign_message(second, key("executor")), T0 + 7 * 86_400_000, ()
    )
    forged = dataclasses.replace(
        entry, receipt=sign_message(dataclasses.replace(second, executor=nid("stranger")), key("stranger"))
    )
    return [
        ("results", "executor", Results(NET, nid("executor"), tuple(sorted((first, entry), key=BY_ENTRY)))),
        ("results-one-entry", "executor", Results(NET, nid("executor"), (first,))),
        (
            "results-entry-receipt-of-another-signer",
            "executor",
            Results(NET, nid("executor"), tuple(sorted((first, forged), key=BY_ENTRY))),
        ),
    ]


def results_invalid() -> list[dict[str, Any]]:
    """`results` carriers a decoder must refuse whole (InvalidMessage), signed by the executor."""
    rw = next(m for n, _, m in results_samples() if n == "results").to_wire()
    one, two = rw[2]
    many = tuple((digest(f"results: assignment {i}").raw, *one[1:]) for i in range(MAX_RESULTS + 1))
    cases = [
        ("results-no-entries", (*rw[:2], ())),
        ("results-entries-unsorted", (*rw[:2], (two, one))),
        ("results-entry-twice", (*rw[:2], (one, one))),
        (f"results-{MAX_RESULTS + 1}-entries", (*rw[:2], tuple(sorted(many)))),
        ("results-entry-no-receipt", (*rw[:2], ((*one[:2], b"", *one[3:]),))),
        ("results-entry-output-over-push-max", (*rw[:2], ((*one[:4], (b"x" * (PUSH_MAX + 1),)),))),
        ("results-no-executor", (rw[0], rw[2])),
    ]
    return [
        {
            "name": name,
            "valid": False,
            "kind": "results",
            "seed": seed("executor").hex(),
            "error": "InvalidMessage",
            "envelope": _resign("results", pack(wire), key("executor")).hex(),
        }
        for name, wire in cases
    ]


def withdraw_samples() -> list[tuple[str, str, Message]]:
    """`withdraw` (issue 19: the submitter re-plans a job whose executor fell behind its promise): the
    submitter takes the sample assignment back, and the executor's `release` (reason `withdrawn`)."""
    from e31.protocol.messages import Withdraw

    assign = sample("assign")
    assert isinstance(assign, Assign)
    assignment_id = verify(sign_message(assign, key("submitter"))).message_id
    text = "no result 1500 ms past its promised finish: offered elsewhere"
    return [
        (
            "withdraw",
            "submitter",
            Withdraw(NET, assign.job_id, assignment_id, nid("submitter"), assign.lease_expires, text),
        ),
        (
            "withdraw-no-text",
            "submitter",
            Withdraw(NET, assign.job_id, assignment_id, nid("submitter"), T0, ""),
        ),
        (
            "release-withdrawn",
            "executor",
            Release(
                NET,
                assign.job_id,
                assignment_id,
                nid("executor"),
                "withdrawn",
                "withdrawn by its submitter before it started here: it was never started",
            ),
        ),
    ]


def withdraw_invalid() -> list[dict[str, Any]]:
    """`withdraw` and `release` bodies a decoder must refuse (InvalidMessage), each signed by the key its
    kind expects, and a withdraw signed by a key other than the submitter it names (BadSignature)."""
    ww = next(m for n, _, m in withdraw_samples() if n == "withdraw").to_wire()
    rw = next(m for n, _, m in withdraw_samples() if n == "release-withdrawn").to_wire()
    cases = [
        ("withdraw-short-assignment-id", "withdraw", "submitter", (*ww[:2], ww[2][:31], *ww[3:])),
        ("withdraw-no-expires", "withdraw", "submitter", (*ww[:4], ww[5])),
        ("withdraw-text-too-long", "withdraw", "submitter", (*ww[:5], "x" * 257)),
        ("withdraw-with-a-reason", "withdraw", "submitter", (*ww[:5], "withdrawn", ww[5])),
        ("release-reason-withdraw", "release", "executor", (*rw[:4], "withdraw", rw[5])),
    ]
    out = [
        {
            "name": name,
            "valid": False,
            "kind": kind,
            "seed": seed(key_name).hex(),
            "error": "InvalidMessage",
            "envelope": _resign(kind, pack(wire), key(key_name)).hex(),
        }
        for name, kind, key_name, wire in cases
    ]
    out.append(
        {
            "name": "withdraw-signed-by-the-executor",
            "valid": False,
            "kind": "withdraw",
            "seed": seed("executor").hex(),
            "error": "BadSignature",
            "envelope": _resign("withdraw", pack(ww), key("executor")).hex(),
        }
    )
    return out


def build() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for name, key_name, msg in samples() + relay_samples() + results_samples() + withdraw_samples():
        data = sign_message(msg, key(key_name))
        env = verify(data)
        assert env.message_id == message_id(env.kind, env.body, env.signer)
        out.append(
            {
                "name": name,
                "valid": True,
                "kind": msg.KIND,
                "seed": seed(key_name).hex(),
                "signer": str(env.signer),
                "message_id": env.message_id.hex(),
                "envelope": data.hex(),
                "fields": msg.to_json(),
            }
        )
    return out + invalid() + results_invalid() + withdraw_invalid()


def render() -> str:
    return json.dumps(build(), indent=1) + "\n"


def main() -> int:
    OUT.write_text(render())
    print(f"wrote {OUT} ({len(build())} vectors)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
