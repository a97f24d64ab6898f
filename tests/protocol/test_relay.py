"""The relay's ledger and a node's reachability (protocol/relay.py): pure, time passed in."""

from __future__ import annotations

import pytest
from e31.protocol.errors import LocalProtocolError
from e31.protocol.relay import Reachability, Refused, RelayBook, RelayLimits, check_observed

A, B, C, D = (bytes([i]) * 32 for i in range(1, 5))
C1, C2, C3 = (bytes([i]) * 16 for i in range(1, 4))


def refusal(call: object, *args: object) -> str:
    assert callable(call)
    with pytest.raises(Refused) as caught:
        call(*args)
    return caught.value.reason


def test_a_circuit_needs_the_targets_reservation_which_runs_out() -> None:
    book = RelayBook(RelayLimits(reservation_seconds=10))
    assert refusal(book.open, C1, A, B, 0.0) == "no_reservation"
    assert book.reserve(B, 0.0) == 10.0
    book.open(C1, A, B, 1.0)
    assert refusal(book.open, C1, A, B, 1.0) == "in_use"
    assert refusal(book.open, C2, A, B, 11.0) == "no_reservation"
    assert refusal(book.open, C2, B, B, 1.0) == "refused"


def test_limits_on_reservations_and_on_circuits_in_total_and_per_node() -> None:
    book = RelayBook(RelayLimits(reservations=2, circuits=3, circuits_per_node=2))
    book.reserve(B, 0.0)
    book.reserve(C, 0.0)
    assert refusal(book.reserve, D, 0.0) == "limit"
    book.reserve(B, 5.0)  # a renewal is not a new reservation
    book.open(C1, A, B, 0.0)
    book.open(C2, A, C, 0.0)
    assert refusal(book.open, C3, A, B, 0.0) == "limit"  # a is an end of two already
    book.close(C1)
    book.open(C3, A, B, 0.0)
    assert set(book.circuits) == {C2, C3}


def test_carrying_counts_bytes_both_ways_and_ends_a_circuit_at_its_byte_and_time_limits() -> None:
    book = RelayBook(RelayLimits(circuit_bytes=100, circuit_seconds=60))
    book.reserve(B, 0.0)
    book.open(C1, A, B, 0.0)
    assert book.carry(C1, A, 60, 1.0) == B
    assert book.carry(C1, B, 40, 1.0) == A
    assert refusal(book.carry, C1, A, 1, 1.0) == "bytes"
    assert C1 not in book.circuits
    assert refusal(book.carry, C1, A, 1, 1.0) == "closed"
    book.open(C2, A, B, 0.0)
    assert refusal(book.carry, C2, C, 1, 1.0) == "closed"  # not one of its ends
    assert refusal(book.carry, C2, A, 1, 61.0) == "duration"
    book.reserve(B, 100.0)
    book.open(C3, A, B, 100.0)
    assert [c.circuit for c in book.overdue(161.0)] == [C3] and not book.circuits


def test_a_node_whose_link_closes_loses_its_reservation_and_circuits() -> None:
    book = RelayBook(RelayLimits())
    book.reserve(B, 0.0)
    book.reserve(C, 0.0)
    book.open(C1, A, B, 0.0)
    book.open(C2, A, C, 0.0)
    assert {c.circuit for c in book.drop(B)} == {C1}
    assert not book.reserved(B, 1.0) and set(book.circuits) == {C2}
    assert {c.circuit for c in book.drop(A)} == {C2} and not book.circuits


def test_limits_must_be_positive() -> None:
    with pytest.raises(LocalProtocolError):
        RelayLimits(circuits=0)
    with pytest.raises(LocalProtocolError):
        RelayLimits(circuit_seconds=-1)


def test_reachability_is_private_after_failed_dialbacks_and_public_after_one_success() -> None:
    reach = Reachability(needed=2)
    assert reach.status == "unknown"
    assert reach.dialed(A, "127.0.0.7:7531", False) == "unknown"
    assert reach.dialed(A, "127.0.0.7:7531", False) == "unknown"  # the same peer twice counts once
    assert reach.dialed(B, "127.0.0.7:7531", False) == "private"
    assert reach.dialed(C, "127.0.0.7:7531", True) == "public"
    reach.reset()
    assert reach.status == "unknown"


def test_one_lying_peer_cannot_make_a_node_with_other_peers_private() -> None:
    reach = Reachability(needed=2)
    assert reach.dialed(A, "127.0.0.7:7531", False, peers=3) == "unknown"  # one liar among three peers
    assert reach.dialed(B, "127.0.0.7:7531", False, peers=3) == "private"  # a second, distinct peer agrees
    alone = Reachability(needed=2)
    assert alone.dialed(A, "127.0.0.7:7531", False, peers=1) == "private"  # its only peer is all it can ask


def test_reachability_forgets_what_a_peer_observed_when_its_link_goes_and_keeps_a_bounded_number() -> None:
    reach = Reachability()
    reach.observe(A, "127.0.0.7:1")
    reach.forget(A)
    assert reach.observed == {}
    for i in range(Reachability.MAX_OBSERVED + 10):
        reach.observe(i.to_bytes(32, "big"), "127.0.0.7:1")
    assert len(reach.observed) == Reachability.MAX_OBSERVED
    assert (Reachability.MAX_OBSERVED + 9).to_bytes(32, "big") in reach.observed  # the newest kept
    assert (0).to_bytes(32, "big") not in reach.observed


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("127.0.0.7:7531", True),
        ("[2001:db8::1]:1", True),
        ("2001:db8::1:7531", False),
        ("[127.0.0.7]:7531", False),
        ("example.org:7531", False),
        ("127.0.0.7:0", False),
        ("127.0.0.7:65536", False),
        ("127.0.0.7:07531", False),
        ("127.0.0.7", False),
    ],
)
def test_an_observed_address_is_an_ip_literal_and_a_port(text: str, ok: bool) -> None:
    assert (check_observed(text) is None) == ok
