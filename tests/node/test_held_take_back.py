"""A `withdraw` that comes before its assignment is held is remembered (held.py), and applied when the
job is held only while it is live and signed by that job's submitter."""

from __future__ import annotations

import trio
from e31.node.market.held import Held, HeldJobs

NOW = 1_800_000_000_000
SUBMITTER, OTHER = b"s" * 32, b"o" * 32


def held(submitter: bytes = SUBMITTER) -> Held:
    return Held(trio.CancelScope(), NOW + 60_000, 1_000, submitter=submitter, fuel=1)


def never(job_id: bytes) -> bool:
    return False


async def test_a_remembered_withdraw_stops_the_job_when_it_is_held() -> None:
    jobs = HeldJobs(lambda: NOW)
    assert not jobs.take_back(b"j", b"a1", SUBMITTER, has_worker=never, expires=NOW + 1)
    h = jobs.hold(b"j", held(), b"a1")
    assert h.moved and h.scope.cancel_called


async def test_an_expired_remembered_withdraw_changes_nothing() -> None:
    clock = [NOW]
    jobs = HeldJobs(lambda: clock[0])
    jobs.take_back(b"j", b"a1", SUBMITTER, has_worker=never, expires=NOW + 1)
    clock[0] = NOW + 1  # the withdraw lapsed before the assignment was held
    h = jobs.hold(b"j", held(), b"a1")
    assert not h.moved and not h.scope.cancel_called


async def test_a_remembered_withdraw_by_another_signer_or_for_another_assignment_changes_nothing() -> None:
    jobs = HeldJobs(lambda: NOW)
    jobs.take_back(b"j", b"a1", OTHER, has_worker=never, expires=NOW + 1)
    jobs.take_back(b"k", b"a2", SUBMITTER, has_worker=never, expires=NOW + 1)
    assert not jobs.hold(b"j", held(), b"a1").moved  # not its submitter's
    assert not jobs.hold(b"k", held(), b"a3").moved  # another assignment of it


async def test_a_withdraw_of_one_job_of_a_set_leaves_the_sets_other_jobs_alone() -> None:
    """A set's jobs share its assignment id: a withdraw names the job with it, held or remembered."""
    jobs = HeldJobs(lambda: NOW)
    first, second = jobs.hold(b"j1", held(), b"set"), jobs.hold(b"j2", held(), b"set")
    assert jobs.take_back(b"j1", b"set", SUBMITTER, has_worker=never, expires=NOW + 1)
    assert first.moved and not second.moved and not second.scope.cancel_called
    # remembered before its job is held: only that job is stopped when held, not its set's others
    assert not jobs.take_back(b"j3", b"set2", SUBMITTER, has_worker=never, expires=NOW + 1)
    assert not jobs.hold(b"j4", held(), b"set2").moved
    assert jobs.hold(b"j3", held(), b"set2").moved
