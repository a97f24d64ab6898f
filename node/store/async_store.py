"""AsyncStore: the store for trio code, which decides per call where it runs and when it returns.

- Where a call runs. A point read (INLINE_READS) runs on the event loop, on a second, read-only
  connection (Store.reader) that never waits for the writer (WAL); a short write (INLINE_WRITES: a row
  or two, microseconds, and no fsync in the call) runs on the event loop unless the worker thread holds
  the connection; anything else runs in a worker thread under a CapacityLimiter(1), so trio tasks queue
  instead of blocking the event loop. A thread hop costs ten times what such a call does. A call names
  a method of Store (`await db.run(Store.peers, network="main")`): it runs inline only when it is Store's
  own method of that name (`getattr(Store, name) is method`), so a wrapper or a partial runs in the thread.
- Group commit. Calls commit durable writes without their own fsync (Store.deferring); before any call
  returns (read or write), AsyncStore waits, if some durable commit is not yet on disk, for one fsync of
  the WAL that began after it (`Store.sync`, in a thread of its own), shared by every task waiting
  meanwhile. So a durable write still returns only once it is on disk, nothing read through AsyncStore
  is a commit a power cut could take back, and a burst of jobs costs one fsync per burst instead of one
  per write, with no thread hop per write. Short writes of tasks ready at once share one transaction and
  commit (a write group, `_grouped`).
- Checkpoints. The event loop's connection does not checkpoint the WAL on its own: AsyncStore
  checkpoints in the worker thread every CHECKPOINT_EVERY writes, so a checkpoint's copying and syncing
  never runs inline.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

import trio

from .. import metrics
from ..errors import StoreError
from .connection import translate
from .db import BUMP_SEQ, Call, Store

P = ParamSpec("P")
T = TypeVar("T")


INLINE_READS = frozenset(
    {
        "job",
        "jobs_held",
        "jobs_by_id",
        "envelope",
        "envelopes_for_job",
        "assignments_for_job",
        "receipts_for_job",
        "kv_get",
        "receipt",
        "ack_for",
        "results_for_job",
        "receipts_with_envelopes",
        "small_blobs",
    }
)
"""Point reads by key (or by a proof's keys, 256 at most): run on the event loop, on a read-only
connection of their own."""
INLINE_WRITES = frozenset(
    {
        "put_envelope",
        "put_shared_envelope",
        "ref_blob",
        "kv_set",
        "mark_seen",
        "receipt_delivery_failed",
        "update_job",
        "add_job",
        "put_result",
        "put_receipt",
        "set_receipt_log_index",
        "put_acks",
        "record_verified_receipt",
        "put_small_blob",
    }
)
"""Writes of a row or two: they commit in microseconds (a durable one waits for its group's fsync after)."""
CHECKPOINT_EVERY = 500
"""Calls other than INLINE_READS between two WAL checkpoints (run in the worker thread)."""


def _short_write(method: Callable[..., Any]) -> bool:
    """Whether `method` is one of Store's own short writes (INLINE_WRITES): it may run inline."""
    name = getattr(method, "__name__", "")
    return name in INLINE_WRITES and getattr(Store, name, None) is method


@dataclass(eq=False)
class _Group:
    """Short writes of several tasks sharing one transaction and commit (AsyncStore._grouped)."""

    changes: int
    """The connection's total_changes when the group began."""
    done: trio.Event = field(default_factory=trio.Event)
    error: StoreError | None = None


class AsyncStore:
    """The store for trio code: `await db.run(Store.peers, network="main")`.

    A point read (INLINE_READS) runs at once on the event loop, on a read-only connection of its own
    that never waits for the writer (WAL); a write of a row or two (INLINE_WRITES) runs on the event
    loop when the thread does not hold the connection; any other call runs in a worker thread
    (CapacityLimiter(1)), so the event loop never waits on the disk. A call that made a durable
    commit, or that finds one not yet on disk, returns after the group commit's fsync (`_settle`).
    Each call is a trio checkpoint;
    a cancelled call has not run, a returned one is done. One task's calls keep their order; a read
    sees every commit made before it starts, but not a write of another task still queued for the
    thread (as with any two concurrent tasks, nothing orders those).
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._limiter = trio.CapacityLimiter(1)
        self._writes = 0
        store.set_autocheckpoint(0)
        self._reader = store.reader()
        self._synced = store.unsynced
        self._syncing: trio.Event | None = None
        self._sync_limiter = trio.CapacityLimiter(1)
        self._failed: StoreError | None = None
        self._group: _Group | None = None
        self._in_thread = 0  # calls in (or queued for) the worker thread
        self._thread_done = trio.Event()

    @classmethod
    async def open(cls, path: Path | str) -> AsyncStore:
        return cls(await trio.to_thread.run_sync(Store, path))

    async def run(self, method: Callable[Concatenate[Store, P], T], *args: P.args, **kwargs: P.kwargs) -> T:
        if self._failed is not None:
            raise self._failed
        name = getattr(method, "__name__", "")  # a functools.partial has none: it runs in the thread
        read = name in INLINE_READS
        if not read:
            self._writes += 1
            if self._writes >= CHECKPOINT_EVERY:
                self._writes = 0  # before the wait: the writers arriving meanwhile must not checkpoint too
                await self._in_the_thread(self.store.checkpoint)
        # An inline call keeps the thread's contract: cancelled means not run, returned means done.
        if read and getattr(Store, name, None) is method:
            await trio.lowlevel.checkpoint_if_cancelled()
            result: T = method(self._reader, *args, **kwargs)
            await self._settle()
            return result
        if _short_write(method) or (
            method is Store.many and type(args[0]) is tuple and all(_short_write(m) for m, _, _ in args[0])
        ):
            # not while the thread holds the connection: then after its calls (calls queued for the
            # thread are other tasks', as a task waits for each of its calls: nothing orders them
            # against this one). Queueing behind them would keep the connection in the thread for as
            # long as writes keep coming, each one a thread hop.
            await trio.lowlevel.checkpoint_if_cancelled()
            while True:
                if self._group is not None or self.store._lock.acquire(blocking=False):
                    return await self._grouped(method, args, kwargs)
                if not self._in_thread:
                    break  # held by a thread of someone else's (briefly, by a sync): join the queue
                await self._thread_done.wait()
                if self._failed is not None:  # the store failed meanwhile (a sync)
                    raise self._failed

        def call() -> T:
            deferring = self.store.deferring
            deferring.on = True
            try:
                return method(self.store, *args, **kwargs)
            finally:
                deferring.on = False

        out: T = await self._in_the_thread(call)
        await self._settle()
        return out

    async def _in_the_thread(self, fn: Callable[[], T]) -> T:
        """Run `fn` in the worker thread (one at a time), counting the calls there; each one that ends
        sets `_thread_done`, so the short writes waiting for the connection try again before the next
        queued call can take it (it starts from the event loop too), and none waits for a queue that
        keeps growing."""
        self._in_thread += 1
        began = time.perf_counter()
        try:
            return await trio.to_thread.run_sync(fn, limiter=self._limiter)
        finally:
            metrics.STORE_CALLS.observe(time.perf_counter() - began)
            self._in_thread -= 1
            self._thread_done.set()
            self._thread_done = trio.Event()

    async def _grouped(self, method: Callable[..., T], args: Any, kwargs: Any) -> T:
        """Run a short write in the event loop's open write transaction (a group), opening one if there
        is none (the caller holds the connection's lock then). The first writer of a group lets the
        other ready tasks run once, so their writes join, then commits them all: one commit (and its
        WAL pages) for a burst of writes instead of one each. Each write is a savepoint of its own: one
        that fails is rolled back alone and raises to its caller; the others commit. Every writer returns
        after the group's commit (and, when it held a durable write, its sync); a commit that fails
        raises to all of them."""
        store = self.store
        group = self._group
        driver = group is None
        if group is None:
            try:
                group = self._open_group()
            except BaseException:
                store._lock.release()
                raise
        failure: BaseException | None = None
        result: Any = None
        try:
            result = self._member(group, method, args, kwargs)
        except BaseException as e:
            failure = e
        with trio.CancelScope(shield=True):  # the writes have run: the caller learns how they ended
            if driver:
                try:
                    await trio.lowlevel.checkpoint()  # the tasks ready now write too, into this commit
                finally:  # whatever happens, the group ends and the connection is let go
                    self._commit_group(group)
            elif failure is None:
                await group.done.wait()
        if failure is not None:
            raise failure
        if group.error is not None:
            raise group.error
        await self._settle()
        return cast(T, result)

    def _open_group(self) -> _Group:
        store, c = self.store, self.store._conn
        with translate(store.path):
            if store._durable:
                c.execute("PRAGMA synchronous = NORMAL")  # made durable by the group fsync (_settle)
                store._durable = False
            c.execute("BEGIN IMMEDIATE")
        store._depth, store._outer_durable, store._inner_durable = 1, True, False
        store._grouping = True
        group = self._group = _Group(c.total_changes)
        return group

    def _member(self, group: _Group, method: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        """One write of a group, in a savepoint: rolled back alone if it fails."""
        store, c = self.store, self.store._conn
        if group.error is not None:
            raise group.error
        with translate(store.path):
            c.execute("SAVEPOINT write")
        store._in_member = True
        try:
            result = method(store, *args, **kwargs)
            with translate(store.path):
                c.execute("RELEASE write")
        except BaseException as e:
            if not c.in_transaction:  # SQLite ended the whole transaction: every write of it is lost
                group.error = StoreError(
                    f"{store.path}: a write failed and the writes to commit with it were lost ({e})"
                )
                raise
            try:
                with translate(store.path):
                    c.execute("ROLLBACK TO write")
                    c.execute("RELEASE write")
            except (StoreError, sqlite3.Error) as lost:
                group.error = StoreError(f"{store.path}: a failed write could not be undone alone ({lost})")
            raise
        finally:
            store._in_member = False
        return result

    def _commit_group(self, group: _Group) -> None:
        store, c = self.store, self.store._conn
        try:
            if group.error is None:
                with translate(store.path):
                    bump = store._inner_durable and c.total_changes != group.changes
                    if bump:
                        store.unsynced += 1  # before COMMIT, as in Store.transaction
                        c.execute(BUMP_SEQ)
                    c.execute("COMMIT")
                    if bump:
                        store.seq += 1
        except BaseException as e:
            group.error = e if isinstance(e, StoreError) else StoreError(f"{store.path}: commit failed: {e}")
            if not isinstance(e, Exception):
                raise
        finally:
            try:
                if c.in_transaction:  # not committed (a failed COMMIT may leave it open): nothing was
                    c.execute("ROLLBACK")
                    if group.error is None:
                        group.error = StoreError(f"{store.path}: the writes were rolled back")
            except sqlite3.Error:
                pass
            store._depth = 0
            store._grouping = False
            self._group = None
            store._lock.release()
            group.done.set()

    async def atomically(self, *calls: Call, durable: bool = True) -> list[Any]:
        """`Store.many` through `run`: several writes in one transaction, one commit and at most one
        sync (none when not `durable`). Runs on the event loop when every method is one of the short
        writes (INLINE_WRITES)."""
        return await self.run(Store.many, calls, durable=durable)

    async def _settle(self) -> None:
        """The end of every call, cancel-shielded (the call has run): when durable commits made before
        it ended are still to be synced, wait for a sync that covers them, so a call returns nothing (a
        durable write's success, a row it wrote) that a power cut could take back. Whoever finds no sync
        running starts one in a thread, after letting the other tasks ready to run commit too; everyone
        who waits meanwhile shares the next (group commit). Commits made later are not waited for.

        A sync that fails leaves the WAL in doubt (after a write-back error the kernel may drop the dirty
        pages, and a later fsync succeed without them): the store is then failed for good, every call
        raises StoreError, and the node stops."""
        target = self.store.unsynced
        if target <= self._synced:
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        with trio.CancelScope(shield=True):
            while self._synced < target:
                if self._failed is not None:
                    raise self._failed
                if self._syncing is not None:
                    await self._syncing.wait()
                    continue
                await self._sync_once()

    async def flush(self) -> None:
        """Put every commit made so far on disk, those made not durable included: for a promise that
        rests on writes which needed no sync when they were made (an executor's `accepted`). Shares a
        sync that starts after this call; raises StoreError as `_settle` does."""
        with trio.CancelScope(shield=True):
            running = self._syncing
            if running is not None:  # it may have begun before the commits to cover
                await running.wait()
            if self._failed is not None:
                raise self._failed
            if self._syncing is not None:  # begun after this call: it covers them
                await self._syncing.wait()
                if self._failed is not None:
                    raise self._failed
            else:
                await self._sync_once()

    async def _sync_once(self) -> None:
        """One sync in a thread, covering every commit made before it begins (callers shield it)."""
        done = self._syncing = trio.Event()
        try:
            await trio.lowlevel.checkpoint()  # a yield, so the commits of tasks ready now join
            covered = await trio.to_thread.run_sync(self.store.sync, limiter=self._sync_limiter)
            self._synced = max(self._synced, covered)
        except StoreError as e:
            self._failed = StoreError(
                f"the database could not be synced to disk ({e}); its last "
                "writes may not be durable: stop the node and check the disk"
            )
            raise self._failed from e
        finally:
            self._syncing = None
            done.set()

    async def aclose(self) -> None:
        self._reader.close()
        await trio.to_thread.run_sync(self.store.close, limiter=self._limiter)
