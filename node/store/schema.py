"""The schema of the node's database (DATA/node.sqlite) as its history: MIGRATIONS, applied in order.

application_id marks the file as an e31 store; user_version is its schema version, the number of
migrations applied. Every table and index is made here and nowhere else. MIGRATIONS[i] takes a store at
version i to version i + 1, in one transaction (`migrate`); a step is never edited once released, so a
step's text is history: queries build their state lists from node/lifecycle.py, not from these strings.
Opening a file checks it before migrating it (store/connection.py).
"""

from __future__ import annotations

import sqlite3

APPLICATION_ID = 0x0E31_0001

# Append only; never edit a released step.

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

_V8 = """
CREATE TABLE IF NOT EXISTS receipt_log (
    idx        INTEGER PRIMARY KEY,
    receipt_id BLOB NOT NULL UNIQUE,       -- the receipt's message id
    leaf_hash  BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS receipt_log_nodes (
    level INTEGER NOT NULL,                -- 1 and up: the subtree over 2^level leaves
    idx   INTEGER NOT NULL,
    hash  BLOB NOT NULL,
    PRIMARY KEY (level, idx)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS receipt_log_heads (
    size INTEGER PRIMARY KEY,
    raw  BLOB NOT NULL                     -- the signed `treehead` envelope of that size
);
"""
"""The executor's receipt log (store/receiptlog.py, store/receipt_tree.py) gets its tables from a migration
like every other table. Stores of v7 and before made them on first use, so they may exist already (a store
from before receipt_log_nodes existed gets it empty here, and the log rewrites it from the leaves)."""

_V9 = """
CREATE TABLE IF NOT EXISTS store_seq (
    id       INTEGER PRIMARY KEY CHECK (id = 1),
    store_id BLOB NOT NULL,                -- random, made once: names this database in its watermark
    seq      INTEGER NOT NULL              -- bumped by every durable commit (store/db.py)
);
INSERT OR IGNORE INTO store_seq (id, store_id, seq) VALUES (1, randomblob(16), 0);
"""
"""The store's identity and commit sequence, which its watermark (store/watermark.py) records outside the
database, so a database older than what the node promised is found at open."""

MIGRATIONS: tuple[str, ...] = (_V1, _V2, _V3, _V4, _V5, _V6, _V7, _V8, _V9)
SCHEMA_VERSION = len(MIGRATIONS)


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
