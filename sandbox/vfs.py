"""The virtual file tree a guest sees: a read-only /input and a writable /output, all in our code.

No host path is reachable from here. /input's files are served from the host files the job named
(by offset reads, never loaded whole); /output lives in memory, and every byte that makes it grow is
charged to the job's output budget *before* it is stored, so the budget bounds host memory too.
Inode numbers are handed out in creation order, timestamps start at one fixed instant (a guest may set
those of its /output entries; nothing else moves them), and listings are sorted by name: nothing of the
host's filesystem leaks into the guest.

A path is resolved relative to the directory it starts from and never climbs above it: `..` past the
start, or an absolute path, is EPERM (as wasmtime answers), even where the result would stay inside
the preopen. A change under a read-only directory (/input) is EPERM too, checked before the path is
looked up, as wasmtime does.

Operations raise `Errno` (a WASI errno) for a guest mistake and `OutputLimit` when the budget is
spent; the WASI layer (wasi.py) turns the first into a return value and the second into a stop.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

from .errors import JobSpecError

FIXED_TIME_NS = 1_704_067_200 * 10**9
"""Every file's atime, mtime and ctime: 2024-01-01T00:00:00Z."""

MAX_OUTPUT_ENTRIES = 10_000
"""Files and directories a guest may create under /output (ENOSPC beyond)."""

MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 4096
MAX_FILE_SIZE = 2**63 - 1


class E(enum.IntEnum):
    """The WASI preview-1 errno values we return."""

    SUCCESS = 0
    BADF = 8
    EXIST = 20
    FAULT = 21
    FBIG = 22
    ILSEQ = 25
    INVAL = 28
    IO = 29
    ISDIR = 31
    MFILE = 33
    NAMETOOLONG = 37
    NOENT = 44
    NOSPC = 51
    NOTDIR = 54
    NOTEMPTY = 55
    NOTSOCK = 57
    NOTSUP = 58
    PERM = 63
    SPIPE = 70
    NOTCAPABLE = 76


class FileType(enum.IntEnum):
    CHARACTER_DEVICE = 2
    DIRECTORY = 3
    REGULAR_FILE = 4


class Errno(Exception):
    def __init__(self, code: E) -> None:
        super().__init__(code.name)
        self.code = code


class OutputLimit(Exception):
    """The guest tried to store more than max_output_bytes (stdout + stderr + /output)."""


