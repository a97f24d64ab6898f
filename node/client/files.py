"""The files a submitter names (a prompts file, a model, a batch file), read as the user who named them:
only a regular file, within a size cap, never blocking on a FIFO or reading a device without end.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from e31.node.errors import UsageError


def file_kind(mode: int) -> str:
    """What a file of `mode` is, for a message: "a FIFO", "a directory", ..."""
    for test, kind in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISLNK, "a symbolic link"),
    ):
        if test(mode):
            return kind
    return "not a regular file"


def read_regular_file(path: Path, label: str, most: int) -> bytes:
    """The bytes of the regular file at `path`, at most `most` of them, or UsageError (one line).

    A FIFO, device, directory or socket is refused from its stat, before it is opened; the file is then
    opened without blocking (a FIFO swapped in meanwhile cannot hang the read), the descriptor's own
    fstat is checked again, and at most `most` + 1 bytes are read, so a file that grows is refused too.
    Links are followed: the command reads the file as the user who named it.
    """
    try:
        before = os.stat(path)
        if not stat.S_ISREG(before.st_mode):
            raise UsageError(f"{label}: {file_kind(before.st_mode)}, not a regular file")
        if before.st_size > most:
            raise UsageError(f"{label}: {before.st_size} bytes, more than the {most} allowed")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise UsageError(f"{label}: {file_kind(st.st_mode)}, not a regular file")
            chunks: list[bytes] = []
            left = most + 1
            while left > 0:
                chunk = os.read(fd, min(left, 1 << 20))
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
        finally:
            os.close(fd)
    except FileNotFoundError:
        raise UsageError(f"{label}: no such file") from None
    except OSError as e:
        raise UsageError(f"{label}: {e.strerror or e}") from None
    data = b"".join(chunks)
    if len(data) > most:
        raise UsageError(f"{label}: more than the {most} bytes allowed")
    return data
