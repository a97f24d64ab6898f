"""`assigns`: several jobs of one bid given in one signed message, and each job's assignment read out
of it (protocol/assignments.py) exactly as from a one-job `assign`."""

from __future__ import annotations

import dataclasses

import pytest
import vector_files as vectors
from e31.protocol.assignments import Assignment, assignment_of, assignments, reopen_assignment
from e31.protocol.envelope import sign_message, sign_verified, verify
from e31.protocol.errors import InvalidMessage, Mismatch
from e31.protocol.ids import sha256
from e31.protocol.messages import MAX_ASSIGNED, Assign, AssignItem, AssignSet, Bid, UsageReceipt
from e31.protocol.receipts import check_receipt_assignment

GEN = vectors.generator()
BY_NAME = {name: msg for name, _, msg in GEN.samples() + GEN.assigns_samples()}
SUBMITTER = GEN.key("submitter")
SET: AssignSet = BY_NAME["assigns"]  # type: ignore[assignment]
BID: Bid = BY_NAME["bid"]  # type: ignore[assignment]


def test_each_job_of_a_set_is_an_assignment_under_the_sets_id() -> None:
    env = verify(sign_message(SET, SUBMITTER), AssignSet)
    got = assignments(env)
    assert [a.job_id for a in got] == [i.job_id for i in BID.items]  # every job of the bid, in order
    assert {a.assignment_id for a in got} == {env.message_id}
    assert [(a.attempt, a.lease_expires) for a in got] == [(i.attempt, i.lease_expires) for i in SET.items]
    for a in got:
        assert (a.bid_id, a.submitter, a.executor, a.network) == (
            SET.bid_id,
            SET.submitter,
            SET.executor,
            SET.network,
        )
        assert a.raw == env.raw and a.key == (env.message_id.raw, a.job_id.raw)
        assert assignment_of(env, a.job_id) == a == reopen_assignment(env.raw, a.job_id.raw)
    assert assignment_of(env, sha256(b"a job the set does not name")) is None


def test_a_one_job_assign_reads_the_same_way() -> None:
    env = verify(sign_message(BY_NAME["assign"], SUBMITTER), Assign)
    (only,) = assignments(env)
    msg = env.message
    assert only == Assignment(
        msg.network, msg.job_id, msg.bid_id, msg.submitter, msg.executor, msg.attempt, msg.lease_expires,
        env.message_id, env.raw,
    )  # fmt: skip
    assert assignment_of(env, msg.job_id) == only
    assert assignment_of(env, sha256(b"another job")) is None


def test_a_receipt_of_a_set_names_the_sets_id_and_its_own_job() -> None:
    env = verify(sign_message(SET, SUBMITTER), AssignSet)
    receipt: UsageReceipt = BY_NAME["receipt-of-an-assigns-set"]  # type: ignore[assignment]
    mine = assignment_of(env, receipt.job_id)
    assert mine is not None
    check_receipt_assignment(receipt, mine)
    other = next(a for a in assignments(env) if a.job_id != receipt.job_id)
    with pytest.raises(Mismatch, match="different jobs"):
        check_receipt_assignment(receipt, other)
    with pytest.raises(Mismatch, match="another assignment"):  # the same job, assigned alone
        check_receipt_assignment(receipt, dataclasses.replace(mine, assignment_id=sha256(b"x")))


def test_a_set_of_the_most_jobs_signs_and_opens() -> None:
    items = tuple(sorted((AssignItem(sha256(b"%d" % i), 1, 10_000 + i) for i in range(MAX_ASSIGNED)),
                         key=lambda i: i.job_id.raw))  # fmt: skip
    msg = dataclasses.replace(SET, items=items, expires=10_000 + MAX_ASSIGNED - 1)
    env = sign_verified(msg, SUBMITTER)
    assert len(assignments(verify(env.raw))) == MAX_ASSIGNED


def test_a_set_whose_expiry_is_not_its_latest_lease_is_refused() -> None:
    with pytest.raises(InvalidMessage, match="latest"):
        dataclasses.replace(SET, expires=SET.expires + 1)
    with pytest.raises(InvalidMessage, match="latest"):
        dataclasses.replace(SET, expires=SET.items[0].lease_expires)


def test_other_kinds_assign_nothing() -> None:
    env = verify(sign_message(BID, GEN.key("executor")))
    with pytest.raises(InvalidMessage, match="assigns no job"):
        assignments(env)
