"""Our WASI preview 1: every `wasi_snapshot_preview1` function, implemented over the virtual tree.

wasmtime's own WASI is never linked (no `define_wasi`): the linker holds only the functions below,
so no host file, socket, clock or entropy source is reachable from a guest. A module importing a
preview-1 function with the right signature gets ours; anything else it imports makes it
`invalid_module` before it runs (runner.compile_module checks the import list against `SIGNATURES`).

Answers follow wasmtime's own preview-1 implementation, errno for errno (tests/sandbox/
test_wasi_conformance.py runs the same probes under both), except where docs/security.md ("WASI:
where we differ from the standard, and why") says otherwise and why.

Deterministic by construction:
- Clocks are virtual. REALTIME and MONOTONIC read one counter that starts at 0 and advances 1 µs per
  `clock_time_get` call and by the timeout of every clock wait in `poll_oneoff` (waits return at
  once). REALTIME adds a fixed epoch (2024-01-01T00:00:00Z); MONOTONIC is the counter itself. The
  CPU-time clocks do not exist (EBADF), as in wasmtime.
- `random_get` is SHA-256 in counter mode keyed by the job seed: block i is
  SHA-256("e31/random/1" || seed || u64le(i)); the stream is consumed in order across calls.
- fds: 0 stdin (a stream over the job's stdin file, or empty), 1 stdout, 2 stderr, 3 the /input
  preopen (read-only), 4 the /output preopen (with a writable root: 3 is "/", the only preopen);
  new fds take the lowest free number above the preopens.
- argv[0] is "job.wasm"; the environment is exactly the job's.

Host functions run with the guest's memory as a ctypes view (hostcall.py links them into wasmtime and
keeps the view current); every pointer and length coming from the guest is bounds-checked (EFAULT)
before it is touched.
"""

from __future__ import annotations

import ctypes
import hashlib
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, BinaryIO

import wasmtime

from .vfs import (
    FIXED_TIME_NS,
    E,
    Errno,
    FileType,
    HostFiles,
    InputFile,
    Node,
    OutputBudget,
    OutputFile,
    Tree,
)
from .vfs import Dir as VDir

MODULE = "wasi_snapshot_preview1"
ARGV0 = "job.wasm"
REALTIME_EPOCH_NS = 1_704_067_200 * 10**9
CLOCK_STEP_NS = 1_000
MAX_FDS = 1024
MAX_IOVS = 1024
READ_CHUNK = 1 << 20
DISPLAY_CAP = 1 << 20
"""Bytes of stdout and of stderr kept in memory (RunResult.stdout and .stderr): the whole stream when it
is no longer than that, else its start, for display (all of it is hashed)."""

_U32 = 0xFFFFFFFF
_U64 = 0xFFFFFFFFFFFFFFFF

# Rights bits (preview 1).
R_FD_DATASYNC, R_FD_READ, R_FD_SEEK, R_FD_FDSTAT_SET_FLAGS = 1 << 0, 1 << 1, 1 << 2, 1 << 3
R_FD_SYNC, R_FD_TELL, R_FD_WRITE, R_FD_ADVISE, R_FD_ALLOCATE = 1 << 4, 1 << 5, 1 << 6, 1 << 7, 1 << 8
R_PATH_CREATE_DIRECTORY, R_PATH_CREATE_FILE, R_PATH_LINK_SOURCE = 1 << 9, 1 << 10, 1 << 11
R_PATH_LINK_TARGET, R_PATH_OPEN, R_FD_READDIR, R_PATH_READLINK = 1 << 12, 1 << 13, 1 << 14, 1 << 15
R_PATH_RENAME_SOURCE, R_PATH_RENAME_TARGET, R_PATH_FILESTAT_GET = 1 << 16, 1 << 17, 1 << 18
R_PATH_FILESTAT_SET_SIZE, R_PATH_FILESTAT_SET_TIMES = 1 << 19, 1 << 20
R_FD_FILESTAT_GET, R_FD_FILESTAT_SET_SIZE, R_FD_FILESTAT_SET_TIMES = 1 << 21, 1 << 22, 1 << 23
R_PATH_SYMLINK, R_PATH_REMOVE_DIRECTORY, R_PATH_UNLINK_FILE = 1 << 24, 1 << 25, 1 << 26
R_POLL_FD_READWRITE, R_SOCK_SHUTDOWN, R_SOCK_ACCEPT = 1 << 27, 1 << 28, 1 << 29
RIGHTS_ALL = (1 << 30) - 1