class OutputBudget:
    """Counts stored output bytes against the cap; charging past it raises OutputLimit."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0

    def charge(self, n: int) -> None:
        if n <= 0:
            return
        if self.used + n > self.limit:
            raise OutputLimit(f"output exceeds {self.limit} bytes")
        self.used += n


class Node:
    __slots__ = ("atim", "dev", "ino", "mtim", "parent")
    filetype: ClassVar[FileType] = FileType.REGULAR_FILE

    def __init__(self, ino: int, dev: int, parent: Dir | None) -> None:
        self.ino = ino
        self.dev = dev
        self.parent = parent
        self.atim = FIXED_TIME_NS
        self.mtim = FIXED_TIME_NS

    @property
    def size(self) -> int:
        return 0


class Dir(Node):
    __slots__ = ("children", "writable")
    filetype = FileType.DIRECTORY

    def __init__(self, ino: int, dev: int, parent: Dir | None, writable: bool) -> None:
        super().__init__(ino, dev, parent)
        self.children: dict[str, Node] = {}
        self.writable = writable

    def is_within(self, other: Dir) -> bool:
        d: Dir | None = self
        while d is not None:
            if d is other:
                return True
            d = d.parent
        return False


class InputFile(Node):
    __slots__ = ("_size", "host_path")

    def __init__(self, ino: int, dev: int, parent: Dir, host_path: Path, size: int) -> None:
        super().__init__(ino, dev, parent)
        self.host_path = host_path
        self._size = size

    @property
    def size(self) -> int:
        return self._size


class OutputFile(Node):
    __slots__ = ("data",)

    def __init__(self, ino: int, dev: int, parent: Dir) -> None:
        super().__init__(ino, dev, parent)
        self.data = bytearray()

    @property
    def size(self) -> int:
        return len(self.data)


class HostFiles:
    """Host file descriptors for open input files, one per node, shared by the guest fds using it."""

    def __init__(self) -> None:
        self._fds: dict[int, tuple[int, int]] = {}

    def acquire(self, node: InputFile) -> None:
        held = self._fds.get(node.ino)
        if held is not None:
            self._fds[node.ino] = (held[0], held[1] + 1)
            return
        try:
            fd = os.open(node.host_path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as e:
            raise Errno(E.IO) from e
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise Errno(E.IO)
        self._fds[node.ino] = (fd, 1)

    def release(self, node: InputFile) -> None:
        fd, refs = self._fds[node.ino]
        if refs > 1:
            self._fds[node.ino] = (fd, refs - 1)
        else:
            del self._fds[node.ino]
            os.close(fd)

    def pread(self, node: InputFile, n: int, offset: int) -> bytes:
        """Up to n bytes at offset, never past the size recorded when the job was specified."""
        n = max(0, min(n, node.size - offset))
        if n == 0:
            return b""
        try:
            return os.pread(self._fds[node.ino][0], n, offset)
        except OSError as e:
            raise Errno(E.IO) from e

    def close_all(self) -> None:
        for fd, _ in self._fds.values():
            os.close(fd)
        self._fds.clear()


class Tree:
    """The preopened roots and every operation on names within them.

    A job's tree has two: /input (read-only) and /output (writable). With `writable_root` (local
    conformance runs only: `e31 sandbox run --writable-root`, never a job from the network) it has one
    writable root preopened as "/", its files seeded with `seed_file`; `output` is then that root.
    """

    INPUT_DEV = 1
    OUTPUT_DEV = 2

    def __init__(self, budget: OutputBudget, *, writable_root: bool = False) -> None:
        self.budget = budget
        self._next_ino = 1
        self.created = 0
        if writable_root:
            self.output = Dir(self._ino(), self.OUTPUT_DEV, None, writable=True)
            self.input = self.output
            self._preopens = [("/", self.output)]
        else:
            self.input = Dir(self._ino(), self.INPUT_DEV, None, writable=False)
            self.output = Dir(self._ino(), self.OUTPUT_DEV, None, writable=True)
            self._preopens = [("/input", self.input), ("/output", self.output)]

    def preopens(self) -> list[tuple[str, Dir]]:
        """(guest name, directory) of each preopen, in fd order from 3."""
        return list(self._preopens)

    def _ino(self) -> int:
        ino = self._next_ino
        self._next_ino += 1
        return ino

    def add_input(self, parts: tuple[str, ...], host_path: Path, size: int) -> None:
        """Called in sorted order while building the tree, so inode numbers are deterministic."""
        d = self.input
        for name in parts[:-1]:
            child = d.children.get(name)
            if child is None:
                child = Dir(self._ino(), self.INPUT_DEV, d, writable=False)
                d.children[name] = child
            assert isinstance(child, Dir)
            d = child
        d.children[parts[-1]] = InputFile(self._ino(), self.INPUT_DEV, d, host_path, size)

    def seed_file(self, parts: tuple[str, ...], data: bytes) -> None:
        """Put a file (and any missing parent directories) under a writable root before the run:
        counted and charged like the guest's own output."""
        d = self.output
        for name in parts[:-1]:
            child = d.children.get(name)
            if child is None:
                self._count_new_entry()
                child = Dir(self._ino(), self.OUTPUT_DEV, d, writable=True)
                d.children[name] = child
            if not isinstance(child, Dir):
                raise Errno(E.NOTDIR)
            d = child
        if parts[-1] in d.children:
            raise Errno(E.EXIST)
        node = self.create_file(d, parts[-1])
        self.write_at(node, 0, data)

    def seed_dir(self, parts: tuple[str, ...]) -> None:
        d = self.output
        for name in parts:
            child = d.children.get(name)
            if child is None:
                self._count_new_entry()
                child = Dir(self._ino(), self.OUTPUT_DEV, d, writable=True)
                d.children[name] = child
            if not isinstance(child, Dir):
                raise Errno(E.NOTDIR)
            d = child

    # -- names ---------------------------------------------------------------------------------

    @staticmethod
    def _split(path: bytes) -> tuple[list[str], bool]:
        if len(path) > MAX_PATH_BYTES:
            raise Errno(E.NAMETOOLONG)
        if b"\x00" in path:
            raise Errno(E.INVAL)
        if path.startswith(b"/"):
            raise Errno(E.PERM)
        try:
            text = path.decode("utf-8")
        except UnicodeDecodeError as e:
            raise Errno(E.ILSEQ) from e
        if not text:
            raise Errno(E.NOENT)
        parts = text.split("/")
        trailing_slash = parts[-1] == ""
        parts = [p for p in parts if p not in ("", ".")]
        for p in parts:
            if len(p.encode("utf-8")) > MAX_NAME_BYTES:
                raise Errno(E.NAMETOOLONG)
        return parts, trailing_slash

    def _walk(self, start: Dir, parts: list[str]) -> Dir:
        d = start
        depth = 0
        for name in parts:
            if name == "..":
                if depth == 0 or d.parent is None:
                    raise Errno(E.PERM)
                d, depth = d.parent, depth - 1
                continue
            child = d.children.get(name)
            if child is None:
                raise Errno(E.NOENT)
            if not isinstance(child, Dir):
                raise Errno(E.NOTDIR)
            d, depth = child, depth + 1
        return d

    def locate(self, start: Dir, path: bytes) -> tuple[Dir, str | None, bool]:
        """Resolve all but the last component: (parent, last name or None for a directory, trailing /)."""
        parts, trailing = self._split(path)
        if not parts:
            return start, None, trailing
        if parts[-1] == "..":
            return self._walk(start, parts), None, trailing
        return self._walk(start, parts[:-1]), parts[-1], trailing

    def lookup(self, start: Dir, path: bytes) -> Node:
        parent, name, trailing = self.locate(start, path)
        if name is None:
            return parent
        node = parent.children.get(name)
        if node is None:
            raise Errno(E.NOENT)
        if trailing and not isinstance(node, Dir):
            raise Errno(E.NOTDIR)
        return node

    # -- changes (only under /output) ----------------------------------------------------------

    @staticmethod
    def mutable(start: Dir) -> None:
        """A change starting from a read-only directory: EPERM, before its path is looked at."""
        if not start.writable:
            raise Errno(E.PERM)

    def _count_new_entry(self) -> None:
        if self.created >= MAX_OUTPUT_ENTRIES:
            raise Errno(E.NOSPC)
        self.created += 1

    def create_file(self, parent: Dir, name: str) -> OutputFile:
        self.mutable(parent)
        self._count_new_entry()
        node = OutputFile(self._ino(), self.OUTPUT_DEV, parent)
        parent.children[name] = node
        return node

    def mkdir(self, start: Dir, path: bytes) -> None:
        self.mutable(start)
        parent, name, _ = self.locate(start, path)
        if name is None or name in parent.children:
            raise Errno(E.EXIST)
        self.mutable(parent)
        self._count_new_entry()
        parent.children[name] = Dir(self._ino(), self.OUTPUT_DEV, parent, writable=True)

    def unlink(self, start: Dir, path: bytes) -> None:
        self.mutable(start)
        parent, name, trailing = self.locate(start, path)
        if name is None:
            raise Errno(E.ISDIR)
        node = parent.children.get(name)
        if node is None:
            raise Errno(E.NOENT)
        if isinstance(node, Dir):
            raise Errno(E.ISDIR)
        if trailing:
            raise Errno(E.NOTDIR)
        self.mutable(parent)
        del parent.children[name]

    def rmdir(self, start: Dir, path: bytes) -> None:
        self.mutable(start)
        parent, name, _ = self.locate(start, path)
        if name is None:
            raise Errno(E.INVAL)
        node = parent.children.get(name)
        if node is None:
            raise Errno(E.NOENT)
        if not isinstance(node, Dir):
            raise Errno(E.NOTDIR)
        self.mutable(parent)
        if node.children:
            raise Errno(E.NOTEMPTY)
        del parent.children[name]

    def rename(self, old_start: Dir, old_path: bytes, new_start: Dir, new_path: bytes) -> None:
        self.mutable(old_start)
        self.mutable(new_start)
        old_parent, old_name, _ = self.locate(old_start, old_path)
        new_parent, new_name, _ = self.locate(new_start, new_path)
        if old_name is None or new_name is None:
            raise Errno(E.INVAL)
        node = old_parent.children.get(old_name)
        if node is None:
            raise Errno(E.NOENT)
        self.mutable(old_parent)
        self.mutable(new_parent)
        if node is new_parent.children.get(new_name):
            return
        if isinstance(node, Dir) and new_parent.is_within(node):
            raise Errno(E.INVAL)
        target = new_parent.children.get(new_name)
        if target is not None:
            if isinstance(node, Dir):
                if not isinstance(target, Dir):
                    raise Errno(E.NOTDIR)
                if target.children:
                    raise Errno(E.NOTEMPTY)
            elif isinstance(target, Dir):
                raise Errno(E.ISDIR)
        del old_parent.children[old_name]
        new_parent.children[new_name] = node
        node.parent = new_parent

    def resize(self, node: OutputFile, size: int) -> None:
        """Truncate or extend; growth is charged to the budget before anything is stored."""
        if size > MAX_FILE_SIZE:
            raise Errno(E.FBIG)
        grow = size - len(node.data)
        if grow > 0:
            self.budget.charge(grow)
            node.data.extend(bytes(grow))
        elif grow < 0:
            del node.data[size:]

    def write_at(self, node: OutputFile, offset: int, data: bytes) -> None:
        end = offset + len(data)
        if end > MAX_FILE_SIZE:
            raise Errno(E.FBIG)
        if end > len(node.data):
            self.budget.charge(end - len(node.data))
            if offset > len(node.data):
                node.data.extend(bytes(offset - len(node.data)))
        node.data[offset:end] = data

    # -- results --------------------------------------------------------------------------------

    def output_entries(self) -> Iterator[tuple[str, Node]]:
        """Every entry under /output, depth first in sorted order, as ("a/b.txt", node)."""

        def walk(d: Dir, prefix: str) -> Iterator[tuple[str, Node]]:
            for name in sorted(d.children):
                node = d.children[name]
                path = prefix + name
                yield path, node
                if isinstance(node, Dir):
                    yield from walk(node, path + "/")

        return walk(self.output, "")

    def output_hashes(self) -> dict[str, str]:
        return {
            name: hashlib.sha256(node.data).hexdigest()
            for name, node in self.output_entries()
            if isinstance(node, OutputFile)
        }

    def write_output_dir(self, dest: Path) -> None:
        """Materialise /output under dest (created only when /output holds something: a run that
        leaves no output costs no directory). Never follows a symlink that already sits in dest."""
        entries = list(self.output_entries())
        if not entries:
            return
        make_private_dirs(dest)
        root_fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        fds = {"": root_fd}
        try:
            for name, node in entries:
                head, _, base = name.rpartition("/")
                dir_fd = fds[head]
                if isinstance(node, Dir):
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(base, dir_fd=dir_fd)
                    fds[name] = os.open(
                        base, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd
                    )
                elif isinstance(node, OutputFile):
                    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
                    fd = os.open(base, flags, 0o644, dir_fd=dir_fd)
                    try:
                        view = memoryview(node.data)
                        while view:
                            view = view[os.write(fd, view) :]
                    finally:
                        os.close(fd)
        finally:
            for fd in fds.values():
                os.close(fd)


