"""Gossip under a flood, pure: budgets per peer and per signer, cut-off, growing bans, capped tables."""

from __future__ import annotations

import random
from typing import Any

import e31.protocol.gossip as gossip
import nacl.signing
import pytest
from e31.protocol.envelope import node_id_of, sign_message
from e31.protocol.gossip import (
    Action,
    Deliver,
    Disconnect,
    Drop,
    GossipConfig,
    GossipEngine,
    Reason,
)
from e31.protocol.gossip_limits import PenaltyBox, TokenBucket
from e31.protocol.ids import sha256
from e31.protocol.messages import Capacity
from hypothesis import given, settings
from hypothesis import strategies as st

NET = "testnet"
T0 = 1_800_000_000_000
PROFILE = sha256(b"profile")
RNG = random.Random(3)
KEYS = [nacl.signing.SigningKey(sha256(b"flood key %d" % i).raw) for i in range(8)]
POOL = [
    sign_message(Capacity(NET, node_id_of(k), T0 + 3_600_000, 4, 1 << 30, (PROFILE,), n, 1000), k)
    for n in range(400)
    for k in KEYS[:1]
]
"""400 distinct valid messages of one signer (each costs 1 token)."""
MANY = [
    sign_message(Capacity(NET, node_id_of(k), T0 + 3_600_000, 4, 1 << 30, (PROFILE,), n, 1000), k)
    for n in range(50)
    for k in KEYS
]
"""400 distinct valid messages of 8 signers, interleaved."""


def engine(**changes: Any) -> GossipEngine[str]:
    e = GossipEngine[str](GossipConfig(NET, **changes))
    for peer in ("flooder", "good", "other"):
        assert e.add_peer(peer, T0)
    return e


def verdict(actions: list[Action[str]]) -> str:
    for a in actions:
        if isinstance(a, Deliver):
            return "delivered"
    drops = [a.reason.value for a in actions if isinstance(a, Drop)]
    return drops[0] if drops else "none"