# The rights fd_fdstat_get reports, as wasmtime's preview-1 implementation reports them: a file has
# every right but FD_WRITE when it is not open for writing (FD_READ and FD_READDIR likewise); a preopen
# the fixed set "expected by many userlands"; any other directory every right but those of seeking,
# writing and sizing.
RIGHTS_PREOPEN = (
    R_PATH_CREATE_DIRECTORY
    | R_PATH_CREATE_FILE
    | R_PATH_LINK_SOURCE
    | R_PATH_LINK_TARGET
    | R_PATH_OPEN
    | R_FD_READDIR
    | R_PATH_READLINK
    | R_PATH_RENAME_SOURCE
    | R_PATH_RENAME_TARGET
    | R_PATH_FILESTAT_GET
    | R_PATH_FILESTAT_SET_TIMES
    | R_FD_FILESTAT_GET
    | R_FD_FILESTAT_SET_TIMES
    | R_PATH_SYMLINK
    | R_PATH_REMOVE_DIRECTORY
    | R_PATH_UNLINK_FILE
)
RIGHTS_FILE_BASE = (
    R_FD_DATASYNC
    | R_FD_READ
    | R_FD_SEEK
    | R_FD_FDSTAT_SET_FLAGS
    | R_FD_SYNC
    | R_FD_TELL
    | R_FD_WRITE
    | R_FD_ADVISE
    | R_FD_ALLOCATE
    | R_FD_FILESTAT_GET
    | R_FD_FILESTAT_SET_SIZE
    | R_FD_FILESTAT_SET_TIMES
    | R_POLL_FD_READWRITE
)
RIGHTS_PREOPEN_INHERITING = RIGHTS_PREOPEN | RIGHTS_FILE_BASE
RIGHTS_DIR = RIGHTS_ALL & ~(R_FD_SEEK | R_FD_WRITE | R_PATH_FILESTAT_SET_SIZE | R_FD_FILESTAT_SET_SIZE)
RIGHTS_STDIO = R_FD_READ | R_FD_WRITE | R_FD_FDSTAT_SET_FLAGS | R_FD_FILESTAT_GET | R_POLL_FD_READWRITE
"""stdio: a character device without seek or tell, i.e. a terminal to libc's isatty() (not wasmtime's
answer for captured streams: see docs/security.md)."""


def file_rights(readable: bool, writable: bool) -> int:
    return RIGHTS_ALL & ~(0 if readable else R_FD_READ | R_FD_READDIR) & ~(0 if writable else R_FD_WRITE)


O_CREAT, O_DIRECTORY, O_EXCL, O_TRUNC = 1, 2, 4, 8
FDFLAG_APPEND, FDFLAG_DSYNC, FDFLAG_NONBLOCK, FDFLAG_RSYNC, FDFLAG_SYNC = 1, 2, 4, 8, 16
FDFLAGS_SYNCS = FDFLAG_DSYNC | FDFLAG_RSYNC | FDFLAG_SYNC
FST_ATIM, FST_ATIM_NOW, FST_MTIM, FST_MTIM_NOW = 1, 2, 4, 8
WHENCE_SET, WHENCE_CUR, WHENCE_END = 0, 1, 2
EVENT_CLOCK, EVENT_FD_READ, EVENT_FD_WRITE = 0, 1, 2
SUBCLOCK_ABSTIME = 1
FD_READWRITE_HANGUP = 1


class GuestExit(Exception):
    """proc_exit: unwinds the guest through wasmtime back to the runner."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class Fault(Exception):
    """A guest pointer outside its memory (or any pointer when it exports no memory)."""


class Memory:
    """Bounds-checked access to the guest's linear memory: `size` bytes from address `base` (both 0 when
    the guest exports no memory), valid for the host call it is given to (hostcall.py keeps them current)."""

    __slots__ = ("base", "size")

    def __init__(self, base: int, size: int) -> None:
        self.base = base
        self.size = size

    def _check(self, ptr: int, n: int) -> int:
        ptr &= _U32
        if n < 0 or ptr + n > self.size:
            raise Fault
        return self.base + ptr

    def read(self, ptr: int, n: int) -> bytes:
        return ctypes.string_at(self._check(ptr, n), n) if n else b""

    def write(self, ptr: int, data: bytes) -> None:
        if data:
            ctypes.memmove(self._check(ptr, len(data)), data, len(data))

    def put(self, ptr: int, fmt: struct.Struct, *values: int) -> None:
        self.write(ptr, fmt.pack(*values))

    def get(self, ptr: int, fmt: struct.Struct) -> tuple[int, ...]:
        return fmt.unpack(self.read(ptr, fmt.size))

    def iovecs(self, ptr: int, count: int) -> list[tuple[int, int]]:
        count &= _U32
        if count > MAX_IOVS:
            raise Errno(E.INVAL)
        raw = self.read(ptr, 8 * count)
        return [(b, n) for b, n in struct.iter_unpack("<II", raw)]


U8, U16, U32, U64 = (struct.Struct(f) for f in ("<B", "<H", "<I", "<Q"))
FDSTAT = struct.Struct("<BxHxxxxQQ")
FILESTAT = struct.Struct("<QQBxxxxxxxQQQQQ")
PRESTAT = struct.Struct("<BxxxI")
DIRENT = struct.Struct("<QQIBxxx")
SUBSCRIPTION = struct.Struct("<QB7xIxxxxQQH6x")
EVENT = struct.Struct("<QHBxxxxxQH6x")


@dataclass
class Open:
    """One guest file descriptor. `rights` and `inheriting` are what fd_fdstat_get reports; they only
    shrink (fd_fdstat_set_rights), and a call needing a right the guest dropped is ENOTCAPABLE."""

    node: Node | None  # None for stdio streams
    kind: str  # "file", "dir", "stdin", "stdout", "stderr"
    readable: bool = False
    writable: bool = False
    append: bool = False
    pos: int = 0
    preopen: str | None = None
    rights: int = 0
    inheriting: int = 0
    dropped: int = 0
    """Rights dropped from `inheriting` here or above: never granted to what is opened from this fd."""
    nonblock: bool = False

    def need(self, right: int) -> None:
        if not self.rights & right:
            raise Errno(E.NOTCAPABLE)


def _stdio(node: Node | None, kind: str) -> Open:
    return Open(node, kind, readable=kind == "stdin", writable=kind != "stdin", rights=RIGHTS_STDIO)


def _preopen(node: VDir, name: str) -> Open:
    return Open(node, "dir", preopen=name, rights=RIGHTS_PREOPEN, inheriting=RIGHTS_PREOPEN_INHERITING)


class SinkFailed(Exception):
    """A stream's host file could not be opened or written: a host-side failure, not the guest's.
    It stops the guest; the runner then raises SandboxError with `Stream.error`."""


class Stream:
    """stdout or stderr: everything hashed, and held in memory while it fits in `keep` bytes (its first
    `keep` bytes stay there afterwards, for display). With `spill`, a function that opens a host file,
    a stream that outgrows `keep` goes on to that file: first what was held, then every later byte as
    it is written, so the file holds the whole stream. A stream of at most `keep` bytes never touches
    the disk: creating a file costs 0.2-1 ms of kernel time on the ext4 of the machines measured, more
    than a tiny job's whole run (docs/benchmarks.md)."""

    def __init__(self, keep: int, spill: Callable[[], BinaryIO] | None = None) -> None:
        self.sha = hashlib.sha256()
        self.kept = bytearray()
        self.keep = keep
        self.total = 0
        self.spill = spill
        self.sink: BinaryIO | None = None
        self.error: OSError | None = None

    def write(self, data: bytes) -> None:
        if self.sink is None and self.spill is not None and self.total + len(data) > self.keep:
            self._to_sink(self.kept[: self.total], self.spill)
        if self.sink is not None:
            self._to_sink(data, None)
        self.sha.update(data)
        self.total += len(data)
        room = self.keep - len(self.kept)
        if room > 0:
            self.kept += data[:room]

    def _to_sink(self, data: bytes | bytearray, opener: Callable[[], BinaryIO] | None) -> None:
        try:
            if opener is not None:
                self.sink = opener()
            assert self.sink is not None
            self.sink.write(data)
        except OSError as e:
            self.error = e
            self.spill = None
            raise SinkFailed(str(e)) from e


