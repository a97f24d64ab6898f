"""A job's inputs on the executor: the blobs it needs (module, inputs, stdin), and the check that the
files a run read were not changed under it."""

from __future__ import annotations

from e31.protocol.blobs import BlobRef
from e31.protocol.jobs import JobManifest

from ..store.blobs import BlobStore
from .outputs import JobFailed


def inputs_unchanged(blobs: BlobStore, manifest: JobManifest) -> None:
    """Raise JobFailed if an input or stdin file the sandbox read was written to, replaced or removed
    since it was checked before the run: the receipt would name bytes the run may not have seen."""
    for ref in blob_refs(manifest)[1:]:  # (the module is read whole before the run: module_bytes.py)
        if not blobs.unchanged(ref.root.raw):
            raise JobFailed(f"input blob {ref.root.hex()} changed on disk during the run: no receipt for it")


def blob_refs(manifest: JobManifest) -> list[BlobRef]:
    """The blobs a job needs to run: its module, inputs and stdin."""
    refs = [manifest.module, *(f.blob for f in manifest.inputs)]
    if manifest.stdin is not None:
        refs.append(manifest.stdin)
    return refs
