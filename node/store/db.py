"""The node's durable state: one SQLite database, DATA/node.sqlite.

Settings and why:
- WAL journal: readers never block the writer, and a crash (kill -9, power loss) leaves the database at
  its last committed transaction.
- Two kinds of commit. Every commit survives a crash of the process (kill -9): WAL mode writes it to the
  WAL file before COMMIT returns. Power loss is another matter: a *durable* commit (synchronous=FULL)
  fsyncs the WAL before it returns; any other commit (synchronous=NORMAL) reaches the disk at the next
  durable commit or checkpoint. The WAL is one file synced whole, so a durable commit also makes every
  commit before it durable: a promise made after a durable commit covers everything written before it.
  Durable: `transaction()` by default (callers outside this module), jobs submitted (`add_job`), job
  states that others rely on (lifecycle.DURABLE: assigned and the ends), results, receipts and
  receipt log indexes, the writes behind "safe to walk away".
  Not durable (each one a few microseconds instead of an fsync): acknowledgements (an ack lost to a
  power cut is sent or signed again when its receipt is delivered again), the key-value cache, peers, the
  seen-cache, envelopes and small blobs (kept before, or with, the durable write that names them),
  blob references, delivery retry times, the intermediate job states (offered, fetching, queued,
  running), and an executor's job until it promises it (AsyncStore.flush before `accepted`); losing
  them to a power cut only repeats work (an offer re-sent, a blob re-fetched, a run started again from
  the start, which an executor does after any stop, a job offered again).
- Group commit. Calls made through AsyncStore commit durable writes without their own fsync; before any
  call returns (read or write), AsyncStore waits, if some durable commit is not yet on disk, for one
  fsync of the WAL that began after it (`Store.sync`, in a thread of its own), shared by every task
  waiting meanwhile. So a durable write still returns only once it is on disk, nothing read through
  AsyncStore is a commit a power cut could take back, and a burst of jobs costs one fsync per burst
  instead of one per write, with no thread hop per write.
- foreign_keys=ON, and every write method is one transaction (BEGIN IMMEDIATE ... COMMIT).
- application_id marks the file as an e31 store; user_version is the schema version. Opening refuses a
  file that is not SQLite, is another program's database, fails quick_check, or has a newer schema,
  with a StoreError, and never writes to such a file. Older schemas are migrated forward in order, each
  step in one transaction.

Threads: one connection (check_same_thread=False) guarded by a lock; `AsyncStore` runs point reads on
the event loop on a second, read-only connection, a short write (a row or two: microseconds, and no
fsync in the call, see group commit) on the event loop unless the thread holds the connection, and
anything else in a worker thread under a CapacityLimiter(1), so trio tasks queue instead of blocking
the event loop; a thread hop costs ten times what such a call does. The event loop's connection does
not checkpoint the WAL on its own: AsyncStore checkpoints in the worker thread every CHECKPOINT_EVERY
writes, so a checkpoint's copying and syncing never runs inline. All SQL lives in this module. Times
are Unix seconds (float) passed in by the caller, so tests control the clock.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar, cast

import trio
from e31.protocol.blobs import PUSH_MAX

from ..config import STORE_FILE
from ..errors import StoreError
from ..lifecycle import DURABLE, PRUNABLE, JobState, Role, sql_in

APPLICATION_ID = 0x0E31_0001

PEER_SOURCES = frozenset({"bootstrap", "mdns", "exchange", "inbound", "manual"})
Call = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]
"""A store method with its arguments (`call`), for `Store.many` and `AsyncStore.atomically`."""


def call(method: Callable[..., Any], *args: Any, **kwargs: Any) -> Call:
    return method, args, kwargs


SHARED_KINDS = ("offer", "bid", "proof", "ack")
"""Kinds of envelope that may be shared by several jobs (`put_shared_envelope`); pruning deletes one
once no job links it any more."""


# --- schema ---------------------------------------------------------------------------------------------
# MIGRATIONS[i] takes a store at version i to version i + 1. Append only; never edit a released step.

_V1 = """
CREATE TABLE kv (
    key   TEXT PRIMARY KEY,
    value BLOB NOT NULL
) WITHOUT ROWID;

CREATE TABLE peers (
    node_id      TEXT PRIMARY KEY,
    network      TEXT NOT NULL,
    addresses    TEXT NOT NULL,            -- JSON list of "HOST:PORT", most recent first
    source       TEXT NOT NULL,            -- how it was first found: bootstrap, mdns, exchange, ...
    first_seen   REAL NOT NULL,
    last_seen    REAL NOT NULL,
    failures     INTEGER NOT NULL DEFAULT 0,  -- consecutive failed contacts
    last_failure REAL,
    contact      BLOB                      -- the peer's latest signed contact record, exact bytes
);
CREATE INDEX peers_network ON peers (network, last_seen);

