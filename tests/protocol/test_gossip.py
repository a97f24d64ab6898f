"""The pure gossip decisions: validation order, seen-cache, fan-out, rate limits, scores, bans."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import e31.protocol.gossip as gossip
import nacl.signing
import pytest
from e31.protocol.blobs import BlobRef
from e31.protocol.codec import pack, unpack
from e31.protocol.envelope import node_id_of, sign, sign_message, verify
from e31.protocol.errors import DecodeError, LocalProtocolError, NonCanonical, ProtocolError, UnknownKind
from e31.protocol.gossip import (
    Action,
    Deliver,
    Disconnect,
    Drop,
    Forward,
    GossipConfig,
    GossipEngine,
    Penalise,
    Reason,
    peek,
)
from e31.protocol.gossip_limits import Score, TokenBucket
from e31.protocol.ids import NodeId, sha256
from e31.protocol.jobs import FileRef, JobManifest, Limits
from e31.protocol.messages import BY_JOB, MAX_SET, Capacity, Offer, Ping
from hypothesis import given
from hypothesis import strategies as st

NET = "testnet"
T0 = 1_800_000_000_000
PROFILE = sha256(b"profile")


def key(n: int) -> nacl.signing.SigningKey:
    return nacl.signing.SigningKey(sha256(b"gossip test key %d" % n).raw)


def capacity(
    k: nacl.signing.SigningKey, *, n: int = 0, expires: int = T0 + 60_000, network: str = NET
) -> bytes:
    return sign_message(Capacity(network, node_id_of(k), expires, 4, 1 << 30, (PROFILE,), n, 1000), k)


def engine(peers: int = 10, **changes: Any) -> GossipEngine[str]:
    e = GossipEngine[str](GossipConfig(NET, **changes))
    for i in range(peers):
        assert e.add_peer(f"p{i}", T0)
    return e


def kinds(actions: list[Action[str]]) -> list[str]:
    return [type(a).__name__ for a in actions]


def forwards(actions: list[Action[str]]) -> list[str]:
    return [a.peer for a in actions if isinstance(a, Forward)]


def reasons(actions: list[Action[str]]) -> list[Reason]:
    return [a.reason for a in actions if isinstance(a, Drop)]


RNG = random.Random(7)


# -- configuration --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes",
    [
        {"kinds": {"nosuchkind": 100}},
        {"kinds": {"treehead": 1000}},  # no expiry: cannot be gossiped
        {"kinds": {"capacity": 0}},
        {"kinds": {}},
        {"fanout": 0},
        {"publish_fanout": 0},
        {"peer_rate": 0},
        {"peer_burst": 0.5},
        {"clock_skew_ms": -1},
        {"token_bytes": 0},
        {"disconnect_below": 0},
        {"penalties": {Reason.MALFORMED: -5}},
    ],
)
def test_bad_config_is_a_local_error(changes: dict[str, Any]) -> None:
    with pytest.raises(LocalProtocolError):
        GossipConfig(NET, **changes)


# -- peek: the id before any signature work --------------------------------------------------


def test_peek_gives_the_verified_message_id() -> None:
    raw = capacity(key(1))
    head = peek(raw, gossip.DEFAULT_KINDS)
    assert head.kind == "capacity"
    assert head.message_id == verify(raw).message_id.raw
    assert head.signer == node_id_of(key(1)).raw


def test_peek_ignores_the_signature() -> None:
    raw = bytearray(capacity(key(1)))
    raw[-1] ^= 1
    real = peek(capacity(key(1)), gossip.DEFAULT_KINDS)
    assert peek(bytes(raw), gossip.DEFAULT_KINDS).message_id == real.message_id


def test_peek_refuses_non_canonical_kind_outside_gossip_and_oversize() -> None:
    raw = capacity(key(1))
    version, kind, body, signer, sig = unpack(raw)
    longer = b"\xdc\x00\x05" + pack(version) + pack(kind) + pack(body) + pack(signer) + pack(sig)
    assert unpack(longer) == unpack(raw)
    with pytest.raises(NonCanonical):
        peek(longer, gossip.DEFAULT_KINDS)
    with pytest.raises(UnknownKind, match="not carried"):
        peek(raw, {"offer": 10_000})
    with pytest.raises(DecodeError, match="exceeds"):
        peek(raw, {"capacity": len(raw) - 1, "offer": 10_000})
    with pytest.raises(DecodeError):
        peek(pack((1, "capacity", body, signer[:31], sig)), gossip.DEFAULT_KINDS)
    with pytest.raises(DecodeError):
        peek(pack((2, "capacity", body, signer, sig)), gossip.DEFAULT_KINDS)


# -- a valid message ------------------------------------------------------------------------


def test_new_message_is_delivered_and_forwarded_to_fanout_peers_not_the_sender() -> None:
    e = engine(peers=10)
    raw = capacity(key(1))
    actions = e.receive("p3", raw, T0, random.Random(1))
    assert isinstance(actions[0], Deliver)
    assert actions[0].envelope.message.node == node_id_of(key(1))
    targets = forwards(actions)
    assert len(targets) == 6 and len(set(targets)) == 6 and "p3" not in targets
    assert all(a.raw == raw for a in actions if isinstance(a, Forward))
    assert e.counters["delivered"] == 1 and e.counters["forwarded"] == 6


def test_forwarding_is_deterministic_for_a_seed() -> None:
    raw = capacity(key(1))
    first = forwards(engine().receive("p0", raw, T0, random.Random(99)))
    second = forwards(engine().receive("p0", raw, T0, random.Random(99)))
    assert first == second


def test_with_few_peers_every_other_peer_gets_it() -> None:
    e = engine(peers=4)
    assert sorted(forwards(e.receive("p1", capacity(key(1)), T0, RNG))) == ["p0", "p2", "p3"]


def test_the_signer_is_not_sent_its_own_message_when_peers_are_node_ids() -> None:
    e = GossipEngine[NodeId](GossipConfig(NET))
    ids = [node_id_of(key(i)) for i in range(4)]
    for peer in ids:
        e.add_peer(peer, T0)
    actions: list[Action[NodeId]] = e.receive(ids[0], capacity(key(1)), T0, RNG)
    assert {a.peer for a in actions if isinstance(a, Forward)} == {ids[2], ids[3]}


# -- duplicates ------------------------------------------------------------------------------


def test_a_duplicate_is_dropped_without_signature_work(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def counting_verify(*args: Any, **kw: Any) -> Any:
        calls.append(1)
        return verify(*args, **kw)

    monkeypatch.setattr(gossip, "verify", counting_verify)
    e = engine()
    raw = capacity(key(1))
    e.receive("p0", raw, T0, RNG)
    for peer in ("p1", "p2", "p0"):
        assert e.receive(peer, raw, T0 + 5, RNG) == [Drop(Reason.DUPLICATE, peer)]
    assert len(calls) == 1
    assert e.counters["duplicate"] == 3 and e.counters["delivered"] == 1


def test_a_forged_copy_cannot_shadow_the_real_message() -> None:
    e = engine()
    raw = capacity(key(1))
    forged = bytearray(raw)
    forged[-1] ^= 0x40
    assert reasons(e.receive("p0", bytes(forged), T0, RNG)) == [Reason.BAD_SIGNATURE]
    assert isinstance(e.receive("p1", raw, T0, RNG)[0], Deliver)


# -- validation failures and scores ---------------------------------------------------------


def test_a_bad_signature_disconnects_and_bans_the_peer() -> None:
    e = engine(ban_ms=60_000)
    forged = bytearray(capacity(key(1)))
    forged[-5] ^= 1
    actions = e.receive("p0", bytes(forged), T0, RNG)
    assert kinds(actions) == ["Drop", "Penalise", "Disconnect"]
    assert actions[2] == Disconnect("p0", Reason.BAD_SIGNATURE, T0 + 60_000)
    assert "p0" not in e.peers
    assert e.receive("p0", capacity(key(1)), T0, RNG) == [Drop(Reason.UNKNOWN_PEER, "p0")]
    assert not e.add_peer("p0", T0 + 59_999)
    e.expire(T0 + 60_000)
    assert e.add_peer("p0", T0 + 60_000)
    assert e.score("p0", T0 + 60_000) == 0.0


def test_a_message_signed_by_someone_other_than_its_issuer_is_a_bad_signature() -> None:
    k1, k2 = key(1), key(2)
    body = pack(Capacity(NET, node_id_of(k1), T0 + 60_000, 1, 1, (PROFILE,), 0, 0).to_wire())
    stolen = sign("capacity", body, k2)
    assert reasons(engine().receive("p0", stolen, T0, RNG)) == [Reason.BAD_SIGNATURE]


@pytest.mark.parametrize(
    ("make", "reason", "points"),
    [
        (lambda: capacity(key(1), network="othernet"), Reason.WRONG_NETWORK, 50),
        (lambda: capacity(key(1), expires=T0 - 30_001), Reason.EXPIRED, 10),
        (lambda: capacity(key(1), expires=T0 + 24 * 3_600_000 + 30_001), Reason.TOO_FAR_AHEAD, 10),
        (
            lambda: sign_message(Ping(NET, node_id_of(key(1)), bytes(16), T0 + 1000), key(1)),
            Reason.NOT_GOSSIP,
            1,
        ),
        (lambda: b"\x93\x01\x02\x03", Reason.MALFORMED, 100),
        (lambda: b"\xc1", Reason.MALFORMED, 100),
        (lambda: pack((2, "capacity", b"", bytes(32), bytes(64))), Reason.MALFORMED, 100),
        (lambda: sign("capacity", pack((NET, b"short")), key(1)), Reason.INVALID, 100),
        (lambda: bytes(max(gossip.DEFAULT_KINDS.values()) + 1), Reason.OVERSIZE, 100),
    ],
)
def test_each_invalid_message_costs_the_sender_its_penalty(make: Any, reason: Reason, points: int) -> None:
    e = engine()
    actions = e.receive("p0", make(), T0, RNG)
    assert actions[:2] == [Drop(reason, "p0"), Penalise("p0", reason, -float(points))]
    assert not any(isinstance(a, (Deliver, Forward)) for a in actions)
    assert e.counters[reason.value] == 1


def test_expiry_within_the_clock_skew_is_accepted() -> None:
    actions = engine().receive("p0", capacity(key(1), expires=T0 - 29_000), T0, RNG)
    assert isinstance(actions[0], Deliver)


def test_penalties_add_up_to_a_disconnect_and_decay_with_time() -> None:
    e = engine(score_half_life_ms=1000)
    wrong = [capacity(key(1), n=i, network="othernet") for i in range(3)]
    e.receive("p0", wrong[0], T0, RNG)
    assert e.score("p0", T0) == -50
    assert e.score("p0", T0 + 1000) == pytest.approx(-25)
    e.receive("p0", wrong[1], T0 + 1000, RNG)  # -75: still connected
    assert "p0" in e.peers
    actions = e.receive("p0", wrong[2], T0 + 1000, RNG)  # -125
    assert isinstance(actions[-1], Disconnect)


def test_reconnecting_does_not_reset_a_negative_score() -> None:
    e = engine(score_half_life_ms=1000)
    e.receive("p0", capacity(key(1), network="othernet"), T0, RNG)
    e.remove_peer("p0")
    assert e.add_peer("p0", T0 + 1000)
    assert e.score("p0", T0 + 1000) == pytest.approx(-25)
    e.remove_peer("p1")
    assert e.add_peer("p1", T0) and e.score("p1", T0) == 0.0


def test_other_peers_are_unaffected_by_one_peers_faults() -> None:
    e = engine()
    e.receive("p0", b"\xc1", T0, RNG)
    assert "p0" not in e.peers
    assert isinstance(e.receive("p1", capacity(key(1)), T0, RNG)[0], Deliver)
    assert e.score("p1", T0) == 0.0
    e.receive("p2", capacity(key(1), network="othernet"), T0, RNG)
    assert e.scores(T0) == {f"p{i}": (-50.0 if i == 2 else 0.0) for i in range(1, 10)}


def test_kinds_gossip_does_not_carry_cost_little_but_are_rate_limited() -> None:
    e = engine(peer_burst=1, peer_rate=0.001, duplicate_cost=0.1)
    ping = sign_message(Ping(NET, node_id_of(key(1)), bytes(16), T0 + 1000), key(1))
    got = [reasons(e.receive("p0", ping, T0, RNG)) for _ in range(11)]
    assert got[:10] == [[Reason.NOT_GOSSIP]] * 10 and got[10] == [Reason.FLOODING]
    assert e.score("p0", T0) == -12.0


# -- rate limits -----------------------------------------------------------------------------


def test_a_flooding_peer_is_refused_then_disconnected() -> None:
    e = engine(peer_burst=5, peer_rate=1, sender_burst=1000)
    msgs = [capacity(key(1), n=i) for i in range(60)]
    results = [e.receive("p0", m, T0, RNG) for m in msgs]
    assert all(isinstance(r[0], Deliver) for r in results[:5])
    assert all(reasons(r) == [Reason.FLOODING] for r in results[5:55])
    assert isinstance(results[54][-1], Disconnect)  # 50 x 2 points
    assert "p0" not in e.peers


def test_the_peer_bucket_refills_with_time() -> None:
    e = engine(peer_burst=2, peer_rate=1, sender_burst=1000)
    m = [capacity(key(1), n=i) for i in range(4)]
    e.receive("p0", m[0], T0, RNG)
    e.receive("p0", m[1], T0, RNG)
    assert reasons(e.receive("p0", m[2], T0, RNG)) == [Reason.FLOODING]
    assert isinstance(e.receive("p0", m[3], T0 + 1000, RNG)[0], Deliver)


def test_duplicates_cost_a_fraction_of_a_new_message() -> None:
    e = engine(peer_burst=2, peer_rate=0.001, duplicate_cost=0.1)
    raw = capacity(key(1))
    e.receive("p0", raw, T0, RNG)
    got = [reasons(e.receive("p0", raw, T0, RNG)) for _ in range(12)]
    assert got[:10] == [[Reason.DUPLICATE]] * 10
    assert got[10] == [Reason.FLOODING]


def test_a_signer_beyond_its_rate_is_dropped_without_blaming_the_peer() -> None:
    e = engine(sender_burst=3, sender_rate=1)
    msgs = [capacity(key(1), n=i) for i in range(5)]
    results = [e.receive(f"p{i}", m, T0, RNG) for i, m in enumerate(msgs)]
    assert all(isinstance(r[0], Deliver) for r in results[:3])
    assert results[3] == [Drop(Reason.SENDER_RATE, "p3")]
    assert e.score("p3", T0) == 0.0
    assert isinstance(e.receive("p0", capacity(key(2)), T0, RNG)[0], Deliver)
    assert isinstance(e.receive("p0", capacity(key(1), n=9), T0 + 1000, RNG)[0], Deliver)


def test_token_bucket_and_score_ignore_a_clock_going_backwards() -> None:
    b = TokenBucket.full(rate=1000, burst=1, now=T0)
    assert b.take(1, T0)
    assert not b.take(1, T0 - 10_000)
    s = Score(-80.0, T0)
    assert s.at(T0 - 10_000, 1000) == -80.0


# -- the seen-cache --------------------------------------------------------------------------


def test_seen_ids_are_pruned_after_expiry_plus_skew_and_replays_then_fail_expiry() -> None:
    e = engine()
    raw = capacity(key(1), expires=T0 + 1000)
    e.receive("p0", raw, T0, RNG)
    mid = verify(raw).message_id
    assert e.expire(T0 + 1000 + 29_999) == 0 and e.has_seen(mid)
    assert e.expire(T0 + 1000 + 30_000) == 1 and not e.has_seen(mid)
    assert reasons(e.receive("p1", raw, T0 + 1000 + 30_000, RNG)) == [Reason.EXPIRED]


def test_the_seen_cache_is_bounded_and_evicts_the_soonest_to_expire() -> None:
    e = engine(seen_capacity=3, sender_burst=100)
    expiries = [5000, 9000, 7000, 8000, 6000]
    msgs = [capacity(key(1), n=i, expires=T0 + x) for i, x in enumerate(expiries)]
    for m in msgs:
        e.receive("p0", m, T0, RNG)
    assert e.seen_size == 3 and e.counters["seen_evicted"] == 2
    assert [e.has_seen(verify(m).message_id) for m in msgs] == [False, True, False, True, True]


# -- publishing ------------------------------------------------------------------------------


def test_publish_sends_to_every_peer_or_to_publish_fanout() -> None:
    raw = capacity(key(1))
    assert sorted(forwards(engine(peers=8).publish(raw, T0, RNG))) == [f"p{i}" for i in range(8)]
    assert len(forwards(engine(peers=8, publish_fanout=3).publish(raw, T0, RNG))) == 3


def test_publishing_the_envelope_sign_verified_made_is_publishing_its_bytes() -> None:
    raw = capacity(key(1))
    env = verify(raw)
    assert sorted(forwards(engine(peers=8).publish(env, T0, RNG))) == [f"p{i}" for i in range(8)]
    e = engine()
    e.publish(env, T0, RNG)
    assert e.publish(raw, T0, RNG) == [Drop(Reason.DUPLICATE, None)]  # the same message
    with pytest.raises(LocalProtocolError, match="expired"):  # checked like bytes, but for the signature
        e.publish(verify(capacity(key(1), expires=T0 - 60_000)), T0, RNG)


def test_our_own_message_coming_back_is_a_duplicate_and_is_never_delivered() -> None:
    e = engine()
    raw = capacity(key(1))
    e.publish(raw, T0, RNG)
    assert e.publish(raw, T0, RNG) == [Drop(Reason.DUPLICATE, None)]
    assert e.receive("p4", raw, T0, RNG) == [Drop(Reason.DUPLICATE, "p4")]


def test_publish_refuses_what_the_network_would_refuse() -> None:
    e = engine()
    with pytest.raises(LocalProtocolError, match="expired"):
        e.publish(capacity(key(1), expires=T0 - 60_000), T0, RNG)
    with pytest.raises(LocalProtocolError, match="wrong network"):
        e.publish(capacity(key(1), network="othernet"), T0, RNG)
    with pytest.raises(LocalProtocolError, match="not carried"):
        e.publish(sign_message(Ping(NET, node_id_of(key(1)), bytes(16), T0 + 1), key(1)), T0, RNG)
    with pytest.raises(ProtocolError):
        e.publish(b"junk", T0, RNG)
    assert e.seen_size == 0


def full_offer(k: nacl.signing.SigningKey, inputs: int) -> bytes:
    """An offer of MAX_SET jobs of one submitter, each reading `inputs` files."""
    blob = BlobRef(sha256(b"blob"), 1000)
    files = tuple(FileRef(f"data/part-{i:04}.csv", blob) for i in range(inputs))
    limits = Limits(10**9, 1 << 28, 60_000, 1 << 20)
    manifests = [
        JobManifest(
            blob,
            files,
            ("run", f"--job={j}"),
            (),
            None,
            limits,
            T0 + 3_600_000,
            86_400_000,
            1,
            PROFILE,
            node_id_of(k),
            j.to_bytes(16, "big"),
            T0,
        )
        for j in range(MAX_SET)
    ]
    return sign_message(Offer(NET, T0 + 60_000, node_id_of(k), tuple(sorted(manifests, key=BY_JOB))), k)


def test_a_full_offer_set_of_sizeable_jobs_travels() -> None:
    """The offer cap holds MAX_SET manifests of dozens of inputs each (it was 64 KiB for one job)."""
    raw = full_offer(key(1), inputs=40)
    assert 64 * 1024 < len(raw) <= gossip.DEFAULT_KINDS["offer"]
    actions = engine().receive("p0", raw, T0, RNG)
    assert isinstance(actions[0], Deliver) and len(actions[0].envelope.message.manifests) == MAX_SET
    assert len(forwards(actions)) == 6
    too_big = full_offer(key(1), inputs=80)
    assert len(too_big) > gossip.DEFAULT_KINDS["offer"]
    assert engine().receive("p0", too_big, T0, RNG)[:1] == [Drop(Reason.OVERSIZE, "p0")]


def test_unknown_peer_is_dropped() -> None:
    e = engine(peers=0)
    assert e.receive("stranger", capacity(key(1)), T0, RNG) == [Drop(Reason.UNKNOWN_PEER, "stranger")]


# -- robustness --------------------------------------------------------------------------------


@given(st.binary(max_size=300))
def test_any_bytes_give_only_actions_and_never_a_delivery(data: bytes) -> None:
    e = engine(peers=3)
    actions = e.receive("p0", data, T0, random.Random(0))
    assert actions and not any(isinstance(a, (Deliver, Forward)) for a in actions)


def test_config_is_a_frozen_value() -> None:
    c = GossipConfig(NET)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.fanout = 3  # type: ignore[misc]


def test_a_message_costs_a_token_per_started_16_kib_of_both_buckets() -> None:
    raw = full_offer(key(1), inputs=40)
    cost = gossip.message_cost(len(raw))
    assert cost == -(-len(raw) // (16 * 1024)) and cost > 4
    assert gossip.message_cost(1) == 1 and gossip.message_cost(16 * 1024 + 1) == 2
    # the peer's bucket: one large offer takes `cost` tokens, so a second finds too few
    e = engine(peer_burst=cost + 1, peer_rate=0.001, sender_burst=1000)
    assert isinstance(e.receive("p0", raw, T0, RNG)[0], Deliver)
    assert reasons(e.receive("p0", full_offer(key(2), inputs=40), T0, RNG)) == [Reason.FLOODING]
    assert isinstance(e.receive("p0", capacity(key(3)), T0, RNG)[0], Deliver)  # a small one still fits
    # the signer's bucket likewise: its large offers use it up `cost` tokens at a time
    e = engine(sender_burst=cost + 1, sender_rate=0.001)
    assert isinstance(e.receive("p0", raw, T0, RNG)[0], Deliver)
    other = full_offer(key(1), inputs=41)
    assert e.receive("p1", other, T0, RNG) == [Drop(Reason.SENDER_RATE, "p1")]