class Context:
    """All per-run state the WASI functions see."""

    def __init__(
        self,
        args: tuple[str, ...],
        env: tuple[tuple[str, str], ...],
        seed: bytes,
        tree: Tree,
        budget: OutputBudget,
        stdin: InputFile | None,
        spills: tuple[Callable[[], BinaryIO], Callable[[], BinaryIO]] | None = None,
    ) -> None:
        self.argv = [a.encode() + b"\0" for a in (ARGV0, *args)]
        self.environ = [f"{k}={v}".encode() + b"\0" for k, v in env]
        self.seed = seed
        self.tree = tree
        self.budget = budget
        self.host = HostFiles()
        self.stdout = Stream(DISPLAY_CAP, None if spills is None else spills[0])
        self.stderr = Stream(DISPLAY_CAP, None if spills is None else spills[1])
        self.clock_ns = 0
        self.rng_counter = 0
        self.rng_buf = b""
        self.stdin = stdin
        if stdin is not None:
            self.host.acquire(stdin)
        self.fds: dict[int, Open] = {
            0: _stdio(stdin, "stdin"),
            1: _stdio(None, "stdout"),
            2: _stdio(None, "stderr"),
        }
        for name, root in tree.preopens():
            self.fds[len(self.fds)] = _preopen(root, name)
        self.first_new_fd = len(self.fds)

    def close(self) -> None:
        self.host.close_all()

    def fd(self, fd: int, right: int = 0) -> Open:
        """The open fd, with `right` unless the guest dropped it (EBADF, ENOTCAPABLE)."""
        o = self.fds.get(fd & _U32)
        if o is None:
            raise Errno(E.BADF)
        if right:
            o.need(right)
        return o

    def dir_fd(self, fd: int, right: int, on_file: E = E.BADF) -> VDir:
        """The directory a path starts from. Not a directory: EBADF, or `on_file` for a file (as
        wasmtime answers: ENOTDIR from path_open, EBADF from every other path_* call)."""
        o = self.fd(fd)
        if not isinstance(o.node, VDir):
            raise Errno(on_file if o.kind == "file" else E.BADF)
        o.need(right)
        return o.node

    def add_fd(self, o: Open) -> int:
        if len(self.fds) >= MAX_FDS:
            raise Errno(E.MFILE)
        n = self.first_new_fd
        while n in self.fds:
            n += 1
        if isinstance(o.node, InputFile):
            self.host.acquire(o.node)
        self.fds[n] = o
        return n

    def release(self, o: Open) -> None:
        if isinstance(o.node, InputFile) and o.kind == "file":
            self.host.release(o.node)

    def random(self, n: int) -> bytes:
        out = bytearray(self.rng_buf[:n])
        self.rng_buf = self.rng_buf[n:]
        while len(out) < n:
            counter = self.rng_counter.to_bytes(8, "little")
            block = hashlib.sha256(b"e31/random/1" + self.seed + counter).digest()
            self.rng_counter += 1
            take = n - len(out)
            out += block[:take]
            self.rng_buf = block[take:]
        return bytes(out)


