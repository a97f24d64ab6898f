"""A job's lifecycle: the roles a node plays for a job, the states of each role, and the moves between them.

This is the one place that names job states. The market's services move jobs through these tables
(`check_transition` refuses any other move), the store keeps the state of each (role, job) row and
builds its SQL state lists from the sets here (`sql_in`), and the API and CLI show them as they are.
The values are the strings stored in the database and shown by the API, so `JobState.DONE == "done"`.

    submitter:  queued -> offered -> assigned -> done | failed | expired | cancelled | disputed
                            ^---------'  (an assignment given back or run out: offered again)
    executor:   fetching -> queued -> running -> done | failed | cancelled

- A valid outcome of an earlier attempt that arrives after its lease ran out is still accepted
  (submitter: offered -> done): the work was done and verified.
- A job withdrawn by its submitter (`e31 cancel`) ends `cancelled` from any state before an end, on
  both sides.
- An executor also ends `cancelled` a job whose assignment its submitter took back (`withdraw`) before
  it started (fetching or queued); the submitter offers the job again (assigned -> offered).
- An executor may go queued -> done for a run too short to be recorded `running`.

Imports only the standard library: the CLI reads these names without starting trio.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum

from .errors import NodeError


class Role(StrEnum):
    """Which side of a job a node's row describes."""

    SUBMITTER = "submitter"
    EXECUTOR = "executor"


class JobState(StrEnum):
    QUEUED = "queued"
    """Submitter: waiting to be offered. Executor: its inputs are here; waiting for a core."""
    OFFERED = "offered"
    """Submitter: an offer is out (or will be sent again); no executor holds it."""
    ASSIGNED = "assigned"
    """Submitter: an executor holds a signed assignment for the current attempt."""
    FETCHING = "fetching"
    """Executor: fetching the job's module and inputs."""
    RUNNING = "running"
    """Executor: in the sandbox."""
    DONE = "done"
    FAILED = "failed"
    EXPIRED = "expired"
    """Submitter: the deadline passed before a verified outcome came."""
    CANCELLED = "cancelled"
    DISPUTED = "disputed"
    """Submitter: replicas disagreed on the outcome."""


S = JobState
SUBMITTER_TRANSITIONS: Mapping[JobState, frozenset[JobState]] = {
    S.QUEUED: frozenset({S.OFFERED, S.FAILED, S.EXPIRED, S.CANCELLED}),
    S.OFFERED: frozenset({S.ASSIGNED, S.DONE, S.FAILED, S.EXPIRED, S.CANCELLED, S.DISPUTED}),
    S.ASSIGNED: frozenset({S.OFFERED, S.DONE, S.FAILED, S.EXPIRED, S.CANCELLED, S.DISPUTED}),
    S.DONE: frozenset(),
    S.FAILED: frozenset(),
    S.EXPIRED: frozenset(),
    S.CANCELLED: frozenset(),
    S.DISPUTED: frozenset(),
}
EXECUTOR_TRANSITIONS: Mapping[JobState, frozenset[JobState]] = {
    S.FETCHING: frozenset({S.QUEUED, S.FAILED, S.CANCELLED}),
    S.QUEUED: frozenset({S.RUNNING, S.DONE, S.FAILED, S.CANCELLED}),
    S.RUNNING: frozenset({S.DONE, S.FAILED, S.CANCELLED}),
    S.DONE: frozenset(),
    S.FAILED: frozenset(),
    S.CANCELLED: frozenset(),
}
TRANSITIONS: Mapping[Role, Mapping[JobState, frozenset[JobState]]] = {
    Role.SUBMITTER: SUBMITTER_TRANSITIONS,
    Role.EXECUTOR: EXECUTOR_TRANSITIONS,
}

TERMINAL = frozenset({S.DONE, S.FAILED, S.EXPIRED, S.CANCELLED, S.DISPUTED})
"""Ends: no move leaves them."""
PRUNABLE = frozenset({S.DONE, S.FAILED, S.EXPIRED, S.CANCELLED})
"""Ends after which a job is forgotten once its retention is over. Not `disputed`: its conflicting
receipts are the evidence an operator needs."""
DURABLE = frozenset({S.ASSIGNED, S.DONE, S.FAILED, S.EXPIRED, S.CANCELLED, S.DISPUTED})
"""States whose update is a durable commit (others may see them: a hand-off, an end). Not `running`:
an executor resumes a job found `queued` or `running` after a stop alike, from the start, so the state
promises nothing, and it was one fsync per job on an executor that runs them one at a time."""
del S


class IllegalTransition(NodeError):
    """A job state change the rules do not allow (a bug, or a message answering a finished job)."""


def check_transition(role: str, old: str, new: str) -> None:
    """Raise IllegalTransition unless `role`'s job may move from `old` to `new` (plain strings work:
    a StrEnum member hashes and compares as its value)."""
    table = TRANSITIONS.get(role)  # type: ignore[call-overload]
    if table is None or new not in table.get(old, frozenset()):
        raise IllegalTransition(f"a {role} job cannot go from {old} to {new}")


def sql_in(states: Iterable[str], column: str = "state") -> str:
    """`column IN ('a', 'b')` over `states`, sorted: one spelling for a set, so a query's condition is
    the text of the partial index built from the same set (SQLite uses an index only then)."""
    return f"{column} IN ({', '.join(repr(str(s)) for s in sorted(states))})"
