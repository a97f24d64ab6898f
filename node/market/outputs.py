"""A finished run's outputs made blobs: stdout, stderr and the files under /output, each checked
against the hashes the run reported.

The run's stdout and stderr come whole in its result, or, when longer than 1 MiB, in files under the
run's directory (runner `streams_dir`, `whole_stream`); they are stored as blobs, checked against the
run's hashes, and named in the receipt. Outputs of 1..PUSH_MAX bytes are not files of the blob store:
they are kept in the database with the job's end and carried in its result.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from e31.protocol.blobs import PUSH_MAX, BlobRef, blob_ref
from e31.protocol.ids import Digest
from e31.protocol.jobs import FileRef
from e31.sandbox.limits import RunResult, whole_stream

from ..errors import NodeError
from ..store.blobs import BlobStore


class JobFailed(NodeError):
    """This node cannot run an assigned job (its data could not be fetched, or the sandbox refused it)."""


@dataclass(frozen=True, slots=True)
class StoredOutputs:
    """A run's stdout, stderr and output files, checked; the larger ones stored as blobs, and the small
    ones (1..PUSH_MAX bytes) in `small`: kept in the database with the job's end (no file, no fsync of
    their own) and carried to the submitter in the result."""

    stdout: BlobRef
    stderr: BlobRef
    outputs: tuple[FileRef, ...]
    small: tuple[tuple[BlobRef, bytes], ...]


def store_outputs(blobs: BlobStore, work: Path, result: RunResult) -> StoredOutputs:
    """Check a run's stdout, stderr and output files against the hashes the run reported and store the
    larger ones as blobs (in the thread that waited for the run); the small ones are returned."""
    streams = work / "streams"
    small: list[tuple[BlobRef, bytes]] = []
    stdout = put_checked(blobs, streams, "stdout", result, small)
    stderr = put_checked(blobs, streams, "stderr", result, small)
    outputs = []
    for name, sha in sorted(result.output_files.items()):
        data = (work / "output" / name).read_bytes()
        if hashlib.sha256(data).hexdigest() != sha:
            raise JobFailed(f"output file {name!r} changed after the run")
        ref = _small(small, data) or BlobRef(Digest(bytes.fromhex(blobs.put(data))), len(data))
        outputs.append(FileRef(name, ref))
    return StoredOutputs(stdout, stderr, tuple(outputs), tuple(small))


def _small(small: list[tuple[BlobRef, bytes]], data: bytes) -> BlobRef | None:
    """The BlobRef of an output of 1..PUSH_MAX bytes, added to `small` (kept in the database, carried
    in the result: protocol/results.make_result takes the first MAX_PUSHED); None for another size."""
    if not 0 < len(data) <= PUSH_MAX:
        return None
    ref = blob_ref(data)
    small.append((ref, data))
    return ref


def put_checked(
    blobs: BlobStore, streams: Path, name: str, result: RunResult, small: list[tuple[BlobRef, bytes]]
) -> BlobRef:
    """Store the run's stream `name` as a blob, from the result when it holds it whole, else from its
    file under `streams`, if it is exactly the size and hash the run reported (a small one goes to
    `small` instead)."""
    _, total, sha = result.stream(name)
    where = whole_stream(result, streams, name)
    if isinstance(where, bytes):
        if hashlib.sha256(where).hexdigest() != sha:
            raise JobFailed(f"the run's {name} does not match the hash it reported")
        return _small(small, where) or BlobRef(Digest(bytes.fromhex(blobs.put(where))), total)
    path = where
    digest = hashlib.sha256()
    size = 0

    def chunks() -> Iterator[bytes]:
        nonlocal size
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                digest.update(chunk)
                size += len(chunk)
                yield chunk

    try:
        root, _ = blobs.put_stream(chunks())
    except FileNotFoundError:
        raise JobFailed(f"the sandbox left no {path.name} stream") from None
    if size != total or digest.hexdigest() != sha:
        raise JobFailed(
            f"the {path.name} stream holds {size} bytes that do not match the {total} bytes the run reported"
        )
    return BlobRef(Digest(bytes.fromhex(root)), total)