def count_verifies(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    real = gossip.verify

    def counting(raw: bytes, **kw: Any) -> Any:
        calls[0] += 1
        return real(raw, **kw)

    monkeypatch.setattr(gossip, "verify", counting)
    return calls


# -- the budget per peer -----------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(gaps=st.lists(st.integers(min_value=0, max_value=200), min_size=1, max_size=len(MANY)))
def test_no_peer_exceeds_its_budget_over_any_window(gaps: list[int]) -> None:
    rate, burst = 20.0, 10.0
    e = engine(peer_rate=rate, peer_burst=burst, sender_rate=1e6, sender_burst=1e6, penalties={})
    now, accepted = T0, []
    for gap, raw in zip(gaps, MANY, strict=False):
        now += gap
        if verdict(e.receive("flooder", raw, now, RNG)) != "flooding":
            accepted.append(now)
    for i in range(len(accepted)):
        for j in range(i, len(accepted)):
            window_ms = accepted[j] - accepted[i]
            assert j - i + 1 <= burst + rate * window_ms / 1000 + 1e-9


@settings(max_examples=40, deadline=None)
@given(
    gaps=st.lists(st.integers(min_value=50, max_value=400), min_size=1, max_size=len(MANY)),
    noise=st.lists(st.booleans(), min_size=len(MANY), max_size=len(MANY)),
)
def test_a_good_peer_under_its_budget_is_never_cut_off(gaps: list[int], noise: list[bool]) -> None:
    """A peer that keeps to 20 messages per second (one per 50 ms or slower) with duplicates mixed in."""
    e = engine(peer_rate=20.0, peer_burst=10.0, sender_rate=1e6, sender_burst=1e6)
    now = T0
    for i, (gap, raw) in enumerate(zip(gaps, MANY, strict=False)):
        now += gap
        actions = e.receive("good", raw, now, RNG)
        assert verdict(actions) == "delivered"
        assert not any(isinstance(a, Disconnect) for a in actions)
        if noise[i]:  # the same message again: a duplicate, cheap
            assert verdict(e.receive("good", raw, now, RNG)) == "duplicate"
    assert "good" in e.peers and e.score("good", now) == 0.0


def test_a_flood_of_distinct_valid_messages_is_cut_by_budget_not_by_verifying_each(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = count_verifies(monkeypatch)
    e = engine(peer_rate=100.0, peer_burst=200.0, sender_rate=1e6, sender_burst=1e6, ban_ms=60_000)
    verdicts = []
    for raw in MANY:  # 400 messages in the same millisecond, 8 signers
        actions = e.receive("flooder", raw, T0, RNG)
        verdicts.append(verdict(actions))
        if any(isinstance(a, Disconnect) for a in actions):
            disconnect = next(a for a in actions if isinstance(a, Disconnect))
            break
    assert verdicts.count("delivered") == 200  # the burst
    assert calls[0] == 200  # no signature check beyond it
    assert verdicts.count("flooding") == 50  # 2 points each: at -100 it is cut off
    assert disconnect.reason is Reason.FLOODING and disconnect.until == T0 + 60_000
    assert "flooder" not in e.peers and not e.add_peer("flooder", T0 + 59_999)
    assert verdict(e.receive("flooder", MANY[-1], T0, RNG)) == "unknown_peer"
    assert calls[0] == 200


def test_a_signer_over_its_limit_costs_no_signature_check(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = count_verifies(monkeypatch)
    e = engine(sender_rate=1.0, sender_burst=5.0, peer_burst=1e6, peer_rate=1e6)
    verdicts = [verdict(e.receive("flooder", raw, T0, RNG)) for raw in POOL[:50]]
    assert verdicts == ["delivered"] * 5 + ["sender_rate"] * 45
    assert calls[0] == 5
    assert "flooder" in e.peers  # not the peer's fault: an honest relay may be a step behind


def test_forgeries_in_a_signers_name_do_not_spend_its_tokens() -> None:
    e = engine(sender_rate=0.001, sender_burst=3.0, peer_burst=1e6, peer_rate=1e6)
    assert verdict(e.receive("good", POOL[0], T0, RNG)) == "delivered"
    for raw in POOL[1:20]:
        forged = bytearray(raw)
        forged[-3] ^= 1
        e.receive("flooder", bytes(forged), T0, RNG)
        if "flooder" not in e.peers:
            break
    assert [verdict(e.receive("good", raw, T0, RNG)) for raw in POOL[20:23]] == [
        "delivered",
        "delivered",
        "sender_rate",
    ]


# -- penalties -------------------------------------------------------------------------------


def test_each_repeat_offence_doubles_the_ban_up_to_the_maximum() -> None:
    e = engine(peer_rate=1.0, peer_burst=1.0, sender_rate=1e6, sender_burst=1e6, ban_ms=1000, max_ban_ms=5000)
    now, bans = T0, []
    messages = iter(MANY)
    for _ in range(5):
        assert e.add_peer("flooder", now)
        while True:
            actions = e.receive("flooder", next(messages), now, RNG)
            cut = [a for a in actions if isinstance(a, Disconnect)]
            if cut:
                bans.append(cut[0].until - now)
                now = cut[0].until
                break
    assert bans == [1000, 2000, 4000, 5000, 5000]
    assert e.offences("flooder") == 5


def test_offences_are_forgotten_after_the_memory() -> None:
    box = PenaltyBox(base_ms=1000, max_ms=10_000, memory_ms=60_000, capacity=10)
    assert box.offend("k", T0) == T0 + 1000
    assert box.offend("k", T0 + 2000) == T0 + 4000
    assert box.until("k", T0 + 3999) == T0 + 4000 and box.until("k", T0 + 4000) is None
    assert box.offend("k", T0 + 2000 + 60_000) == T0 + 62_000 + 1000  # a first offence again
    assert box.prune(T0 + 62_000 + 60_000) == 1 and len(box) == 0


def test_the_penalty_box_is_capped_forgetting_the_oldest_offence_first() -> None:
    box = PenaltyBox(base_ms=1000, max_ms=1000, memory_ms=60_000, capacity=3)
    for i in range(5):
        box.offend(i, T0 + i)
    assert len(box) == 3
    assert box.until(0, T0 + 5) is None and box.until(4, T0 + 5) == T0 + 1004


# -- memory ------------------------------------------------------------------------------------


def test_every_table_stays_within_its_cap() -> None:
    e = engine(seen_capacity=50, max_senders=4, peer_burst=1e6, peer_rate=1e6, sender_burst=1e6)
    for i, raw in enumerate(MANY):
        e.receive("good", raw, T0 + i, RNG)
        sizes = e.sizes
        assert sizes["seen"] <= 50 and sizes["senders"] <= 4
    for i in range(20):  # peers that misbehave and leave
        e.add_peer(f"bad{i}", T0)
        e.receive(f"bad{i}", b"\xc1", T0, RNG)
        e.remove_peer(f"bad{i}")
    assert e.sizes["departed"] <= 4 and e.sizes["banned"] <= 4


# -- the token bucket --------------------------------------------------------------------------


@given(
    events=st.lists(
        st.tuples(st.integers(min_value=0, max_value=2000), st.integers(min_value=1, max_value=16)),
        max_size=200,
    )
)
def test_a_bucket_never_grants_more_than_its_burst_plus_its_rate(events: list[tuple[int, int]]) -> None:
    rate, burst = 50.0, 40.0
    bucket = TokenBucket.full(rate, burst, T0)
    now, granted = T0, []
    for gap, cost in events:
        now += gap
        has, wait = bucket.has(cost, now), bucket.wait_ms(cost, now)
        assert (wait == 0) == has
        if bucket.take(cost, now):
            granted.append((now, cost))
        elif cost <= burst:
            assert bucket.take(cost, now + wait)  # the wait it named is enough
            granted.append((now + wait, cost))
            now += wait
    for i in range(len(granted)):
        spent = 0
        for j in range(i, len(granted)):
            spent += granted[j][1]
            assert spent <= burst + rate * (granted[j][0] - granted[i][0]) / 1000 + 1e-6
