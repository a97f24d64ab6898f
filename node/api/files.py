"""The files the local API reads and writes on a request's behalf, without following links.

Reading (the module, inputs and stdin of a submission): `open_named_file` opens only a regular file whose
last path component is not a symbolic link, checked on the descriptor that is then read, never blocking
on a FIFO; `read_capped` reads it with a size cap. Writing (a job's results): `write_under` writes a
file below a directory descriptor, opening every directory on the way with O_NOFOLLOW, and puts it in
place by a hard link that fails if the name is taken (or, with `overwrite`, by a rename, which replaces
a link rather than writing through it). docs/security.md, "Files a request names", is the contract.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path

from .server import HttpError


def _bad(message: str) -> HttpError:
    return HttpError(400, message, "invalid_job")


_FILE_KINDS = (
    (stat.S_ISLNK, "a symbolic link (the node does not follow links: name the file it points to)"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _not_regular(mode: int) -> str:
    return next((kind for test, kind in _FILE_KINDS if test(mode)), "not a regular file")


def open_named_file(path: Path, what: str, most: int) -> int:
    """A descriptor open for reading on the regular file a request names, or HttpError 400.

    The last component of `path` must not be a symbolic link (directories above it are followed: they
    are the user's own naming of a place). The lstat refuses a link, FIFO, device, directory or socket
    without opening it; the open (O_NOFOLLOW, O_NONBLOCK) then cannot follow a link or block on a FIFO
    swapped in since, and the descriptor's own fstat, which is what gets read, must be a regular file of
    at most `most` bytes. The caller reads at most `most` + 1 bytes, so a file that grows is caught.
    """
    try:
        mode = os.lstat(path).st_mode
        if not stat.S_ISREG(mode):
            raise _bad(f"{what} {path}: {_not_regular(mode)}")
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise _bad(f"{what} {path}: no such file") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise _bad(f"{what} {path}: {_not_regular(stat.S_IFLNK)}") from None
        raise _bad(f"{what} {path}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _bad(f"{what} {path}: {_not_regular(st.st_mode)}")
        if st.st_size > most:
            raise _bad(f"{what} {path}: {st.st_size} bytes, more than the {most} allowed")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_capped(fd: int, what: str, path: Path, most: int) -> Iterator[bytes]:
    """The file's bytes in chunks of up to 1 MiB; HttpError 400 once more than `most` have come."""
    total = 0
    while True:
        try:
            chunk = os.read(fd, 1 << 20)
        except OSError as e:
            raise _bad(f"{what} {path}: {e.strerror or e}") from None
        if not chunk:
            return
        total += len(chunk)
        if total > most:
            raise _bad(f"{what} {path}: grew past the {most} bytes allowed while it was read")
        yield chunk


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_dir(name: Path | str, dir_fd: int | None, shown: str) -> int:
    """A descriptor on the directory `name` (relative to `dir_fd`), refusing a symbolic link."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as e:
        if e.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        try:
            link = stat.S_ISLNK(os.lstat(name, dir_fd=dir_fd).st_mode)
        except OSError:
            link = e.errno == errno.ELOOP
    if link:
        raise HttpError(400, f"{shown} is a symbolic link: results are not written through links")
    raise HttpError(400, f"{shown} is not a directory")


def write_under(top: int, name: str, data: bytes, overwrite: bool, shown: str) -> None:
    """Write `data` to the relative path `name` under the directory `top` (`shown` in messages),
    never following a link."""
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise HttpError(400, f"refusing to write {name!r}: not a plain relative path")
    fd = top
    try:
        for i, part in enumerate(parts[:-1]):
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, dir_fd=fd)
            inner = open_dir(part, fd, "/".join([shown, *parts[: i + 1]]))
            if fd != top:
                os.close(fd)
            fd = inner
        _write_file(fd, parts[-1], data, overwrite, f"{shown}/{name}")
    finally:
        if fd != top:
            os.close(fd)


def _write_file(dir_fd: int, name: str, data: bytes, overwrite: bool, shown: str) -> None:
    """Write the file `name` in `dir_fd`: whole under a temporary name, then renamed into place (with
    `overwrite`) or hard-linked there, which fails if anything, even a dangling link, has the name."""
    tmp = f".{name}.{secrets.token_hex(4)}"
    fd = os.open(
        tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666, dir_fd=dir_fd
    )
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        if overwrite:
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            return
        try:
            os.link(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
        except FileExistsError:
            if not _holds(dir_fd, name, data):
                raise HttpError(
                    409, f"{shown} exists: not overwritten (ask for overwrite to replace it)", "exists"
                ) from None
        except OSError as e:
            if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
                raise
            # a file system without hard links: a check, then a rename (a small window, but never
            # through a link: the rename replaces whatever name it finds)
            with contextlib.suppress(FileNotFoundError):
                os.lstat(name, dir_fd=dir_fd)
                if not _holds(dir_fd, name, data):
                    raise HttpError(
                        409, f"{shown} exists: not overwritten (ask for overwrite to replace it)", "exists"
                    ) from None
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dir_fd)


def _holds(dir_fd: int, name: str, data: bytes) -> bool:
    """Whether `name` in `dir_fd` is a regular file (not a link) holding exactly `data`."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != len(data):
            return False
        with os.fdopen(os.dup(fd), "rb") as f:
            return bool(f.read(len(data) + 1) == data)
    finally:
        os.close(fd)
