"""Receipt bundles: one msgpack file holding every signed envelope an auditor needs, and the blobs to re-run.

Format (docs/protocol.md section 13): the array ["e31-bundle", 1, envelopes, blobs, consistency] where
envelopes are bins holding signed envelopes byte for byte, blobs are [root, size, data] keyed by the
BlobRef root the manifests name, and consistency entries are [executor, old_size, new_size, proof].
The reader checks shape, types, caps and every blob's root, and raises BundleError for anything else;
it does not verify envelopes (the auditor does, and reports each bad one).

The exporter reads the node's store: the envelopes of each job (offers, assignments, receipts,
acknowledgements, proofs), plus fresh inclusion proofs and consistency proofs from the node's
own receipt log when it has one: an inclusion proof for each of its receipts, every tree head it ever
signed, and consistency proofs between them. Blobs come from the node's blob store, which names them
by the same blob root the manifests use.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import secrets
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from e31.protocol.blobs import BlobRef, chunk_list
from e31.protocol.codec import MAX_FRAME, pack, unpack
from e31.protocol.envelope import verify
from e31.protocol.errors import ProtocolError
from e31.protocol.ids import DIGEST_SIZE, KEY_SIZE, NodeId
from e31.protocol.messages import InclusionProof, Offer, TreeHead, UsageReceipt

from ..errors import UsageError
from ..store.blobs import BlobCorrupt, BlobNotFound

if TYPE_CHECKING:
    from ..store.blobs import BlobStore
    from ..store.db import Store
    from ..store.receiptlog import ReceiptLog

MAGIC = "e31-bundle"
VERSION = 1
MAX_BUNDLE_BYTES = 2 << 30
MAX_ITEMS = 1_000_000
MAX_PROOF = 64
EXPORT_KINDS = ("offer", "assign", "assigns", "receipt", "ack", "proof", "treehead")


class BundleError(UsageError):
    """A bundle that cannot be read or written; the message says why, in one line."""


@dataclass(frozen=True, slots=True)
class Consistency:
    """A consistency proof between two sizes of one executor's log (checked against its signed heads)."""

    executor: bytes
    old_size: int
    new_size: int
    proof: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class Bundle:
    envelopes: tuple[bytes, ...] = ()
    blobs: dict[bytes, bytes] = field(default_factory=dict)
    """Blob root (32 bytes) -> the blob's bytes."""
    consistency: tuple[Consistency, ...] = ()


# --- encoding -------------------------------------------------------------------------------------------


def encode_bundle(bundle: Bundle) -> bytes:
    blobs = [(root, len(data), data) for root, data in sorted(bundle.blobs.items())]
    cons = [(c.executor, c.old_size, c.new_size, list(c.proof)) for c in bundle.consistency]
    data = pack([MAGIC, VERSION, list(bundle.envelopes), blobs, cons])
    if len(data) > MAX_BUNDLE_BYTES:
        raise BundleError(
            f"the bundle would be {len(data)} bytes, more than the {MAX_BUNDLE_BYTES} a reader "
            "accepts; export fewer jobs, or without blobs"
        )
    return data