CREATE TABLE seen (
    message_id BLOB PRIMARY KEY,
    expires    REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX seen_expires ON seen (expires);
"""

_V2 = """
CREATE TABLE jobs (
    job_id     BLOB NOT NULL,
    role       TEXT NOT NULL CHECK (role IN ('submitter', 'executor')),
    manifest   BLOB NOT NULL,              -- the job manifest's exact bytes (job_id = its SHA-256)
    state      TEXT NOT NULL,
    submitter  TEXT NOT NULL,
    executor   TEXT,
    attempt    INTEGER NOT NULL DEFAULT 0,
    created    REAL NOT NULL,
    deadline   REAL NOT NULL,
    updated    REAL NOT NULL,
    started    REAL,
    finished   REAL,
    fuel_limit INTEGER,
    fuel_used  INTEGER,
    reason     TEXT,
    PRIMARY KEY (job_id, role)
) WITHOUT ROWID;
CREATE INDEX jobs_state ON jobs (role, state, deadline);

CREATE TABLE envelopes (
    message_id BLOB PRIMARY KEY,
    kind       TEXT NOT NULL,
    raw        BLOB NOT NULL,              -- the signed envelope exactly as received or sent
    job_id     BLOB,                       -- no foreign key: an envelope may precede its job
    received   REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX envelopes_job ON envelopes (job_id, kind);

CREATE TABLE results (
    job_id     BLOB NOT NULL,
    attempt    INTEGER NOT NULL,
    executor   TEXT NOT NULL,
    message_id BLOB NOT NULL REFERENCES envelopes (message_id),
    status     TEXT NOT NULL,              -- the outcome kind: ok, trap, out_of_fuel, ...
    fuel_used  INTEGER,
    outputs    TEXT NOT NULL,              -- JSON object: output name -> blob hash
    created    REAL NOT NULL,
    PRIMARY KEY (job_id, attempt, executor)
) WITHOUT ROWID;

CREATE TABLE receipts (
    digest           BLOB PRIMARY KEY,
    job_id           BLOB NOT NULL,
    attempt          INTEGER NOT NULL,
    executor         TEXT NOT NULL,
    message_id       BLOB NOT NULL REFERENCES envelopes (message_id),
    log_index        INTEGER,              -- position in the executor's receipt log, once appended
    created          REAL NOT NULL,
    delivered        REAL,                 -- when the submitter acknowledged it
    next_delivery    REAL,                 -- executor side: when to retry delivery
    delivery_tries   INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;
CREATE INDEX receipts_job ON receipts (job_id);
CREATE INDEX receipts_pending ON receipts (next_delivery) WHERE delivered IS NULL;

CREATE TABLE acks (
    receipt_digest BLOB PRIMARY KEY REFERENCES receipts (digest),
    message_id     BLOB NOT NULL REFERENCES envelopes (message_id),
    created        REAL NOT NULL
) WITHOUT ROWID;

CREATE TABLE blob_refs (
    blob_hash    TEXT NOT NULL,
    owner        TEXT NOT NULL,            -- what needs it: "job:<hex id>", "pin:<name>", ...
    retain_until REAL,                     -- NULL: as long as the owner exists
    PRIMARY KEY (blob_hash, owner)
) WITHOUT ROWID;
CREATE INDEX blob_refs_owner ON blob_refs (owner);
"""

_V3 = """
CREATE INDEX receipts_unproved ON receipts (executor, delivered)
    WHERE log_index IS NULL AND delivered IS NOT NULL;
"""
"""A submitter marks a receipt's log_index when it holds a verified inclusion proof of it: the
receipts it acknowledged and holds no proof of are found without a scan (acked_without_proof)."""

_V4 = """
CREATE TABLE envelope_jobs (
    job_id     BLOB NOT NULL,
    message_id BLOB NOT NULL REFERENCES envelopes (message_id),
    PRIMARY KEY (job_id, message_id)
) WITHOUT ROWID;
CREATE INDEX envelope_jobs_message ON envelope_jobs (message_id);
CREATE INDEX results_message ON results (message_id);
CREATE INDEX receipts_message ON receipts (message_id);
CREATE INDEX acks_message ON acks (message_id);
CREATE INDEX jobs_ended ON jobs (updated) WHERE state IN ('cancelled', 'done', 'expired', 'failed');
"""
"""An envelope that concerns several jobs (an offer of a set of jobs, a bid for several of them) is
stored once, with job_id NULL, and linked here to each job it concerns (put_shared_envelope).
The indexes on the columns that reference envelopes let a deleted envelope's foreign key checks look
up its referrers instead of scanning their tables once per envelope, and jobs_ended gives pruning its
oldest ended jobs without a scan (both made pruning quadratic in the jobs held)."""

_V5 = """
CREATE TABLE small_blobs (
    blob_hash TEXT PRIMARY KEY,
    data      BLOB NOT NULL
);
UPDATE receipts SET log_index = NULL WHERE log_index IS NOT NULL
    AND job_id IN (SELECT job_id FROM envelopes WHERE kind = 'proof' AND job_id IS NOT NULL);
DELETE FROM envelopes WHERE kind = 'proof';
"""
"""Small blobs kept in the database instead of as files: a job's outputs of PUSH_MAX bytes at most
(those its `result` carries), stored by its executor and by its submitter in the commit that ends the
job on each, so a tiny job's outputs cost neither a file, two fsyncs nor a thread hop. Referenced like
any blob (blob_refs); they go once no live reference names them (drop_small_blobs).
Proofs stored before v5 place one receipt each, a `proof` body this version no longer reads: they go,
and the receipts they proved are marked unproven, so the submitter asks for them again (`proofreq`)
and keeps proofs of the current form (an executor's own log indexes, set by its log, stay)."""

_V6 = """
DELETE FROM acks;
DELETE FROM envelopes WHERE kind = 'ack';
INSERT INTO kv (key, value) VALUES ('acks_v6_at', CAST(CAST((julianday('now') - 2440587.5) * 86400.0 AS TEXT)
    AS BLOB)) ON CONFLICT (key) DO UPDATE SET value = excluded.value;
"""
"""An `ack` now countersigns a batch of receipts and is stored once, shared (put_acks). Acks stored
before v6 name one receipt each, a body this version no longer reads: they go. The receipts they
answered stay delivered on both sides (an executor does not deliver them again, and logs those it had
not logged yet when it starts), and a submitter does not acknowledge them again (`verified_unacked`
looks only at receipts delivered after kv `acks_v6_at`, the migration's time): a bundle of such a job
carries no acknowledgement, which an audit notes."""

_V7 = """
CREATE TABLE IF NOT EXISTS batch_jobs (
    batch_id TEXT NOT NULL,
    seq      INTEGER NOT NULL,
    job_id   BLOB NOT NULL,
    created  REAL NOT NULL,
    PRIMARY KEY (batch_id, seq)
) WITHOUT ROWID;
"""
"""Batches (store/batches.py) get their table from a migration like every other table. Stores of v6 and
before made it on first use, so it may exist already."""

MIGRATIONS: tuple[str, ...] = (_V1, _V2, _V3, _V4, _V5, _V6, _V7)
SCHEMA_VERSION = len(MIGRATIONS)


# --- rows -----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PeerRow:
    node_id: str
    network: str
    addresses: tuple[str, ...]
    source: str
    first_seen: float
    last_seen: float
    failures: int
    last_failure: float | None
    contact: bytes | None


@dataclass(frozen=True, slots=True)
class JobRow:
    job_id: bytes
    role: str
    manifest: bytes
    state: str
    submitter: str
    executor: str | None
    attempt: int
    created: float
    deadline: float
    updated: float
    started: float | None
    finished: float | None
    fuel_limit: int | None
    fuel_used: int | None
    reason: str | None


@dataclass(frozen=True, slots=True)
class EnvelopeRow:
    message_id: bytes
    kind: str
    raw: bytes
    job_id: bytes | None
    """The job it was stored for; None for one stored alone or shared by several jobs."""
    received: float


@dataclass(frozen=True, slots=True)
class ResultRow:
    job_id: bytes
    attempt: int
    executor: str
    message_id: bytes
    status: str
    fuel_used: int | None
    outputs: dict[str, str]
    created: float


@dataclass(frozen=True, slots=True)
class ReceiptRow:
    digest: bytes
    job_id: bytes
    attempt: int
    executor: str
    message_id: bytes
    log_index: int | None
    created: float
    delivered: float | None
    next_delivery: float | None
    delivery_tries: int


_JOB_COLUMNS = ", ".join(JobRow.__slots__)
_ENVELOPES_FOR_JOB = (
    "SELECT 0, message_id, kind, raw, job_id, received FROM envelopes "
    "WHERE job_id = ?1 AND (?2 IS NULL OR kind = ?2) "
    "UNION ALL "
    "SELECT 1, e.message_id, e.kind, e.raw, e.job_id, e.received FROM envelope_jobs l "
    "JOIN envelopes e ON e.message_id = l.message_id "
    "WHERE l.job_id = ?1 AND e.job_id IS NOT ?1 AND (?2 IS NULL OR e.kind = ?2) "
    "ORDER BY 1, 6, 2"
)
_JOB_UPDATABLE = frozenset(
    {"state", "executor", "attempt", "deadline", "started", "finished", "fuel_limit", "fuel_used", "reason"}
)
_RECEIPT_COLUMNS = ", ".join(ReceiptRow.__slots__)


def _peer(row: sqlite3.Row) -> PeerRow:
    return PeerRow(
        row["node_id"],
        row["network"],
        tuple(json.loads(row["addresses"])),
        row["source"],
        row["first_seen"],
        row["last_seen"],
        row["failures"],
        row["last_failure"],
        row["contact"],
    )


def _result(row: sqlite3.Row) -> ResultRow:
    return ResultRow(
        row["job_id"],
        row["attempt"],
        row["executor"],
        row["message_id"],
        row["status"],
        row["fuel_used"],
        json.loads(row["outputs"]),
        row["created"],
    )


# --- the store ------------------------------------------------------------------------------------------


class Store:
    """Synchronous access to the node's database; safe to share between threads."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._lock = threading.RLock()
        self._conn = _open(self.path)
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

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def reader(self) -> Store:
        """A second, read-only view of this store on its own connection (for one thread): in WAL mode
        its reads never wait for a write on this one, and see every commit made before they start."""
        with _translate(self.path):
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=10.0)
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA query_only = ON")
        view = object.__new__(Store)
        view.path, view._lock, view._conn, view._durable = self.path, threading.RLock(), conn, True
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
            covered = self.unsynced
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
                raise StoreError(f"{target}: fsync failed: {e.strerror}") from e
            finally:
                os.close(fd)
            break
        return covered

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

    @contextmanager
    def transaction(self, *, durable: bool = True) -> Iterator[sqlite3.Connection]:
        """One write transaction: everything inside commits together or not at all.

        A durable commit is on disk when this returns, with every commit before it (when deferred: once
        `sync` has run after it); otherwise it survives a process crash but may be lost to a power cut
        until the next durable commit. A transaction opened inside another one (on the same thread: the
        lock is held) is part of it: it commits or rolls back with the outer one (see `many`). There
        are no savepoints: an inner failure must fail the outer transaction, never be caught inside it."""
        with self._lock, _translate(self.path):
            c = self._conn
            if self._depth:
                if self._grouping and not self._in_member:
                    raise RuntimeError(
                        "a store write from the event loop outside AsyncStore would join the "
                        "open write group unseen: call it through AsyncStore.run"
                    )
                if durable and not self._outer_durable:
                    raise ValueError("a durable write inside a transaction that is not durable")
                self._inner_durable |= durable
                self._depth += 1
                try:
                    yield c
                finally:
                    self._depth -= 1
                return
            deferred = getattr(self.deferring, "on", False)
            full = durable and not deferred
            if full is not self._durable:
                c.execute("PRAGMA synchronous = FULL" if full else "PRAGMA synchronous = NORMAL")
                self._durable = full
            changes = c.total_changes
            c.execute("BEGIN IMMEDIATE")
            self._depth, self._outer_durable = 1, durable
            try:
                yield c
                if deferred and durable and c.total_changes != changes:
                    self.unsynced += 1  # before COMMIT: a reader may see the commit as soon as it is made
                c.execute("COMMIT")
            except BaseException:
                if c.in_transaction:  # also after a failed COMMIT (disk full), which may leave it open
                    c.execute("ROLLBACK")
                raise
            finally:
                self._depth = 0

    def many(self, calls: Sequence[Call], *, durable: bool = True) -> list[Any]:
        """Run several of this store's methods as one transaction (durable unless told not: then no call
        may be durable either): all commit or none does. Returns their results in order."""
        with self.transaction(durable=durable):
            return [method(self, *args, **kwargs) for method, args, kwargs in calls]

    # --- kv ---

    def kv_get(self, key: str) -> bytes | None:
        with self.reading() as c:
            row = c.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
        return None if row is None else bytes(row[0])

    def kv_set(self, key: str, value: bytes) -> None:
        with self.transaction(durable=False) as c:
            c.execute(
                "INSERT INTO kv (key, value) VALUES (?, ?) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (key, value),
            )

    def kv_delete(self, key: str) -> bool:
        with self.transaction(durable=False) as c:
            return c.execute("DELETE FROM kv WHERE key = ?", (key,)).rowcount > 0

    # --- peers ---

    def upsert_peer(
        self,
        node_id: str,
        network: str,
        addresses: Sequence[str],
        source: str,
        now: float,
        contact: bytes | None = None,
    ) -> None:
        """Record that a peer was seen now at `addresses` (merged in front of those already known).

        A sighting resets its failure count; its source stays the one it was first found by.
        """
        if source not in PEER_SOURCES:
            raise ValueError(f"unknown peer source {source!r}")
        with self.transaction(durable=False) as c:
            row = c.execute("SELECT addresses FROM peers WHERE node_id = ?", (node_id,)).fetchone()
            known = json.loads(row[0]) if row else []
            merged = list(dict.fromkeys([*addresses, *known]))[:16]
            c.execute(
                "INSERT INTO peers (node_id, network, addresses, source, first_seen, last_seen, contact) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (node_id) DO UPDATE SET "
                "network = excluded.network, addresses = excluded.addresses, last_seen = excluded.last_seen, "
                "failures = 0, contact = coalesce(excluded.contact, peers.contact)",
                (node_id, network, json.dumps(merged), source, now, now, contact),
            )

    def peer_failed(self, node_id: str, now: float) -> int:
        """Count a failed contact; returns the consecutive failures so far (0 if the peer is unknown)."""
        with self.transaction(durable=False) as c:
            row = c.execute(
                "UPDATE peers SET failures = failures + 1, last_failure = ? WHERE node_id = ? "
                "RETURNING failures",
                (now, node_id),
            ).fetchone()
        return 0 if row is None else int(row[0])

    def peer(self, node_id: str) -> PeerRow | None:
        with self.reading() as c:
            row = c.execute("SELECT * FROM peers WHERE node_id = ?", (node_id,)).fetchone()
        return None if row is None else _peer(row)

    def peers(self, network: str | None = None) -> list[PeerRow]:
        """Known peers, most recently seen first."""
        with self.reading() as c:
            rows = c.execute(
                "SELECT * FROM peers WHERE ?1 IS NULL OR network = ?1 ORDER BY last_seen DESC, node_id",
                (network,),
            ).fetchall()
        return [_peer(r) for r in rows]

    def remove_peer(self, node_id: str) -> bool:
        with self.transaction(durable=False) as c:
            return c.execute("DELETE FROM peers WHERE node_id = ?", (node_id,)).rowcount > 0

    def prune_peers(self, *, seen_before: float, min_failures: int) -> int:
        """Forget peers not seen since `seen_before` that failed at least `min_failures` times in a row."""
        with self.transaction(durable=False) as c:
            return c.execute(
                "DELETE FROM peers WHERE last_seen < ? AND failures >= ?", (seen_before, min_failures)
            ).rowcount

    # --- seen messages ---

    def mark_seen(self, message_id: bytes, expires: float) -> bool:
        """Remember a message id until `expires`; True if it was new, False if already known."""
        with self.transaction(durable=False) as c:
            cur = c.execute(
                "INSERT INTO seen (message_id, expires) VALUES (?, ?) ON CONFLICT (message_id) DO NOTHING",
                (message_id, expires),
            )
            return cur.rowcount > 0

    def is_seen(self, message_id: bytes, now: float) -> bool:
        with self.reading() as c:
            row = c.execute(
                "SELECT 1 FROM seen WHERE message_id = ? AND expires > ?", (message_id, now)
            ).fetchone()
        return row is not None

    def prune_seen(self, now: float) -> int:
        """Forget message ids whose expiry has passed; returns how many."""
        with self.transaction(durable=False) as c:
            return c.execute("DELETE FROM seen WHERE expires <= ?", (now,)).rowcount

    # --- jobs ---

    def add_job(
        self,
        *,
        job_id: bytes,
        role: str,
        manifest: bytes,
        state: str,
        submitter: str,
        created: float,
        deadline: float,
        fuel_limit: int | None = None,
        executor: str | None = None,
        attempt: int = 0,
        blobs: Sequence[str] = (),
        durable: bool = True,
    ) -> bool:
        """Insert a job; returns False (and changes nothing) if this node already holds it in `role`.

        `blobs` (hashes) are referenced by owner "job:<hex id>" in the same transaction. Not `durable`:
        a power cut may take the job back (an executor's, until it promises it: see AsyncStore.flush)."""
        _check_job(role, state)
        with self.transaction(durable=durable) as c:
            cur = c.execute(
                "INSERT INTO jobs (job_id, role, manifest, state, submitter, executor, attempt, created, "
                "deadline, updated, fuel_limit) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (job_id, role) DO NOTHING",
                (
                    job_id,
                    role,
                    manifest,
                    state,
                    submitter,
                    executor,
                    attempt,
                    created,
                    deadline,
                    created,
                    fuel_limit,
                ),
            )
            if cur.rowcount > 0:
                c.executemany(
                    "INSERT INTO blob_refs (blob_hash, owner, retain_until) VALUES (?, ?, NULL) "
                    "ON CONFLICT DO NOTHING",
                    [(h, f"job:{job_id.hex()}") for h in blobs],
                )
            return cur.rowcount > 0

    def job(self, job_id: bytes, role: str) -> JobRow | None:
        with self.reading() as c:
            row = c.execute(
                f"SELECT {_JOB_COLUMNS} FROM jobs WHERE job_id = ? AND role = ?", (job_id, role)
            ).fetchone()
        return None if row is None else JobRow(*row)

    def jobs_held(self, job_ids: Sequence[bytes], role: str) -> set[bytes]:
        """Which of `job_ids` this store holds a job row of in `role` (one query for an offer's jobs)."""
        with self.reading() as c:
            marks = ", ".join("?" * len(job_ids))
            rows = c.execute(
                f"SELECT job_id FROM jobs WHERE role = ? AND job_id IN ({marks})", (role, *job_ids)
            ).fetchall()
        return {bytes(r[0]) for r in rows}

    def jobs(self, *, role: str | None = None, states: Sequence[str] | None = None) -> list[JobRow]:
        """Jobs, oldest first, optionally only in `role` and in one of `states`."""
        sql = f"SELECT {_JOB_COLUMNS} FROM jobs WHERE (?1 IS NULL OR role = ?1)"
        args: list[Any] = [role]
        if states is not None:
            sql += f" AND state IN ({', '.join('?' * len(states))})"
            args += list(states)
        with self.reading() as c:
            rows = c.execute(sql + " ORDER BY created, job_id", args).fetchall()
        return [JobRow(*r) for r in rows]

    def update_job(
        self, /, job_id: bytes, role: str, now: float, *, expect_state: str | None = None, **changes: Any
    ) -> bool:
        """Change a job's fields; with `expect_state`, only if it is still in that state (compare-and-set).

        Returns whether a row changed. Only state, executor, attempt, deadline, started, finished,
        fuel_limit, fuel_used and reason may change.
        """
        bad = set(changes) - _JOB_UPDATABLE
        if bad:
            raise ValueError(f"cannot update job field(s): {', '.join(sorted(bad))}")
        if "state" in changes:
            _check_job(role, changes["state"])
        sets = ", ".join(f"{k} = ?" for k in changes)
        sql = f"UPDATE jobs SET {sets + ', ' if sets else ''}updated = ? WHERE job_id = ? AND role = ?"
        args: list[Any] = [*changes.values(), now, job_id, role]
        if expect_state is not None:
            sql += " AND state = ?"
            args.append(expect_state)
        with self.transaction(durable=changes.get("state") in DURABLE) as c:
            return c.execute(sql, args).rowcount > 0

    # --- envelopes ---

    def put_envelope(
        self, message_id: bytes, kind: str, raw: bytes, now: float, job_id: bytes | None = None
    ) -> bool:
        """Keep a signed envelope's exact bytes; returns False if it was already stored."""
        with self.transaction(durable=False) as c:
            cur = c.execute(
                "INSERT INTO envelopes (message_id, kind, raw, job_id, received) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT (message_id) DO NOTHING",
                (message_id, kind, raw, job_id, now),
            )
            return cur.rowcount > 0

    def put_shared_envelope(
        self, message_id: bytes, kind: str, raw: bytes, now: float, job_ids: Sequence[bytes]
    ) -> bool:
        """Keep a signed envelope that concerns several jobs once, linked to each of `job_ids` (links
        are added even when the envelope was already stored); returns whether the envelope was new.
        Only SHARED_KINDS: pruning collects an envelope of those kinds once no job links it."""
        if kind not in SHARED_KINDS:
            raise ValueError(
                f"an envelope of kind {kind!r} is not shared by jobs (only {', '.join(SHARED_KINDS)} are)"
            )
        if not job_ids:
            raise ValueError("a shared envelope needs at least one job to link it to")
        with self.transaction(durable=False) as c:
            cur = c.execute(
                "INSERT INTO envelopes (message_id, kind, raw, job_id, received) VALUES (?, ?, ?, NULL, ?) "
                "ON CONFLICT (message_id) DO NOTHING",
                (message_id, kind, raw, now),
            )
            c.executemany(
                "INSERT OR IGNORE INTO envelope_jobs (job_id, message_id) VALUES (?, ?)",
                [(job_id, message_id) for job_id in job_ids],
            )
            return cur.rowcount > 0

    def envelope(self, message_id: bytes) -> EnvelopeRow | None:
        with self.reading() as c:
            row = c.execute(
                "SELECT message_id, kind, raw, job_id, received FROM envelopes WHERE message_id = ?",
                (message_id,),
            ).fetchone()
        return None if row is None else EnvelopeRow(*row)

    def envelopes_for_job(self, job_id: bytes, kind: str | None = None) -> list[EnvelopeRow]:
        """The job's envelopes (of `kind`, or all): those stored for it, then those it shares with
        other jobs, each group by arrival; each envelope once."""
        with self.reading() as c:
            rows = c.execute(_ENVELOPES_FOR_JOB, (job_id, kind)).fetchall()
        return [EnvelopeRow(*r[1:]) for r in rows]

    def envelope_job_ids(self, kinds: Sequence[str]) -> set[bytes]:
        """Ids of the jobs that have an envelope of one of `kinds`, stored for them or shared."""
        marks = ", ".join("?" * len(kinds))
        with self.reading() as c:
            rows = c.execute(
                f"SELECT job_id FROM envelopes WHERE job_id IS NOT NULL AND kind IN ({marks}) UNION "
                f"SELECT l.job_id FROM envelope_jobs l JOIN envelopes e ON e.message_id = l.message_id "
                f"WHERE e.kind IN ({marks})",
                (*kinds, *kinds),
            ).fetchall()
        return {bytes(r[0]) for r in rows}

    # --- results, receipts, acknowledgements ---

    def put_result(
        self,
        *,
        job_id: bytes,
        attempt: int,
        executor: str,
        message_id: bytes,
        status: str,
        outputs: dict[str, str],
        now: float,
        fuel_used: int | None = None,
    ) -> bool:
        """Index an executor's result of an attempt (`message_id`: its receipt's envelope, already stored);
        False if this attempt's result is known."""
        with self.transaction() as c:
            cur = c.execute(
                "INSERT INTO results (job_id, attempt, executor, message_id, status, fuel_used, outputs, "
                "created) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (
                    job_id,
                    attempt,
                    executor,
                    message_id,
                    status,
                    fuel_used,
                    json.dumps(outputs, sort_keys=True),
                    now,
                ),
            )
            return cur.rowcount > 0

    def results_for_job(self, job_id: bytes) -> list[ResultRow]:
        with self.reading() as c:
            rows = c.execute(
                "SELECT * FROM results WHERE job_id = ? ORDER BY attempt, executor", (job_id,)
            ).fetchall()
        return [_result(r) for r in rows]

    def put_receipt(
        self,
        *,
        digest: bytes,
        job_id: bytes,
        attempt: int,
        executor: str,
        message_id: bytes,
        now: float,
        next_delivery: float | None = None,
    ) -> bool:
        """Index a receipt whose envelope is already stored; False if it was known."""
        with self.transaction() as c:
            cur = c.execute(
                "INSERT INTO receipts (digest, job_id, attempt, executor, message_id, created, "
                "next_delivery) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (digest) DO NOTHING",
                (digest, job_id, attempt, executor, message_id, now, next_delivery),
            )
            return cur.rowcount > 0

    def receipt(self, digest: bytes) -> ReceiptRow | None:
        with self.reading() as c:
            row = c.execute(f"SELECT {_RECEIPT_COLUMNS} FROM receipts WHERE digest = ?", (digest,)).fetchone()
        return None if row is None else ReceiptRow(*row)

    def receipts_with_envelopes(self, digests: Sequence[bytes]) -> list[tuple[ReceiptRow, bytes]]:
        """The receipts of `digests` this store indexes, each with its stored envelope's bytes (one
        query for a proof's batch of receipts; digests it does not index are left out)."""
        out: list[tuple[ReceiptRow, bytes]] = []
        columns = ", ".join(f"r.{c}" for c in ReceiptRow.__slots__)
        with self.reading() as c:
            for i in range(0, len(digests), 500):  # within SQLite's bound on parameters
                part = digests[i : i + 500]
                marks = ", ".join("?" * len(part))
                sql = (
                    f"SELECT {columns}, e.raw FROM receipts r JOIN envelopes e "
                    f"ON e.message_id = r.message_id WHERE r.digest IN ({marks})"
                )
                rows = c.execute(sql, part).fetchall()
                out += [(ReceiptRow(*row[:-1]), bytes(row[-1])) for row in rows]
        return out

    def receipts_for_job(self, job_id: bytes) -> list[ReceiptRow]:
        with self.reading() as c:
            rows = c.execute(
                f"SELECT {_RECEIPT_COLUMNS} FROM receipts WHERE job_id = ? ORDER BY attempt, executor",
                (job_id,),
            ).fetchall()
        return [ReceiptRow(*r) for r in rows]

    def receipts_due(self, now: float, limit: int = 100) -> list[ReceiptRow]:
        """Unacknowledged receipts whose next delivery attempt is due."""
        with self.reading() as c:
            rows = c.execute(
                f"SELECT {_RECEIPT_COLUMNS} FROM receipts WHERE delivered IS NULL "
                "AND next_delivery IS NOT NULL AND next_delivery <= ? ORDER BY next_delivery LIMIT ?",
                (now, limit),
            ).fetchall()
        return [ReceiptRow(*r) for r in rows]

    def acked_without_proof(
        self, executor: str, limit: int = 100, before: tuple[float, bytes] | None = None
    ) -> list[ReceiptRow]:
        """Receipts by `executor` this node acknowledged (as their submitter) for jobs it still holds
        and holds no inclusion proof of (its `log_index` is set when one is kept), newest first, from
        just below `before` (a row's (delivered, digest): where the last page ended); an index of
        exactly those rows makes it cheap however many receipts the store holds."""
        after = "" if before is None else "AND (r.delivered, r.digest) < (?, ?) "
        with self.reading() as c:
            rows = c.execute(
                f"SELECT {_RECEIPT_COLUMNS} FROM receipts r WHERE r.executor = ? AND r.delivered IS NOT NULL "
                f"AND r.log_index IS NULL {after}"
                "AND EXISTS (SELECT 1 FROM jobs j WHERE j.job_id = r.job_id AND j.role = 'submitter') "
                "ORDER BY r.delivered DESC, r.digest DESC LIMIT ?",
                (executor, *(before or ()), limit),
            ).fetchall()
        return [ReceiptRow(*r) for r in rows]

    def verified_unacked(self, limit: int = 10_000) -> list[ReceiptRow]:
        """Up to `limit` receipts of jobs this node submitted that it verified (marked delivered) and
        holds no ack of: the node stopped before their batch's ack was stored. Newest first. Receipts
        delivered before schema v6 are not among them (their acks of the old form were dropped: _V6)."""
        with self.reading() as c:
            rows = c.execute(
                f"SELECT {_RECEIPT_COLUMNS} FROM receipts r WHERE r.delivered IS NOT NULL "
                "AND r.delivered > coalesce((SELECT CAST(value AS REAL) FROM kv "
                "WHERE key = 'acks_v6_at'), 0) "
                "AND NOT EXISTS (SELECT 1 FROM acks a WHERE a.receipt_digest = r.digest) "
                "AND EXISTS (SELECT 1 FROM jobs j WHERE j.job_id = r.job_id AND j.role = 'submitter') "
                "ORDER BY r.delivered DESC LIMIT ?",
                (limit,),
            ).fetchall()
        return [ReceiptRow(*r) for r in rows]

    def acked_unlogged(self, executor: str) -> list[ReceiptRow]:
        """`executor`'s acknowledged receipts not yet in its receipt log (the node stopped between the
        ack and the append), oldest first."""
        with self.reading() as c:
            rows = c.execute(
                f"SELECT {_RECEIPT_COLUMNS} FROM receipts WHERE executor = ? AND delivered IS NOT NULL "
                "AND log_index IS NULL ORDER BY delivered",
                (executor,),
            ).fetchall()
        return [ReceiptRow(*r) for r in rows]

    def receipt_delivery_failed(self, digest: bytes, next_delivery: float) -> None:
        with self.transaction(durable=False) as c:
            c.execute(
                "UPDATE receipts SET delivery_tries = delivery_tries + 1, next_delivery = ? WHERE digest = ?",
                (next_delivery, digest),
            )

    def set_receipt_log_index(self, digest: bytes, log_index: int, *, durable: bool = True) -> None:
        """Record where a receipt sits in its executor's log: durable for the executor's own log; a
        submitter's record of a proof it can ask for again need not be."""
        with self.transaction(durable=durable) as c:
            c.execute("UPDATE receipts SET log_index = ? WHERE digest = ?", (log_index, digest))

    def put_acks(
        self,
        ack_id: bytes,
        ack_raw: bytes,
        now: float,
        receipts: Sequence[tuple[bytes, bytes]],
        *,
        durable: bool = True,
    ) -> None:
        """Keep a verified `ack` once, linked to the jobs it answers, as the acknowledgement of each of
        `receipts` ((receipt digest, job id) pairs, receipts already indexed) that has none yet, and mark
        those receipts delivered. Not `durable` (an executor's copy, or a submitter's, which signs
        another when the receipt is delivered again): a power cut may take it back."""
        with self.transaction(durable=durable) as c:
            self.put_shared_envelope(ack_id, "ack", ack_raw, now, sorted({job for _, job in receipts}))
            c.executemany(
                "INSERT INTO acks (receipt_digest, message_id, created) VALUES (?, ?, ?) "
                "ON CONFLICT (receipt_digest) DO NOTHING",
                [(digest, ack_id, now) for digest, _ in receipts],
            )
            c.executemany(
                "UPDATE receipts SET delivered = ?, next_delivery = NULL "
                "WHERE digest = ? AND delivered IS NULL",
                [(now, digest) for digest, _ in receipts],
            )

    def record_verified_receipt(
        self,
        *,
        receipt_digest: bytes,
        job_id: bytes,
        attempt: int,
        executor: str,
        now: float,
        blobs: Sequence[str] = (),
    ) -> None:
        """A submitter's side of a verified outcome: the receipt (envelope already stored) indexed and
        marked delivered (it is acknowledged with the next `ack` to its executor: put_acks), and the
        output blobs the job's result names (`blobs`) referenced by the job."""
        with self.transaction() as c:
            for blob in blobs:
                self.ref_blob(blob, f"job:{job_id.hex()}")
            self.put_receipt(
                digest=receipt_digest,
                job_id=job_id,
                attempt=attempt,
                executor=executor,
                message_id=receipt_digest,
                now=now,
            )
            c.execute(
                "UPDATE receipts SET delivered = ?, next_delivery = NULL WHERE digest = ? "
                "AND delivered IS NULL",
                (now, receipt_digest),
            )

    def ack_for(self, receipt_digest: bytes) -> EnvelopeRow | None:
        with self.reading() as c:
            row = c.execute(
                "SELECT e.message_id, e.kind, e.raw, e.job_id, e.received FROM acks a "
                "JOIN envelopes e ON e.message_id = a.message_id WHERE a.receipt_digest = ?",
                (receipt_digest,),
            ).fetchone()
        return None if row is None else EnvelopeRow(*row)

    # --- blob references (what keeps a blob from garbage collection) ---

    def ref_blob(self, blob_hash: str, owner: str, retain_until: float | None = None) -> None:
        with self.transaction(durable=False) as c:
            c.execute(
                "INSERT INTO blob_refs (blob_hash, owner, retain_until) VALUES (?, ?, ?) "
                "ON CONFLICT DO UPDATE SET retain_until = excluded.retain_until",
                (blob_hash, owner, retain_until),
            )

    def unref_owner(self, owner: str) -> int:
        with self.transaction(durable=False) as c:
            return c.execute("DELETE FROM blob_refs WHERE owner = ?", (owner,)).rowcount

    def put_small_blob(self, blob_hash: str, data: bytes) -> None:
        """Keep a small blob (at most PUSH_MAX bytes, already checked against its hash) in the database;
        a no-op when it is there. Reference it (ref_blob) in the same transaction, or it is dropped."""
        if len(data) > PUSH_MAX:
            raise ValueError(f"a small blob is at most {PUSH_MAX} bytes, not {len(data)}")
        with self.transaction(durable=False) as c:
            c.execute(
                "INSERT INTO small_blobs (blob_hash, data) VALUES (?, ?) ON CONFLICT DO NOTHING",
                (blob_hash, data),
            )

    def small_blobs(self, blob_hashes: Sequence[str]) -> dict[str, bytes]:
        """The small blobs of `blob_hashes` the database holds, by hash."""
        out: dict[str, bytes] = {}
        with self.reading() as c:
            for h in dict.fromkeys(blob_hashes):
                row = c.execute("SELECT data FROM small_blobs WHERE blob_hash = ?", (h,)).fetchone()
                if row is not None:
                    out[h] = bytes(row[0])
        return out

    def drop_small_blobs(self, now: float) -> int:
        """Forget the small blobs no live reference names (as `live_blobs` judges it at `now`)."""
        with self.transaction(durable=False) as c:
            return c.execute(
                "DELETE FROM small_blobs WHERE NOT EXISTS (SELECT 1 FROM blob_refs r WHERE r.blob_hash = "
                "small_blobs.blob_hash AND (r.retain_until IS NULL OR r.retain_until > ?))",
                (now,),
            ).rowcount

    def live_blobs(self, now: float) -> set[str]:
        """Hashes still referenced (no end of retention, or one in the future): not to be collected."""
        with self.reading() as c:
            rows = c.execute(
                "SELECT DISTINCT blob_hash FROM blob_refs WHERE retain_until IS NULL OR retain_until > ?",
                (now,),
            ).fetchall()
        return {r[0] for r in rows}

    def expire_blob_refs(self, now: float) -> int:
        with self.transaction(durable=False) as c:
            return c.execute("DELETE FROM blob_refs WHERE retain_until <= ?", (now,)).rowcount

    # --- finished jobs ---

    def prune_finished_jobs(self, ended_before: float, limit: int = 500) -> int:
        """Forget up to `limit` jobs that ended (lifecycle.PRUNABLE) before `ended_before`, oldest first, in
        one transaction; returns how many rows went (call again until it returns less than `limit`).

        Goes: the job row, and once no role of the job is left, its results, its blob references and
        its envelopes (bids, result, accepted, proofs...; all of them when it has no receipt). Stays,
        for a job with a usage receipt: the receipts and their acknowledgements, with the offer and the
        assignments they name (the signed evidence an audit checks a receipt against, in the receipt
        log); undelivered receipts are not offered again. And every `disputed` job stays whole.

        An envelope shared by several jobs loses the job's link likewise (a job with a receipt keeps
        its links to offers and acks), and goes once no job links it any more. One stored for a job and shared
        with others later is kept, for those others, as a shared one."""
        with self.transaction() as c:
            rows = c.execute(  # the states as literals, as in the partial index jobs_ended
                f"SELECT job_id, role FROM jobs WHERE {_ENDED} AND updated < ? ORDER BY updated LIMIT ?",
                (ended_before, limit),
            ).fetchall()
            c.executemany("DELETE FROM jobs WHERE job_id = ? AND role = ?", [(r[0], r[1]) for r in rows])
            gone = [
                (job,)
                for job in {bytes(r[0]) for r in rows}
                if c.execute("SELECT 1 FROM jobs WHERE job_id = ?", (job,)).fetchone() is None
            ]
            c.executemany("DELETE FROM results WHERE job_id = ?", gone)
            c.executemany("DELETE FROM blob_refs WHERE owner = ?", [(f"job:{j.hex()}",) for (j,) in gone])
            c.executemany(
                "UPDATE receipts SET next_delivery = NULL WHERE job_id = ? AND delivered IS NULL", gone
            )  # its result goes: no more delivery attempts
            unlinked = {
                bytes(r[0])
                for (j,) in gone
                for r in c.execute(
                    "DELETE FROM envelope_jobs AS l WHERE job_id = ?1 AND NOT (EXISTS ("
                    "SELECT 1 FROM receipts WHERE job_id = ?1) AND EXISTS ("
                    "SELECT 1 FROM envelopes e WHERE e.message_id = l.message_id "
                    "AND e.kind IN ('offer', 'ack'))) "
                    "RETURNING message_id",
                    (j,),
                ).fetchall()
            }
            c.executemany(
                f"UPDATE envelopes SET job_id = NULL WHERE {_NOT_EVIDENCE} AND EXISTS ("
                "SELECT 1 FROM envelope_jobs l WHERE l.message_id = envelopes.message_id)",
                gone,
            )
            c.executemany(f"DELETE FROM envelopes WHERE {_NOT_EVIDENCE}", gone)
            marks = ", ".join("?" * len(SHARED_KINDS))
            c.executemany(
                f"DELETE FROM envelopes WHERE message_id = ? AND job_id IS NULL AND kind IN ({marks}) "
                "AND NOT EXISTS (SELECT 1 FROM envelope_jobs l WHERE l.message_id = envelopes.message_id)",
                [(m, *SHARED_KINDS) for m in sorted(unlinked)],
            )
            return len(rows)


_ENDED = sql_in(PRUNABLE)
"""PRUNABLE as SQL, spelled exactly as the index jobs_ended's condition (so the query uses it)."""
_NOT_EVIDENCE = (
    "job_id = ?1 AND NOT ("
    "message_id IN (SELECT message_id FROM receipts WHERE job_id = ?1 UNION SELECT a.message_id "
    "FROM acks a JOIN receipts r ON r.digest = a.receipt_digest WHERE r.job_id = ?1) "
    "OR (kind IN ('offer', 'assign') AND EXISTS (SELECT 1 FROM receipts WHERE job_id = ?1)))"
)
"""The envelopes stored for job ?1 that are not the signed evidence of a receipt (prune_finished_jobs)."""


def _check_job(role: str, state: str) -> None:
    if role not in Role.__members__.values():
        raise ValueError(f"unknown job role {role!r}")
    if state not in JobState.__members__.values():
        raise ValueError(f"unknown job state {state!r}")


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
        _raise_as_store_error(self.store.path, e)


class _translate:
    """Turn sqlite3's errors inside the block into StoreError naming the file (an IntegrityError goes
    through: callers handle it). A class, not a generator: it wraps every store call, several times, and a
    @contextmanager costs about 8 µs a use against under 1."""

    __slots__ = ("path",)

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, e: BaseException | None, tb: object) -> None:
        _raise_as_store_error(self.path, e)


def _raise_as_store_error(path: Path, e: BaseException | None) -> None:
    """Raise a StoreError naming `path` for sqlite3's error `e` (a closed store's ProgrammingError too),
    except an IntegrityError, which callers handle; do nothing for anything else."""
    if e is not None and isinstance(e, sqlite3.DatabaseError) and not isinstance(e, sqlite3.IntegrityError):
        raise StoreError(f"{path}: {_describe(e)}") from e


def _describe(e: sqlite3.Error) -> str:
    text = str(e)
    if "not a database" in text:
        return "not an SQLite database (left untouched)"
    if "malformed" in text or "corrupt" in text:
        return f"the database is corrupt ({text}); it was left untouched"
    if "locked" in text or "busy" in text:
        return f"the database is locked by another process ({text})"
    return text


def _open(path: Path) -> sqlite3.Connection:
    """Connect, check the file is ours and intact, set it up, migrate it; StoreError otherwise."""
    if path.is_dir():
        raise StoreError(f"{path}: is a directory, expected the node's database file")
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as e:
        raise StoreError(f"{path.parent}: cannot create the data directory: {e.strerror or e}") from None
    try:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=10.0)
    except sqlite3.Error as e:
        raise StoreError(f"{path}: cannot open: {e}") from None
    try:
        conn.row_factory = sqlite3.Row
        _check_and_setup(conn, path)
    except BaseException:
        conn.close()
        raise
    return conn


def _check_and_setup(conn: sqlite3.Connection, path: Path) -> None:
    with _translate(path):
        # Reading the header first: a non-database file fails here, before anything is written.
        conn.execute("PRAGMA schema_version").fetchone()
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        has_tables = conn.execute("SELECT count(*) FROM sqlite_schema").fetchone()[0] > 0
        if app_id != APPLICATION_ID and (app_id != 0 or has_tables):
            raise StoreError(f"{path}: an SQLite database, but not an e31 store (left untouched)")
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"{path}: written by a newer e31 (schema version {version}; this e31 knows up to "
                f"{SCHEMA_VERSION}); upgrade e31 to use this data dir"
            )
        if has_tables:
            problems = [r[0] for r in conn.execute("PRAGMA quick_check").fetchall()]
            if problems != ["ok"]:
                raise StoreError(
                    f"{path}: the database is corrupt ({'; '.join(problems[:3])}); it was left untouched"
                )
        mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if mode != "wal":
            raise StoreError(f"{path}: cannot use write-ahead logging here (journal mode {mode})")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute("PRAGMA foreign_keys = ON")
        migrate(conn, SCHEMA_VERSION)


