"""The compiled-module cache: precompiled wasmtime artifacts on disk, trusted only with our own tag.

wasmtime's `Module.deserialize` runs native code from the artifact and does not check its integrity
(a flipped byte was accepted), so an artifact is only ever one this node produced (`Module.serialize`),
stored with an HMAC-SHA256 tag under a key only the node holds, and the tag is checked before the
bytes reach wasmtime. A missing, corrupt, tampered or incompatible entry is discarded and the module
recompiled; nothing in the cache directory is trusted without the tag.

Layout of the cache directory:
    key                          32 random bytes, mode 0600 (unless a key is passed in)
    <module sha256>-<profile digest>.cwasm
                                 the artifact, then MAGIC, then the 32-byte tag; the tag covers
                                 the module hash, the profile digest and the artifact, so an entry
                                 cannot be replayed under another name.
The artifact comes first so that wasmtime can map the entry itself (`Module.deserialize_file`, which
ignores the trailer): the entry is opened once, its tag checked by streaming the artifact through the
HMAC, and that same open file (/proc/self/fd/N: the inode just checked, not the name again) is what
wasmtime maps. A 30 MB entry (the CPython interpreter) then loads in the time of one read and one
HMAC, with no copy into Python and none into wasmtime. Writers never change an entry in place (they
write a new file and rename it over), so the mapped bytes are the bytes checked; a process that could
write into the directory could as well read the key. Where /proc is missing the checked bytes are
read into memory and deserialized from there.
Entries are written to a temporary name, fsynced and renamed, so readers see whole entries only; several
processes (the pool's workers) can share one directory. The directory is bounded by `max_bytes`: after a
store, the least recently used entries (by mtime, which a hit refreshes) are removed. A small in-memory
map in front of the disk keeps the modules this process used last, so a hot module costs a dict lookup.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import io
import logging
import os
import secrets
import stat
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import wasmtime

from .errors import SandboxError
from .profile import PROFILE
from .vfs import make_private_dirs

log = logging.getLogger(__name__)

MAGIC = b"e31-cwasm/2\n"
KEY_BYTES = 32
TAG_BYTES = 32
SUFFIX = ".cwasm"
DEFAULT_MAX_BYTES = 512 * 1024 * 1024
DEFAULT_MEMORY_ENTRIES = 32
READ_CHUNK = 1 << 20
TRAILER = len(MAGIC) + TAG_BYTES

Compiler = Callable[[wasmtime.Engine, bytes], wasmtime.Module]


class CacheError(SandboxError):
    """The cache directory or its key cannot be used (permissions, a key of the wrong size)."""


@dataclass
class CacheStats:
    memory_hits: int = 0
    disk_hits: int = 0
    misses: int = 0
    discarded: int = 0
    """Entries found corrupt, tampered or incompatible, deleted and recompiled."""
    evicted: int = 0


def _default_compiler(engine: wasmtime.Engine, module_bytes: bytes) -> wasmtime.Module:
    from .runner import compile_module

    return compile_module(engine, module_bytes)


def load_or_create_key(path: Path) -> bytes:
    """Reads the node's cache key, creating it (mode 0600, atomically) on first use."""
    try:
        return _read_key(path)
    except FileNotFoundError:
        pass
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(KEY_BYTES))
            f.flush()
            os.fsync(f.fileno())
        # link() fails if another process created the key first: then theirs is the key.
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(path.parent)
    return _read_key(path)