def decode_bundle(data: bytes) -> Bundle:
    """Parse and check a bundle; BundleError for anything that is not a well-formed one."""
    if len(data) > MAX_BUNDLE_BYTES:
        raise BundleError(f"{len(data)} bytes is larger than a bundle may be ({MAX_BUNDLE_BYTES})")
    if not data:
        raise BundleError("the file is empty")
    try:
        doc = unpack(data, max_len=MAX_BUNDLE_BYTES)
    except ProtocolError as e:
        raise BundleError(f"not a bundle: {e}") from None
    if type(doc) is not tuple or len(doc) < 2 or doc[0] != MAGIC:
        raise BundleError(f"not a bundle (it does not start with {MAGIC!r})")
    if type(doc[1]) is not int or doc[1] != VERSION:
        raise BundleError(f"unsupported bundle version {doc[1]!r} (this e31 reads version {VERSION})")
    if len(doc) != 5:
        raise BundleError(f"a version {VERSION} bundle is an array of 5 items, got {len(doc)}")
    envelopes = _items(doc[2], "envelopes")
    for i, env in enumerate(envelopes):
        if type(env) is not bytes or not env:
            raise BundleError(f"envelopes[{i}] is not a non-empty bin")
        if len(env) > MAX_FRAME:
            raise BundleError(
                f"envelopes[{i}] is {len(env)} bytes, larger than an envelope may be ({MAX_FRAME})"
            )
    if len(set(envelopes)) != len(envelopes):
        raise BundleError("the same envelope appears twice")
    blobs: dict[bytes, bytes] = {}
    for i, item in enumerate(_items(doc[3], "blobs")):
        root, size, blob = _shape(item, f"blobs[{i}]", (bytes, int, bytes))
        if len(root) != DIGEST_SIZE:
            raise BundleError(f"blobs[{i}]: the root is not {DIGEST_SIZE} bytes")
        if root in blobs:
            raise BundleError(f"blobs[{i}]: blob {root.hex()} appears twice")
        if size != len(blob):
            raise BundleError(f"blobs[{i}]: blob {root.hex()} says {size} bytes but holds {len(blob)}")
        if chunk_list(blob).root.raw != root:
            raise BundleError(f"blobs[{i}]: the data does not hash to its root {root.hex()}")
        blobs[root] = blob
    cons: list[Consistency] = []
    for i, item in enumerate(_items(doc[4], "consistency")):
        executor, old, new, proof = _shape(item, f"consistency[{i}]", (bytes, int, int, tuple))
        if len(executor) != KEY_SIZE:
            raise BundleError(f"consistency[{i}]: the executor is not a {KEY_SIZE}-byte key")
        if not 0 <= old <= new < 1 << 64:
            raise BundleError(f"consistency[{i}]: sizes {old} -> {new} are not 0 <= old <= new < 2^64")
        if len(proof) > MAX_PROOF or any(type(h) is not bytes or len(h) != DIGEST_SIZE for h in proof):
            raise BundleError(f"consistency[{i}]: the proof is not at most {MAX_PROOF} 32-byte hashes")
        cons.append(Consistency(executor, old, new, proof))
    return Bundle(tuple(envelopes), blobs, tuple(cons))


def _items(value: object, what: str) -> tuple[Any, ...]:
    if type(value) is not tuple:
        raise BundleError(f"{what} is not an array")
    if len(value) > MAX_ITEMS:
        raise BundleError(f"{what} has {len(value)} items, more than {MAX_ITEMS}")
    return value


def _shape(item: object, what: str, types: tuple[type, ...]) -> tuple[Any, ...]:
    if type(item) is not tuple or len(item) != len(types):
        raise BundleError(f"{what} is not an array of {len(types)} items")
    for i, (v, t) in enumerate(zip(item, types, strict=True)):
        if type(v) is not t:
            raise BundleError(f"{what}[{i}] is not {'an integer' if t is int else t.__name__}")
        if isinstance(v, int) and v < 0:
            raise BundleError(f"{what}[{i}] is negative")
    return item


def read_bundle(path: Path | str) -> Bundle:
    """Read and parse a bundle file (refusing one too large before reading it)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_BUNDLE_BYTES:
                raise BundleError(f"{path}: {size} bytes is larger than a bundle may be ({MAX_BUNDLE_BYTES})")
            data = f.read(MAX_BUNDLE_BYTES + 1)
    except IsADirectoryError:
        raise BundleError(f"{path}: is a directory") from None
    except OSError as e:
        raise BundleError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        return decode_bundle(data)
    except BundleError as e:
        raise BundleError(f"{path}: {e}") from None


def write_bundle(path: Path | str, data: bytes) -> None:
    """Write atomically: a temporary file in the same directory, fsync, rename, fsync the directory."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(4)}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as e:
        raise BundleError(f"cannot write {path}: {e.strerror or e}") from None


# --- export ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Export:
    """An exported bundle and what went into it."""

    data: bytes
    jobs: int
    envelopes: int
    blobs: int
    missing_blobs: tuple[str, ...]
    """Roots (hex) of blobs needed to re-run that this node does not hold (corrupt ones included)."""
    corrupt_blobs: tuple[str, ...] = ()
    """Those of them that were here but failed their hash check (now in the blob store's quarantine)."""


def _read_blob(blobs: BlobStore, ref: BlobRef) -> bytes | str | None:
    """The blob named by `ref` (the store names blobs by their blob root, and checks it on reading); None
    if it is not here, or why it cannot be exported (it failed its check, or cannot be read)."""
    try:
        data = blobs.read(ref.root.raw)
    except BlobNotFound:
        return None
    except BlobCorrupt as e:
        return str(e)
    except OSError as e:
        return f"blob {ref.root.hex()} cannot be read: {e.strerror or e}"
    return data if len(data) == ref.size else f"blob {ref.root.hex()} has {len(data)} bytes, not {ref.size}"


