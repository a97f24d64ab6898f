"""A submitter's acknowledgements, a batch at a time (node/acks.py): a real store and real signatures;
the links are a function that records what is sent."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path

import nacl.signing
import pytest
import trio
from e31.node.errors import StoreError
from e31.node.market.acks import Acknowledger
from e31.node.market.context import MarketContext, MarketSettings
from e31.node.store.async_store import AsyncStore
from e31.node.store.blobs import BlobStore
from e31.node.store.db import Store
from e31.protocol.envelope import verify
from e31.protocol.ids import NodeId
from e31.protocol.receipts import MAX_ACKED, Ack

NETWORK = "test"
X, Y = b"\x0a" * 32, b"\x0b" * 32  # two executors


def _receipts(store: Store, executor: bytes, count: int, tag: bytes) -> list[tuple[bytes, bytes]]:
    """`count` verified receipts of `executor`, each of its own job: (receipt id, job id)."""
    out = []
    for i in range(count):
        job, digest = hashlib.sha256(tag + b"job%d" % i).digest(), hashlib.sha256(tag + b"r%d" % i).digest()
        store.add_job(
            job_id=job,
            role="submitter",
            manifest=b"m",
            state="done",
            submitter="s",
            created=1.0,
            deadline=2.0,
        )
        store.put_envelope(digest, "receipt", b"r", 1.0, job)
        store.record_verified_receipt(
            receipt_digest=digest, job_id=job, attempt=1, executor=str(NodeId(executor)), now=time.time()
        )
        out.append((digest, job))
    return out


async def until(check: Callable[[], bool]) -> None:
    """Poll `check` every 10 ms; fail the test if it is not true within 5 s."""
    for _ in range(500):
        if check():
            return
        await trio.sleep(0.01)
    assert check(), "still not true after 5 s"


@pytest.fixture
def ctx(tmp_path: Path) -> MarketContext:
    return MarketContext(
        identity=nacl.signing.SigningKey(b"\x01" * 32),
        network=NETWORK,
        store=AsyncStore(Store(tmp_path / "a.sqlite")),
        blobs=BlobStore(tmp_path / "blobs"),
        settings=MarketSettings(ack_batch_s=0.05),
    )


async def test_each_executor_gets_one_ack_per_batch_of_at_most_max_acked_receipts(ctx: MarketContext) -> None:
    store = ctx.store.store
    many, few = _receipts(store, X, MAX_ACKED + 44, b"x"), _receipts(store, Y, 2, b"y")
    sent: list[tuple[bytes, bytes]] = []

    async def send(peer: bytes, raw: bytes) -> bool:
        sent.append((peer, raw))
        return True

    ctx.peer_send = send
    acks = Acknowledger(ctx)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(acks.run)
        for executor, receipts in ((X, many), (Y, few)):
            for digest, job in receipts:
                acks.add(executor, digest, job)
                acks.add(executor, digest, job)  # twice (a result delivered again meanwhile): once
        await until(lambda: len(sent) >= 3)
        await trio.sleep(0.2)  # and nothing more
        nursery.cancel_scope.cancel()
    assert len(sent) == 3
    named: dict[bytes, list[bytes]] = {X: [], Y: []}
    for peer, raw in sent:
        env = verify(raw, Ack)
        assert env.signer == ctx.node and env.message.executor == NodeId(peer)
        ids = [r.raw for r in env.message.receipt_ids]
        assert ids == sorted(ids) and len(ids) <= MAX_ACKED
        named[peer] += ids
        for receipt_id in ids:  # stored once, as the ack of each receipt it names
            kept = store.ack_for(receipt_id)
            assert kept is not None and kept.raw == raw
    assert sorted(named[X]) == sorted(d for d, _ in many) and sorted(named[Y]) == sorted(d for d, _ in few)
    assert store.verified_unacked() == []
    [to_y] = [verify(raw).message_id.raw for peer, raw in sent if peer == Y]
    assert {r.message_id for r in store.envelopes_for_job(few[0][1], "ack")} == {to_y}


async def test_an_ack_that_finds_no_link_is_kept_and_sent_when_asked_again(ctx: MarketContext) -> None:
    store = ctx.store.store
    [(digest, job)] = _receipts(store, X, 1, b"x")
    ctx.peer_send = None  # no link at all
    acks = Acknowledger(ctx)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(acks.run)
        acks.add(X, digest, job)
        await until(lambda: store.ack_for(digest) is not None)
        nursery.cancel_scope.cancel()
    kept = store.ack_for(digest)
    assert kept is not None and [r.raw for r in verify(kept.raw, Ack).message.receipt_ids] == [digest]


async def test_acks_the_store_cannot_keep_are_tried_again(
    ctx: MarketContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = ctx.store.store
    [(digest, job)] = _receipts(store, X, 1, b"x")
    sent: list[bytes] = []

    async def send(peer: bytes, raw: bytes) -> bool:
        sent.append(raw)
        return True

    ctx.peer_send = send
    put_acks, failures = Store.put_acks, [0]

    def full_disk(self: Store, *args: object, **kwargs: object) -> None:
        if not failures[0]:
            failures[0] += 1
            raise StoreError("disk full")
        put_acks(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Store, "put_acks", full_disk)
    acks = Acknowledger(ctx)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(acks.run)
        acks.add(X, digest, job)
        await until(lambda: bool(sent))
        nursery.cancel_scope.cancel()
    assert failures == [1] and store.ack_for(digest) is not None  # (a node's own job comes no more)
    assert [r.raw for r in verify(sent[0], Ack).message.receipt_ids] == [digest]


async def test_too_many_receipts_waiting_drop_the_oldest(
    ctx: MarketContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    import e31.node.market.acks as acks_module

    monkeypatch.setattr(acks_module, "ACKS_DUE_KEPT", 3)
    acks = Acknowledger(ctx)
    for i in range(5):
        acks.add(X if i % 2 else Y, bytes([i]) * 32, b"j" * 32)
    assert list(acks._due) == [(Y, bytes([2]) * 32), (X, bytes([3]) * 32), (Y, bytes([4]) * 32)]
