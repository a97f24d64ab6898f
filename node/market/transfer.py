"""Blobs between peers, in chunks: serving our blobs and fetching others' with every chunk verified.

A blob of one chunk (most job outputs) takes one round trip: chunk 0 is asked for directly, and the
chunk list it implies (its own SHA-256) must hash to the root, which checks the bytes completely; the
blob is then stored in one write. A larger blob is asked for its chunk list first (`blobreq` with
index nil), which must hash to the root; then the missing chunks are asked for, a window of them at
a time, and each is checked against its listed digest before it is written (as its own fsynced file)
into the blob store's PartialBlob for that root. A fetch interrupted by a timeout, a lost link or a
restart resumes with only the chunks still missing; the blob is installed once the whole of it hashes
to the root. No unverified byte is ever kept.

Serving answers each `blobreq` with a `blobchunk` read from the blob store; chunk lists are computed
once per blob (the whole blob is checked then) and cached. Replies are matched to requests by
(peer, root, index); a chunk nobody asked for is dropped. (A job's small outputs need no fetch: they
come in its `result`, protocol/results.py.)
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field

import nacl.signing
import trio
from e31.protocol.blobs import CHUNK_SIZE, BlobRef, ChunkList, blob_ref, chunk_list
from e31.protocol.envelope import VerifiedEnvelope, check_fresh, sign_message
from e31.protocol.errors import BadBlob, ProtocolError
from e31.protocol.ids import Digest, NodeId
from e31.protocol.messages import BlobChunk, BlobRequest

from ..errors import Unavailable
from ..nursery import TaskSlot
from ..store.blobs import BlobCorrupt, BlobError, BlobStore, PartialBlob
from .fetch_estimate import FetchRate

log = logging.getLogger("e31.transfer")

SendTo = Callable[[bytes, bytes], Awaitable[bool]]
"""Send a signed envelope to a peer (32-byte key); False when there is no link to it."""
SmallBlobs = Callable[[bytes], Awaitable[bytes | None]]
"""A small blob (one chunk, PUSH_MAX bytes at most) the node keeps in its database rather than its blob
store, by root; None when it holds none."""


class FetchError(Unavailable):
    """A blob could not be fetched from a peer (no link, no answer, or bad data); the message says why."""


class PeerUnreachable(FetchError):
    """The peer could not be asked (no link) or did not answer: the same fetch may succeed later."""


@dataclass(frozen=True, slots=True)
class TransferSettings:
    window: int = 8
    """Chunk requests in flight per fetch."""
    request_timeout: float = 10.0
    retries: int = 3
    """Times one chunk is asked for before the fetch gives up (it resumes later from what it has)."""
    request_ttl_ms: int = 60_000
    serve_concurrency: int = 4
    chunk_list_cache: int = 256


@dataclass(eq=False)
class _Waiter:
    event: trio.Event = field(default_factory=trio.Event)
    data: bytes | None = None


class BlobTransfer:
    def __init__(
        self,
        *,
        identity: nacl.signing.SigningKey,
        network: str,
        blobs: BlobStore,
        send: SendTo,
        wall_ms: Callable[[], int],
        settings: TransferSettings | None = None,
        small_blobs: SmallBlobs | None = None,
        on_corrupt: Callable[[bytes, str], None] | None = None,
    ) -> None:
        self.identity = identity
        self.local = bytes(identity.verify_key)
        self.network = network
        self.blobs = blobs
        self.send = send
        self.wall_ms = wall_ms
        self.settings = settings or TransferSettings()
        self.small_blobs = small_blobs
        self.on_corrupt = on_corrupt
        """Told (root, why) when a blob this node was asked for is found corrupt (and quarantined): it
        cannot be served, so the node's own jobs that need it end now, not at their deadline."""
        self._waiters: dict[tuple[bytes, bytes, int | None], _Waiter] = {}
        self._locks: dict[bytes, trio.Lock] = {}
        self._lists: OrderedDict[bytes, bytes] = OrderedDict()
        self._serve_limit = trio.CapacityLimiter(self.settings.serve_concurrency)
        self._tasks = TaskSlot()
        self.served_chunks = 0
        self.fetched_chunks = 0
        self.rate = FetchRate()
        """The rate this node's fetches run at, measured by `_fetch`: what its bids plan fetches at."""

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with self._tasks.open():
            task_status.started()
            await trio.sleep_forever()

    # --- incoming messages (called from the market's link listener; never block) ---

    def on_request(self, peer: bytes, env: VerifiedEnvelope[BlobRequest]) -> None:
        nursery = self._tasks.nursery
        if env.signer.raw != peer or nursery is None:
            return
        try:
            check_fresh(env, self.wall_ms(), network=self.network)
        except ProtocolError as e:
            log.debug("ignoring a blob request from %s: %s", NodeId(peer), e)
            return
        nursery.start_soon(self._serve, peer, env.message)

    def on_chunk(self, peer: bytes, env: VerifiedEnvelope[BlobChunk]) -> None:
        msg = env.message
        if env.signer.raw != peer or msg.network != self.network:
            return
        waiter = self._waiters.get((peer, msg.blob.raw, msg.index))
        if waiter is not None and waiter.data is None:
            waiter.data = msg.data
            waiter.event.set()

    # --- serving ---

    async def _serve(self, peer: bytes, request: BlobRequest) -> None:
        async with self._serve_limit:
            try:
                small = await self._small(request.blob.raw)
                if small is not None:  # one chunk: its chunk list is its own digest
                    data = chunk_list(small).to_bytes() if request.index is None else small
                    if request.index not in (None, 0):
                        raise BlobError(f"blob {request.blob} has one chunk, not {request.index + 1}")
                elif request.index is None:
                    data = await self._chunk_list(request.blob.raw)
                else:
                    data = await trio.to_thread.run_sync(
                        self.blobs.read_chunk, request.blob.raw, request.index
                    )
            except BlobCorrupt as e:
                log.warning("cannot serve %s to %s: %s", request.blob, NodeId(peer), e)
                if self.on_corrupt is not None:
                    self.on_corrupt(request.blob.raw, str(e))
                return
            except (BlobError, ValueError, OSError) as e:
                log.debug("cannot serve %s[%s] to %s: %s", request.blob, request.index, NodeId(peer), e)
                return
        reply = BlobChunk(self.network, NodeId(self.local), request.blob, request.index, data)
        if await self.send(peer, sign_message(reply, self.identity)):
            self.served_chunks += 1

    async def _small(self, root: bytes) -> bytes | None:
        """The blob from the database when the blob store has no file of it (checked: a row that does
        not hash to its root is not served)."""
        if self.small_blobs is None or self.blobs.has(root):
            return None
        data = await self.small_blobs(root)
        if data is None or blob_ref(data).root.raw != root:
            return None
        return data

    async def _chunk_list(self, root: bytes) -> bytes:
        cached = self._lists.get(root)
        if cached is not None:
            self._lists.move_to_end(root)
            return cached
        hashes = await trio.to_thread.run_sync(self.blobs.chunk_hashes, root)
        data = b"".join(hashes)
        self._lists[root] = data
        while len(self._lists) > self.settings.chunk_list_cache:
            self._lists.popitem(last=False)
        return data

    # --- fetching ---

    async def fetch(self, peer: bytes, ref: BlobRef) -> None:
        """Make the blob `ref` present in the local store, fetching what is missing from `peer`."""
        root = ref.root.raw
        lock = self._locks.setdefault(root, trio.Lock())
        try:
            async with lock:
                if self.blobs.has(root):  # one stat of a local file: cheaper inline than a thread hop
                    return
                if ref.size == 0:
                    await trio.to_thread.run_sync(self.blobs.put_stream, [], root)
                elif ref.size <= CHUNK_SIZE:
                    await self._fetch_one_chunk(peer, ref)
                else:
                    await self._fetch(peer, ref)
        finally:
            if not lock.locked() and lock.statistics().tasks_waiting == 0:
                self._locks.pop(root, None)

    async def _fetch_one_chunk(self, peer: bytes, ref: BlobRef) -> None:
        data = await self._ask(peer, ref.root, 0)
        if len(data) != ref.size or blob_ref(data) != ref:
            raise FetchError(f"{NodeId(peer)} sent a bad chunk of {ref.root}: it does not hash to its root")
        try:
            await trio.to_thread.run_sync(self.blobs.put_stream, [data], ref.root.raw)
        except (BlobError, OSError) as e:
            raise FetchError(f"cannot store blob {ref.root}: {e}") from None
        self.fetched_chunks += 1

    async def _fetch(self, peer: bytes, ref: BlobRef) -> None:
        started = trio.current_time()
        raw_list = await self._ask(peer, ref.root, None)
        try:
            chunks = ChunkList.from_bytes(ref, raw_list)
        except BadBlob as e:
            raise FetchError(f"{NodeId(peer)} sent a wrong chunk list for {ref.root}: {e}") from None
        try:
            partial = await trio.to_thread.run_sync(self.blobs.partial, ref.root.raw, ref.size)
            missing = await trio.to_thread.run_sync(partial.missing)
        except (BlobError, ValueError, OSError) as e:
            raise FetchError(f"cannot store blob {ref.root}: {e}") from None
        pending = iter(missing)
        failures: list[FetchError] = []
        async with trio.open_nursery() as nursery:
            for _ in range(min(self.settings.window, len(missing))):
                nursery.start_soon(self._fetch_chunks, peer, ref, chunks, partial, pending, failures)
        if failures:
            raise failures[0]
        try:
            await trio.to_thread.run_sync(partial.finalise)
        except (BlobError, OSError) as e:
            raise FetchError(f"blob {ref.root} from {NodeId(peer)} did not assemble: {e}") from None
        fetched = sum(min(CHUNK_SIZE, ref.size - i * CHUNK_SIZE) for i in missing)
        self.rate.observe(fetched, trio.current_time() - started)

    async def _fetch_chunks(
        self,
        peer: bytes,
        ref: BlobRef,
        chunks: ChunkList,
        partial: PartialBlob,
        pending: Iterator[int],
        failures: list[FetchError],
    ) -> None:
        for index in pending:  # shared iterator: each index is taken by exactly one task
            if failures:
                return
            try:
                data = await self._ask(peer, ref.root, index)
                chunks.verify_chunk(index, data)
                await trio.to_thread.run_sync(partial.write_chunk, index, data, chunks.hashes[index].raw)
                self.fetched_chunks += 1
            except BadBlob as e:
                failures.append(FetchError(f"{NodeId(peer)} sent a bad chunk of {ref.root}: {e}"))
            except FetchError as e:
                failures.append(e)
            except (BlobError, OSError) as e:
                failures.append(FetchError(f"cannot store a chunk of {ref.root}: {e}"))

    async def _ask(self, peer: bytes, root: Digest, index: int | None) -> bytes:
        key = (peer, root.raw, index)
        for _attempt in range(self.settings.retries):
            waiter = _Waiter()
            self._waiters[key] = waiter
            try:
                request = BlobRequest(
                    self.network,
                    NodeId(self.local),
                    root,
                    index,
                    self.wall_ms() + self.settings.request_ttl_ms,
                )
                if not await self.send(peer, sign_message(request, self.identity)):
                    raise PeerUnreachable(f"no link to {NodeId(peer)} to fetch blob {root}")
                with trio.move_on_after(self.settings.request_timeout):
                    await waiter.event.wait()
            finally:
                if self._waiters.get(key) is waiter:
                    del self._waiters[key]
            if waiter.data is not None:
                return waiter.data
        what = "the chunk list" if index is None else f"chunk {index}"
        raise PeerUnreachable(
            f"{NodeId(peer)} did not send {what} of blob {root} "
            f"({self.settings.retries} tries of {self.settings.request_timeout:g} s)"
        )
