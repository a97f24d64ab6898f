"""The node's durable state: one SQLite database, DATA/node.sqlite, and `Store`, the synchronous access to it.

This module holds the store's core: the connection and its lock, the reading and transaction contexts,
the durability of commits and the Store side of group commit. Store's query methods come from one class
per table family (store/kv.py, seen.py, peer_rows.py, jobs.py, envelopes.py, receipts.py, blob_refs.py,
pruning.py); the schema and its migrations are store/schema.py, opening a file and sqlite3's errors
store/connection.py, the rows returned store/rows.py, and trio code uses AsyncStore (store/async_store.py).
All SQL lives in node/store/. Times are Unix seconds (float) passed in by the caller, so tests control
the clock.

- Two kinds of commit. Every commit survives a crash of the process (kill -9): WAL mode writes it to the
  WAL file before COMMIT returns. Power loss is another matter: a *durable* commit (synchronous=FULL)
  fsyncs the WAL before it returns; any other commit (synchronous=NORMAL) reaches the disk at the next
  durable commit or checkpoint. The WAL is one file synced whole, so a durable commit also makes every
  commit before it durable: a promise made after a durable commit covers everything written before it.
  Durable: `transaction()` by default (callers outside the table modules), jobs submitted (`add_job`),
  job states that others rely on (lifecycle.DURABLE: assigned and the ends), results, receipts and
  receipt log indexes, the writes behind "safe to walk away".
  Not durable (each one a few microseconds instead of an fsync): acknowledgements (an ack lost to a
  power cut is sent or signed again when its receipt is delivered again), the key-value cache, peers, the
  seen-cache, envelopes and small blobs (kept before, or with, the durable write that names them),
  blob references, delivery retry times, the intermediate job states (offered, fetching, queued,
  running), and an executor's job until it promises it (AsyncStore.flush before `accepted`); losing
  them to a power cut only repeats work (an offer re-sent, a blob re-fetched, a run started again from
  the start, which an executor does after any stop, a job offered again).
- Group commit. Calls made through AsyncStore commit durable writes without their own fsync (a thread
  whose `deferring.on` is set: the commit is counted in `unsynced`); before any call returns, AsyncStore
  waits for one fsync of the WAL that began after it (`sync`), shared by every task waiting meanwhile
  (store/async_store.py says how).

- The watermark. Every durable commit bumps the store's commit sequence (table store_seq) in its own
  transaction; after each sync (and each signed tree head, and at close) the watermark file next to the
  database records the sequence and the newest signed head (store/watermark.py). At open a database
  behind its watermark is refused (StoreBehind) before anything is written to it.

Threads: one connection (check_same_thread=False) guarded by a lock, so a Store is safe to share between
threads; `reader()` gives a second, read-only one, which AsyncStore uses for its point reads.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..config import STORE_FILE
from ..errors import StoreError
from . import watermark
from .blob_refs import BlobRefs
from .connection import DiskFull, connect, connect_reader, is_disk_full, raise_as_store_error
from .envelopes import Envelopes
from .jobs import Jobs
from .kv import Kv
from .peer_rows import Peers
from .pruning import Pruning
from .receipts import Receipts
from .seen import Seen

log = logging.getLogger("e31.node.store")

BUMP_SEQ = "UPDATE store_seq SET seq = seq + 1"
"""Run in every durable commit, before its COMMIT (here and in AsyncStore's write groups)."""

Call = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]
"""A store method with its arguments (`call`), for `Store.many` and `AsyncStore.atomically`."""


def call(method: Callable[..., Any], *args: Any, **kwargs: Any) -> Call:
    return method, args, kwargs