def _read_key(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise CacheError(f"cache key {path} is not a regular file")
        if st.st_mode & 0o077:
            raise CacheError(
                f"cache key {path} is readable by others (mode {st.st_mode & 0o777:o}); expected 0600"
            )
        key = f.read(KEY_BYTES + 1)
    if len(key) != KEY_BYTES:
        raise CacheError(f"cache key {path} must hold exactly {KEY_BYTES} bytes")
    return key


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ModuleCache:
    """Compiles modules, or loads this node's own precompiled artifacts, for one engine profile.

    Not thread-safe: one per worker process (the pool runs one job per worker at a time).
    """

    def __init__(
        self,
        directory: Path,
        *,
        key: bytes | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
        memory_entries: int = DEFAULT_MEMORY_ENTRIES,
        profile_digest: bytes = PROFILE.digest,
        compiler: Compiler = _default_compiler,
    ) -> None:
        if max_bytes < 0 or memory_entries < 0:
            raise ValueError("max_bytes and memory_entries must not be negative")
        self.directory = Path(directory)
        try:
            make_private_dirs(self.directory)
        except OSError as e:
            raise CacheError(f"cannot create cache directory {self.directory}: {e.strerror}") from e
        if key is None:
            try:
                key = load_or_create_key(self.directory / "key")
            except OSError as e:
                raise CacheError(
                    f"cannot read or create the cache key in {self.directory}: {e.strerror}"
                ) from e
        elif len(key) < 16:
            raise CacheError("a cache key must be at least 16 bytes")
        self._key = key
        self.max_bytes = max_bytes
        self.memory_entries = memory_entries
        self.profile_digest = profile_digest
        self._compile = compiler
        self._memory: OrderedDict[bytes, wasmtime.Module] = OrderedDict()
        self.stats = CacheStats()

    def path_for(self, module_sha256: bytes) -> Path:
        return self.directory / f"{module_sha256.hex()}-{self.profile_digest.hex()}{SUFFIX}"

    def get(
        self, engine: wasmtime.Engine, module_bytes: bytes, digest: bytes | None = None
    ) -> wasmtime.Module:
        """The compiled module, from memory, from a verified disk entry, or freshly compiled (and
        stored). Raises what the compiler raises for an invalid module (`InvalidModule`). `digest` is
        the module's SHA-256 when the caller has just computed it from these bytes (a JobSpec does):
        hashing a 26 MB module again costs 25 ms."""
        if digest is None:
            digest = hashlib.sha256(module_bytes).digest()
        module = self._memory.get(digest)
        if module is not None:
            self._memory.move_to_end(digest)
            self.stats.memory_hits += 1
            return module
        path = self.path_for(digest)
        module = self._load(engine, digest, path)
        if module is not None:
            self.stats.disk_hits += 1
        else:
            self.stats.misses += 1
            module = self._compile(engine, module_bytes)
            self._store(digest, path, module.serialize())
        self._remember(digest, module)
        return module

    def _remember(self, digest: bytes, module: wasmtime.Module) -> None:
        if self.memory_entries == 0:
            return
        self._memory[digest] = module
        while len(self._memory) > self.memory_entries:
            self._memory.popitem(last=False)

    def _mac(self, digest: bytes) -> hmac.HMAC:
        mac = hmac.new(self._key, digestmod=hashlib.sha256)
        mac.update(MAGIC)
        mac.update(digest)
        mac.update(self.profile_digest)
        return mac

    def _tag(self, digest: bytes, artifact: bytes | bytearray) -> bytes:
        mac = self._mac(digest)
        mac.update(artifact)
        return mac.digest()

    def _load(self, engine: wasmtime.Engine, digest: bytes, path: Path) -> wasmtime.Module | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        except OSError as e:
            self._discard(path, f"cannot open: {e.strerror}")
            return None
        with os.fdopen(fd, "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            mac = self._mac(digest)
            if size <= TRAILER or not _stream(f, size - TRAILER, mac):
                self._discard(path, "truncated or not a cache entry")
                return None
            trailer = f.read(TRAILER + 1)
            if len(trailer) != TRAILER or not trailer.startswith(MAGIC):
                self._discard(path, "truncated or not a cache entry")
                return None
            if not hmac.compare_digest(trailer[len(MAGIC) :], mac.digest()):
                self._discard(path, "integrity tag does not match")
                return None
            try:
                module = _deserialize(engine, f.fileno(), size - TRAILER)
            except Exception as e:  # wasmtime raises its own WasmtimeError, or ValueError
                self._discard(path, f"rejected by this engine: {e}")
                return None
        with contextlib.suppress(OSError):
            os.utime(path)
        return module

    def _discard(self, path: Path, why: str) -> None:
        log.warning("discarding compiled-module cache entry %s: %s", path.name, why)
        self.stats.discarded += 1
        with contextlib.suppress(OSError):
            path.unlink()

    def _store(self, digest: bytes, path: Path, artifact: bytes | bytearray) -> None:
        entry_size = len(artifact) + TRAILER
        if entry_size > self.max_bytes:
            return
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(artifact)
                f.write(MAGIC)
                f.write(self._tag(digest, artifact))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            _fsync_dir(self.directory)
        except OSError as e:
            # A full disk or a read-only cache costs a recompile next time, never the job.
            log.warning("cannot store compiled module %s: %s", path.name, e.strerror)
            with contextlib.suppress(OSError):
                tmp.unlink()
            return
        self._evict(keep=path)

    def entries(self) -> list[tuple[Path, int, float]]:
        """(path, size, last use) of every entry, least recently used first."""
        found = []
        with os.scandir(self.directory) as it:
            for e in it:
                if not e.name.endswith(SUFFIX) or e.name.startswith("."):
                    continue
                try:
                    st = e.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                found.append((Path(e.path), st.st_size, st.st_mtime))
        found.sort(key=lambda t: (t[2], t[0].name))
        return found

    def size_bytes(self) -> int:
        return sum(size for _, size, _ in self.entries())

    def _evict(self, keep: Path) -> None:
        entries = self.entries()
        total = sum(size for _, size, _ in entries)
        for path, size, _ in entries:
            if total <= self.max_bytes:
                break
            if path == keep:
                continue
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                self.stats.evicted += 1
            total -= size

    def clear_memory(self) -> None:
        """Forgets the in-memory modules (the disk entries stay)."""
        self._memory.clear()


def _stream(f: io.FileIO, length: int, mac: hmac.HMAC) -> bool:
    """Feeds the first `length` bytes of `f` to `mac`; False if the file ends before them."""
    buf = bytearray(min(READ_CHUNK, length))
    view = memoryview(buf)
    while length:
        n = f.readinto(view[: min(len(buf), length)])
        if not n:
            return False
        mac.update(view[:n])
        length -= n
    return True


def _deserialize(engine: wasmtime.Engine, fd: int, length: int) -> wasmtime.Module:
    """The module of the checked artifact (the first `length` bytes of the open file `fd`)."""
    by_fd = f"/proc/self/fd/{fd}"
    if os.path.exists(by_fd):
        return wasmtime.Module.deserialize_file(engine, by_fd)
    return wasmtime.Module.deserialize(engine, os.pread(fd, length, 0))
