"""Content-addressed blob store: files named by their blob root under DATA/blobs/.

A blob's name is the protocol's blob root (e31.protocol.blobs, docs/protocol.md section 7): SHA-256 over
the blob's size and the SHA-256 of each of its CHUNK_SIZE chunks, so a peer that knows only the root can
fetch the chunk list and check every chunk as it arrives.

Layout:
    blobs/ab/cdef...            a blob whose root is "abcdef..." (sharded by the first two hex digits)
    blobs/ab/.tmp-*             a write in progress (same directory, so the final rename is atomic)
    blobs/tmp/.tmp-*            a write whose hash is not known in advance (renamed across, same disk)
    blobs/partial/<hash>/       a chunked download in progress: one file per verified chunk, "<index>"
    blobs/quarantine/<hash>.*   blobs that failed verification; kept for inspection, never served

A write goes to a temp file, is fsynced, checked against its expected hash, renamed into place, and the
directory is fsynced: after a crash a blob is either whole under its name or absent. Chunked downloads
keep each verified chunk as its own fsynced file, so they resume after a restart with only the missing
chunks; the blob is assembled once every chunk is there and kept only if the whole hash matches.

Nothing is used, served or exported unchecked. A blob's bytes are hashed on its first use after the
store opens (and whenever its file changes), then trusted while the file keeps the identity it had
when they were last seen to match: device, inode, size, mtime and ctime (`checked_path`), so a sweep of
a thousand jobs over one input hashes it once, and a byte changed on disk by anything but a silent
media fault is caught at the next use. A blob that fails is moved to quarantine and reported as
BlobCorrupt; putting the same bytes again (the user's file, a peer's chunks) replaces it. A reader that
holds a path across a long use (a sandbox run) asks `unchanged` afterwards, before it signs anything.

Blobs are split into CHUNK_SIZE chunks for transfer; a chunk's hash is SHA-256 of its bytes, and a blob
of n bytes has ceil(n / CHUNK_SIZE) chunks (none when empty). The methods are synchronous and
thread-safe; the node calls them through trio.to_thread.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import shutil
import stat
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from e31.protocol.blobs import BlobHasher

from ..errors import PeerError, StoreError
from .connection import DiskFull, is_disk_full

CHUNK_SIZE = 256 * 1024
HASH_HEX_LEN = 64
_TMP_PREFIX = ".tmp-"
_COPY = 1 << 20


class BlobError(StoreError):
    """Base of the blob store's errors."""


class BlobNotFound(BlobError):
    """No blob with that hash is stored."""


class HashMismatch(PeerError, BlobError):
    """Bytes offered for a hash (whole blob or chunk) do not have that hash; nothing was kept."""


class BlobCorrupt(BlobError):
    """A stored blob no longer matches its hash; it has been moved to quarantine."""


class BlobStoreFull(BlobError):
    """Keeping the blob would take the store over its disk ceiling."""


class BlobDiskFull(BlobStoreFull, DiskFull):
    """The disk holding the blob store is full (ENOSPC, EDQUOT): nothing was kept; writes work again
    once there is space."""


class _room:
    """Turn a full disk's OSError inside the block into BlobDiskFull naming `what`."""

    __slots__ = ("what",)

    def __init__(self, what: object) -> None:
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, e: BaseException | None, tb: object) -> None:
        if e is not None and is_disk_full(e):
            raise BlobDiskFull(f"{self.what}: the disk is full ({e}); free space on it") from None