class Store(Kv, Peers, Seen, Jobs, Receipts, Envelopes, BlobRefs, Pruning):
    """Synchronous access to the node's database; safe to share between threads. Its query methods are
    its table families' (the classes it is made of)."""

    def __init__(self, path: Path | str, *, check_watermark: bool = True) -> None:
        """Open (or create) the store; StoreBehind when the database is behind its watermark (unless
        `check_watermark` is False: `e31 node recover` looks at such a store)."""
        self.path = Path(path)
        self._lock = threading.RLock()
        self.watermark_path = watermark.path_for(self.path)
        mark = watermark.read(self.watermark_path)
        if mark is not None and check_watermark:
            _refuse_missing(self.path, mark)
            _refuse_behind(self.path, mark)
        self._conn = connect(self.path)
        try:
            self.watermark: watermark.Keeper | None = self._open_watermark(mark, check_watermark)
        except BaseException:
            self._conn.close()
            raise
        self._durable = True  # whether the connection's synchronous setting is FULL
        self.deferring = threading.local()
        """`deferring.on` true on a thread: its durable commits are deferred (group commit, see `sync`)."""
        self.unsynced = 0
        """How many deferred durable commits were made so far (each one is on disk after a `sync`)."""
        self._depth = 0  # transactions open on the thread holding the lock (an inner one joins the outer)
        self._outer_durable = True
        self._inner_durable = False  # whether a durable transaction joined the open one
        self._grouping = False  # an AsyncStore write group is open (on the event loop thread)
        self._in_member = False  # one of its writes is running

    @classmethod
    def in_data_dir(cls, data_dir: Path | str) -> Store:
        return cls(Path(data_dir) / STORE_FILE)

    def _open_watermark(self, mark: watermark.Mark | None, check: bool) -> watermark.Keeper:
        state = self.state(mark)
        self.seq = state.seq
        """The store's commit sequence: its newest commit's (store_seq.seq)."""
        if mark is None:
            size, root, raw = self.newest_head() or (0, b"", b"")
            mark = watermark.Mark(state.store_id, state.seq, size, root, raw)
            watermark.write(self.watermark_path, mark)
            log.info(
                "%s: no store watermark yet: made one from the database (commit %d, receipt log head of "
                "size %d)",
                self.watermark_path,
                state.seq,
                size,
            )
        elif check:
            found = watermark.behind(mark, state)
            if found:
                raise watermark.StoreBehind(
                    f"{self.path}: the database is older than what this node has promised: "
                    f"{'; '.join(found)}. It was left untouched; run `e31 node recover` to see what was "
                    "lost and how to go on"
                )
        return watermark.Keeper(self.watermark_path, mark)

    def state(self, mark: watermark.Mark | None) -> watermark.DbState:
        """What the database holds, to compare with `mark` (store/watermark.py)."""
        with self.reading() as c:
            return _state(c, mark)

    def newest_head(self) -> tuple[int, bytes, bytes] | None:
        """The newest signed tree head stored: its size, the root it signs and its envelope."""
        from e31.protocol.envelope import verify
        from e31.protocol.errors import ProtocolError
        from e31.protocol.messages import TreeHead

        with self.reading() as c:
            row = c.execute("SELECT size, raw FROM receipt_log_heads ORDER BY size DESC LIMIT 1").fetchone()
        if row is None:
            return None
        try:
            root = verify(bytes(row[1]), TreeHead).message.root.raw
        except ProtocolError:
            root = b""
        return int(row[0]), root, bytes(row[1])

    def promise_head(self, size: int, root: bytes, raw: bytes) -> None:
        """Record a tree head just signed (and stored) in the watermark, once it is on disk; before the
        head is handed out. StoreError (DiskFull when the disk is) when the watermark cannot be written."""
        self.sync()
        keeper = self.watermark
        if keeper is not None and not keeper.advance(seq=self._seq_now(), head=(size, root, raw)):
            raise keeper.failing or StoreError(f"{self.watermark_path}: cannot write the watermark")

    def _seq_now(self) -> int:
        with self._lock:
            return self.seq

    def close(self) -> None:
        with self._lock:
            synced = False
            if self.watermark is not None:  # not a reader()
                try:
                    self._fsync()
                    synced = True
                except StoreError:
                    pass
            seq = self.seq
            self._conn.close()
        if self.watermark is not None:
            self.watermark.close()
            if synced:
                self.watermark.advance(seq=seq)

    def reader(self) -> Store:
        """A second, read-only view of this store on its own connection (for one thread): in WAL mode
        its reads never wait for a write on this one, and see every commit made before they start."""
        conn = connect_reader(self.path)
        view = object.__new__(Store)
        view.path, view._lock, view._conn, view._durable = self.path, threading.RLock(), conn, True
        view.watermark_path, view.watermark, view.seq = self.watermark_path, None, self.seq
        view.deferring, view.unsynced, view._depth, view._outer_durable = threading.local(), 0, 0, True
        view._inner_durable, view._grouping, view._in_member = False, False, False
        return view

    def set_autocheckpoint(self, pages: int) -> None:
        """Checkpoint the WAL on commit once it holds `pages` pages (SQLite's default 1000); 0: never."""
        with self.reading() as c:
            c.execute(f"PRAGMA wal_autocheckpoint = {int(pages)}")

    def sync(self) -> int:
        """Put every commit made so far on disk: fsync the WAL (the database file when there is none).
        Returns the `unsynced` count it covers.

        Group commit: a durable commit made on a thread whose `deferring.on` is true is written like any
        other (to the WAL, no fsync) and counted in `unsynced`; it is on disk once `sync` has run after
        it, and one sync serves every commit before it, however many. AsyncStore defers its calls' commits
        and syncs before a call returns (see AsyncStore._settle); other callers get FULL commits.
        The count is read under the lock, so a transaction counted but still committing has finished;
        the fsync itself needs no lock: the WAL is only appended to (or restarted after a checkpoint that
        synced the database first), so it covers every frame written before it began."""
        with self._lock:
            covered, seq = self.unsynced, self.seq
        self._fsync()
        if self.watermark is not None:
            self.watermark.advance_soon(seq)  # after the fsync; a failure leaves it behind (still true)
        return covered

    def _fsync(self) -> None:
        wal = self.path.with_name(self.path.name + "-wal")
        for target in (wal, self.path):
            try:
                fd = os.open(target, os.O_RDONLY)
            except FileNotFoundError:
                continue
            except OSError as e:
                raise StoreError(f"{target}: cannot open for fsync: {e.strerror}") from e
            try:
                os.fsync(fd)
            except OSError as e:
                kind = DiskFull if is_disk_full(e) else StoreError
                raise kind(f"{target}: fsync failed: {e.strerror}") from e
            finally:
                os.close(fd)
            break

    def checkpoint(self) -> None:
        """Copy the WAL into the database as far as readers allow (a passive checkpoint)."""
        with self.reading() as c:
            c.execute("PRAGMA wal_checkpoint(PASSIVE)")

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def schema_version(self) -> int:
        with self.reading() as c:
            version: int = c.execute("PRAGMA user_version").fetchone()[0]
            return version

    def reading(self) -> _Reading:
        """The connection for a read of one or more queries (no transaction is opened), under the lock
        (`with store.reading() as c:`)."""
        return _Reading(self)

    def transaction(self, *, durable: bool = True) -> _Transaction:
        """One write transaction: everything inside commits together or not at all.

        A durable commit is on disk when this returns, with every commit before it (when deferred: once
        `sync` has run after it); otherwise it survives a process crash but may be lost to a power cut
        until the next durable commit. A transaction opened inside another one (on the same thread: the
        lock is held) is part of it: it commits or rolls back with the outer one (see `many`). There
        are no savepoints: an inner failure must fail the outer transaction, never be caught inside it.
        (`with store.transaction() as c:`; a class, not a generator: every store write opens one, most
        of them inside another, and a @contextmanager costs several times what its body does.)"""
        return _Transaction(self, durable)

    def many(self, calls: Sequence[Call], *, durable: bool = True) -> list[Any]:
        """Run several of this store's methods as one transaction (durable unless told not: then no call
        may be durable either): all commit or none does. Returns their results in order."""
        with self.transaction(durable=durable):
            return [method(self, *args, **kwargs) for method, args, kwargs in calls]