def migrate(conn: sqlite3.Connection, target: int) -> None:
    """Apply the migrations that take the database from its version to `target`, each atomically."""
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    for step in range(version, target):
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in _statements(MIGRATIONS[step]):
                conn.execute(statement)
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            conn.execute(f"PRAGMA user_version = {step + 1}")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise


def _statements(script: str) -> list[str]:
    """Split a migration script into statements (sqlite3's executescript would commit on its own)."""
    out: list[str] = []
    pending = ""
    for line in script.splitlines(keepends=True):
        pending += line
        if sqlite3.complete_statement(pending):
            out.append(pending.strip())
            pending = ""
    if pending.strip():
        raise ValueError(f"incomplete SQL statement in a migration: {pending.strip()[:60]!r}")
    return out


# --- trio ---------------------------------------------------------------------------------------------

P = ParamSpec("P")
T = TypeVar("T")


INLINE_READS = frozenset(
    {
        "job",
        "jobs_held",
        "envelope",
        "envelopes_for_job",
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
        try:
            return await trio.to_thread.run_sync(fn, limiter=self._limiter)
        finally:
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
        with _translate(store.path):
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
        with _translate(store.path):
            c.execute("SAVEPOINT write")
        store._in_member = True
        try:
            result = method(store, *args, **kwargs)
            with _translate(store.path):
                c.execute("RELEASE write")
        except BaseException as e:
            if not c.in_transaction:  # SQLite ended the whole transaction: every write of it is lost
                group.error = StoreError(
                    f"{store.path}: a write failed and the writes to commit with it were lost ({e})"
                )
                raise
            try:
                with _translate(store.path):
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
                with _translate(store.path):
                    if store._inner_durable and c.total_changes != group.changes:
                        store.unsynced += 1  # before COMMIT, as in Store.transaction
                    c.execute("COMMIT")
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
