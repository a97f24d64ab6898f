"""The losing streak of a node's bids to a submitter (node/market/standing.py): after `lost` bids in a
row that won nothing, the node bids on one in 2^(lost-1) of that submitter's offers (at most SKIP_MAX
skipped, at least one bid PROBE_MS after the last), and a win ends the streak."""

from __future__ import annotations

from e31.node.market.standing import PROBE_MS, SKIP_MAX, Standing
from hypothesis import given
from hypothesis import strategies as st

A, B = b"a" * 32, b"b" * 32


def pattern(standing: Standing, submitter: bytes, offers: int, now: int = 0) -> str:
    """Which of the next offers get a bid (B) or an unplanned decline (d), each heard at `now`."""
    out = ""
    for _ in range(offers):
        if standing.worth_bidding(submitter, now):
            standing.bid(submitter, now)
            out += "B"
        else:
            out += "d"
    return out


def test_a_node_bids_on_every_offer_until_its_bids_lose() -> None:
    standing = Standing()
    assert pattern(standing, A, 5) == "BBBBB"
    standing.decided(A, won=True)
    assert pattern(standing, A, 3) == "BBB"


def test_each_lost_bid_doubles_the_offers_skipped_up_to_skip_max() -> None:
    standing = Standing()
    standing.bid(A, 0)
    for lost, gap in ((1, 1), (2, 2), (3, 4), (4, 8), (5, SKIP_MAX), (30, SKIP_MAX)):
        while standing.lost(A) < lost:
            standing.decided(A, won=False)
        assert pattern(standing, A, 2 * (gap + 1)) == ("d" * gap + "B") * 2


def test_a_win_ends_the_streak_and_other_submitters_are_not_touched() -> None:
    standing = Standing()
    for _ in range(3):
        standing.decided(A, won=False)
    assert pattern(standing, B, 3) == "BBB"
    assert pattern(standing, A, 5) == "ddddB"
    standing.decided(A, won=True)
    assert standing.lost(A) == 0
    assert pattern(standing, A, 3) == "BBB"


def test_a_probe_goes_probe_ms_after_the_last_bid_however_long_the_streak() -> None:
    standing = Standing()
    standing.bid(A, 10_000)
    for _ in range(10):
        standing.decided(A, won=False)
    assert not standing.worth_bidding(A, 10_000 + PROBE_MS - 1)
    assert standing.worth_bidding(A, 10_000 + PROBE_MS)


def test_the_submitters_remembered_are_bounded_least_recent_forgotten() -> None:
    standing = Standing(kept=2)
    standing.decided(A, won=False)
    standing.decided(B, won=False)
    standing.decided(b"c" * 32, won=False)
    assert standing.lost(A) == 0 and standing.lost(B) == 1


@given(st.lists(st.sampled_from(["won", "lost", "offer"]), max_size=200))
def test_never_more_than_skip_max_offers_in_a_row_go_unbid(events: list[str]) -> None:
    standing = Standing()
    run = 0
    for event in events:
        if event == "offer":
            if standing.worth_bidding(A, 0):
                standing.bid(A, 0)
                run = 0
            else:
                run += 1
                assert run <= SKIP_MAX
        else:
            standing.decided(A, won=event == "won")
            if event == "won":
                assert standing.worth_bidding(A, 0)
                standing.bid(A, 0)
                run = 0
