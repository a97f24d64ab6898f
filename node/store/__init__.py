"""Durable state, and the only wing with SQL: the SQLite database (schema and migrations, one module
per table family composed into Store, the trio wrapper AsyncStore with its group commit), blob files
named by their content, the receipt log and its Merkle tree, batches, and garbage collection.

Its public names are imported lazily from their modules (node/__init__.py, `lazy_exports`).
"""

from typing import TYPE_CHECKING

from .. import lazy_exports

if TYPE_CHECKING:
    from .async_store import AsyncStore
    from .blobs import BlobCorrupt, BlobError, BlobNotFound, BlobStore
    from .db import Store, call
    from .gc import collect, run_gc
    from .receiptlog import ReceiptLog, ReceiptLogError
    from .rows import JobRow, PeerRow, ReceiptRow

__all__ = [
    "AsyncStore",
    "BlobCorrupt",
    "BlobError",
    "BlobNotFound",
    "BlobStore",
    "JobRow",
    "PeerRow",
    "ReceiptLog",
    "ReceiptLogError",
    "ReceiptRow",
    "Store",
    "call",
    "collect",
    "run_gc",
]
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "AsyncStore": "async_store",
        "BlobCorrupt": "blobs",
        "BlobError": "blobs",
        "BlobNotFound": "blobs",
        "BlobStore": "blobs",
        "JobRow": "rows",
        "PeerRow": "rows",
        "ReceiptLog": "receiptlog",
        "ReceiptLogError": "receiptlog",
        "ReceiptRow": "rows",
        "Store": "db",
        "call": "db",
        "collect": "gc",
        "run_gc": "gc",
    },
)
