"""One job's assignment, whether it came alone (`assign`) or as an item of a set (`assigns`).

A submitter gives the jobs one bid wins together in one signed `assigns` set (docs/protocol.md §6): one
signature, one message and one stored envelope for them all. Everything after that (the executor's run,
its `accepted`, `release` and receipt, the submitter's checks, `e31 audit`) is about one job, so it reads
the job's `Assignment` out of the envelope: the job, its attempt and lease, the bid, both parties, and
the assignment id, which is the message id of the envelope that carried it (shared by a set's jobs; a
job is named by the pair). `raw` is the whole signed envelope, kept and sent again as it is.
Sans-I/O: verified envelopes in, values out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .envelope import VerifiedEnvelope, reopen_stored
from .errors import InvalidMessage
from .ids import Digest, NodeId
from .messages import Assign, AssignSet

ASSIGN_KINDS = ("assign", "assigns")
"""The message kinds that assign jobs."""


@dataclass(frozen=True, slots=True)
class Assignment:
    """Attempt `attempt` of job `job_id`, given by `submitter` to `executor` (its bid `bid_id`) until
    `lease_expires`, under the assignment `assignment_id` (the message id of `raw`, the signed `assign`
    or `assigns` that carried it)."""

    network: str
    job_id: Digest
    bid_id: Digest
    submitter: NodeId
    executor: NodeId
    attempt: int
    lease_expires: int
    assignment_id: Digest
    raw: bytes

    @property
    def key(self) -> tuple[bytes, bytes]:
        """(assignment id, job id): what names this job's assignment on the wire."""
        return self.assignment_id.raw, self.job_id.raw


def assignments(env: VerifiedEnvelope[Any]) -> tuple[Assignment, ...]:
    """Every job's assignment in a verified `assign` or `assigns` envelope, in job id order."""
    msg = env.message
    if isinstance(msg, Assign):
        return (_one(env, msg, msg.job_id, msg.attempt, msg.lease_expires),)
    if isinstance(msg, AssignSet):
        return tuple(_one(env, msg, i.job_id, i.attempt, i.lease_expires) for i in msg.items)
    raise InvalidMessage(f"a {env.kind} assigns no job")


def assignment_of(env: VerifiedEnvelope[Any], job_id: Digest | bytes) -> Assignment | None:
    """The assignment of `job_id` in a verified `assign` or `assigns` envelope, or None if it names
    no such job."""
    wanted = job_id if isinstance(job_id, Digest) else Digest(job_id)
    msg = env.message
    if isinstance(msg, AssignSet):
        item = msg.item(wanted)
        return None if item is None else _one(env, msg, item.job_id, item.attempt, item.lease_expires)
    return next((a for a in assignments(env) if a.job_id == wanted), None)


def _one(
    env: VerifiedEnvelope[Any], msg: Assign | AssignSet, job_id: Digest, attempt: int, lease_expires: int
) -> Assignment:
    return Assignment(
        msg.network,
        job_id,
        msg.bid_id,
        msg.submitter,
        msg.executor,
        attempt,
        lease_expires,
        env.message_id,
        env.raw,
    )


def reopen_assignment(raw: bytes, job_id: Digest | bytes) -> Assignment | None:
    """The job's assignment in an `assign` or `assigns` envelope this node verified before it stored it
    (envelope.reopen_stored: no signature check); None if it names no such job."""
    return assignment_of(reopen_stored(raw), job_id)
