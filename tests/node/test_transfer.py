"""Chunked blob transfer between two nodes' blob stores, over an in-memory link of signed envelopes."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import nacl.signing
import pytest
import trio
from e31.node.market.transfer import BlobTransfer, FetchError, TransferSettings
from e31.node.store.blobs import BlobStore
from e31.protocol.blobs import CHUNK_SIZE, BlobRef, blob_ref, chunk_list
from e31.protocol.envelope import sign_message, verify
from e31.protocol.ids import NodeId
from e31.protocol.messages import BlobChunk, BlobRequest

NETWORK = "test"
FAST = TransferSettings(window=3, request_timeout=0.5, retries=2)


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


class Pair:
    """Node a serves, node b fetches; `drop` decides which envelopes the link loses."""

    def __init__(self, tmp: Path) -> None:
        self.keys = {n: nacl.signing.SigningKey(bytes([i + 1]) * 32) for i, n in enumerate("ab")}
        self.ids = {n: bytes(k.verify_key) for n, k in self.keys.items()}
        self.stores = {n: BlobStore(tmp / n) for n in "ab"}
        self.drop: Callable[[str, bytes], bool] = lambda sender, raw: False
        self.nodes = {
            n: BlobTransfer(
                identity=self.keys[n],
                network=NETWORK,
                blobs=self.stores[n],
                send=self._sender(n),
                wall_ms=wall_ms,
                settings=FAST,
            )
            for n in "ab"
        }

    def _sender(self, me: str) -> Callable[[bytes, bytes], object]:
        async def send(peer: bytes, raw: bytes) -> bool:
            if self.drop(me, raw):
                return True
            target = next(n for n, key in self.ids.items() if key == peer)
            env = verify(raw)
            node = self.nodes[target]
            if isinstance(env.message, BlobRequest):
                node.on_request(self.ids[me], env)
            elif isinstance(env.message, BlobChunk):
                node.on_chunk(self.ids[me], env)
            return True

        return send

    async def fetch(self, ref: BlobRef) -> None:
        await self.nodes["b"].fetch(self.ids["a"], ref)


@pytest.fixture
async def pair(tmp_path: Path, nursery: trio.Nursery) -> Pair:
    p = Pair(tmp_path)
    for node in p.nodes.values():
        await nursery.start(node.run)
    return p


def blob(size: int) -> bytes:
    return os.urandom(size)


async def test_a_multi_chunk_blob_arrives_whole_and_verified(pair: Pair) -> None:
    data = blob(3 * CHUNK_SIZE + 1234)
    root = pair.stores["a"].put(data)
    ref = blob_ref(data)
    assert root == ref.root.hex()
    await pair.fetch(ref)
    assert pair.stores["b"].read(root) == data
    assert pair.nodes["b"].fetched_chunks == 4
    assert pair.stores["b"].partials() == []
    await pair.fetch(ref)  # already there: nothing is asked for again
    assert pair.nodes["b"].fetched_chunks == 4


async def test_empty_and_single_chunk_blobs(pair: Pair) -> None:
    for data in (b"", b"x", blob(CHUNK_SIZE)):
        pair.stores["a"].put(data)
        await pair.fetch(blob_ref(data))
        assert pair.stores["b"].read(blob_ref(data).root.raw) == data


async def test_a_blob_the_peer_does_not_hold_fails_cleanly(pair: Pair) -> None:
    with pytest.raises(FetchError, match="did not send chunk 0"):
        await pair.fetch(blob_ref(b"nobody has this"))
    with pytest.raises(FetchError, match="did not send the chunk list"):
        await pair.fetch(blob_ref(bytes(CHUNK_SIZE + 1)))


async def test_a_single_chunk_blob_takes_one_request(pair: Pair) -> None:
    asked: list[int | None] = []

    def count(sender: str, raw: bytes) -> bool:
        env = verify(raw)
        if isinstance(env.message, BlobRequest):
            asked.append(env.message.index)
        return False

    pair.drop = count
    data = blob(CHUNK_SIZE)
    pair.stores["a"].put(data)
    await pair.fetch(blob_ref(data))
    assert asked == [0]
    assert pair.stores["b"].read(blob_ref(data).root.raw) == data
    assert pair.stores["b"].partials() == []


def _asked(pair: Pair) -> list[bytes]:
    """Roots b asks a for, as they are asked."""
    asked: list[bytes] = []

    def count(sender: str, raw: bytes) -> bool:
        env = verify(raw)
        if isinstance(env.message, BlobRequest):
            asked.append(env.message.blob.raw)
        return False

    pair.drop = count
    return asked


async def test_an_unasked_chunk_is_never_used(pair: Pair) -> None:
    asked = _asked(pair)
    data = b"the real output"
    pair.stores["a"].put(data)
    ref = blob_ref(data)
    lie = BlobChunk(NETWORK, NodeId(pair.ids["a"]), ref.root, 0, b"forged output!!")
    pair.nodes["b"].on_chunk(pair.ids["a"], verify(sign_message(lie, pair.keys["a"])))
    await pair.fetch(ref)
    assert asked == [ref.root.raw], "a chunk sent before it was asked for is dropped: it is asked for"
    assert pair.stores["b"].read(ref.root.raw) == data


async def test_a_single_chunk_blob_that_does_not_hash_to_its_root_is_refused(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    data, other = b"the real bytes", b"other bytes!!!"
    ref = blob_ref(data)
    pair.stores["a"].put(data)
    lying = pair.stores["a"]  # a peer serving the wrong bytes under the root asked for
    monkeypatch.setattr(lying, "read_chunk", lambda digest, index: other)
    with pytest.raises(FetchError, match="bad chunk"):
        await pair.fetch(ref)
    assert not pair.stores["b"].has(ref.root.raw)
    assert list(pair.stores["b"].root.glob("*/.tmp-*")) == []


async def test_a_corrupt_chunk_is_refused_and_nothing_unverified_is_kept(
    pair: Pair, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = blob(2 * CHUNK_SIZE + 10)
    root = pair.stores["a"].put(data)
    ref = blob_ref(data)
    real = pair.stores["a"].read_chunk

    def lying(digest: bytes | str, index: int) -> bytes:  # a peer that flips a byte of chunk 1
        chunk = bytearray(real(digest, index))
        if index == 1:
            chunk[5] ^= 0xFF
        return bytes(chunk)

    monkeypatch.setattr(pair.stores["a"], "read_chunk", lying)
    with pytest.raises(FetchError, match="bad chunk"):
        await pair.fetch(ref)
    assert not pair.stores["b"].has(root)
    partial = pair.stores["b"].partial(root, ref.size)
    assert 1 not in [i for i in range(partial.chunk_count) if partial.have(i)]


async def test_a_blob_damaged_on_the_serving_disk_is_quarantined_there_not_served(pair: Pair) -> None:
    data = blob(2 * CHUNK_SIZE + 10)
    root = pair.stores["a"].put(data)
    ref = blob_ref(data)
    await pair.nodes["a"]._chunk_list(ref.root.raw)  # the list is served from the cache from now on
    path = pair.stores["a"].path(root)
    corrupt = bytearray(path.read_bytes())
    corrupt[CHUNK_SIZE + 5] ^= 0xFF
    path.write_bytes(bytes(corrupt))
    with pytest.raises(FetchError):
        await pair.fetch(ref)
    assert not pair.stores["a"].has(root), "the damaged copy is quarantined where it lies"
    assert list((pair.stores["a"].root / "quarantine").iterdir())
    assert not pair.stores["b"].has(root)


async def test_a_wrong_chunk_list_is_refused(pair: Pair) -> None:
    data, other = blob(CHUNK_SIZE + 1), blob(CHUNK_SIZE + 1)
    pair.stores["a"].put(other)
    lying = BlobRef(blob_ref(data).root, blob_ref(data).size)
    pair.nodes["a"]._lists[lying.root.raw] = chunk_list(other).to_bytes()
    with pytest.raises(FetchError, match="wrong chunk list"):
        await pair.fetch(lying)


async def test_an_interrupted_fetch_resumes_with_only_the_missing_chunks(pair: Pair) -> None:
    data = blob(4 * CHUNK_SIZE)
    root = pair.stores["a"].put(data)
    ref = blob_ref(data)

    def lose_chunk_2(sender: str, raw: bytes) -> bool:
        env = verify(raw)
        return isinstance(env.message, BlobChunk) and env.message.index == 2

    pair.drop = lose_chunk_2
    with pytest.raises(FetchError, match="chunk 2"):
        await pair.fetch(ref)
    assert not pair.stores["b"].has(root)
    fetched = pair.nodes["b"].fetched_chunks
    assert fetched == 3
    pair.drop = lambda sender, raw: False
    await pair.fetch(ref)
    assert pair.stores["b"].read(root) == data
    assert pair.nodes["b"].fetched_chunks == fetched + 1