Handler = Callable[..., Any]
_I32, _I64 = "i", "I"


# name -> (param kinds, has result, implementation). Filled by @wasi below.
FUNCTIONS: dict[str, tuple[str, bool, Handler]] = {}


def wasi(params: str, result: bool = True) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        FUNCTIONS[fn.__name__] = (params, result, fn)
        return fn

    return register


def _valtypes(kinds: str) -> list[wasmtime.ValType]:
    return [wasmtime.ValType.i64() if k == _I64 else wasmtime.ValType.i32() for k in kinds]


def func_type(name: str) -> wasmtime.FuncType:
    params, result, _ = FUNCTIONS[name]
    return wasmtime.FuncType(_valtypes(params), [wasmtime.ValType.i32()] if result else [])


# -- args, environment, clocks, random, scheduling -----------------------------------------------


def _put_strings(m: Memory, ptrs: int, buf: int, items: list[bytes]) -> None:
    offset = 0
    for i, item in enumerate(items):
        m.put(ptrs + 4 * i, U32, (buf + offset) & _U32)
        m.write(buf + offset, item)
        offset += len(item)


@wasi("ii")
def args_get(ctx: Context, m: Memory, argv: int, buf: int) -> int:
    _put_strings(m, argv, buf, ctx.argv)
    return 0


@wasi("ii")
def args_sizes_get(ctx: Context, m: Memory, count: int, size: int) -> int:
    m.put(count, U32, len(ctx.argv))
    m.put(size, U32, sum(map(len, ctx.argv)))
    return 0


@wasi("ii")
def environ_get(ctx: Context, m: Memory, env: int, buf: int) -> int:
    _put_strings(m, env, buf, ctx.environ)
    return 0


@wasi("ii")
def environ_sizes_get(ctx: Context, m: Memory, count: int, size: int) -> int:
    m.put(count, U32, len(ctx.environ))
    m.put(size, U32, sum(map(len, ctx.environ)))
    return 0


CLOCK_REALTIME, CLOCK_MONOTONIC = 0, 1


def _clock_id(clock: int) -> int:
    """REALTIME or MONOTONIC; the CPU-time clocks are EBADF (wasmtime has none), other ids EINVAL."""
    clock &= _U32
    if clock > 3:
        raise Errno(E.INVAL)
    if clock > CLOCK_MONOTONIC:
        raise Errno(E.BADF)
    return clock


@wasi("ii")
def clock_res_get(ctx: Context, m: Memory, clock: int, out: int) -> int:
    _clock_id(clock)
    m.put(out, U64, CLOCK_STEP_NS)
    return 0


@wasi("iIi")
def clock_time_get(ctx: Context, m: Memory, clock: int, precision: int, out: int) -> int:
    base = REALTIME_EPOCH_NS if _clock_id(clock) == 0 else 0
    m.put(out, U64, (base + ctx.clock_ns) & _U64)
    ctx.clock_ns += CLOCK_STEP_NS
    return 0


@wasi("ii")
def random_get(ctx: Context, m: Memory, buf: int, n: int) -> int:
    n &= _U32
    m._check(buf, n)
    for off in range(0, n, READ_CHUNK):
        m.write(buf + off, ctx.random(min(READ_CHUNK, n - off)))
    return 0


@wasi("")
def sched_yield(ctx: Context, m: Memory) -> int:
    return 0


@wasi("i", result=False)
def proc_exit(ctx: Context, m: Memory, code: int) -> None:
    raise GuestExit(code & _U32)


@wasi("i")
def proc_raise(ctx: Context, m: Memory, sig: int) -> int:
    return E.NOTSUP


@wasi("iiii")
def poll_oneoff(ctx: Context, m: Memory, subs: int, events: int, n: int, nevents: int) -> int:
    """Clock waits finish at once and advance the virtual clock; fd waits are always ready (as in
    wasmtime: nbytes 1, and HANGUP for a file read at its end). A subscription to an fd that cannot be
    polled (closed, a directory, stdout for reading) fails the whole call with EBADF, a clock other
    than REALTIME and MONOTONIC with EINVAL, as wasmtime answers."""
    n &= _U32
    if n == 0:
        return E.INVAL
    if n > MAX_FDS:
        return E.NOTSUP
    parsed = [m.get(subs + SUBSCRIPTION.size * i, SUBSCRIPTION) for i in range(n)]
    ready: list[tuple[int, int, int]] = []  # userdata, type, flags
    waits: list[tuple[int, int]] = []  # delay, userdata
    for userdata, tag, fd, timeout, _, flags in parsed:
        if tag in (EVENT_FD_READ, EVENT_FD_WRITE):
            o = ctx.fd(fd)
            if o.kind not in (("file", "stdin") if tag == EVENT_FD_READ else ("file", "stdout", "stderr")):
                return E.BADF
            o.need(R_POLL_FD_READWRITE)
            at_end = tag == EVENT_FD_READ and o.pos >= (o.node.size if o.node is not None else 0)
            ready.append((userdata, tag, FD_READWRITE_HANGUP if at_end else 0))
        elif tag == EVENT_CLOCK:
            clock = fd  # the clock id sits where an fd subscription has its fd
            if clock & _U32 > CLOCK_MONOTONIC:
                return E.INVAL
            base = REALTIME_EPOCH_NS if clock == CLOCK_REALTIME else 0
            delta = timeout - (base + ctx.clock_ns) if flags & SUBCLOCK_ABSTIME else timeout
            waits.append((max(0, delta), userdata))
        else:
            return E.INVAL
    if not ready:
        first = min(w for w, _ in waits)
        ctx.clock_ns += first
        ready = [(u, EVENT_CLOCK, 0) for w, u in waits if w == first]
    for i, (userdata, kind, rwflags) in enumerate(ready):
        nbytes = 0 if kind == EVENT_CLOCK else 1
        m.put(events + EVENT.size * i, EVENT, userdata, 0, kind, nbytes, rwflags)
    m.put(nevents, U32, len(ready))
    return 0