def chunk_count(size: int) -> int:
    return -(-size // CHUNK_SIZE)


def chunk_length(size: int, index: int) -> int:
    """The length of chunk `index` of a blob of `size` bytes."""
    if not 0 <= index < chunk_count(size):
        raise ValueError(f"chunk {index} out of range for a blob of {size} bytes")
    return min(CHUNK_SIZE, size - index * CHUNK_SIZE)


def hash_hex(digest: str | bytes) -> str:
    """A hash as 64 lower-case hex digits, from that text or from 32 raw bytes."""
    if isinstance(digest, bytes):
        if len(digest) != 32:
            raise ValueError(f"a SHA-256 hash is 32 bytes, got {len(digest)}")
        return digest.hex()
    if not isinstance(digest, str) or len(digest) != HASH_HEX_LEN or digest.strip("0123456789abcdef") != "":
        raise ValueError(f"not a SHA-256 hash (64 lower-case hex digits): {digest!r:.80}")
    return digest


class _BlobName:
    """Computes a blob's name from its bytes: the protocol's blob root (chunk-list root).

    Every place that names or checks a blob goes through here.
    """

    def __init__(self) -> None:
        self._h = BlobHasher()

    def update(self, data: bytes | bytearray | memoryview) -> None:
        self._h.update(data)

    def hexdigest(self) -> str:
        return self._h.finish().root.hex()


_Stamp = tuple[int, int, int, int, int]


_NO_FILE = frozenset({errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP})
"""The errors of a stat that mean no file there (the ones Path.is_file takes for False)."""


def _stamp(st: os.stat_result) -> _Stamp:
    """A file's identity: any write, truncation or replacement changes it (ctime moves on every one)."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class BlobStore:
    def __init__(self, root: Path | str, *, ceiling: int | None = None) -> None:
        self.root = Path(root)
        self._root = str(self.root)
        self.ceiling = ceiling
        self._lock = threading.Lock()
        self._total: int | None = None
        self._checked: dict[str, _Stamp] = {}
        """Blobs whose bytes matched their name, with the identity their file had then."""
        try:
            for sub in ("", "partial", "quarantine"):
                (self.root / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as e:
            raise BlobError(f"cannot create the blob store at {self.root}: {e.strerror or e}") from None

    # --- naming ---

    def path(self, digest: str | bytes) -> Path:
        return Path(self._file(hash_hex(digest)))

    def _file(self, h: str) -> str:
        """`path` as a str, for the calls made per job (`has`, `put` of a blob held already): a Path
        is parsed again at every join, which costs more than the stat it is built for."""
        return os.path.join(self._root, h[:2], h[2:])

    def _held(self, h: str) -> os.stat_result | None:
        """The stat of the blob's file, a regular file; None when there is none. As Path.is_file, other
        errors (a directory this user may not read, an I/O error) are raised, not taken for a missing
        blob."""
        try:
            st = os.stat(self._file(h))
        except OSError as e:
            if e.errno in _NO_FILE:
                return None
            raise
        return st if stat.S_ISREG(st.st_mode) else None

    def has(self, digest: str | bytes) -> bool:
        return self._held(hash_hex(digest)) is not None

    def size(self, digest: str | bytes) -> int:
        try:
            return self.path(digest).stat().st_size
        except FileNotFoundError:
            raise BlobNotFound(f"no blob {hash_hex(digest)}") from None

    def hashes(self) -> Iterator[str]:
        """Every stored blob's hash (in no particular order)."""
        for shard in self.root.iterdir():
            if len(shard.name) != 2 or not shard.is_dir():
                continue
            for f in shard.iterdir():
                if not f.name.startswith(_TMP_PREFIX) and len(f.name) == HASH_HEX_LEN - 2:
                    yield shard.name + f.name

    def total_size(self) -> int:
        """Bytes held by stored blobs (not counting partial downloads)."""
        with self._lock:
            if self._total is None:
                self._total = sum(self.path(h).stat().st_size for h in self.hashes())
            return self._total

    def partial_size(self) -> int:
        return sum(f.stat().st_size for f in (self.root / "partial").glob("*/*") if f.is_file())

    # --- writing ---

    def put(self, data: bytes) -> str:
        name = _BlobName()
        name.update(data)
        digest = name.hexdigest()
        st = self._held(digest)
        if st is not None:
            if self._checked.get(digest) == _stamp(st):  # held, and whole when its file last changed
                return digest
            try:
                self.checked_path(digest)
                return digest
            except BlobError:  # corrupt (now quarantined) or gone meanwhile: these bytes replace it
                pass
        digest, _ = self.put_stream([data], expected=digest)
        return digest

    def put_stream(self, chunks: Iterable[bytes], expected: str | bytes | None = None) -> tuple[str, int]:
        """Store the concatenated chunks; returns (hash, size). With `expected`, a mismatch keeps nothing."""
        want = None if expected is None else hash_hex(expected)
        shard_guess = self.root / (want[:2] if want else "tmp")
        tmp = shard_guess / f"{_TMP_PREFIX}{secrets.token_hex(8)}"
        h = _BlobName()
        size = 0
        try:
            with _room(f"storing a blob in {self.root}"):
                shard_guess.mkdir(mode=0o700, exist_ok=True)
                with open(tmp, "xb") as f:
                    for chunk in chunks:
                        h.update(chunk)
                        size += len(chunk)
                        self._check_room(size)
                        f.write(chunk)
                    f.flush()
                    os.fsync(f.fileno())
                digest = h.hexdigest()
                if want is not None and digest != want:
                    raise HashMismatch(f"expected {want}, the bytes hash to {digest}")
                self._install(tmp, digest, size)
        finally:
            tmp.unlink(missing_ok=True)
        return digest, size

    def _check_room(self, extra: int) -> None:
        if self.ceiling is not None and self.total_size() + extra > self.ceiling:
            raise BlobStoreFull(
                f"storing {extra} more bytes would exceed the disk ceiling of {self.ceiling} bytes "
                f"({self.total_size()} in use)"
            )

    def _install(self, tmp: Path, digest: str, size: int) -> None:
        """Rename a verified, fsynced temp file into place (a blob already there is kept as is)."""
        final = self.path(digest)
        final.parent.mkdir(mode=0o700, exist_ok=True)
        with self._lock:
            if final.exists():
                return
            os.replace(tmp, final)
            self._checked[digest] = _stamp(os.stat(final))
            if self._total is not None:
                self._total += size
        _fsync_dir(final.parent)

    # --- reading ---

    def open(self, digest: str | bytes, *, verify: bool = True) -> BinaryIO:
        """Open a blob for reading; with `verify` (the default) its bytes are known to match its name
        (checked now, unless they were since the file last changed: `checked_path`).

        A blob that fails the check is quarantined and BlobCorrupt raised: a corrupt blob is never served.
        """
        h = hash_hex(digest)
        try:
            f = open(self.path(h), "rb")  # noqa: SIM115 -- returned to the caller
        except FileNotFoundError:
            raise BlobNotFound(f"no blob {h}") from None
        if verify:
            try:
                stamp = _stamp(os.fstat(f.fileno()))
                if self._checked.get(h) != stamp:
                    self._check_file(f, h)
                    self._checked[h] = stamp
                    f.seek(0)
            except BaseException:
                f.close()
                raise
        return f

    def checked_path(self, digest: str | bytes) -> Path:
        """The path of a blob whose bytes match its name, for a reader that opens the file itself (the
        sandbox's inputs). Hashes it unless it was checked since its file last changed; a corrupt blob
        is quarantined (BlobCorrupt). The stamp is taken before the hash, so a write during the hash
        makes the next call hash again."""
        with self.open(digest):
            return self.path(digest)

    def unchanged(self, digest: str | bytes) -> bool:
        """Whether a blob's file is still the one `checked_path` last found whole (not written, replaced
        or removed since): asked after a long use of the path, before anything is signed over it."""
        h = hash_hex(digest)
        try:
            return self._checked.get(h) == _stamp(os.stat(self.path(h)))
        except FileNotFoundError:
            return False

    def read(self, digest: str | bytes) -> bytes:
        """A whole (verified) blob's bytes."""
        with self.open(digest) as f:
            return f.read()

    def read_checked(self, digest: str | bytes) -> bytes:
        """A whole blob's bytes, hashed in memory after one read of the file, so the bytes returned are the
        very bytes checked (`read` checks the file, then reads it again): for a caller that keeps them.
        Raises BlobNotFound, or BlobCorrupt (the blob quarantined)."""
        h = hash_hex(digest)
        with self.open(h, verify=False) as f:
            stamp = _stamp(os.fstat(f.fileno()))
            data = f.read()
        name = _BlobName()
        name.update(data)
        self._judge(h, name.hexdigest())
        self._checked[h] = stamp
        return data

    def read_chunk(self, digest: str | bytes, index: int) -> bytes:
        """Chunk `index` of a stored (checked) blob, for serving to a peer, who checks the chunk's hash
        too: a corrupt blob is quarantined here, not blamed on the peer there."""
        with self.open(digest) as f:
            length = chunk_length(os.fstat(f.fileno()).st_size, index)
            f.seek(index * CHUNK_SIZE)
            return f.read(length)

    def chunk_hashes(self, digest: str | bytes) -> list[bytes]:
        """The SHA-256 of each chunk of a stored blob, after checking the whole hash."""
        out: list[bytes] = []
        whole = _BlobName()
        h = hash_hex(digest)
        with self.open(h, verify=False) as f:
            stamp = _stamp(os.fstat(f.fileno()))
            while chunk := f.read(CHUNK_SIZE):
                whole.update(chunk)
                out.append(hashlib.sha256(chunk).digest())
        self._judge(h, whole.hexdigest())
        self._checked[h] = stamp
        return out

    def verify(self, digest: str | bytes) -> None:
        """Rehash a stored blob now, whatever its stamp; quarantine it and raise BlobCorrupt if it does
        not match."""
        h = hash_hex(digest)
        self._checked.pop(h, None)
        with self.open(h, verify=True):
            pass

    def _check_file(self, f: BinaryIO, want: str) -> None:
        h = _BlobName()
        while block := f.read(_COPY):
            h.update(block)
        self._judge(want, h.hexdigest())

    def _judge(self, want: str, got: str) -> None:
        if got != want:
            where = self.quarantine(want)
            raise BlobCorrupt(f"blob {want} is corrupt (its bytes hash to {got}); moved to {where}")

    def quarantine(self, digest: str | bytes) -> Path:
        h = hash_hex(digest)
        self._checked.pop(h, None)
        src = self.path(h)
        dest = self.root / "quarantine" / f"{h}.{int(time.time())}.{secrets.token_hex(4)}"
        with self._lock:
            try:
                size = src.stat().st_size
                os.replace(src, dest)
            except FileNotFoundError:
                raise BlobNotFound(f"no blob {h}") from None
            if self._total is not None:
                self._total -= size
        return dest

    def delete(self, digest: str | bytes) -> bool:
        """Remove a blob; returns False if it was not there."""
        self._checked.pop(hash_hex(digest), None)
        p = self.path(digest)
        with self._lock:
            try:
                size = p.stat().st_size
                p.unlink()
            except FileNotFoundError:
                return False
            if self._total is not None:
                self._total -= size
        return True

    def sweep(self) -> int:
        """Remove temp files left by a crash; call at start-up, before any writer runs. Returns a count."""
        removed = 0
        for tmp in self.root.glob(f"*/{_TMP_PREFIX}*"):
            tmp.unlink(missing_ok=True)
            removed += 1
        for tmp in self.root.glob(f"partial/*/{_TMP_PREFIX}*"):
            tmp.unlink(missing_ok=True)
            removed += 1
        return removed

    # --- chunked downloads ---

    def partial(self, digest: str | bytes, size: int) -> PartialBlob:
        """Start or resume the chunked download of a blob of `size` bytes."""
        h = hash_hex(digest)
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise ValueError(f"a blob size is a non-negative integer, got {size!r}")
        self._check_room(size)
        return PartialBlob(self, h, size)

    def partials(self) -> list[str]:
        """Hashes of the downloads in progress."""
        return sorted(p.name for p in (self.root / "partial").iterdir() if p.is_dir())


class PartialBlob:
    """A download in progress: verified chunks arrive in any order, then `finalise` keeps the blob."""

    def __init__(self, store: BlobStore, digest: str, size: int) -> None:
        self.store = store
        self.hash = digest
        self.size = size
        self.dir = store.root / "partial" / digest
        with _room(f"downloading blob {digest}"):
            self.dir.mkdir(mode=0o700, exist_ok=True)
        size_file = self.dir / "size"
        try:
            known: int | None = int(size_file.read_text())
        except FileNotFoundError:
            known = None
        except (OSError, ValueError):  # unreadable bookkeeping: start this download afresh
            self.abort()
            self.dir.mkdir(mode=0o700)
            known = None
        if known is None:
            with _room(f"downloading blob {digest}"):
                _write_atomic(size_file, str(size).encode())
        elif known != size:
            raise ValueError(f"download of {digest} was started with size {known}, not {size}")

    @property
    def chunk_count(self) -> int:
        return chunk_count(self.size)

    def have(self, index: int) -> bool:
        return (self.dir / str(index)).is_file()

    def missing(self) -> list[int]:
        return [i for i in range(self.chunk_count) if not self.have(i)]

    @property
    def complete(self) -> bool:
        return not self.missing()

    def write_chunk(self, index: int, data: bytes, expected: bytes) -> None:
        """Keep chunk `index` if it has the expected length and SHA-256; HashMismatch otherwise."""
        want = chunk_length(self.size, index)
        if len(data) != want:
            raise HashMismatch(f"chunk {index} of {self.hash} should be {want} bytes, got {len(data)}")
        if hashlib.sha256(data).digest() != bytes(expected):
            raise HashMismatch(f"chunk {index} of {self.hash} does not match its expected hash")
        with _room(f"downloading blob {self.hash}"):
            _write_atomic(self.dir / str(index), data)

    def finalise(self) -> str:
        """Assemble the chunks into the blob once all are present; a whole-hash mismatch discards them."""
        missing = self.missing()
        if missing:
            raise BlobError(f"download of {self.hash} is missing {len(missing)} of {self.chunk_count} chunks")

        def pieces() -> Iterator[bytes]:
            for i in range(self.chunk_count):
                yield (self.dir / str(i)).read_bytes()

        try:
            self.store.put_stream(pieces(), expected=self.hash)
        except HashMismatch:
            self.abort()
            raise
        self.abort()
        return self.hash

    def abort(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f"{_TMP_PREFIX}{path.name}.{secrets.token_hex(4)}")
    try:
        with open(tmp, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    _fsync_dir(path.parent)
