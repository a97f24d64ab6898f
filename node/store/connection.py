"""Opening the node's database file, and sqlite3's errors as StoreError naming it.

Opening refuses a file that is not SQLite, is another program's database, fails quick_check, or has a
newer schema, with a StoreError, and never writes to such a file; a file that passes is set up (WAL
journal, synchronous=FULL, foreign_keys=ON) and migrated forward (store/schema.py). Settings and why:
- WAL journal: readers never block the writer, and a crash (kill -9, power loss) leaves the database at
  its last committed transaction.
- foreign_keys=ON, and every write method is one transaction (BEGIN IMMEDIATE ... COMMIT; store/db.py).
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from ..errors import StoreError
from .schema import APPLICATION_ID, SCHEMA_VERSION, migrate


def connect(path: Path) -> sqlite3.Connection:
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
        if is_disk_full(e, path):
            raise _full_at_open(path, e) from None
        raise StoreError(f"{path}: cannot open: {e}") from None
    try:
        conn.row_factory = sqlite3.Row
        _check_and_setup(conn, path)
    except DiskFull as e:
        conn.close()
        raise _full_at_open(path, e.__cause__ or e) from None
    except BaseException:
        conn.close()
        raise
    return conn


def _full_at_open(path: Path, e: BaseException) -> DiskFull:
    try:
        st = os.statvfs(path.parent)
        free = f", {st.f_bavail * st.f_frsize} bytes free"
    except OSError:
        free = ""
    return DiskFull(
        f"{path}: cannot open the store: the disk is full ({e}{free}); free space on it and start again"
    )


def _check_and_setup(conn: sqlite3.Connection, path: Path) -> None:
    with translate(path):
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


def connect_reader(path: Path) -> sqlite3.Connection:
    """A read-only connection to an opened store (for Store.reader)."""
    with translate(path):
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=10.0)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA query_only = ON")
    return conn


class translate:
    """Turn sqlite3's errors inside the block into StoreError naming the file (an IntegrityError goes
    through: callers handle it). A class, not a generator: it wraps every store call, several times, and a
    @contextmanager costs about 8 µs a use against under 1."""

    __slots__ = ("path",)

    def __init__(self, path: Path) -> None:
        self.path = path

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, e: BaseException | None, tb: object) -> None:
        raise_as_store_error(self.path, e)


class DiskFull(StoreError):
    """The disk holding the store is full (SQLITE_FULL, ENOSPC): the write was not made; reads still work,
    and writes work again once there is space. Logged as one line, never with a traceback (node/logs.py):
    a service that retries its write says what it tried and this message says why it failed."""

    log_traceback = False


def raise_as_store_error(path: Path, e: BaseException | None) -> None:
    """Raise a StoreError naming `path` for sqlite3's error `e` (a closed store's ProgrammingError too),
    DiskFull when the disk is full, except an IntegrityError, which callers handle; do nothing for anything
    else."""
    if e is not None and isinstance(e, sqlite3.DatabaseError) and not isinstance(e, sqlite3.IntegrityError):
        if is_disk_full(e, path):
            raise DiskFull(f"{path}: the disk is full ({e}); free space on it") from e
        raise StoreError(f"{path}: {_describe(e)}") from e


LOW_SPACE = 1 << 20
"""Free bytes under which an SQLite I/O error on the file's disk is taken for a full disk."""


def is_disk_full(e: BaseException, path: Path | None = None) -> bool:
    """Whether `e` says the disk is full: SQLITE_FULL, an OSError with ENOSPC or EDQUOT, or (given the
    file's `path`) an SQLite I/O error while its disk has under LOW_SPACE free: SQLite reports a -shm
    or WAL file it cannot grow as SQLITE_IOERR_SHMSIZE or _WRITE, not as SQLITE_FULL."""
    import errno

    if isinstance(e, sqlite3.Error):
        code = getattr(e, "sqlite_errorcode", None)
        if code == sqlite3.SQLITE_FULL or "disk is full" in str(e):
            return True
        return path is not None and code is not None and code & 0xFF == sqlite3.SQLITE_IOERR and _low(path)
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)


def _low(path: Path) -> bool:
    try:
        st = os.statvfs(path.parent)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < LOW_SPACE


def _describe(e: sqlite3.Error) -> str:
    text = str(e)
    if "not a database" in text:
        return "not an SQLite database (left untouched)"
    if "malformed" in text or "corrupt" in text:
        return f"the database is corrupt ({text}); it was left untouched"
    if "locked" in text or "busy" in text:
        return f"the database is locked by another process ({text})"
    return text
