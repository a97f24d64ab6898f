"""The pure rule for taking a job back from an executor that fell behind its promise (market/behind.py)."""

from __future__ import annotations

from dataclasses import replace

from e31.node.market.adverts import PeerCapacity
from e31.node.market.behind import GRACE_MIN_MS, ROOM_MS, Promise, check_at, is_behind, last_useful
from e31.node.market.replan import could_take
from e31.protocol.blobs import blob_ref
from e31.protocol.ids import Digest, NodeId
from e31.protocol.jobs import JobManifest, Limits
from e31.sandbox.profile import PROFILE
from hypothesis import given
from hypothesis import strategies as st

NOW = 1_800_000_000_000

T = 1_767_225_600_000


def test_a_job_is_behind_after_its_promised_finish_and_one_more_promised_run() -> None:
    promise = Promise(T + 10_000, T + 15_000)  # a 5 s run, promised to end at T + 15 s
    deadline = T + 120_000
    assert promise.behind_at == T + 20_000
    assert check_at(promise, deadline) == T + 20_000
    assert not is_behind(T + 15_000, promise, deadline)  # at its promised finish: not yet
    assert not is_behind(T + 19_999, promise, deadline)  # within the grace
    assert is_behind(T + 20_000, promise, deadline)
    assert is_behind(T + 60_000, promise, deadline)


def test_a_short_job_gets_at_least_a_second_of_grace() -> None:
    promise = Promise(T, T + 50)
    assert promise.behind_at == T + 50 + GRACE_MIN_MS
    assert not is_behind(T + 1_000, promise, T + 60_000) and is_behind(T + 1_050, promise, T + 60_000)


def test_a_promise_of_no_time_counts_as_a_run_of_one_ms() -> None:
    promise = Promise(T, T)
    assert promise.run_ms == 1 and promise.behind_at == T + GRACE_MIN_MS


def test_a_job_is_not_moved_when_the_deadline_leaves_no_room_to_run_it_elsewhere() -> None:
    promise = Promise(T + 10_000, T + 15_000)
    # behind at T + 20 s; another node needs the 5 s run and ROOM_MS more
    tight = T + 20_000 + 5_000 + ROOM_MS
    assert check_at(promise, tight) == T + 20_000 and is_behind(T + 20_000, promise, tight)
    assert not is_behind(T + 20_001, promise, tight)  # a moment later there is no room
    assert check_at(promise, tight - 1) is None
    assert not any(is_behind(T + t, promise, tight - 1) for t in range(0, 40_000, 500))


@given(
    start=st.integers(T, T + 10**7),
    run=st.integers(0, 10**6),
    slack=st.integers(-(10**6), 10**7),
    now=st.integers(T, T + 2 * 10**7),
)
def test_behind_only_past_the_grace_and_only_with_room_left(
    start: int, run: int, slack: int, now: int
) -> None:
    promise = Promise(start, start + run)
    deadline = start + run + slack
    behind = is_behind(now, promise, deadline)
    grace = max(GRACE_MIN_MS, max(1, run))
    assert behind == (now >= start + run + grace and now + max(1, run) + ROOM_MS <= deadline)
    at = check_at(promise, deadline)
    if at is None:  # never: no time at or after the promise and its grace leaves room
        assert not behind and promise.behind_at > last_useful(promise, deadline)
    else:  # the first time it can be behind
        assert is_behind(at, promise, deadline) and not is_behind(at - 1, promise, deadline)


def test_a_node_whose_advert_says_it_cannot_take_the_job_is_no_place_to_move_it() -> None:
    manifest = JobManifest(
        module=blob_ref(b"\0asm\1\0\0\0"),
        inputs=(),
        args=(),
        env=(),
        stdin=None,
        limits=Limits(10**9, 64 << 20, 10_000, 1 << 20),
        deadline=NOW + 60_000,
        retention_ms=60_000,
        replicas=1,
        profile=Digest(PROFILE.digest),
        submitter=NodeId(b"s" * 32),
        nonce=bytes(16),
        created_at=NOW,
    )
    room = PeerCapacity(cores=1, memory_bytes=64 << 20, queue_length=0, fuel_rate=1, expires=NOW + 1)
    assert could_take(None, manifest, NOW)  # no advert: nothing against it
    assert could_take(room, manifest, NOW)
    assert not could_take(replace(room, cores=0), manifest, NOW)  # suspended, or its owner took the cores
    assert not could_take(replace(room, memory_bytes=(64 << 20) - 1), manifest, NOW)
    assert could_take(replace(room, cores=0, expires=NOW), manifest, NOW)  # a lapsed advert says nothing