# -- file descriptors ----------------------------------------------------------------------------


def _filestat(m: Memory, out: int, node: Node | None) -> None:
    t = FIXED_TIME_NS
    if node is None:
        m.put(out, FILESTAT, 0, 0, FileType.CHARACTER_DEVICE, 1, 0, t, t, t)
    else:
        m.put(out, FILESTAT, node.dev, node.ino, node.filetype, 1, node.size, node.atim, node.mtim, t)


def _now(ctx: Context) -> int:
    """ "Now" for a timestamp set with ATIM_NOW/MTIM_NOW: the virtual realtime clock (not advanced)."""
    return (REALTIME_EPOCH_NS + ctx.clock_ns) & _U64


def _check_fstflags(flags: int) -> None:
    """Unknown bits, or a time both given and "now": EINVAL (wasmtime traps on unknown bits)."""
    if flags & ~(FST_ATIM | FST_ATIM_NOW | FST_MTIM | FST_MTIM_NOW):
        raise Errno(E.INVAL)
    if (flags & FST_ATIM and flags & FST_ATIM_NOW) or (flags & FST_MTIM and flags & FST_MTIM_NOW):
        raise Errno(E.INVAL)


def _set_times(ctx: Context, node: Node, atim: int, mtim: int, flags: int) -> None:
    flags &= 0xFFFF
    _check_fstflags(flags)
    if isinstance(node, InputFile) or (isinstance(node, VDir) and not node.writable):
        raise Errno(E.PERM)
    if flags & FST_ATIM:
        node.atim = atim & _U64
    elif flags & FST_ATIM_NOW:
        node.atim = _now(ctx)
    if flags & FST_MTIM:
        node.mtim = mtim & _U64
    elif flags & FST_MTIM_NOW:
        node.mtim = _now(ctx)


@wasi("i")
def fd_close(ctx: Context, m: Memory, fd: int) -> int:
    o = ctx.fd(fd)
    ctx.release(o)
    del ctx.fds[fd & _U32]
    return 0


@wasi("ii")
def fd_fdstat_get(ctx: Context, m: Memory, fd: int, out: int) -> int:
    o = ctx.fd(fd)
    if o.kind == "dir":
        filetype = FileType.DIRECTORY
    elif o.kind == "file":
        filetype = FileType.REGULAR_FILE
    else:
        filetype = FileType.CHARACTER_DEVICE
    flags = (FDFLAG_APPEND if o.append else 0) | (FDFLAG_NONBLOCK if o.nonblock else 0)
    m.put(out, FDSTAT, filetype, flags, o.rights, o.inheriting)
    return 0


@wasi("ii")
def fd_fdstat_set_flags(ctx: Context, m: Memory, fd: int, flags: int) -> int:
    """APPEND and NONBLOCK on files; the SYNC flags are refused (EINVAL) as wasmtime refuses them."""
    o = ctx.fd(fd)
    if o.kind != "file":
        return E.BADF
    o.need(R_FD_FDSTAT_SET_FLAGS)
    flags &= 0xFFFF
    if flags & ~(FDFLAG_APPEND | FDFLAG_NONBLOCK) or flags & FDFLAGS_SYNCS:
        return E.INVAL
    o.append = bool(flags & FDFLAG_APPEND)
    o.nonblock = bool(flags & FDFLAG_NONBLOCK)
    return 0


@wasi("iII")
def fd_fdstat_set_rights(ctx: Context, m: Memory, fd: int, base: int, inheriting: int) -> int:
    """Rights only shrink: asking for one the fd does not hold is ENOTCAPABLE."""
    o = ctx.fd(fd)
    base &= _U64
    inheriting &= _U64
    if base & ~o.rights or inheriting & ~o.inheriting:
        return E.NOTCAPABLE
    o.dropped |= o.inheriting & ~inheriting
    o.rights, o.inheriting = base, inheriting
    return 0


@wasi("ii")
def fd_filestat_get(ctx: Context, m: Memory, fd: int, out: int) -> int:
    _filestat(m, out, ctx.fd(fd, R_FD_FILESTAT_GET).node)
    return 0