def seed_from_dir(tree: Tree, source: Path) -> None:
    """Copy a host directory into a writable-root tree before a run (local conformance runs only):
    regular files and directories, never a symbolic link or a special file (JobSpecError). Its bytes
    and entries count against the run's output budget and entry cap, as the guest's own would."""

    def walk(host: Path, parts: tuple[str, ...]) -> None:
        with os.scandir(host) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            where = (*parts, e.name)
            shown = "/".join(where)
            if e.is_symlink():
                raise JobSpecError(f"{source}: {shown} is a symbolic link (not supported in the sandbox)")
            try:
                if e.is_dir(follow_symlinks=False):
                    tree.seed_dir(where)
                    walk(Path(e.path), where)
                elif e.is_file(follow_symlinks=False):
                    fd = os.open(e.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                    with os.fdopen(fd, "rb") as f:
                        tree.seed_file(where, f.read(tree.budget.limit - tree.budget.used + 1))
                else:
                    raise JobSpecError(f"{source}: {shown} is neither a regular file nor a directory")
            except OutputLimit:
                raise JobSpecError(
                    f"{source} holds more than the output limit of {tree.budget.limit} bytes"
                ) from None
            except Errno as err:
                raise JobSpecError(f"{source}: {shown}: {err.code.name}") from None

    try:
        walk(source, ())
    except OSError as e:
        raise JobSpecError(f"cannot read {source}: {e.strerror or e}") from None


def make_private_dirs(path: Path) -> None:
    """Create `path` and any missing parents, each readable by this user only (Path.mkdir gives parents
    the default mode)."""
    missing = []
    while not path.is_dir():
        missing.append(path)
        path = path.parent
    for p in reversed(missing):
        with contextlib.suppress(FileExistsError):
            p.mkdir(mode=0o700)
