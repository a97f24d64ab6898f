"""The market over in-memory links: real stores, blob stores and sandbox workers, no sockets.

Node A submits (and does not run its own jobs); node B executes. A third party, C, is scripted: it
bids on everything and then either says nothing or returns a receipt that lies about the job. The
submitter must end every job done with a receipt it verified, and never accept C's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import nacl.signing
import pytest
import trio
from e31.node.market.executor import ACCEPT_DELAY
from e31.node.market.submitter import UnknownJob
from e31.node.store.blobs import BlobStore
from e31.node.store.db import Store
from e31.protocol.assignments import Assignment, assignment_of, assignments
from e31.protocol.blobs import BlobRef, blob_ref
from e31.protocol.envelope import VerifiedEnvelope, sign_message, verify
from e31.protocol.ids import Digest, NodeId
from e31.protocol.jobs import JobManifest, Limits
from e31.protocol.messages import (
    Accepted,
    Assign,
    AssignSet,
    Bid,
    BidItem,
    Cancel,
    Decline,
    Offer,
    Release,
    Result,
    Results,
)
from e31.protocol.receipts import Ack, Outcome, UsageReceipt
from e31.sandbox.profile import PROFILE
from market_nodes import NETWORK, SETTINGS, Net, RealNode, start, until, wait_state, wall_ms


class Liar:
    """Bids on every offer; on an assignment, stays silent, answers with a receipt for another module,
    (mode "accepts") says it holds the job and then stays silent, or (mode "releases") gives it back."""

    def __init__(self, net: Net, mode: str) -> None:
        self.key = nacl.signing.SigningKey(b"\x63" * 32)
        self.id = bytes(self.key.verify_key)
        self.mode = mode
        self.assigned = 0
        """Assignment messages received, copies included."""
        self.assignments: set[bytes] = set()
        self.net = net
        self.send = net.sender(self.id)
        net.handlers[self.id] = self.message
        net.offer_sinks[self.id] = self.offer

    def offer(self, env: VerifiedEnvelope[Any]) -> None:
        now = wall_ms()
        items = tuple(BidItem(m.job_id, now, now + 1) for m in env.message.manifests)
        bid = Bid(NETWORK, env.message_id, NodeId(self.id), now + 30_000, items)
        assert self.net.nursery is not None
        self.net.nursery.start_soon(self.send, env.message.submitter.raw, sign_message(bid, self.key))

    async def message(self, peer: bytes, raw: bytes) -> None:
        env = verify(raw)
        if not isinstance(env.message, Assign | AssignSet):
            return
        self.assigned += 1
        self.assignments.add(env.message_id.raw)  # an assignment not accepted is sent again
        for a in assignments(env):
            await self.answer(peer, a)

    async def answer(self, peer: bytes, a: Assignment) -> None:
        if self.mode == "silent":
            return
        if self.mode == "releases":
            msg = Release(NETWORK, a.job_id, a.assignment_id, NodeId(self.id), "unknown", "")
            await self.send(peer, sign_message(msg, self.key))
            return
        if self.mode == "accepts":
            await self.send(
                peer, sign_message(Accepted(NETWORK, a.job_id, a.assignment_id, NodeId(self.id)), self.key)
            )
            return
        empty = blob_ref(b"")
        now = wall_ms()
        receipt = UsageReceipt(
            NETWORK,
            a.job_id,
            a.assignment_id,
            a.submitter,
            NodeId(self.id),
            module=BlobRef(Digest(b"\x01" * 32), 10),
            inputs=(),
            stdin=None,
            stdout=empty,
            stderr=empty,
            outputs=(),
            profile=Digest(PROFILE.digest),
            limits=Limits(10**10, 64 << 20, 30_000, 1 << 20),
            outcome=Outcome("exited", 0, None),
            fuel_used=1,
            peak_memory=0,
            compute_ms=1,
            queued_at=now,
            started_at=now,
            finished_at=now,
        )
        raw_receipt = sign_message(receipt, self.key)
        result = Result(NETWORK, a.job_id, a.assignment_id, NodeId(self.id), raw_receipt, now + 60_000, ())
        await self.send(peer, sign_message(result, self.key))


def lose_first(net: Net, node: bytes, kind: type) -> list[bytes]:
    """Make `node` lose the first message of `kind` sent to it; the list it returns gets that message."""
    lost: list[bytes] = []
    deliver = net.handlers[node]

    async def handler(peer: bytes, raw: bytes) -> None:
        if not lost and isinstance(verify(raw).message, kind):
            lost.append(raw)
            return
        await deliver(peer, raw)

    net.handlers[node] = handler
    return lost


def intercept(net: Net, node: bytes, kind: str, drop: Callable[[int], bool]) -> list[bytes]:
    """Record every message of `kind` sent to `node` in the list returned, and drop the n-th (from 1)
    when `drop(n)` says so."""
    seen: list[bytes] = []
    deliver = net.handlers[node]

    async def handler(peer: bytes, raw: bytes) -> None:
        if verify(raw).kind == kind:
            seen.append(raw)
            if drop(len(seen)):
                return
        await deliver(peer, raw)

    net.handlers[node] = handler
    return seen


async def output_bytes(node: RealNode, ref: BlobRef) -> bytes:
    """An output a submitter holds: in its database when the result carried it, else in its blob store."""
    kept = await node.store.run(Store.small_blobs, [ref.root.hex()])
    return kept.get(ref.root.hex()) or node.blobs.read(ref.root.raw)


def receipt_log(node: RealNode) -> Any:
    """Give `node`'s executor a receipt log of its own (the harness has none): acknowledged receipts are
    appended to it. Its prover is left as it is."""
    from e31.node.store.receiptlog import ReceiptLog

    log = ReceiptLog(node.store.store, node.key, NETWORK)

    async def append(receipts: list[VerifiedEnvelope[UsageReceipt]]) -> None:
        await trio.to_thread.run_sync(log.append_many, receipts)

    node.executor.delivery.on_acked = append
    return log


async def test_a_job_runs_on_another_node_and_comes_back_verified_and_acknowledged(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    await start(nursery, a, b)
    job_id = await a.submitter.submit(a.manifest(("5", "1000")))
    row = await wait_state(a, job_id, "done")
    assert row.executor == str(NodeId(b.id))
    assert row.reason == "exited 0" and row.fuel_used and row.fuel_used > 0
    receipts = await a.store.run(Store.receipts_for_job, job_id)
    assert len(receipts) == 1 and receipts[0].delivered is not None
    receipt = verify((await a.store.run(Store.envelope, receipts[0].message_id)).raw, UsageReceipt)
    stdout = receipt.message.stdout.root
    # its stdout came in the result and is kept in A's database (no file), stderr is empty
    kept = await a.store.run(Store.small_blobs, [stdout.hex()])
    assert kept[stdout.hex()].startswith(b"samples 1000\n") and not a.blobs.has(stdout.raw)
    await until(lambda: b.acked, 10)
    assert b.acked == [receipt.message_id.raw]
    executed = await b.store.run(Store.job, job_id, "executor")
    assert executed is not None and executed.state == "done"
    # B's copy of the module arrived by chunked transfer and is the submitter's exact blob.
    assert b.blobs.has(receipt.message.module.root.raw)
    # A run whose streams fit in its result and that leaves no /output creates no directory at all (one
    # that does is deleted after it: the next test).
    assert not (tmp_path / "b" / "runs").exists()


async def test_a_run_that_leaves_files_has_its_directory_deleted_once_they_are_stored(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    await start(nursery, a, b)
    tile = ("64", "48", "0", "0", "64", "48", "50", "/output/tile.pgm")
    job_id = await a.submitter.submit(a.manifest(tile, workload="mandelbrot"))
    await wait_state(a, job_id, "done")
    receipts = await a.store.run(Store.receipts_for_job, job_id)
    receipt = verify((await a.store.run(Store.envelope, receipts[0].message_id)).raw, UsageReceipt)
    [output] = receipt.message.outputs
    assert output.name == "tile.pgm" and (await output_bytes(a, output.blob)).startswith(b"P5\n64 48\n")
    # the run's directory held /output; it is moved aside when the run ends and deleted at the delivery
    # loop's next turn
    runs = tmp_path / "b" / "runs"
    assert runs.is_dir()
    await until(lambda: not any(runs.iterdir()))
    assert list(runs.iterdir()) == []


async def test_receipts_acknowledged_but_not_logged_at_a_stop_are_logged_at_the_next_start(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    await start(nursery, a, b)
    job_id = await a.submitter.submit(a.manifest(("5", "1000")))
    await wait_state(a, job_id, "done")
    await until(lambda: b.acked, 10)
    # This harness's log records the receipts it is handed but marks no log index: to the store the
    # acknowledged receipt is still unlogged, as after a stop between the ack and the append.
    relogged: list[bytes] = []

    async def acked(receipts: list[VerifiedEnvelope[UsageReceipt]]) -> None:
        relogged.extend(r.message_id.raw for r in receipts)

    restarted = b.build(b.ctx.settings, on_acked=acked).executor
    async with trio.open_nursery() as inner:
        await inner.start(restarted.run)
        await until(lambda: relogged)
        inner.cancel_scope.cancel()
    assert relogged == b.acked


async def test_receipts_verified_together_are_acknowledged_with_one_ack(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    a.ctx.settings = replace(SETTINGS, ack_batch_s=2.0)  # every job of the test ends inside one batch
    await start(nursery, a, b)
    jobs = [await a.submitter.submit(a.manifest((str(20 + i), "1000"))) for i in range(3)]
    for job_id in jobs:
        await wait_state(a, job_id, "done")
    receipts = [r.digest for job_id in jobs for r in await a.store.run(Store.receipts_for_job, job_id)]
    await until(lambda: len(b.acked) == 3, 10)
    assert sorted(b.acked) == sorted(receipts)
    acks = {(await a.store.run(Store.ack_for, digest)).raw for digest in receipts}  # type: ignore[union-attr]
    assert len(acks) < len(jobs), "receipts verified within one batch share an ack"
    # the executor keeps each ack once, as the ack of each receipt it names
    kept = {(await b.store.run(Store.ack_for, digest)).raw for digest in receipts}  # type: ignore[union-attr]
    assert kept == acks


async def test_an_executor_takes_from_an_ack_only_the_receipts_it_signed_for_that_submitter(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    lost = intercept(net, b.id, "ack", lambda n: True)  # B gets none of A's acks: only those below
    await start(nursery, a, b)
    job_id = await a.submitter.submit(a.manifest(("24", "1000")))
    await wait_state(a, job_id, "done")
    await until(lambda: lost, 10)
    [receipt] = await b.store.run(Store.receipts_for_job, job_id)
    stranger = nacl.signing.SigningKey(b"\x64" * 32)
    now = wall_ms()
    # an ack signed by another node than the job's submitter is ignored
    forged = sign_message(
        Ack(NETWORK, NodeId(bytes(stranger.verify_key)), NodeId(b.id), now, (Digest(receipt.digest),)),
        stranger,
    )
    await b.market.message(bytes(stranger.verify_key), forged)
    # A's ack naming the receipt among ids B signed nothing for: the receipt is acknowledged
    ids = tuple(Digest(d) for d in sorted((receipt.digest, b"\x00" * 32, b"\xff" * 32)))
    real = sign_message(Ack(NETWORK, NodeId(a.id), NodeId(b.id), now, ids), a.key)
    await trio.sleep(1.0)  # time for a forged ack to be taken, were it taken: none is
    assert b.acked == []
    await b.market.message(a.id, real)
    await until(lambda: b.acked, 10)
    assert b.acked == [receipt.digest]
    kept = await b.store.run(Store.ack_for, receipt.digest)
    assert kept is not None and kept.raw == real


async def test_a_receipt_verified_before_a_stop_without_its_ack_is_acknowledged_at_the_next_start(
    net: Net, nursery: trio.Nursery, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    monkeypatch.setattr(a.submitter.acks, "add", lambda *args: None)  # as if it stopped before each ack
    results = intercept(net, a.id, "results", lambda n: n > 1)  # B's deliveries stop after the first
    await start(nursery, a, b)
    job_id = await a.submitter.submit(a.manifest(("25", "1000")))
    await wait_state(a, job_id, "done")
    await until(lambda: len(results) > 2, 10)
    assert b.acked == [] and await a.store.run(Store.verified_unacked)
    restarted = a.build(a.ctx.settings).submitter
    async with trio.open_nursery() as inner:
        await inner.start(restarted.run)
        await until(lambda: b.acked, 10)
        inner.cancel_scope.cancel()
    [receipt] = await a.store.run(Store.receipts_for_job, job_id)
    assert b.acked == [receipt.digest] and await a.store.run(Store.verified_unacked) == []


async def test_a_silent_executor_loses_the_job_when_its_lease_runs_out(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    liar = Liar(net, "silent")
    await start(nursery, a, b)
    job_id = await a.submitter.submit(a.manifest(("6", "1000")))
    row = await wait_state(a, job_id, "done")
    assert len(liar.assignments) == 1  # its bid (finish at once) won the first round, then its lease ran out
    assert row.executor == str(NodeId(b.id)) and row.attempt == 2


async def test_a_receipt_that_does_not_match_the_job_is_refused(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    liar = Liar(net, "lying")
    await start(nursery, a, b)
    job_id = await a.submitter.submit(a.manifest(("7", "1000")))
    row = await wait_state(a, job_id, "done")
    assert len(liar.assignments) == 1
    assert row.executor == str(NodeId(b.id))
    await until(lambda: a.store.run(Store.envelopes_for_job, job_id, "ack"))  # with the next batch of acks
    acks = await a.store.run(Store.envelopes_for_job, job_id, "ack")
    assert len(acks) == 1 and verify(acks[0].raw).message.executor == NodeId(b.id)
    # the refused outcome is kept as evidence, beside the one accepted
    receipts = await a.store.run(Store.envelopes_for_job, job_id, "receipt")
    assert {verify(r.raw).signer for r in receipts} == {NodeId(b.id), NodeId(liar.id)}


async def test_a_lost_result_comes_again_without_its_outputs_which_are_fetched(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    await start(nursery, a, b)
    # B delivers again every 0.2 s: its later deliveries wait until A's state after the loss is seen
    checked, deliver = trio.Event(), net.handlers[a.id]

    async def held(peer: bytes, raw: bytes) -> None:
        if isinstance(verify(raw).message, Results):
            await checked.wait()
        await deliver(peer, raw)

    net.handlers[a.id] = held
    lost = lose_first(net, a.id, Results)  # the first delivery, carrying the job's stdout, goes missing
    job_id = await a.submitter.submit(a.manifest(("18", "1000")))
    await until(lambda: lost, 10)
    (first,) = verify(lost[0], Results).message.entries
    assert len(first.outputs) == 1, "the first delivery carries the job's small stdout"
    assert (await a.job(job_id)).state == "assigned"
    assert not await a.store.run(Store.envelopes_for_job, job_id, "receipt")
    checked.set()
    # B delivers again (until acknowledged), the receipt alone: A fetches the stdout, and keeps only
    # the receipt (a result is not kept)
    row = await wait_state(a, job_id, "done")
    receipts = await a.store.run(Store.envelopes_for_job, job_id, "receipt")
    assert [r.raw for r in receipts] == [first.receipt]
    assert not await a.store.run(Store.envelopes_for_job, job_id, "result")
    stdout = verify(first.receipt, UsageReceipt).message.stdout
    assert a.blobs.read(stdout.root.raw) == first.outputs[0]
    assert row.state == "done"


async def test_a_job_nobody_can_run_expires_at_its_deadline(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    a = RealNode(net, tmp_path, "a", 1)
    await start(nursery, a)
    manifest = a.manifest(("8", "1000"), deadline_s=1.5)
    job_id = await a.submitter.submit(replace(manifest))
    row = await wait_state(a, job_id, "expired", seconds=10)
    assert "deadline" in (row.reason or "")


async def test_a_job_no_node_can_run_is_given_back_and_fails_with_the_reason(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    await start(nursery, a, b)
    manifest = replace(a.manifest(("9", "1000")), limits=Limits(10**10, 1000, 30_000, 1 << 20))
    job_id = await a.submitter.submit(manifest)
    row = await wait_state(a, job_id, "failed", seconds=10)  # long before the lease would run out
    assert "memory_bytes" in (row.reason or "")
    executed = await b.store.run(Store.job, job_id, "executor")
    assert executed is not None and executed.state == "failed"


async def test_an_acceptance_hands_the_job_off_and_a_returning_link_pulls_the_outcome(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    a = RealNode(net, tmp_path, "a", 1)
    liar = Liar(net, "accepts")
    await start(nursery, a)
    job_id = await a.submitter.submit(a.manifest(("10", "1000")))
    row = await wait_state(a, job_id, "assigned")

    async def handed_off() -> set[bytes]:
        return await a.submitter.handed_off([await a.job(job_id)])

    await until(handed_off)
    assert await a.submitter.handed_off([await a.job(job_id)]) == {job_id}
    # An acceptance naming an assignment the submitter never made hands nothing off.
    forged = Accepted(NETWORK, Digest(job_id), Digest(b"\x05" * 32), NodeId(liar.id))
    a.submitter.on_accepted(verify(sign_message(forged, liar.key), Accepted))
    assert len(await a.store.run(Store.envelopes_for_job, job_id, "accepted")) == 1
    # The executor's link comes back: the submitter re-sends the assignment so the outcome comes now.
    assigned = liar.assigned
    a.market.link_up(liar.id, _unused_send)
    await until(lambda: liar.assigned > assigned)
    assert liar.assigned == assigned + 1 and row.attempt == 1


async def _unused_send(raw: bytes) -> None:
    raise AssertionError("the market sends through the context, not the link's sender")


async def test_cancel_ends_the_job_cancelled_with_a_signed_cancel_once(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    a = RealNode(net, tmp_path, "a", 1)
    await start(nursery, a)
    job_id = await a.submitter.submit(a.manifest(("11", "1000")))  # nobody can run it: it stays offered
    await wait_state(a, job_id, "offered")
    assert await a.submitter.cancel(job_id, "changed my mind") == ("cancelled", True)
    row = await a.job(job_id)
    assert row.state == "cancelled" and row.reason == "cancelled by its submitter: changed my mind"
    (stored,) = await a.store.run(Store.envelopes_for_job, job_id, "cancel")
    cancel = verify(stored.raw, Cancel)
    assert cancel.signer == NodeId(a.id) and cancel.message.job_id == Digest(job_id)
    assert cancel.message.reason == "withdrawn" and cancel.message.text == "changed my mind"
    await trio.sleep(0.3)
    assert job_id not in a.submitter.jobs  # the driver stopped
    assert (await a.job(job_id)).state == "cancelled"
    assert await a.submitter.cancel(job_id) == ("cancelled", False)  # ended: nothing new is signed
    assert len(await a.store.run(Store.envelopes_for_job, job_id, "cancel")) == 1
    with pytest.raises(UnknownJob):
        await a.submitter.cancel(b"\x00" * 32)


async def test_replicas_run_on_distinct_nodes_and_agree(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    a = RealNode(net, tmp_path, "a", 1)
    b, c = RealNode(net, tmp_path, "b", 2), RealNode(net, tmp_path, "c", 3)
    await start(nursery, a, b, c)
    job_id = await a.submitter.submit(replace(a.manifest(("12", "1000")), replicas=2))
    row = await wait_state(a, job_id, "done")
    assert row.reason == "exited 0"
    receipts = await a.store.run(Store.receipts_for_job, job_id)
    assert sorted(r.executor for r in receipts) == sorted(str(NodeId(n.id)) for n in (b, c))
    assert all(r.delivered is not None for r in receipts)  # both verified and acknowledged
    claims = {
        (m.outcome, m.fuel_used, m.stdout)
        for m in [
            verify((await a.store.run(Store.envelope, r.message_id)).raw, UsageReceipt).message
            for r in receipts
        ]
    }
    assert len(claims) == 1
    for node in (b, c):
        executed = await node.store.run(Store.job, job_id, "executor")
        assert executed is not None and executed.state == "done"


async def test_a_disputed_job_still_acknowledges_the_receipts_it_verified(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    a = RealNode(net, tmp_path, "a", 1)
    b, c = RealNode(net, tmp_path, "b", 2), RealNode(net, tmp_path, "c", 3)
    dropping = [True]
    dropped = intercept(net, b.id, "ack", lambda n: dropping[0])  # lost until the job has ended
    await start(nursery, a, b, c)
    job_id = await a.submitter.submit(replace(a.manifest(("26", "1000")), replicas=2))
    await wait_state(a, job_id, "done")
    await until(lambda: dropped, 10)
    # as if the replicas had disagreed: the job ends disputed, both receipts verified and kept
    await a.store.run(Store.update_job, job_id, "submitter", a.ctx.now_s(), state="disputed")
    dropping[0] = False
    await until(lambda: b.acked, 10)  # B delivers its result again and gets its ack then
    [mine] = [r for r in await a.store.run(Store.receipts_for_job, job_id) if r.executor == str(NodeId(b.id))]
    assert b.acked == [mine.digest]


async def test_a_lost_ack_of_a_batch_is_sent_again_once_not_once_per_receipt(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    a.ctx.settings = replace(SETTINGS, ack_batch_s=2.0, delivery_interval=1.0)  # one ack for the five
    b.ctx.settings = replace(SETTINGS, delivery_interval=1.0)
    acks = intercept(net, b.id, "ack", lambda n: n == 1)
    await start(nursery, a, b)
    jobs = [await a.submitter.submit(a.manifest((str(30 + i), "1000"))) for i in range(5)]
    for job_id in jobs:
        await wait_state(a, job_id, "done")
    await until(lambda: len(b.acked) == 5, 15)  # B delivered all five again, and got the ack again
    assert len(verify(acks[0], Ack).message.receipt_ids) == 5
    await trio.sleep(1.5)
    assert len(acks) == 2 and acks[1] == acks[0], "the stored ack, sent again once for its five receipts"


async def test_replicas_need_as_many_distinct_nodes(net: Net, nursery: trio.Nursery, tmp_path: Path) -> None:
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    await start(nursery, a, b)
    manifest = a.manifest(("13", "1000"), deadline_s=4.0)
    small = Limits(10**8, 64 << 20, 30_000, 1 << 20)  # so that b's estimate fits the deadline
    job_id = await a.submitter.submit(replace(manifest, replicas=2, limits=small))
    row = await wait_state(a, job_id, "expired", seconds=15)
    receipts = await a.store.run(Store.receipts_for_job, job_id)
    assert [r.executor for r in receipts] == [str(NodeId(b.id))]  # b ran it once, never twice
    assert "deadline" in (row.reason or "")


async def test_an_assignment_the_executor_lost_in_a_restart_is_released_and_offered_again(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    await start(nursery, a, b)
    lost = lose_first(net, b.id, AssignSet)  # B stops there: it bid, but never stored the assignment
    job_id = await a.submitter.submit(a.manifest(("11", "1000"), deadline_s=600))
    await wait_state(a, job_id, "assigned")
    lease_end = assignments(verify(lost[0]))[0].lease_expires
    # B comes back with the same key and none of its bids; the link coming up makes A re-send its
    # assignment, which B does not hold: B releases it, and A offers the job again at once.
    b2 = RealNode(net, tmp_path, "b2", 2)
    await start(nursery, b2)
    a.market.link_up(b2.id, _unused_send)
    row = await wait_state(a, job_id, "done")
    # An `unknown` release says nothing against B: it bid again and ran attempt 2, which it was
    # assigned before attempt 1's lease ran out.
    assert row.attempt == 2 and row.executor == str(NodeId(b.id))
    executed = await b2.store.run(Store.job, job_id, "executor")
    assert executed is not None and executed.attempt == 2 and executed.created * 1000 < lease_end


async def test_a_release_that_does_not_match_its_assignment_changes_nothing(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    a = RealNode(net, tmp_path, "a", 1)
    liar = Liar(net, "accepts")
    await start(nursery, a)
    job_id = await a.submitter.submit(a.manifest(("12", "1000"), deadline_s=600))
    await wait_state(a, job_id, "assigned")
    (stored,) = await a.store.run(Store.assignments_for_job, job_id)
    stranger = nacl.signing.SigningKey(b"\x64" * 32)
    assignment, liar_id = Digest(stored.message_id), NodeId(liar.id)
    forged = [
        # a stranger releasing the liar's assignment; the liar releasing one that was never made
        Release(NETWORK, Digest(job_id), assignment, NodeId(bytes(stranger.verify_key)), "failed", ""),
        Release(NETWORK, Digest(job_id), Digest(b"\x05" * 32), liar_id, "failed", ""),
    ]
    for msg, key in zip(forged, (stranger, liar.key), strict=True):
        a.submitter.on_release(verify(sign_message(msg, key), Release))
    await trio.sleep(0.5)
    row = await a.job(job_id)
    assert row.state == "assigned" and row.attempt == 1
    # The liar's own release of its assignment: no other node can run the job, so it fails now.
    genuine = Release(NETWORK, Digest(job_id), assignment, liar_id, "failed", "cannot fetch the module")
    a.submitter.on_release(verify(sign_message(genuine, liar.key), Release))
    row = await wait_state(a, job_id, "failed", seconds=10)
    assert "cannot fetch the module" in (row.reason or "") and len(liar.assignments) == 1


async def test_an_assignment_lost_on_the_way_is_sent_again_until_accepted(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    await start(nursery, a, b)
    dropped = lose_first(net, b.id, AssignSet)  # e.g. it came in while B's job path was still starting
    job_id = await a.submitter.submit(a.manifest(("13", "1000"), deadline_s=600))
    row = await wait_state(a, job_id, "done")
    # The same assignment, sent again, reached B: attempt 1 ran, no lease ran out.
    assert dropped and row.attempt == 1 and row.executor == str(NodeId(b.id))
    executed = await b.store.run(Store.job, job_id, "executor")
    assert executed is not None and executed.attempt == 1
    # a job this short ends before its acceptance would go: its result is the hand-off
    assert not await a.store.run(Store.envelopes_for_job, job_id, "accepted")


async def test_a_tiny_run_is_recorded_once_from_queued_to_done_a_long_one_as_running_first(
    net: Net, nursery: trio.Nursery, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import e31.node.market.executor as executor_module

    # a mark well past a tiny run (milliseconds) even on a busy host, well short of the long one
    monkeypatch.setattr(executor_module, "RUNNING_MARK_DELAY", 0.3)
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    await start(nursery, a, b)
    moves: list[tuple[str, str]] = []
    marked: list[Any] = []  # the job's row as its `running` was written
    set_state = b.executor._set_state

    async def recording(job_id: bytes, old: str, new: str, **changes: Any) -> None:
        moves.append((old, new))
        await set_state(job_id, old, new, **changes)
        if new == "running":  # read before the run's `done` can be written: it waits for this write
            marked.append(await b.store.run(Store.job, job_id, "executor"))

    b.executor._set_state = recording  # type: ignore[method-assign]
    first = await a.submitter.submit(a.manifest(("15", "1000")))  # fetches the module, compiles it
    await wait_state(a, first, "done")
    moves.clear()
    tiny = await a.submitter.submit(a.manifest(("16", "1000")))
    await wait_state(a, tiny, "done")
    # its blobs were here: it was stored queued, and ran too briefly to be marked running
    row = await b.store.run(Store.job, tiny, "executor")
    assert row is not None and row.state == "done" and row.started is not None and row.fuel_used
    assert ("queued", "running") not in moves
    long = await a.submitter.submit(a.manifest(("17", "400000000"), fuel=4 * 10**10))  # over a second
    await wait_state(a, long, "done")
    assert moves.count(("queued", "running")) == 1
    [running] = marked
    assert running.job_id == long and running.state == "running" and running.started is not None
    assert all(old != "fetching" for old, _ in moves)  # the module was here: no fetch state


async def test_a_job_still_held_after_the_accept_delay_is_handed_off_a_short_one_only_by_its_result(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    await start(nursery, a, b)
    checked, deliver = trio.Event(), net.handlers[a.id]

    async def held(peer: bytes, raw: bytes) -> None:  # B's result waits until A's state is checked
        if isinstance(verify(raw).message, (Result, Results)):
            await checked.wait()
        await deliver(peer, raw)

    net.handlers[a.id] = held
    waiting = await a.submitter.submit(a.manifest(("14", "600000000"), fuel=6 * 10**10))  # runs for seconds

    async def handed_off() -> set[bytes]:
        return await a.submitter.handed_off([await a.job(waiting)])

    await until(handed_off, ACCEPT_DELAY + 5)
    assert (await a.job(waiting)).state == "assigned"  # handed off by the acceptance, not by its end
    checked.set()
    assert len(await a.store.run(Store.envelopes_for_job, waiting, "accepted")) == 1
    await wait_state(a, waiting, "done")
    quick = await a.submitter.submit(a.manifest(("15", "1000")))
    await wait_state(a, quick, "done")
    await trio.sleep(ACCEPT_DELAY + 0.2)
    assert not await a.store.run(Store.envelopes_for_job, quick, "accepted")
    assert len(await a.store.run(Store.envelopes_for_job, waiting, "accepted")) == 1


async def test_accepted_waits_for_the_sync_and_never_follows_the_result(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    await start(nursery, a, b)
    real_flush, flushes, heard = b.store.flush, [], []
    result_in = trio.Event()

    async def slow_flush() -> None:  # a slow disk: the job ends while its rows are being synced
        flushes.append(trio.current_time())
        await result_in.wait()
        await real_flush()

    def outcome(env: Any) -> None:
        heard.append("result")
        result_in.set()
        on_outcome(env)

    def results(env: Any) -> None:  # (results come in carriers: outcomes.take_carrier)
        heard.append("result")
        result_in.set()
        on_results(env)

    def accepted(env: Any) -> None:
        heard.append("accepted")
        on_accepted(env)

    on_outcome, on_accepted = a.submitter.on_outcome, a.submitter.on_accepted
    on_results = a.submitter.on_results
    b.store.flush, a.submitter.on_outcome, a.submitter.on_accepted = (  # type: ignore[method-assign]
        slow_flush,
        outcome,
        accepted,
    )
    a.submitter.on_results = results  # type: ignore[method-assign]
    job_id = await a.submitter.submit(
        a.manifest(("19", "600000000"))
    )  # runs for seconds: held past ACCEPT_DELAY
    await wait_state(a, job_id, "done")
    await trio.sleep(0.5)
    assert flushes, "the job was held past ACCEPT_DELAY: an `accepted` was due, after a sync"
    assert heard and "accepted" not in heard, "the job ended during the sync: no `accepted` after it"


async def test_answered_offers_are_forgotten_once_expired(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    from e31.node.market.bidding import ANSWERED_PRUNE_MIN

    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    await start(nursery, b)
    manifest = a.manifest(("14", "1000"))
    past = wall_ms() - 1
    for i in range(ANSWERED_PRUNE_MIN - 1):
        offer = Offer(NETWORK, past - i, NodeId(a.id), (manifest,))
        b.executor.on_offer(verify(sign_message(offer, a.key), Offer))
    assert len(b.executor.bids._answered) == ANSWERED_PRUNE_MIN - 1
    live = verify(sign_message(Offer(NETWORK, wall_ms() + 60_000, NodeId(a.id), (manifest,)), a.key), Offer)
    b.executor.on_offer(live)  # the one that fills the table: every expired offer is forgotten
    assert list(b.executor.bids._answered) == [live.message_id.raw]


async def test_waiting_on_jobs_leaves_no_event_behind(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    from e31.node.api.jobs import JobsApi
    from e31.node.api.server import Request

    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    await start(nursery, a, b)
    api = JobsApi(a.submitter, a.blobs, PROFILE.digest, lambda module: None)
    jobs = [await a.submitter.submit(a.manifest((str(seed), "1000"))) for seed in (15, 16, 17)]

    async def wait(job_id: bytes) -> dict[str, Any]:
        path = f"/v1/jobs/{job_id.hex()}/wait"
        request = Request("GET", path, {"id": job_id.hex()}, {"timeout": "30"}, None)
        doc: dict[str, Any] = await api.wait(request)
        return doc

    docs = [await wait(j) for j in jobs]  # the first waits for its job; the later ones may find it ended
    docs += [await wait(j) for j in jobs]  # every one ended: a waiter takes an event and finds the end
    assert [d["state"] for d in docs] == ["done"] * 6
    assert not a.submitter._job_changed


async def test_an_executor_that_keeps_releasing_a_job_is_forgiven_once(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    a = RealNode(net, tmp_path, "a", 1)
    liar = Liar(net, "releases")  # wins every round, then says it holds no such assignment
    await start(nursery, a)
    job_id = await a.submitter.submit(a.manifest(("18", "1000"), deadline_s=4))
    row = await wait_state(a, job_id, "expired", seconds=15)
    assert len(liar.assignments) == 2  # once forgiven and assigned again, never a third time
    assert "deadline" in (row.reason or "")


async def test_a_release_lost_on_the_way_is_sent_again_when_the_assignment_comes_again(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    await start(nursery, a, b)
    lost = lose_first(net, a.id, Release)
    missing = blob_ref(b"a module A does not have")
    manifest = replace(a.manifest(("19", "1000"), deadline_s=600), module=missing)
    job_id = await a.submitter.submit(manifest)
    # B cannot fetch the module, so it never accepts the job and releases it; that release is lost,
    # A sends the assignment again, and B, finding the job failed here, releases it again.
    row = await wait_state(a, job_id, "failed", seconds=20)
    assert lost and verify(lost[0], Release).message.reason == "failed"
    assert "every node that could run it failed" in (row.reason or "")
    assert not await a.store.run(Store.envelopes_for_job, job_id, "accepted")


async def test_a_strangers_outcomes_neither_crash_the_submitter_nor_take_the_job_away(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    await start(nursery, a, b)
    # B's result (its run takes milliseconds) waits until A has taken the forgeries: they come while
    # the job is still assigned
    forged_all, deliver = trio.Event(), net.handlers[a.id]

    async def held(peer: bytes, raw: bytes) -> None:
        if isinstance(verify(raw).message, (Result, Results)):
            await forged_all.wait()
        await deliver(peer, raw)

    net.handlers[a.id] = held
    manifest = a.manifest(("5", "3000000"))
    job_id = await a.submitter.submit(manifest)
    await wait_state(a, job_id, "assigned")
    evil = nacl.signing.SigningKey(b"\x77" * 32)
    eid = NodeId(bytes(evil.verify_key))
    now = wall_ms()
    # A result carrying, as its receipt, an envelope that is no receipt (the job's offer).
    offer_raw = (await a.store.run(Store.envelopes_for_job, job_id, "offer"))[0].raw
    odd = Result(NETWORK, Digest(job_id), Digest(b"\x05" * 32), eid, offer_raw, now + 60_000, ())
    await a.market.message(eid.raw, sign_message(odd, evil))
    # A well-formed receipt of the job in a result, signed by a node it was never assigned to.
    empty = blob_ref(b"")
    forged = UsageReceipt(
        NETWORK,
        Digest(job_id),
        Digest(b"\x09" * 32),
        manifest.submitter,
        eid,
        manifest.module,
        (),
        None,
        empty,
        empty,
        (),
        Digest(PROFILE.digest),
        manifest.limits,
        Outcome("exited", 0, None),
        1,
        0,
        1,
        now,
        now,
        now,
    )
    forged_raw = sign_message(forged, evil)
    forged_id = verify(forged_raw).message_id
    claim = Result(NETWORK, Digest(job_id), Digest(b"\x09" * 32), eid, forged_raw, now + 60_000, ())
    await a.market.message(eid.raw, sign_message(claim, evil))
    assert (await a.job(job_id)).state == "assigned"  # B's result is still held: nothing ended the job
    forged_all.set()
    row = await wait_state(a, job_id, "done")
    assert row.executor == str(NodeId(b.id)) and row.attempt == 1, "the honest executor kept its job"
    # and none of what the stranger sent was kept: it holds no assignment of the job
    kept = await a.store.run(Store.envelopes_for_job, job_id)
    assert all(verify(r.raw).signer != eid for r in kept)
    assert await a.store.run(Store.envelope, forged_id.raw) is None


async def test_a_job_whose_run_has_ended_is_not_handed_back_while_its_outputs_are_stored(
    net: Net, nursery: trio.Nursery, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    import e31.node.market.executor as executor_module

    real, storing, release = executor_module.store_outputs, trio.Event(), threading.Event()
    token = trio.lowlevel.current_trio_token()

    def slow(blobs: BlobStore, work: Path, result: Any) -> Any:
        trio.from_thread.run_sync(storing.set, trio_token=token)
        release.wait(30)  # a large output being hashed and stored
        return real(blobs, work, result)

    monkeypatch.setattr(executor_module, "store_outputs", slow)
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    await start(nursery, a, b)
    # estimated at 1 s (its fuel at the default rate) against a deadline 2.5 s away: soon "late"
    limits = Limits(10**9, 64 << 20, 30_000, 1 << 20)
    manifest = replace(a.manifest(("5", "1000"), deadline_s=2.5), limits=limits)
    job_id = await a.submitter.submit(manifest)
    await storing.wait()
    try:
        for _ in range(14):  # past the moment it would miss its deadline by its estimate
            assert await b.executor.give_back_late() == 0, "a job that has run was handed back"
            await trio.sleep(0.2)
    finally:
        release.set()
    # the executor finishes it (the submitter's deadline has passed meanwhile)
    row = await wait_state(b, job_id, "done", 10, role="executor")
    assert row.state == "done"


async def test_a_receipt_log_append_that_fails_is_tried_again(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    calls: list[int] = []
    logged: list[bytes] = []

    async def flaky(receipts: list[VerifiedEnvelope[UsageReceipt]]) -> None:
        calls.append(len(receipts))
        if len(calls) == 1:
            raise OSError("disk full")
        logged.extend(r.message_id.raw for r in receipts)

    b.executor.delivery.on_acked = flaky
    await start(nursery, a, b)
    job_id = await a.submitter.submit(a.manifest(("5", "1000")))
    await wait_state(a, job_id, "done")
    receipt = (await a.store.run(Store.receipts_for_job, job_id))[0]
    await until(lambda: logged)
    assert logged == [receipt.message_id] and len(calls) == 2


async def test_proofs_go_to_every_asker_and_wait_for_a_link_that_is_down(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    proved: list[list[bytes]] = []

    def prover(wanted: dict[bytes, list[bytes]], now: int) -> dict[bytes, list[bytes]]:
        proved.extend(wanted.values())
        return {peer: [b"proof of " + r for r in ids] for peer, ids in wanted.items()}

    b.executor.delivery.prover = prover
    sent: list[tuple[bytes, bytes]] = []
    down = {b"\x01" * 32}
    send = b.ctx.peer_send
    assert send is not None

    async def tracking(peer: bytes, raw: bytes) -> bool:
        if raw.startswith(b"proof of "):
            if peer in down:
                return False
            sent.append((peer, raw))
            return True
        return await send(peer, raw)

    b.ctx.peer_send = tracking
    await start(nursery, a, b)
    job_id = await a.submitter.submit(a.manifest(("5", "1000")))
    await wait_state(a, job_id, "done")
    receipt_id = (await a.store.run(Store.receipts_for_job, job_id))[0].message_id
    b.executor.delivery.prove(b"\x01" * 32, receipt_id, None)  # a second asker, whose link is down
    await until(lambda: sent)
    await trio.sleep(0.3)
    assert sent == [(a.id, b"proof of " + receipt_id)], "the submitter gets its proof, once"
    down.clear()
    b.executor.on_link_up(b"\x01" * 32)
    await until(lambda: len(sent) == 2)
    assert sent[1] == (b"\x01" * 32, b"proof of " + receipt_id)


async def test_a_submitter_asks_again_for_a_proof_it_never_got_when_the_link_comes_up(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    from e31.node.market.service import log_prover
    from e31.protocol.messages import InclusionProof

    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    b.executor.delivery.prover = log_prover(receipt_log(b))
    lost = lose_first(net, a.id, InclusionProof)
    await start(nursery, a, b)
    job_id = await a.submitter.submit(a.manifest(("5", "1000")))
    await wait_state(a, job_id, "done")
    await until(lambda: lost)
    assert lost and await a.store.run(Store.envelopes_for_job, job_id, "proof") == []
    assert await a.store.run(Store.acked_without_proof, str(NodeId(b.id))) != []
    a.submitter.on_link_up(b.id)  # b is back: a asks it for the proofs it lacks
    await until(lambda: a.store.run(Store.envelopes_for_job, job_id, "proof"))
    assert len(await a.store.run(Store.envelopes_for_job, job_id, "proof")) == 1
    assert await a.store.run(Store.acked_without_proof, str(NodeId(b.id))) == []


async def test_a_proof_with_an_entry_that_fails_is_refused_whole(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    from e31.protocol.messages import InclusionProof

    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    log = receipt_log(b)  # receipts are logged, but no proof is sent
    await start(nursery, a, b)
    jobs = [await a.submitter.submit(a.manifest(("5", str(1000 + i)))) for i in range(2)]
    for job_id in jobs:
        await wait_state(a, job_id, "done")
    ids = [(await a.store.run(Store.receipts_for_job, j))[0].digest for j in jobs]
    await until(lambda: all(log.index_of(r) is not None for r in ids))
    (raw,) = log.inclusions(ids, wall_ms())
    proof = verify(raw, InclusionProof).message
    good, bad = (proof.entry(Digest(r)) for r in ids)
    assert good is not None and bad is not None
    lying = replace(bad, leaf_index=good.leaf_index)  # the second receipt placed where the first is
    entries = tuple(sorted((good, lying), key=lambda e: e.receipt_id.raw))
    await a.market.message(b.id, sign_message(replace(proof, entries=entries), b.key))
    await trio.sleep(0.3)
    # kept, it would carry a failing entry into a's bundles: nothing of it is kept
    assert [await a.store.run(Store.envelopes_for_job, j, "proof") for j in jobs] == [[], []]
    unproven = await a.store.run(Store.acked_without_proof, str(NodeId(b.id)))
    assert sorted(r.digest for r in unproven) == sorted(ids)
    await a.market.message(b.id, raw)  # the true proof places both
    await until(lambda: a.store.run(Store.envelopes_for_job, jobs[1], "proof"))
    assert await a.store.run(Store.envelopes_for_job, jobs[0], "proof")
    assert await a.store.run(Store.acked_without_proof, str(NodeId(b.id))) == []


async def test_a_run_that_ends_before_its_start_is_recorded_still_ends_done_at_the_executor(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    set_state = b.executor._set_state

    async def slow_to_record_running(job_id: bytes, old: str, new: str, **changes: Any) -> None:
        if new == "running":  # the store busy: the run is over before `running` is written
            await trio.sleep(0.5)
        await set_state(job_id, old, new, **changes)

    b.executor._set_state = slow_to_record_running  # type: ignore[method-assign]
    await start(nursery, a, b)
    job_id = await a.submitter.submit(a.manifest(("5", "1000")))
    await wait_state(a, job_id, "done")
    row = await wait_state(b, job_id, "done", 5, role="executor")
    assert row.state == "done" and row.started is not None


# --- offers and bids of many jobs ---


class Recorder:
    """A peer that only keeps what it is sent (verified), to look at one node's answers."""

    def __init__(self, net: Net, seed: int) -> None:
        self.key = nacl.signing.SigningKey(bytes([seed]) * 32)
        self.id = bytes(self.key.verify_key)
        self.got: list[VerifiedEnvelope[Any]] = []
        net.handlers[self.id] = self.message

    async def message(self, peer: bytes, raw: bytes) -> None:
        self.got.append(verify(raw))

    def kinds(self, kind: type) -> list[Any]:
        return [env for env in self.got if isinstance(env.message, kind)]

    async def only(self, kind: type) -> Any:
        """The one message of `kind` received, once it has come."""
        await until(lambda: self.kinds(kind))
        (env,) = self.kinds(kind)
        return env

    def offer(self, *manifests: JobManifest) -> VerifiedEnvelope[Offer]:
        ordered = tuple(sorted(manifests, key=lambda m: m.job_id.raw))
        offer = Offer(NETWORK, wall_ms() + 60_000, NodeId(self.id), ordered)
        return verify(sign_message(offer, self.key), Offer)


