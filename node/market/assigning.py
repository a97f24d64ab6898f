"""Assignment sets: the jobs one bid wins at the same moment go to its executor in one signed `assigns`.

Each job's driver (submitter.py) assigns its own job. When the jobs of an offer are spread across its
bidders (spread.py), the drivers of the jobs one bid won reach their assignment in the same turn of the
event loop. `AssignSets.assign` gathers them: the first driver to assign under a bid leads, lets every
other ready driver run (a checkpoint, again while more join: as commits.SharedCommits), then signs one
`assigns` naming every job gathered (each with its own attempt and lease: docs/protocol.md §6), stores
it in one commit with each job's own writes (the bid taken, the state naming the assignment), and sends
it once. Each driver gets back its job's `Assignment` (protocol/assignments.py), the results of its
own writes, and whether the send reached the executor. A lone driver signs a set of one.

Sets never mix bids (so never executors or offers) and hold at most MAX_ASSIGNED jobs; more gathered
under one bid than that (a bid names at most as many) would go in further sets. A job that ended while
its set was gathered is left out of it (`wanted`); one that ends between the signature and the commit is
in the signed set, but its own writes do not move it to `assigned`, and its driver sends the executor
the job's cancel right after the set (submitted.cancel_at), so it is dropped there, or stopped. A set
is stored whole or not at all (a full disk: every driver of it gets the StoreError), and sent only once
stored.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import trio
from e31.protocol.assignments import Assignment, assignments
from e31.protocol.envelope import sign_verified
from e31.protocol.ids import Digest, NodeId
from e31.protocol.messages import MAX_ASSIGNED, AssignItem, AssignSet

from ..errors import StoreError
from ..store.db import Call, Store, call
from .context import MarketContext


@dataclass(eq=False)
class _Member:
    job_id: bytes
    attempt: int
    lease_expires: int
    calls: tuple[Call, ...]
    wanted: Callable[[], bool]
    assignment: Assignment | None = None
    results: list[Any] | StoreError | None = None
    sent: bool = False


@dataclass(eq=False)
class _Gathering:
    bid_id: bytes
    executor: bytes
    bid_raw: bytes
    members: list[_Member] = field(default_factory=list)
    done: trio.Event = field(default_factory=trio.Event)


@dataclass(frozen=True, slots=True)
class Assigned:
    """What one driver's `assign` came to: its job's assignment (None if the job was left out, having
    ended meanwhile), the results of its own writes, and whether the set reached the executor's link."""

    assignment: Assignment | None
    results: list[Any]
    sent: bool


class AssignSets:
    def __init__(self, ctx: MarketContext) -> None:
        self.ctx = ctx
        self._open: dict[bytes, _Gathering] = {}

    async def assign(
        self,
        *,
        bid_id: bytes,
        executor: bytes,
        bid_raw: bytes,
        job_id: bytes,
        attempt: int,
        lease_expires: int,
        calls: Sequence[Call] = (),
        wanted: Callable[[], bool] = lambda: True,
    ) -> Assigned:
        """Assign attempt `attempt` of `job_id` under the bid `bid_id` (its signed bytes `bid_raw`) until
        `lease_expires`, in one `assigns` with the other jobs assigned under that bid at the same moment,
        stored durably in one commit with `calls` (this job's own writes: all or none of them commit).
        Raises the StoreError of its commit. `wanted` is asked just before the set is signed."""
        member = _Member(job_id, attempt, lease_expires, tuple(calls), wanted)
        gathering = self._open.get(bid_id)
        leader = gathering is None or len(gathering.members) >= MAX_ASSIGNED
        if leader:
            gathering = _Gathering(bid_id, executor, bid_raw)
            self._open[bid_id] = gathering
        assert gathering is not None
        gathering.members.append(member)
        if leader:
            with trio.CancelScope(shield=True):  # the others wait on this set: it is always made
                await self._lead(gathering)
        else:
            await gathering.done.wait()
        if isinstance(member.results, StoreError):
            raise member.results
        return Assigned(member.assignment, member.results or [], member.sent)

    async def _lead(self, gathering: _Gathering) -> None:
        try:
            joined = -1
            while joined != len(gathering.members) and len(gathering.members) < MAX_ASSIGNED:
                joined = len(gathering.members)
                await trio.lowlevel.checkpoint()
            if self._open.get(gathering.bid_id) is gathering:
                del self._open[gathering.bid_id]
            await self._make(gathering)
        finally:
            if self._open.get(gathering.bid_id) is gathering:
                del self._open[gathering.bid_id]
            for m in gathering.members:
                if m.results is None:
                    m.results = StoreError("the assignment set was not made")
            gathering.done.set()

    async def _make(self, gathering: _Gathering) -> None:
        members = [m for m in gathering.members if m.wanted()]
        for m in gathering.members:
            if m not in members:
                m.results = []  # left out: its job ended while the set was gathered
        if not members:
            return
        members.sort(key=lambda m: m.job_id)
        items = tuple(AssignItem(Digest(m.job_id), m.attempt, m.lease_expires) for m in members)
        ctx = self.ctx
        msg = AssignSet(
            ctx.network,
            Digest(gathering.bid_id),
            ctx.node,
            NodeId(gathering.executor),
            max(i.lease_expires for i in items),
            items,
        )
        env = sign_verified(msg, ctx.identity)
        now = ctx.now_s()
        job_ids = [m.job_id for m in members]
        calls = [
            call(Store.put_shared_envelope, gathering.bid_id, "bid", gathering.bid_raw, now, job_ids),
            call(Store.put_shared_envelope, env.message_id.raw, "assigns", env.raw, now, job_ids),
            *(c for m in members for c in m.calls),
        ]
        try:  # the set is one unit: stored whole, or not at all and never sent
            results = await ctx.store.atomically(*calls)
        except StoreError as e:
            for m in members:
                m.results = e
            return
        start = 2
        for m, assignment in zip(members, assignments(env), strict=True):
            m.assignment = assignment
            m.results = results[start : start + len(m.calls)]
            start += len(m.calls)
        sent = await ctx.send_to(gathering.executor, env.raw)
        for m in members:
            m.sent = sent
