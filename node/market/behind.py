"""When an executor has fallen behind its promise for a job, and moving the job can still help (pure).

A bid promises, per job, when the executor expects to start it and to finish it (`expected_start`,
`expected_finish`); the submitter assigns the job on that promise. The rule, in ms since the Unix epoch:

- the run the executor promised: `run = max(1, expected_finish - expected_start)` (its own estimate
  of the job, at its calibrated rate and margin, capped by the job's wall limit);
- the grace after the promised finish: `max(GRACE_MIN_MS, run)` (1 s, or one more promised run: a
  job a little late on a busy host is not moved);
- behind at `expected_finish + grace` with no result;
- worth moving only while `now + run + ROOM_MS <= deadline`: another node must still be able to run
  it (at about the same speed) after a new round of offers (`ROOM_MS`: the bid window, the release's
  round trip and a fetch of small blobs).

The submitter then sends its executor one `withdraw` (replan.py, which also waits for the executor's
`accepted` and for another node to move the job to); the executor gives the job back if it has not
started it (docs/protocol.md, `withdraw`). Nothing here reads a clock: the caller passes `now`.
"""

from __future__ import annotations

from dataclasses import dataclass

GRACE_MIN_MS = 1_000
"""The least grace after a promised finish before the job counts as behind."""
ROOM_MS = 2_000
"""Time a move takes besides the run itself: a new round of offers (the bid window, 1 s by default),
the executor's `release` and the new executor's fetch of small blobs."""


@dataclass(frozen=True, slots=True)
class Promise:
    """What the chosen bid promised for one job."""

    expected_start: int
    expected_finish: int

    @property
    def run_ms(self) -> int:
        return max(1, self.expected_finish - self.expected_start)

    @property
    def behind_at(self) -> int:
        """When the job, with no result, counts as behind this promise."""
        return self.expected_finish + max(GRACE_MIN_MS, self.run_ms)


def last_useful(promise: Promise, deadline: int) -> int:
    """The latest time a move still leaves another node room to run the job before its deadline."""
    return deadline - promise.run_ms - ROOM_MS


def check_at(promise: Promise, deadline: int) -> int | None:
    """When to look whether the assignment is behind its promise: `behind_at`, or None when by then the
    deadline leaves no room to move the job (it is then left where it is, as before)."""
    at = promise.behind_at
    return at if at <= last_useful(promise, deadline) else None


def is_behind(now: int, promise: Promise, deadline: int) -> bool:
    """Whether a job assigned on `promise`, with no result by `now`, should be taken back and offered
    again: past the promise and its grace, with room left before the deadline to run it elsewhere."""
    return promise.behind_at <= now <= last_useful(promise, deadline)