class _Transaction:
    """Store.transaction's context: the lock held, sqlite3's errors translated (as `translate`), an
    outer transaction begun and committed (or rolled back), an inner one joined to it."""

    __slots__ = ("changes", "deferred", "durable", "nested", "store")

    def __init__(self, store: Store, durable: bool) -> None:
        self.store = store
        self.durable = durable
        self.nested = False

    def __enter__(self) -> sqlite3.Connection:
        store = self.store
        store._lock.acquire()
        try:
            c = store._conn
            if store._depth:
                if store._grouping and not store._in_member:
                    raise RuntimeError(
                        "a store write from the event loop outside AsyncStore would join the "
                        "open write group unseen: call it through AsyncStore.run"
                    )
                if self.durable and not store._outer_durable:
                    raise ValueError("a durable write inside a transaction that is not durable")
                store._inner_durable |= self.durable
                store._depth += 1
                self.nested = True
                return c
            self.deferred = getattr(store.deferring, "on", False)
            full = self.durable and not self.deferred
            if full is not store._durable:
                c.execute("PRAGMA synchronous = FULL" if full else "PRAGMA synchronous = NORMAL")
                store._durable = full
            self.changes = c.total_changes
            c.execute("BEGIN IMMEDIATE")
            store._depth, store._outer_durable = 1, self.durable
            return c
        except BaseException as e:
            store._lock.release()
            raise_as_store_error(store.path, e)
            raise

    def __exit__(self, kind: type[BaseException] | None, e: BaseException | None, tb: object) -> None:
        store = self.store
        try:
            if self.nested:
                store._depth -= 1
            else:
                self._end(e)
        except BaseException as err:
            store._lock.release()
            raise_as_store_error(store.path, err)
            raise
        store._lock.release()
        raise_as_store_error(store.path, e)

    def _end(self, e: BaseException | None) -> None:
        """Commit the outer transaction (rolled back if the block raised `e`, or the commit failed)."""
        store = self.store
        c = store._conn
        try:
            if e is not None:
                if c.in_transaction:
                    c.execute("ROLLBACK")
                return
            try:
                bump = self.durable and c.total_changes != self.changes
                if bump:
                    if self.deferred:  # counted before COMMIT: a reader may see the commit at once
                        store.unsynced += 1
                    c.execute(BUMP_SEQ)
                c.execute("COMMIT")
                if bump:
                    store.seq += 1
            except BaseException:
                if c.in_transaction:  # also after a failed COMMIT (disk full), which may leave it open
                    c.execute("ROLLBACK")
                raise
        finally:
            store._depth = 0


