"""The modules of recent runs, kept in memory for the runs that follow.

A sweep's jobs share one module. Without this the executor would read its blob from disk for every run
(checked against its name on the first read, then trusted while the file is unchanged) and the run's
job spec would hash the new bytes object again (sandbox/job.py `module_digest` remembers the last
object it hashed, by identity): about 26 MB read and hashed per job for the Python interpreter. Kept
here, a module is read once and the bytes read are checked against its blob root in memory
(`BlobStore.read_checked`), and every run of it hands the sandbox the same bytes object, hashed once.
A run of them needs no file at all; a blob damaged on disk afterwards is caught by the file's next
reader, and these bytes stay the ones that matched. Threads that ask for a module being read wait for
that read rather than reading it too.

Bounded by bytes (least recently run forgotten first); a module larger than the whole budget is read
for each run, as before. The memory stays taken while the node runs (64 MiB at most). Thread-safe:
the pool's threads make the specs.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from ..store.blobs import BlobStore

MODULE_BYTES = 64 << 20
"""The bytes of modules kept (two Python interpreters, or thousands of small C modules)."""


class ModuleBytes:
    def __init__(self, blobs: BlobStore, budget: int = MODULE_BYTES) -> None:
        self.blobs = blobs
        self.budget = budget
        self.reads = 0
        """Modules read from the blob store (the misses)."""
        self._kept: OrderedDict[bytes, bytes] = OrderedDict()
        self._size = 0
        self._reading: dict[bytes, threading.Event] = {}
        self._lock = threading.Lock()

    def read(self, root: bytes) -> bytes:
        """The module whose blob root is `root`, checked against it (BlobStore.read_checked's errors:
        the blob missing, or corrupt and quarantined)."""
        while True:
            with self._lock:
                kept = self._kept.get(root)
                if kept is not None:
                    self._kept.move_to_end(root)
                    return kept
                reading = self._reading.get(root)
                if reading is None:
                    reading = self._reading[root] = threading.Event()
                    break
            reading.wait()  # another thread reads it: then kept, or (too large, failed) read here in turn
        try:
            data = self.blobs.read_checked(root)
            with self._lock:
                self.reads += 1
                if len(data) <= self.budget:
                    self._kept[root] = data
                    self._size += len(data)
                    while self._size > self.budget:
                        _, old = self._kept.popitem(last=False)
                        self._size -= len(old)
            return data
        finally:
            with self._lock:
                del self._reading[root]
            reading.set()

    @property
    def size(self) -> int:
        """Bytes kept now."""
        return self._size
