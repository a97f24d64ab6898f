"""A bid says which of its jobs' blobs the executor holds (Bid.held), and the submitter prefers, all else
equal, the bid that holds more of a job's bytes: the rule (rules.choose_bid, rules.held_bytes) and real
job paths (market_nodes.RealNode: real stores, blob stores and sandbox) whose bids are read off the wire."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio
from e31.node.market.rules import BidView, choose_bid, held_bytes
from e31.protocol.blobs import blob_ref
from e31.protocol.envelope import verify
from e31.protocol.ids import Digest, NodeId
from e31.protocol.jobs import FileRef, JobManifest, Limits
from e31.protocol.messages import Bid
from e31.sandbox.profile import PROFILE
from market_nodes import Net, RealNode, start, wait_state

A, B, C = b"a" * 32, b"b" * 32, b"c" * 32


def view(executor: bytes, finish: int, held: int = 0, start_ms: int = 100) -> BidView:
    return BidView(executor + b"bid", executor, start_ms, finish, 10_000, held)


def test_all_else_equal_the_executor_holding_more_of_the_job_wins() -> None:
    bids = [view(A, 500), view(B, 500, held=4_000_000), view(C, 500, held=10)]
    assert choose_bid(bids, {}, now=0, deadline=1000).executor == B  # type: ignore[union-attr]
    # an earlier finish still comes first: holding blobs only breaks ties
    earlier = [view(A, 499), view(B, 500, held=4_000_000)]
    assert choose_bid(earlier, {}, now=0, deadline=1000).executor == A  # type: ignore[union-attr]
    # as does a known executor over a stranger
    assert choose_bid(bids, {}, now=0, deadline=1000, known={C}).executor == C  # type: ignore[union-attr]
    # with nothing held, the key decides, as before
    assert choose_bid([view(B, 500), view(A, 500)], {}, now=0, deadline=1000).executor == A  # type: ignore[union-attr]


def test_held_bytes_counts_each_of_the_jobs_blobs_once() -> None:
    module, model = blob_ref(b"\x00asm\x01\x00\x00\x00"), blob_ref(b"m" * 1000)
    manifest = JobManifest(
        module=module,
        inputs=(FileRef("a.bin", model), FileRef("b.bin", model)),
        args=(),
        env=(),
        stdin=None,
        limits=Limits(10**9, 64 << 20, 30_000, 1 << 20),
        deadline=2_000_000_000_000,
        retention_ms=60_000,
        replicas=1,
        profile=Digest(PROFILE.digest),
        submitter=NodeId(A),
        nonce=b"\x00" * 16,
        created_at=1_900_000_000_000,
    )
    assert held_bytes(manifest, (model.root,)) == 1000
    assert held_bytes(manifest, (model.root, module.root)) == 1000 + module.size
    assert held_bytes(manifest, (Digest(b"\x07" * 32),)) == 0


def record_bids(net: Net, to: bytes) -> list[Bid]:
    """The bids delivered to `to`, as they travelled (each envelope verified and decoded)."""
    seen: list[Bid] = []
    deliver = net.handlers[to]

    async def handler(peer: bytes, raw: bytes) -> None:
        message: Any = verify(raw).message
        if isinstance(message, Bid):
            seen.append(message)
        await deliver(peer, raw)

    net.handlers[to] = handler
    return seen


async def test_an_executor_says_it_holds_a_module_once_it_has_run_a_job_of_it(
    nursery: trio.Nursery, net: Net, node: Callable[[str, int], RealNode]
) -> None:
    submitter, executor = node("submitter", 1), node("executor", 2)
    bids = record_bids(net, submitter.id)
    await start(nursery, submitter, executor)
    first = submitter.manifest(("1", "1000"))
    await submitter.submitter.submit(first)
    await wait_state(submitter, first.job_id.raw, "done")
    assert bids and bids[0].held == ()  # it held nothing of the first job
    assert executor.blobs.has(first.module.root.raw)  # fetched to run it
    second = submitter.manifest(("2", "1000"))
    await submitter.submitter.submit(second)
    await wait_state(submitter, second.job_id.raw, "done")
    later = [b for b in bids if b.item(second.job_id) is not None]
    assert later and later[0].held == (second.module.root,)