@wasi("iI")
def fd_filestat_set_size(ctx: Context, m: Memory, fd: int, size: int) -> int:
    o = ctx.fd(fd)
    if o.kind != "file":
        return E.BADF
    o.need(R_FD_FILESTAT_SET_SIZE)
    if not isinstance(o.node, OutputFile):
        return E.PERM
    if not o.writable or size < 0:
        return E.INVAL
    ctx.tree.resize(o.node, size)
    return 0


@wasi("iIIi")
def fd_filestat_set_times(ctx: Context, m: Memory, fd: int, atim: int, mtim: int, flags: int) -> int:
    o = ctx.fd(fd)
    if o.node is None:
        return E.BADF
    o.need(R_FD_FILESTAT_SET_TIMES)
    _set_times(ctx, o.node, atim, mtim, flags)
    return 0


@wasi("ii")
def fd_prestat_get(ctx: Context, m: Memory, fd: int, out: int) -> int:
    o = ctx.fd(fd)
    if o.preopen is None:
        return E.BADF
    m.put(out, PRESTAT, 0, len(o.preopen))
    return 0


@wasi("iii")
def fd_prestat_dir_name(ctx: Context, m: Memory, fd: int, buf: int, n: int) -> int:
    o = ctx.fd(fd)
    if o.preopen is None:
        return E.BADF
    name = o.preopen.encode()
    if (n & _U32) < len(name):
        return E.NAMETOOLONG
    m.write(buf, name)
    return 0


def _read_into(ctx: Context, m: Memory, o: Open, iovs: list[tuple[int, int]], offset: int) -> int:
    """Read from a file node at offset into the iovecs; returns the byte count."""
    node = o.node
    total = 0
    for buf, n in iovs:
        m._check(buf, n)
        while n > 0:
            want = min(n, READ_CHUNK)
            if isinstance(node, InputFile):
                data = ctx.host.pread(node, want, offset)
            elif isinstance(node, OutputFile):
                data = bytes(node.data[offset : offset + want])
            else:
                data = b""
            if not data:
                return total
            m.write(buf, data)
            buf, n, offset, total = buf + len(data), n - len(data), offset + len(data), total + len(data)
    return total


def _readable(ctx: Context, fd: int) -> Open:
    o = ctx.fd(fd)
    if o.kind == "dir" or not o.readable:
        raise Errno(E.BADF)
    o.need(R_FD_READ)
    return o


@wasi("iiii")
def fd_read(ctx: Context, m: Memory, fd: int, iovs: int, count: int, out: int) -> int:
    o = _readable(ctx, fd)
    n = _read_into(ctx, m, o, m.iovecs(iovs, count), o.pos)
    o.pos += n
    m.put(out, U32, n)
    return 0


@wasi("iiiIi")
def fd_pread(ctx: Context, m: Memory, fd: int, iovs: int, count: int, offset: int, out: int) -> int:
    o = _readable(ctx, fd)
    if o.kind != "file":
        return E.SPIPE
    o.need(R_FD_SEEK)
    m.put(out, U32, _read_into(ctx, m, o, m.iovecs(iovs, count), offset & _U64))
    return 0


def _gather(m: Memory, iovs: int, count: int) -> bytes:
    return b"".join(m.read(b, n) for b, n in m.iovecs(iovs, count))


def _write(ctx: Context, o: Open, data: bytes, offset: int | None) -> None:
    if o.kind in ("stdout", "stderr"):
        ctx.budget.charge(len(data))
        (ctx.stdout if o.kind == "stdout" else ctx.stderr).write(data)
        return
    if not isinstance(o.node, OutputFile):
        raise Errno(E.BADF)
    if offset is None:
        if o.append:
            o.pos = o.node.size
        ctx.tree.write_at(o.node, o.pos, data)
        o.pos += len(data)
    else:
        ctx.tree.write_at(o.node, offset, data)


def _writable(ctx: Context, fd: int) -> Open:
    o = ctx.fd(fd)
    if o.kind == "dir" or not o.writable:
        raise Errno(E.BADF)
    o.need(R_FD_WRITE)
    return o


@wasi("iiii")
def fd_write(ctx: Context, m: Memory, fd: int, iovs: int, count: int, out: int) -> int:
    o = _writable(ctx, fd)
    data = _gather(m, iovs, count)
    m._check(out, 4)
    _write(ctx, o, data, None)
    m.put(out, U32, len(data))
    return 0


@wasi("iiiIi")
def fd_pwrite(ctx: Context, m: Memory, fd: int, iovs: int, count: int, offset: int, out: int) -> int:
    o = _writable(ctx, fd)
    if o.kind != "file":
        return E.SPIPE
    o.need(R_FD_SEEK)
    data = _gather(m, iovs, count)
    m._check(out, 4)
    _write(ctx, o, data, offset & _U64)
    m.put(out, U32, len(data))
    return 0


@wasi("iIii")
def fd_seek(ctx: Context, m: Memory, fd: int, delta: int, whence: int, out: int) -> int:
    o = ctx.fd(fd)
    if o.kind == "dir":
        return E.BADF
    if o.kind != "file" or o.node is None:
        return E.SPIPE
    o.need(R_FD_TELL if delta == 0 and whence & _U32 == WHENCE_CUR else R_FD_SEEK)
    base = {WHENCE_SET: 0, WHENCE_CUR: o.pos, WHENCE_END: o.node.size}.get(whence & _U32)
    if base is None:
        return E.INVAL
    pos = base + delta
    if not 0 <= pos <= _U64 >> 1:
        return E.INVAL
    m.put(out, U64, pos)
    o.pos = pos
    return 0


