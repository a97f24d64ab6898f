"""The store's watermark: what the node has promised, kept where a lost WAL cannot take it back.

After a kill -9 most committed data sits in node.sqlite-wal. A WAL whose header is damaged, replaced,
cut short, or a database file deleted or truncated, makes SQLite open an older database without an
error. Running on it would lose jobs silently, and the receipt log would sign heads whose roots differ
from heads it signed before at the same sizes: a forked log, by docs/security.md's own definition.

So the store keeps a small second file next to the database, DATA/node.sqlite.watermark, written apart
from SQLite (temp file, fsync, rename, fsync of the directory) and only *after* the durable commit it
describes: it is never ahead of what is on disk. After a group-commit sync it is written behind, in a
thread of its own, at most every WRITE_INTERVAL (100 ms): it lags the database by at most the syncs of
the last interval and the write in progress. A signed tree head is written into it before the head
leaves the node (`Store.promise_head`), and a clean close writes it up to the last commit. It holds

    store_id   the database's random id (table store_seq, made once): another node's WAL or file is not it
    seq        the store's commit sequence: bumped in every durable commit, in the same transaction
    log        size and root of the newest signed tree head, and that head's envelope (evidence)
    floor      heads are signed only at sizes above it (raised by an accepted loss, see below)
    losses     every accepted loss: what was found and the heads signed before it (kept for good)

as JSON with a SHA-256 checksum of its body and a format version. At open (store/db.py) a database that
is behind its watermark (a lower seq, fewer log entries than the head, another root at the head's size,
another store id, a missing or empty file) is refused with StoreBehind, before anything is written to
it; `e31 node recover` (cli/recover.py) explains what was found and, when told, accepts the loss
(`accept_loss`). A missing watermark with an existing database (a store from before watermarks) is
made from the database.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import math
import os
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import StoreError
from .connection import DiskFull, is_disk_full

FORMAT = "e31-store-watermark"
VERSION = 1
SUFFIX = ".watermark"
WRITE_INTERVAL = 0.1
"""Seconds between the starts of two write-behind watermark writes (at most about 10 a second): the syncs
made meanwhile are covered by the next write, which then costs two fsyncs per interval, not per sync."""


class WatermarkError(StoreError):
    """The watermark file cannot be read, is damaged, or cannot be written."""


class StoreBehind(StoreError):
    """The database is older than what the node has promised (its watermark): refused, left untouched."""

    exit_code = 65  # EX_DATAERR: the data on disk cannot be used as it is


@dataclass(frozen=True, slots=True)
class Mark:
    """One watermark: the newest state of the store the node has relied on."""

    store_id: bytes
    seq: int
    log_size: int = 0
    log_root: bytes = b""
    """The root of the newest signed head (empty when no head was signed)."""
    head: bytes = b""
    """That head's signed envelope."""
    floor: int = 0
    """Tree heads are signed only at sizes above this (after an accepted loss; 0 otherwise)."""
    losses: tuple[dict[str, Any], ...] = field(default=())
    """Accepted losses, oldest first: when, what was found, the watermark before (JSON objects)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "store_id": self.store_id.hex(),
            "seq": self.seq,
            "log": {
                "size": self.log_size,
                "root": self.log_root.hex(),
                "head": base64.b64encode(self.head).decode("ascii"),
            },
            "floor": self.floor,
            "losses": list(self.losses),
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Mark:
        log = doc["log"]
        mark = cls(
            store_id=bytes.fromhex(doc["store_id"]),
            seq=doc["seq"],
            log_size=log["size"],
            log_root=bytes.fromhex(log["root"]),
            head=base64.b64decode(log["head"], validate=True),
            floor=doc["floor"],
            losses=tuple(doc["losses"]),
        )
        counts = (mark.seq, mark.log_size, mark.floor)
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts):
            raise ValueError("a count is not a non-negative integer")
        if not all(isinstance(x, dict) for x in mark.losses):
            raise ValueError("a loss is not an object")
        return mark


def path_for(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + SUFFIX)


def _checksum(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def read(path: Path) -> Mark | None:
    """The watermark in `path`; None when there is none; WatermarkError when it cannot be trusted."""
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        raise WatermarkError(f"{path}: cannot read the store's watermark: {e.strerror or e}") from None
    try:
        doc = json.loads(text)
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ValueError("not an e31 store watermark")
        if doc.get("version") != VERSION:
            raise WatermarkError(
                f"{path}: a store watermark of version {doc.get('version')!r} (this e31 knows {VERSION}); "
                "upgrade e31 to use this data dir"
            )
        body = doc["body"]
        if doc.get("sha256") != _checksum(body):
            raise ValueError("its checksum does not match")
        return Mark.from_json(body)
    except WatermarkError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise WatermarkError(
            f"{path}: the store's watermark is damaged ({e}); restore it from a backup, or move it aside "
            "to have one made from the database (which then is trusted as it is)"
        ) from None


def write(path: Path, mark: Mark) -> None:
    """Replace the watermark atomically and durably: temp file, fsync, rename, fsync of the directory.
    WatermarkError (DiskFull when the disk is full; the old one is left in place) when the disk refuses."""
    body = mark.to_json()
    data = json.dumps({"format": FORMAT, "version": VERSION, "sha256": _checksum(body), "body": body})
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, data.encode() + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as e:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        kind = DiskFull if is_disk_full(e) else WatermarkError
        raise kind(f"{path}: cannot write the store's watermark: {e.strerror or e}") from e


@dataclass(frozen=True, slots=True)
class DbState:
    """What the database holds, to compare with its watermark."""

    store_id: bytes
    seq: int
    log_size: int
    root_at_mark: bytes | None
    """The log's root at the watermark's log size (None when the log is shorter or a hash is missing)."""


def behind(mark: Mark, db: DbState) -> list[str]:
    """How the database is behind its watermark (one phrase each); empty when it is not."""
    found: list[str] = []
    if db.store_id != mark.store_id:
        found.append(
            f"it is another database (store id {db.store_id.hex()[:12]}, the watermark names "
            f"{mark.store_id.hex()[:12]}: a replaced or lost file or WAL)"
        )
        return found
    if db.seq < mark.seq:
        found.append(f"its last commit is {db.seq}, the node had durably committed up to {mark.seq}")
    if db.log_size < mark.log_size:
        found.append(
            f"its receipt log holds {db.log_size} entries, the node signed a tree head of size "
            f"{mark.log_size}"
        )
    elif mark.log_size and db.root_at_mark != mark.log_root:
        found.append(f"its receipt log's root at size {mark.log_size} differs from the signed tree head's")
    return found


class Keeper:
    """The watermark of one open store: advanced (never moved back) after durable commits, written at
    most once per advance. Thread-safe."""

    def __init__(self, path: Path, mark: Mark, *, interval: float = WRITE_INTERVAL) -> None:
        self.path = path
        self.mark = mark
        self.interval = interval
        """Seconds between the starts of two write-behind writes (`advance_soon`); 0: as fast as it can."""
        self.written = mark
        self._lock = threading.Lock()
        self.failing: StoreError | None = None
        """Why the last write failed (the watermark lags until one succeeds), or None."""
        self._wake = threading.Condition()
        self._pending = mark.seq
        self._writer: threading.Thread | None = None
        self._closed = False

    def advance_soon(self, seq: int) -> None:
        """`advance(seq=seq)` in a writer thread of its own, off the caller's path: a sync does not wait
        for the watermark's two fsyncs, and one write covers every sync made meanwhile. Writes start at
        most every `interval` seconds, so the watermark lags the database by at most the syncs of the
        last `interval` plus the write in progress (it is never ahead of it)."""
        with self._wake:
            if seq <= self._pending:
                return
            self._pending = seq
            if self._writer is None and not self._closed:
                self._writer = threading.Thread(target=self._write_behind, name="e31-watermark", daemon=True)
                self._writer.start()
            self._wake.notify()

    def _write_behind(self) -> None:
        last = -math.inf
        while True:
            with self._wake:
                while not self._closed:
                    if self._pending <= self.mark.seq:
                        self._wake.wait()
                        continue
                    delay = last + self.interval - time.monotonic()
                    if delay <= 0:
                        break
                    self._wake.wait(delay)  # close() wakes it: the last write is not held back
                if self._pending <= self.mark.seq:
                    return
                seq = self._pending
            last = time.monotonic()
            self.advance(seq=seq)

    def close(self) -> None:
        """Stop the writer thread once it has written what it was given."""
        with self._wake:
            self._closed = True
            self._wake.notify()
            writer = self._writer
        if writer is not None:
            writer.join()

    def advance(self, *, seq: int | None = None, head: tuple[int, bytes, bytes] | None = None) -> bool:
        """Raise the seq and/or the newest signed head (size, root, envelope), then write the watermark
        if it changed. Call only once what it names is durable. Returns False when the write failed (the
        file keeps an older, still true, watermark; `failing` says why); raises nothing."""
        with self._lock:
            mark = self.mark
            if seq is not None and seq > mark.seq:
                mark = replace(mark, seq=seq)
            if head is not None and (head[0] > mark.log_size or not mark.head):
                mark = replace(mark, log_size=head[0], log_root=head[1], head=head[2])
            self.mark = mark
            if mark == self.written:
                return True
            try:
                write(self.path, mark)
            except StoreError as e:
                self.failing = e
                return False
            self.written, self.failing = mark, None
            return True


def accepted(mark: Mark, db: DbState, head: tuple[int, bytes, bytes] | None, now: float, moved: str) -> Mark:
    """The watermark after the operator accepted that the database is behind `mark`: it describes the
    database as it is (`head`: its newest signed head, if any), keeps every earlier loss and this one
    (with the head signed before it), and raises the signing floor to the old log size when the log
    lost entries or differs, so no head is ever signed again at a size signed before."""
    log_lost = (
        db.store_id != mark.store_id
        or db.log_size < mark.log_size
        or (mark.log_size > 0 and db.root_at_mark != mark.log_root)
    )
    loss = {
        "accepted_at": now,
        "found": behind(mark, db),
        "kept_in": moved,
        "before": {k: v for k, v in mark.to_json().items() if k != "losses"},
        "after": {"store_id": db.store_id.hex(), "seq": db.seq, "log_size": db.log_size},
    }
    size, root, raw = head if head is not None else (0, b"", b"")
    return Mark(
        store_id=db.store_id,
        seq=db.seq,
        log_size=size,
        log_root=root,
        head=raw,
        floor=max(mark.floor, mark.log_size) if log_lost else mark.floor,
        losses=(*mark.losses, loss),
    )