def all_job_ids(store: Store) -> list[bytes]:
    """Every job the store holds, or holds an offer or a receipt of (after the job itself was pruned)."""
    ids = {row.job_id for row in store.jobs()}
    ids.update(store.envelope_job_ids(("offer", "receipt")))
    return sorted(ids)


def export_bundle(
    store: Store,
    blobs: BlobStore | None,
    job_ids: Sequence[bytes] | None,
    with_blobs: bool,
    *,
    receipt_log: ReceiptLog | None = None,
    now_ms: int | None = None,
) -> Export:
    """Collect the jobs' envelopes (None: every job the store knows) into a bundle.

    With `receipt_log` (this node's own), each of its receipts gets a fresh inclusion proof and the
    bundle carries consistency proofs between the log's heads it holds. With `with_blobs`, the module,
    input and stdin blobs of every exported job's manifest that the node holds are included. An offer
    of a set of jobs is carried once, whole (its signature covers every manifest), but the blobs of
    the jobs it holds that are not exported are not: an export never depends on unrelated jobs' data.
    """
    now = int(time.time() * 1000) if now_ms is None else now_ms
    ids = all_job_ids(store) if job_ids is None else list(dict.fromkeys(job_ids))
    envelopes: dict[bytes, None] = {}
    for job_id in ids:
        for row in store.envelopes_for_job(job_id):
            if row.kind in EXPORT_KINDS:
                envelopes[bytes(row.raw)] = None
        for receipt in store.receipts_for_job(job_id):
            for kept in (store.envelope(receipt.message_id), store.ack_for(receipt.digest)):
                if kept is not None:
                    envelopes[bytes(kept.raw)] = None
    verified = _verified(envelopes)
    if receipt_log is not None:
        for raw in _own_proofs(verified, receipt_log, now):
            envelopes[raw] = None
        for raw in receipt_log.heads():
            envelopes[raw] = None
        verified = _verified(envelopes)
    consistency = _consistency(verified, receipt_log) if receipt_log is not None else ()
    found: dict[bytes, bytes] = {}
    missing: list[str] = []
    corrupt: list[str] = []
    if with_blobs:
        for ref in _needed_blobs(verified, set(ids)):
            data = _read_blob(blobs, ref) if blobs is not None else None
            if isinstance(data, bytes):
                found[ref.root.raw] = data
                continue
            missing.append(ref.root.hex())
            if data is not None:
                corrupt.append(ref.root.hex())
    bundle = Bundle(tuple(envelopes), found, consistency)
    return Export(encode_bundle(bundle), len(ids), len(envelopes), len(found), tuple(missing), tuple(corrupt))


def _verified(envelopes: Iterable[bytes]) -> list[Any]:
    out = []
    for raw in envelopes:
        with contextlib.suppress(ProtocolError):
            out.append(verify(raw))
    return out


def _own_proofs(verified: list[Any], log: ReceiptLog, now: int) -> list[bytes]:
    """Fresh proofs placing this node's own receipts of the bundle in its log, against its latest head."""
    mine = [
        env.message_id.raw
        for env in verified
        if isinstance(env.message, UsageReceipt) and str(env.signer) == log.node
    ]
    return log.inclusions(mine, now)


def _consistency(verified: list[Any], log: ReceiptLog) -> tuple[Consistency, ...]:
    """Consistency proofs between consecutive sizes of this node's heads that the bundle carries (all
    it ever signed), so a proof against any earlier head of this log can be tied to the latest one."""
    sizes: set[int] = set()
    for env in verified:
        head = None
        if isinstance(env.message, TreeHead):
            head = env.message
        elif isinstance(env.message, InclusionProof):
            with contextlib.suppress(ProtocolError):
                head = verify(env.message.treehead, TreeHead).message
        if head is not None and str(head.executor) == log.node and head.size <= log.size:
            sizes.add(head.size)
    ordered = sorted(sizes)
    executor = NodeId.parse(log.node).raw
    return tuple(Consistency(executor, a, b, log.consistency(a, b)) for a, b in itertools.pairwise(ordered))


def _needed_blobs(verified: list[Any], job_ids: set[bytes]) -> list[BlobRef]:
    """The blobs that re-running the exported jobs (`job_ids`) needs, from their offers' manifests."""
    refs: dict[bytes, BlobRef] = {}
    for env in verified:
        if isinstance(env.message, Offer):
            for man in env.message.manifests:
                if man.job_id.raw not in job_ids:
                    continue
                for ref in (man.module, *(f.blob for f in man.inputs), man.stdin):
                    if ref is not None:
                        refs.setdefault(ref.root.raw, ref)
    return list(refs.values())