@wasi("ii")
def fd_tell(ctx: Context, m: Memory, fd: int, out: int) -> int:
    o = ctx.fd(fd)
    if o.kind != "file":
        return E.SPIPE if o.kind != "dir" else E.BADF
    o.need(R_FD_TELL)
    m.put(out, U64, o.pos)
    return 0


def _file_fd(ctx: Context, fd: int, right: int) -> Open:
    o = ctx.fd(fd)
    if o.kind != "file":
        raise Errno(E.BADF)
    o.need(right)
    return o


@wasi("i")
def fd_sync(ctx: Context, m: Memory, fd: int) -> int:
    _file_fd(ctx, fd, R_FD_SYNC)
    return 0


@wasi("i")
def fd_datasync(ctx: Context, m: Memory, fd: int) -> int:
    _file_fd(ctx, fd, R_FD_DATASYNC)
    return 0


@wasi("iIIi")
def fd_advise(ctx: Context, m: Memory, fd: int, offset: int, length: int, advice: int) -> int:
    _file_fd(ctx, fd, R_FD_ADVISE)
    if advice & _U32 > 5 or offset < 0 or length < 0:
        return E.INVAL
    return 0


@wasi("iII")
def fd_allocate(ctx: Context, m: Memory, fd: int, offset: int, length: int) -> int:
    """Not supported on files (ENOTSUP, as wasmtime answers); EBADF on anything else."""
    _file_fd(ctx, fd, R_FD_ALLOCATE)
    return E.NOTSUP


@wasi("ii")
def fd_renumber(ctx: Context, m: Memory, fd: int, to: int) -> int:
    src, dst = ctx.fd(fd), ctx.fd(to)
    if src is dst:
        return 0
    ctx.release(dst)
    ctx.fds[to & _U32] = src
    del ctx.fds[fd & _U32]
    return 0


@wasi("iiiIi")
def fd_readdir(ctx: Context, m: Memory, fd: int, buf: int, n: int, cookie: int, out: int) -> int:
    """Entries are ".", ".." and the children sorted by name; the cookie is the entry index."""
    o = ctx.fd(fd)
    if not isinstance(o.node, VDir):
        return E.BADF
    o.need(R_FD_READDIR)
    d = o.node
    n &= _U32
    m._check(buf, n)
    parent = d.parent or d
    entries: list[tuple[str, Node]] = [(".", d), ("..", parent)]
    entries += sorted(d.children.items())
    blob = bytearray()
    for index in range(max(0, cookie), len(entries)):
        if len(blob) >= n:
            break
        name, node = entries[index]
        raw = name.encode()
        blob += DIRENT.pack(index + 1, node.ino, len(raw), node.filetype) + raw
    used = bytes(blob[:n])
    m.write(buf, used)
    m.put(out, U32, len(used))
    return 0


# -- paths ---------------------------------------------------------------------------------------


@wasi("iiiiiIIii")
def path_open(
    ctx: Context,
    m: Memory,
    fd: int,
    dirflags: int,
    path: int,
    path_len: int,
    oflags: int,
    base: int,
    inheriting: int,
    fdflags: int,
    out: int,
) -> int:
    """Writable when the rights hold FD_WRITE or the flags create or truncate (as in wasmtime, where
    other rights, such as the FD_FILESTAT_SET_SIZE Go asks for on every open, grant nothing)."""
    o = ctx.fd(fd)
    start = ctx.dir_fd(fd, R_PATH_OPEN, on_file=E.NOTDIR)
    raw = m.read(path, path_len & _U32)
    m._check(out, 4)
    base &= _U64
    if fdflags & FDFLAGS_SYNCS:
        return E.NOTSUP
    if oflags & O_CREAT and oflags & O_DIRECTORY:
        return E.INVAL
    writable = bool(base & R_FD_WRITE or oflags & (O_CREAT | O_TRUNC))
    if writable:
        ctx.tree.mutable(start)
    if base & R_FD_WRITE and o.dropped & R_FD_WRITE:
        return E.NOTCAPABLE
    parent, name, trailing = ctx.tree.locate(start, raw)
    node = parent if name is None else parent.children.get(name)
    if node is None:
        if not oflags & O_CREAT:
            return E.NOENT
        if trailing:
            return E.ISDIR
        o.need(R_PATH_CREATE_FILE)
        node = ctx.tree.create_file(parent, name or "")
    elif oflags & O_CREAT and oflags & O_EXCL:
        return E.EXIST
    if isinstance(node, VDir):
        if writable:
            return E.ISDIR
        rights = RIGHTS_DIR & ~o.dropped
        opened = Open(node, "dir", rights=rights, inheriting=rights, dropped=o.dropped)
    else:
        if oflags & O_CREAT and trailing:
            return E.ISDIR
        if oflags & O_DIRECTORY or trailing:
            return E.NOTDIR
        if oflags & O_TRUNC and isinstance(node, OutputFile):
            ctx.tree.resize(node, 0)
        readable = bool(base & R_FD_READ) or not base & R_FD_WRITE
        rights = file_rights(readable, writable) & ~o.dropped
        opened = Open(
            node,
            "file",
            readable=readable,
            writable=writable,
            append=bool(fdflags & FDFLAG_APPEND),
            nonblock=bool(fdflags & FDFLAG_NONBLOCK),
            rights=rights,
            inheriting=rights,
        )
    m.put(out, U32, ctx.add_fd(opened))
    return 0