def foreign_manifest(node: RealNode, submitter: bytes, args: tuple[str, ...], **changes: Any) -> JobManifest:
    return replace(node.manifest(args), submitter=NodeId(submitter), **changes)


async def executor_and_peer(net: Net, nursery: trio.Nursery, tmp_path: Path) -> tuple[RealNode, Recorder]:
    """A running node and a peer that offers it jobs and keeps its answers."""
    b, c = RealNode(net, tmp_path, "b", 2), Recorder(net, 9)
    await start(nursery, b)
    return b, c


async def test_a_sweep_goes_out_in_offers_of_many_jobs_each_assigned_through_its_bid(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    await start(nursery, a, b)
    # budgets the two nodes can promise all together (admission plans every job at its whole budget)
    manifests = [a.manifest((str(i), "100"), fuel=10**8) for i in range(12)]
    await a.submitter.submit_batch(manifests)
    ids = [m.job_id.raw for m in manifests]
    for job_id in ids:
        await wait_state(a, job_id, "done")
    offers: dict[bytes, Offer] = {}
    bids: dict[bytes, Bid] = {}
    sets: set[Digest] = set()
    for job_id in ids:
        for row in await a.store.run(Store.envelopes_for_job, job_id, "offer"):
            offers[row.message_id] = verify(row.raw, Offer).message
        for row in await a.store.run(Store.envelopes_for_job, job_id, "bid"):
            bids[row.message_id] = verify(row.raw, Bid).message
        (assign_row,) = await a.store.run(Store.assignments_for_job, job_id)
        assign = assignment_of(verify(assign_row.raw), job_id)
        assert assign is not None
        sets.add(assign.assignment_id)
        # the assignment names one bid, and that bid names this job (and was made for its offer)
        bid = bids[assign.bid_id.raw]
        assert bid.item(assign.job_id) is not None
        assert offers[bid.offer_id.raw].manifest(assign.job_id) is not None
    # twelve jobs submitted together: a couple of offers, bids and signed assignment sets, not twelve of each
    assert len(offers) <= 3 and len(bids) <= 3 and len(sets) <= 6
    assert sum(len(o.manifests) for o in offers.values()) >= 12


async def test_an_assignment_of_a_job_its_bid_does_not_name_is_released(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    b, c = await executor_and_peer(net, nursery, tmp_path)
    named = [foreign_manifest(b, c.id, (str(i), "100")) for i in range(2)]
    b.executor.on_offer(c.offer(*named))
    bid_env = await c.only(Bid)
    assert [i.job_id for i in bid_env.message.items] == sorted((m.job_id for m in named), key=lambda d: d.raw)
    other = foreign_manifest(b, c.id, ("7", "100"))
    now = wall_ms()
    assign = Assign(NETWORK, other.job_id, bid_env.message_id, NodeId(c.id), NodeId(b.id), 1, now + 30_000)
    await b.market.message(c.id, sign_message(assign, c.key))
    release = await c.only(Release)
    assert release.message.job_id == other.job_id and release.message.reason == "unknown"
    assert await b.store.run(Store.job, other.job_id.raw, "executor") is None


async def test_jobs_of_one_offer_declined_for_one_reason_share_one_decline(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    b, c = await executor_and_peer(net, nursery, tmp_path)
    alien = Digest(b"\x01" * 32)  # an execution profile b does not run
    no_profile = [foreign_manifest(b, c.id, (str(i), "100"), profile=alien) for i in range(2)]
    huge = foreign_manifest(b, c.id, ("3", "100"), limits=Limits(10**10, 1 << 40, 30_000, 1 << 20))
    fine = foreign_manifest(b, c.id, ("4", "100"))
    b.executor.on_offer(c.offer(*no_profile, huge, fine))
    await until(lambda: len(c.kinds(Decline)) == 2 and c.kinds(Bid))
    declines = {env.message.reason: env.message for env in c.kinds(Decline)}
    assert set(declines) == {"no_profile", "limits"}
    assert set(declines["no_profile"].job_ids) == {m.job_id for m in no_profile}
    assert declines["limits"].job_ids == (huge.job_id,)
    (bid_env,) = c.kinds(Bid)
    assert [i.job_id for i in bid_env.message.items] == [fine.job_id]


async def test_offers_of_the_same_jobs_are_never_the_same_message(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    from e31.node.market.submitted import Joining, SubmittedJob

    a = RealNode(net, tmp_path, "a", 1)
    manifest = a.manifest(("1", "100"))
    job = SubmittedJob(manifest)
    expires = wall_ms() + 60_000
    first = a.submitter.offers._sign_offer([Joining(manifest.job_id.raw, job, expires)])
    again = a.submitter.offers._sign_offer([Joining(manifest.job_id.raw, job, expires)])
    assert first.message.manifests == again.message.manifests
    assert first.message.expires == expires and again.message.expires == expires - 1
    assert first.message_id != again.message_id


async def test_missing_proofs_are_asked_for_a_page_per_link_up_so_none_starves(
    net: Net, nursery: trio.Nursery, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import e31.node.market.inclusion as submitter_module
    from e31.protocol.messages import ProofRequest

    monkeypatch.setattr(submitter_module, "PROOFS_ASKED", 2)
    a = RealNode(net, tmp_path, "a", 1)
    c = Recorder(net, 9)
    executor = str(NodeId(c.id))
    for i in range(3):
        job, digest = bytes([0x70 + i]) * 32, bytes([0x80 + i]) * 32
        await a.store.run(
            Store.add_job,
            job_id=job,
            role="submitter",
            manifest=b"m",
            state="done",
            submitter=str(NodeId(a.id)),
            created=1.0,
            deadline=2.0,
        )
        await a.store.run(Store.put_envelope, digest, "receipt", b"r", 1.0, job)
        await a.store.run(
            Store.record_verified_receipt,
            receipt_digest=digest,
            job_id=job,
            attempt=1,
            executor=executor,
            now=10.0 + i,
        )
    total = 0
    for size in (2, 1, 2):  # three link-ups: the two newest, the oldest, then the newest again
        await a.submitter.proofs.ask(c.id)
        total += size
        await until(lambda: len(c.kinds(ProofRequest)) >= total)  # noqa: B023
    asked = [env.message.receipt_id.raw for env in c.kinds(ProofRequest)]  # each page's in any order
    newest = {b"\x82" * 32, b"\x81" * 32}
    assert (set(asked[:2]), asked[2:3], set(asked[3:])) == (newest, [b"\x80" * 32], newest)


async def test_open_bids_keep_a_bounded_amount_of_offers_then_offers_are_declined_busy(
    net: Net, nursery: trio.Nursery, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import e31.node.market.bidding as executor_module

    b, c = await executor_and_peer(net, nursery, tmp_path)
    first = c.offer(foreign_manifest(b, c.id, ("1", "100")))
    monkeypatch.setattr(executor_module, "PROMISED_BYTES_MAX", len(first.raw) + 10)
    b.executor.on_offer(first)
    await until(lambda: c.kinds(Bid))
    second = c.offer(foreign_manifest(b, c.id, ("2", "100")), foreign_manifest(b, c.id, ("3", "100")))
    b.executor.on_offer(second)
    decline = await c.only(Decline)
    assert decline.message.reason == "busy" and decline.message.offer_id == second.message_id
    assert set(decline.message.job_ids) == {m.job_id for m in second.message.manifests}
    assert len(c.kinds(Bid)) == 1 and b.executor.bids._promised_bytes == len(first.raw)


async def test_a_bid_lasts_as_long_as_its_longest_lived_job_allows(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    b, c = await executor_and_peer(net, nursery, tmp_path)
    now = wall_ms()
    quick = Limits(10**10, 64 << 20, 1_000, 1 << 20)  # at most a second: it can make a 5 s deadline
    near = foreign_manifest(b, c.id, ("1", "100"), deadline=now + 5_000, limits=quick)
    far = foreign_manifest(b, c.id, ("2", "100"))
    b.executor.on_offer(c.offer(near, far))
    bid = await c.only(Bid)
    assert {i.job_id for i in bid.message.items} == {near.job_id, far.job_id}
    assert bid.message.expires >= now + SETTINGS.bid_ttl_ms  # not cut to the near job's deadline


async def test_a_job_whose_offer_must_expire_soon_goes_only_with_jobs_that_expire_about_as_soon(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    from e31.node.market.submitted import Joining, SubmittedJob

    a = RealNode(net, tmp_path, "a", 1)
    now = wall_ms()  # SETTINGS: a bid window of at most 2 s, so "soon" is within 2 s
    entries = []
    for i, expires in enumerate((now + 60_000, now + 1_000, now + 60_000, now + 60_000, now + 1_500)):
        manifest = a.manifest((str(i), "100"))
        entries.append(Joining(manifest.job_id.raw, SubmittedJob(manifest), expires))
    a.submitter.offers._joining = list(entries)

    def take() -> list[Joining]:  # (in the line's order: which of them go together is what counts)
        return sorted(a.submitter.offers._take_set(), key=entries.index)

    assert take() == [entries[0], entries[2], entries[3]]
    assert take() == [entries[1], entries[4]]  # the two short-lived ones, together
    assert a.submitter.offers._joining == []


async def test_a_job_that_cannot_be_offered_fails_and_the_jobs_offered_with_it_go_on(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    a, b = RealNode(net, tmp_path, "a", 1), RealNode(net, tmp_path, "b", 2)
    await start(nursery, a, b)
    good = a.manifest(("1", "100"))
    bad = foreign_manifest(a, bytes(32), ("2", "100"))  # names another submitter: no offer of a's holds it
    await a.submitter.submit_batch([good, bad])
    failed = await wait_state(a, bad.job_id.raw, "failed")
    assert failed.reason.startswith("it cannot be offered")
    await wait_state(a, good.job_id.raw, "done")


async def test_messages_reaching_a_stopped_market_are_dropped_not_spawned(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    """A node stopping cancels its roles one by one; what reaches a role whose tasks have ended (an own
    offer published from a shielded store write, a message read just before the link closed) is dropped
    instead of failing the whole node with 'Nursery is closed to new arrivals'."""
    b = RealNode(net, tmp_path, "b", 2)
    c = Recorder(net, 9)
    async with trio.open_nursery() as inner:
        await inner.start(b.market.run)
        inner.cancel_scope.cancel()
    offer = c.offer(foreign_manifest(b, c.id, ("1", "100")))
    b.executor.on_offer(offer)  # none of these may raise
    b.market.dispatch(c.id, offer)
    b.submitter._drive_job(b"\x01" * 32, foreign_manifest(b, b.id, ("2", "100")))
    await b.market.message(
        c.id, sign_message(Accepted(NETWORK, Digest(b"\x01" * 32), Digest(b"\x02" * 32), NodeId(c.id)), c.key)
    )
    assert b.submitter.jobs == {}


async def test_the_line_offers_jobs_at_risk_first_and_a_lone_job_before_a_sweeps_rest(
    net: Net, nursery: trio.Nursery, tmp_path: Path
) -> None:
    """The submitter's own line follows the scheduling policy (policy.offer_key): a job whose deadline
    is near its estimate goes first; a lone job joining behind a sweep of more than one offer's jobs
    goes in the next offer, not after the whole sweep (the sweep's offered jobs count against it)."""
    from e31.node.market.submitted import Joining, SubmittedJob
    from e31.protocol.messages import MAX_SET

    a = RealNode(net, tmp_path, "a", 1)
    line = a.submitter.offers
    far = wall_ms() + 600_000
    sweep = [a.manifest((str(i), "100"), deadline_s=600) for i in range(MAX_SET + 20)]
    sweep = [replace(m, created_at=sweep[0].created_at) for m in sweep]  # one batch
    lone = a.manifest(("lone", "100"), deadline_s=600)
    urgent = a.manifest(("urgent", "100"), deadline_s=15)  # 1e10 fuel: 12.5 s at the unmeasured rate
    entries = {m.job_id.raw: Joining(m.job_id.raw, SubmittedJob(m), far) for m in (*sweep, lone, urgent)}
    for m in (*sweep, lone, urgent):
        line.join(entries[m.job_id.raw])
    first = line._take_set()
    assert first[0] is entries[urgent.job_id.raw] and len(first) == MAX_SET
    second = line._take_set()
    taken = first + second
    assert entries[lone.job_id.raw] in taken
    # the lone job went before the sweep's last jobs, which came in the order they joined
    rest = [e for e in taken if e.job_id in {m.job_id.raw for m in sweep}]
    assert [e.job_id for e in rest] == [m.job_id.raw for m in sweep]
    assert taken.index(entries[lone.job_id.raw]) < taken.index(rest[-1])
