"""`e31 node recover`: explain why the node refuses its database, and, when told, accept the loss.

A node refuses to start on a database older than its watermark (store/watermark.py: a damaged,
replaced or cut WAL, a deleted or truncated node.sqlite). This command, run with the node stopped:
- without flags, looks at a copy of the database (never the files themselves, so a damaged WAL is not
  reset by opening it), prints what the watermark promised, what the database holds and what is
  missing, and exits 65 when the database is behind (0 when it is not);
- with --accept-loss, first keeps the evidence: the database, its WAL and the watermark are copied into
  DATA/lost/<UTC time>/ (a database that cannot be opened at all is moved there, and a new one made);
  then it writes a watermark describing the database as it is, which keeps the old watermark and every
  earlier loss in its `losses`, and raises the signing floor to the largest receipt-log size signed
  before, so the node never signs a tree head at a size it signed once (store/receiptlog.py).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..config import STORE_FILE, add_data_dir_argument, resolve_data_dir
from ..errors import StoreError
from .main import CliError

if TYPE_CHECKING:
    from ..store.watermark import Mark

SIDE_FILES = ("-wal",)
"""SQLite's files next to the database that hold committed data (-shm is an index, rebuilt on open)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_data_dir_argument(parser)
    parser.add_argument(
        "--accept-loss",
        action="store_true",
        help="keep the evidence in DATA/lost/, accept the database as it is and let the node start",
    )


def run(args: argparse.Namespace) -> int:
    import os

    from ..daemon import _data_dir_lock
    from ..store import watermark

    os.umask(0o077)  # as the node: a database made here holds job arguments and outputs later
    data_dir = resolve_data_dir(args.data_dir)
    db_path = data_dir / STORE_FILE
    mark_path = watermark.path_for(db_path)
    if not data_dir.is_dir():
        raise CliError(f"{data_dir}: no such data dir")
    with _data_dir_lock(data_dir):  # the node must not run meanwhile
        mark = watermark.read(mark_path)
        if mark is None:
            print(f"{mark_path}: no watermark: nothing to recover (the node makes one from the database)")
            return 0
        found, opened = _examine(db_path, mark)
        print(f"watermark {mark_path}:")
        print(f"  promised: commit {mark.seq}, receipt log tree head of size {mark.log_size}")
        if mark.floor:
            print(f"  tree heads are signed only above size {mark.floor} (after {len(mark.losses)} loss(es))")
        if not found:
            print(f"{db_path}: not behind its watermark: the node can start")
            return 0
        print(f"{db_path}: behind what the node promised:")
        for line in found:
            print(f"  - {line}")
        if not args.accept_loss:
            print(
                "The node refuses to start on it. If a backup of the data dir (node.sqlite and "
                "node.sqlite-wal together) holds the lost state, stop here and restore it. Otherwise run "
                "`e31 node recover --accept-loss` to keep the evidence, accept the loss and start on the "
                "database as it is (the node will sign tree heads only above size "
                f"{max(mark.floor, mark.log_size)})."
            )
            return watermark.StoreBehind.exit_code
        kept = _keep_evidence(data_dir, db_path, mark_path, move=not opened)
        new = _accept(db_path, mark, kept.relative_to(data_dir).as_posix())
        watermark.write(mark_path, new)
        print(f"kept the database as found and the old watermark in {kept}")
        print(
            f"accepted: the node starts at commit {new.seq} with a receipt log of {new.log_size} signed "
            f"entries; it signs tree heads only above size {new.floor}"
        )
        return 0


def _examine(db_path: Path, mark: Mark) -> tuple[list[str], bool]:
    """What is missing from the database against `mark`, read from a copy; and whether it opens."""
    from ..store import watermark
    from ..store.db import Store

    try:
        size = db_path.stat().st_size
    except FileNotFoundError:
        size = -1
    with tempfile.TemporaryDirectory(prefix="e31-recover-") as tmp:
        copy = Path(tmp) / db_path.name
        if size > 0:
            for suffix in ("", *SIDE_FILES):
                source = db_path.with_name(db_path.name + suffix)
                if source.exists():
                    shutil.copyfile(source, copy.with_name(copy.name + suffix))
        try:
            with Store(copy, check_watermark=False) as store:
                state = store.state(mark)
        except StoreError as e:
            return [f"it cannot be opened: {e}"], False
    found = watermark.behind(mark, state)
    if size <= 0:
        found.insert(0, "the database file is missing" if size < 0 else "the database file is empty")
    return found, True


def _keep_evidence(data_dir: Path, db_path: Path, mark_path: Path, *, move: bool) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    kept = data_dir / "lost" / stamp
    n = 1
    while kept.exists():
        n += 1
        kept = data_dir / "lost" / f"{stamp}-{n}"
    try:
        kept.mkdir(mode=0o700, parents=True)
        shutil.copy2(mark_path, kept / mark_path.name)
        for suffix in ("", *SIDE_FILES, "-shm"):
            source = db_path.with_name(db_path.name + suffix)
            if not source.exists():
                continue
            if move:
                source.replace(kept / source.name)
            elif suffix != "-shm":
                shutil.copy2(source, kept / source.name)
    except OSError as e:
        raise CliError(
            f"{kept}: cannot keep the evidence, nothing was accepted: {e.strerror or e}", 74
        ) from None
    return kept


def _accept(db_path: Path, mark: Mark, kept: str) -> Mark:
    from ..store import watermark
    from ..store.db import Store

    with Store(db_path, check_watermark=False) as store:
        state = store.state(mark)
        head = store.newest_head()
    return watermark.accepted(mark, state, head, time.time(), kept)
