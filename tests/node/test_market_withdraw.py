"""A job done with an earlier attempt's late result is withdrawn from the executor of its newer attempt.

Node A submits; B and C execute. Whichever of them wins the first round (the first executor) is made
slow to deliver: A does not see its result until its lease has run out and the job was assigned to
the other (the second executor). Then the first result arrives: the job ends `done` with it, and A
withdraws the newer assignment at once with a signed `cancel` (reason `done`). The second executor
drops the job while fetching, stops it while running, and sends no result or release; if it had
already finished, its result is not taken (one receipt counts) and it stops delivering it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import trio
from e31.node.store.db import Store
from e31.protocol.assignments import Assignment, assignments
from e31.protocol.envelope import VerifiedEnvelope, sign_message, verify
from e31.protocol.ids import NodeId
from e31.protocol.jobs import JobManifest, Limits
from e31.protocol.messages import Assign, AssignSet, Cancel
from market_nodes import NETWORK, Net, RealNode, start, until, wait_state


@dataclass
class Slow:
    """Holds back the results the first executor sends A (and, with `hold_second`, the second's),
    records the assignments B and C receive and what A hears from them, and (with `starve_second`)
    keeps the second executor's blob chunks from it so it stays `fetching`."""

    net: Net
    a: RealNode
    nodes: tuple[RealNode, RealNode]
    hold_second: bool = False
    starve_second: bool = False
    assigns: list[tuple[bytes, Assignment]] = field(default_factory=list)
    cancels: list[tuple[bytes, VerifiedEnvelope[Cancel]]] = field(default_factory=list)
    heard: list[tuple[bytes, str]] = field(default_factory=list)
    """(sender, kind) of every message A got from B or C."""
    held: dict[bytes, list[tuple[bytes, bytes]]] = field(default_factory=dict)
    released: set[bytes] = field(default_factory=set)

    def __post_init__(self) -> None:
        deliver_a = self.net.handlers[self.a.id]

        async def to_a(peer: bytes, raw: bytes) -> None:
            env = verify(raw)
            self.heard.append((peer, env.kind))
            if env.kind == "results" and self._holding(peer):
                self.held.setdefault(peer, []).append((peer, raw))
                return
            await deliver_a(peer, raw)

        self.net.handlers[self.a.id] = to_a
        for node in self.nodes:
            self._watch(node)

    def _holding(self, peer: bytes) -> bool:
        if peer in self.released:
            return False
        return peer == self.first or (self.hold_second and peer == self.second)

    def _watch(self, node: RealNode) -> None:
        deliver = self.net.handlers[node.id]

        async def to_node(peer: bytes, raw: bytes) -> None:
            env = verify(raw)
            if isinstance(env.message, Assign | AssignSet):
                self.assigns += [(node.id, a) for a in assignments(env)]
            elif isinstance(env.message, Cancel):
                self.cancels.append((node.id, env))
            elif env.kind == "blobchunk" and self.starve_second and node.id == self.second:
                return
            await deliver(peer, raw)

        self.net.handlers[node.id] = to_node

    @property
    def first(self) -> bytes | None:
        return next((n for n, a in self.assigns if a.attempt == 1), None)

    @property
    def second(self) -> bytes | None:
        first = self.first
        return None if first is None else next(n.id for n in self.nodes if n.id != first)

    def node(self, key: bytes | None) -> RealNode:
        return next(n for n in self.nodes if n.id == key)

    async def release(self, key: bytes | None) -> None:
        """Let `key`'s results through, those held first."""
        assert key is not None
        self.released.add(key)
        for peer, raw in self.held.pop(key, []):
            await self.net.handlers[self.a.id](peer, raw)


def short_job(a: RealNode, args: tuple[str, ...], fuel: int) -> JobManifest:
    """A job whose bids promise a short run (its fuel at the default rate), so its lease is short."""
    return replace(a.manifest(args), limits=Limits(fuel, 64 << 20, 30_000, 1 << 20))


async def executor_row(node: RealNode, job_id: bytes) -> Any:
    return await node.store.run(Store.job, job_id, "executor")


async def late_result_completes(slow: Slow, job_id: bytes, second_state: str) -> tuple[RealNode, RealNode]:
    """Wait for attempt 2 to reach the second executor and its job there to be `second_state`, then
    let the first executor's result through: the job ends done with it. Returns (first, second)."""
    a = slow.a
    await until(lambda: any(x.attempt == 2 for _, x in slow.assigns), 30)
    second = slow.node(slow.second)
    first = slow.node(slow.first)
    assert [n for n, x in slow.assigns if x.attempt == 2] == [second.id]
    await wait_state(second, job_id, second_state, role="executor")
    assert slow.held.get(first.id), "the first executor's result was held back"
    await slow.release(first.id)
    row = await wait_state(a, job_id, "done")
    assert row.executor == str(NodeId(first.id)) and row.attempt == 2
    return first, second


async def assert_withdrawn(slow: Slow, job_id: bytes, second: RealNode) -> None:
    """The second executor was sent one signed cancel (reason `done`) by the submitter and ended the
    job `cancelled` without a receipt, a result or a release."""
    await until(lambda: any(n == second.id for n, _ in slow.cancels))
    # One signed cancel: sent again (the same envelope) if the executor spoke of the job meanwhile
    (cancel,) = {c.message_id: c for n, c in slow.cancels if n == second.id}.values()
    assert cancel.signer == NodeId(slow.a.id) and cancel.message.reason == "done"
    row = await wait_state(second, job_id, "cancelled", role="executor")
    assert row.reason == "cancelled by its submitter"
    assert await second.store.run(Store.receipts_for_job, job_id) == []
    assert (second.id, "results") not in slow.heard and (second.id, "release") not in slow.heard


async def assert_one_receipt_counts(a: RealNode, first: RealNode, job_id: bytes) -> None:
    [receipt] = await a.store.run(Store.receipts_for_job, job_id)
    assert receipt.executor == str(NodeId(first.id)) and receipt.attempt == 1
    await until(lambda: first.acked, 10)
    assert first.acked == [receipt.digest]


async def test_a_newer_assignment_still_fetching_is_withdrawn_and_never_started(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    a, b, c = (RealNode(net, tmp_path, name, seed) for name, seed in (("a", 1), ("b", 2), ("c", 3)))
    slow = Slow(net, a, (b, c), starve_second=True)
    await start(nursery, a, b, c)
    job_id = await a.submitter.submit(short_job(a, ("21", "1000"), 10**8))
    first, second = await late_result_completes(slow, job_id, "fetching")
    await assert_withdrawn(slow, job_id, second)
    assert second.executor.scheduler.completed == 0
    await assert_one_receipt_counts(a, first, job_id)


async def test_a_newer_assignment_already_running_is_stopped(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    a, b, c = (RealNode(net, tmp_path, name, seed) for name, seed in (("a", 1), ("b", 2), ("c", 3)))
    slow = Slow(net, a, (b, c))
    await start(nursery, a, b, c)
    # A run of 3e10 fuel (about 1.5 s on a quiet core, longer on a busy one) is surely recorded running
    # (RUNNING_MARK_DELAY after its start) before it ends; its 3 s wall limit caps what a bid promises
    # (policy.Calibration.estimate_ms), so its lease stays short for a node with no runs to learn from.
    job = replace(a.manifest(("22", "100000000000")), limits=Limits(3 * 10**10, 64 << 20, 3_000, 1 << 20))
    job_id = await a.submitter.submit(job)
    first, second = await late_result_completes(slow, job_id, "running")
    await assert_withdrawn(slow, job_id, second)
    await assert_one_receipt_counts(a, first, job_id)


async def test_a_newer_attempt_that_had_finished_is_not_taken_and_stops_delivering(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    a, b, c = (RealNode(net, tmp_path, name, seed) for name, seed in (("a", 1), ("b", 2), ("c", 3)))
    slow = Slow(net, a, (b, c), hold_second=True)
    await start(nursery, a, b, c)
    job_id = await a.submitter.submit(short_job(a, ("23", "1000"), 10**8))
    first, second = await late_result_completes(slow, job_id, "done")
    # The second executor's run was over when the withdrawal came: it keeps its signed receipt but
    # delivers it no more (it is never acknowledged nor logged), and its job stays done there.
    await until(lambda: any(n == second.id for n, _ in slow.cancels))
    assert [x.message.reason for n, x in slow.cancels if n == second.id] == ["done"]
    [mine] = await second.store.run(Store.receipts_for_job, job_id)

    async def stopped() -> bool:
        row = await second.store.run(Store.receipt, mine.digest)
        return row is not None and row.next_delivery == math.inf

    await until(stopped)
    assert await stopped()
    assert (await executor_row(second, job_id)).state == "done"
    # Its results sent before that reach A now: not taken (A's job keeps the first receipt, the only
    # one it counts), each answered at most once a while with the withdrawal again.
    resent = len(slow.cancels)
    await slow.release(second.id)
    await until(lambda: len(slow.cancels) > resent)
    assert len(slow.cancels) > resent
    assert all(c.message.reason == "done" for _, c in slow.cancels)
    row = await a.job(job_id)
    assert row.state == "done" and row.executor == str(NodeId(first.id))
    await assert_one_receipt_counts(a, first, job_id)
    assert second.acked == []
    assert [verify(r.raw).signer for r in await a.store.run(Store.envelopes_for_job, job_id, "receipt")] == [
        NodeId(first.id)
    ]


async def test_a_withdrawn_job_waiting_in_the_queue_never_starts(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)  # B has one core
    await start(nursery, a, b)
    # a run of up to 30 s holds B's core while the other job waits behind it
    long = await a.submitter.submit(short_job(a, ("24", "10000000000000"), 10**12))
    await wait_state(b, long, "running", role="executor")
    waiting = await a.submitter.submit(short_job(a, ("25", "1000"), 10**8))
    await wait_state(b, waiting, "queued", role="executor")
    assert await a.submitter.cancel(waiting) == ("cancelled", True)
    row = await wait_state(b, waiting, "cancelled", role="executor")
    assert row.started is None
    assert (await executor_row(b, long)).state == "running"
    assert await a.submitter.cancel(long) == ("cancelled", True)  # (stopped too: the test is over)
    await wait_state(b, long, "cancelled", role="executor")
    assert b.executor.scheduler.completed == 0
    assert await b.store.run(Store.receipts_for_job, waiting) == []


async def test_a_withdrawal_racing_its_assignment_keeps_the_job_from_starting(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    deliver = net.handlers[b.id]
    heard: list[str] = []
    deliver_a = net.handlers[a.id]

    async def to_a(peer: bytes, raw: bytes) -> None:
        heard.append(verify(raw).kind)
        await deliver_a(peer, raw)

    async def to_b(peer: bytes, raw: bytes) -> None:
        env = verify(raw)
        if isinstance(env.message, Assign | AssignSet):  # the submitter's cancel comes with it
            for x in assignments(env):  # (in either order)
                cancel = Cancel(NETWORK, x.job_id, x.submitter, x.lease_expires, "done", "")
                await deliver(peer, sign_message(cancel, a.key))
        await deliver(peer, raw)

    net.handlers[a.id], net.handlers[b.id] = to_a, to_b
    await start(nursery, a, b)
    job_id = await a.submitter.submit(short_job(a, ("26", "1000"), 10**8))
    await wait_state(a, job_id, "assigned")
    # Nothing comes back from B: A's lease runs out and the job is offered again.
    await wait_state(a, job_id, "offered")
    row = await executor_row(b, job_id)
    assert row is None or row.state == "cancelled"
    assert b.executor.scheduler.completed == 0 and "results" not in heard
