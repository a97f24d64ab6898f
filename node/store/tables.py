"""What the methods of one table family (kv.py, peer_rows.py, jobs.py, ...) use of the store.

`Store` (store/db.py) is composed of one class per table family, each holding that family's queries;
they run them through the two contexts declared here, which Store provides. Keeping the families as
classes of Store, not as functions, keeps `Store.method` the way to name a call for AsyncStore.run
and Store.many (which decide by the method's name and identity how to run it).
"""

from __future__ import annotations

import sqlite3
from contextlib import AbstractContextManager


class Tables:
    """The base of every table family's class: the store's reading and transaction contexts."""

    def reading(self) -> AbstractContextManager[sqlite3.Connection]:
        """The connection for a read of one or more queries, under the lock (Store.reading)."""
        raise NotImplementedError

    def transaction(self, *, durable: bool = True) -> AbstractContextManager[sqlite3.Connection]:
        """One write transaction, joined by one opened inside it (Store.transaction)."""
        raise NotImplementedError