def _path(m: Memory, ptr: int, n: int) -> bytes:
    return m.read(ptr, n & _U32)


@wasi("iiiii")
def path_filestat_get(
    ctx: Context, m: Memory, fd: int, flags: int, path: int, path_len: int, out: int
) -> int:
    start = ctx.dir_fd(fd, R_PATH_FILESTAT_GET)
    _filestat(m, out, ctx.tree.lookup(start, _path(m, path, path_len)))
    return 0


@wasi("iiiiIIi")
def path_filestat_set_times(
    ctx: Context, m: Memory, fd: int, flags: int, path: int, path_len: int, atim: int, mtim: int, fst: int
) -> int:
    start = ctx.dir_fd(fd, R_PATH_FILESTAT_SET_TIMES)
    raw = _path(m, path, path_len)
    _check_fstflags(fst & 0xFFFF)
    ctx.tree.mutable(start)
    _set_times(ctx, ctx.tree.lookup(start, raw), atim, mtim, fst)
    return 0


@wasi("iii")
def path_create_directory(ctx: Context, m: Memory, fd: int, path: int, path_len: int) -> int:
    ctx.tree.mkdir(ctx.dir_fd(fd, R_PATH_CREATE_DIRECTORY), _path(m, path, path_len))
    return 0


@wasi("iii")
def path_unlink_file(ctx: Context, m: Memory, fd: int, path: int, path_len: int) -> int:
    ctx.tree.unlink(ctx.dir_fd(fd, R_PATH_UNLINK_FILE), _path(m, path, path_len))
    return 0


@wasi("iii")
def path_remove_directory(ctx: Context, m: Memory, fd: int, path: int, path_len: int) -> int:
    ctx.tree.rmdir(ctx.dir_fd(fd, R_PATH_REMOVE_DIRECTORY), _path(m, path, path_len))
    return 0


@wasi("iiiiii")
def path_rename(
    ctx: Context, m: Memory, fd: int, old: int, old_len: int, new_fd: int, new: int, new_len: int
) -> int:
    ctx.tree.rename(
        ctx.dir_fd(fd, R_PATH_RENAME_SOURCE),
        _path(m, old, old_len),
        ctx.dir_fd(new_fd, R_PATH_RENAME_TARGET),
        _path(m, new, new_len),
    )
    return 0


@wasi("iiiiii")
def path_readlink(
    ctx: Context, m: Memory, fd: int, path: int, path_len: int, buf: int, n: int, out: int
) -> int:
    ctx.tree.lookup(ctx.dir_fd(fd, R_PATH_READLINK), _path(m, path, path_len))
    return E.INVAL  # nothing in the tree is a symbolic link


@wasi("iiiii")
def path_symlink(ctx: Context, m: Memory, old: int, old_len: int, fd: int, new: int, new_len: int) -> int:
    """Symbolic links are not supported: ENOTSUP (EPERM under a read-only directory, as for any change)."""
    ctx.tree.mutable(ctx.dir_fd(fd, R_PATH_SYMLINK))
    return E.NOTSUP


@wasi("iiiiiii")
def path_link(
    ctx: Context,
    m: Memory,
    old_fd: int,
    flags: int,
    old: int,
    old_len: int,
    new_fd: int,
    new: int,
    new_len: int,
) -> int:
    """Hard links are not supported: ENOTSUP (EPERM under a read-only directory, as for any change)."""
    ctx.tree.mutable(ctx.dir_fd(old_fd, R_PATH_LINK_SOURCE))
    ctx.tree.mutable(ctx.dir_fd(new_fd, R_PATH_LINK_TARGET))
    return E.NOTSUP


# -- sockets: none exist, so every fd is not a socket --------------------------------------------


@wasi("iii")
def sock_accept(ctx: Context, m: Memory, fd: int, flags: int, out: int) -> int:
    ctx.fd(fd)
    return E.NOTSOCK


@wasi("iiiiii")
def sock_recv(
    ctx: Context, m: Memory, fd: int, data: int, data_len: int, flags: int, out_len: int, out_flags: int
) -> int:
    ctx.fd(fd)
    return E.NOTSOCK


@wasi("iiiii")
def sock_send(ctx: Context, m: Memory, fd: int, data: int, data_len: int, flags: int, out: int) -> int:
    ctx.fd(fd)
    return E.NOTSOCK


@wasi("ii")
def sock_shutdown(ctx: Context, m: Memory, fd: int, how: int) -> int:
    ctx.fd(fd)
    return E.NOTSOCK


SIGNATURES: dict[str, tuple[str, bool]] = {n: (p, r) for n, (p, r, _) in FUNCTIONS.items()}