class _Reading:
    """Store.reading's context: the lock held and sqlite3's errors translated, without a generator."""

    __slots__ = ("store",)

    def __init__(self, store: Store) -> None:
        self.store = store

    def __enter__(self) -> sqlite3.Connection:
        self.store._lock.acquire()
        return self.store._conn

    def __exit__(self, kind: type[BaseException] | None, e: BaseException | None, tb: object) -> None:
        self.store._lock.release()
        raise_as_store_error(self.store.path, e)


def _refuse_missing(path: Path, mark: watermark.Mark) -> None:
    """StoreBehind when the database file the watermark describes is gone or empty (SQLite would make a
    new, empty database there without a word)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        size = -1
    except OSError:
        return  # connect() says what is wrong with it
    if size > 0:
        return
    what = "is missing" if size < 0 else "is empty"
    raise watermark.StoreBehind(
        f"{path}: the database {what}, but its watermark says this node committed up to {mark.seq} and "
        f"signed a receipt log head of size {mark.log_size}; nothing was written; run `e31 node recover` "
        "to see what was lost and how to go on"
    )


def _state(c: sqlite3.Connection, mark: watermark.Mark | None) -> watermark.DbState:
    from . import receipt_tree

    store_id, seq = c.execute("SELECT store_id, seq FROM store_seq WHERE id = 1").fetchone()
    size = c.execute("SELECT coalesce(max(idx) + 1, 0) FROM receipt_log").fetchone()[0]
    root: bytes | None = None
    at = 0 if mark is None else mark.log_size
    if at <= size:
        try:
            root = receipt_tree.root_at(c, at)
        except receipt_tree.TreeStateError:
            root = None
        if mark is not None and mark.log_size and root != mark.log_root:  # stale subtree rows?
            try:
                root = receipt_tree.scan(c, at, rewrite=False)[1]  # then from the leaves
            except receipt_tree.TreeStateError:
                root = None
    return watermark.DbState(bytes(store_id), int(seq), int(size), root)


def _refuse_behind(path: Path, mark: watermark.Mark) -> None:
    """StoreBehind when the database, as SQLite reads it with its WAL, is behind `mark`: checked on a
    read-only connection, so a refused database (and a WAL SQLite found damaged) is not written to, not
    checkpointed and not deleted on close. A file that is not a usable store is left to connect()."""
    try:
        conn = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True, timeout=10.0)
    except sqlite3.Error:
        return
    try:
        try:
            tables = conn.execute(
                "SELECT count(*) FROM sqlite_schema WHERE name IN ('store_seq', 'receipt_log')"
            ).fetchone()[0]
            state = _state(conn, mark) if tables == 2 else None
        except sqlite3.Error:
            return
        found = ["it holds none of the node's tables"] if state is None else watermark.behind(mark, state)
        if found:
            raise watermark.StoreBehind(
                f"{path}: the database is older than what this node has promised: {'; '.join(found)}. "
                "It was left untouched; run `e31 node recover` to see what was lost and how to go on"
            )
    finally:
        conn.close()
