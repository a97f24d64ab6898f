"""WASI preview 1 conformance: one test per function family, each refusal with its errno.

Every probe (wasi_probe.Probe) runs twice: under our WASI, and under wasmtime's own (wasmtime-py's
WasiConfig, two host directories preopened with the same mutability as /input and /output), and
each step must give the errno written next to it under both. A step where we differ from wasmtime
on purpose says so with `wasmtime=` and the reason is in docs/security.md ("WASI: where we differ
from the standard, and why").
"""

from __future__ import annotations

from e31.sandbox.vfs import E
from e31.sandbox.wasi import (
    R_FD_ALLOCATE,
    R_FD_DATASYNC,
    R_FD_FILESTAT_SET_SIZE,
    R_FD_FILESTAT_SET_TIMES,
    R_FD_READ,
    R_FD_READDIR,
    R_FD_WRITE,
    R_PATH_FILESTAT_SET_SIZE,
    RIGHTS_ALL,
)
from wasi_probe import FD, Probe

INPUTS = {"a.txt": b"hello", "d/b.txt": b"bb"}
IN, OUT = 3, 4
O_CREAT, O_DIRECTORY, O_EXCL, O_TRUNC = 1, 2, 4, 8
APPEND, DSYNC, NONBLOCK, RSYNC, SYNC = 1, 2, 4, 8, 16
ATIM, ATIM_NOW, MTIM, MTIM_NOW = 1, 2, 4, 8

# The rights Go's syscall package (GOOS=wasip1) asks for when it opens a file read-only:
# fileRights &^ writeRights (src/syscall/fs_wasip1.go). They include FD_FILESTAT_SET_SIZE.
GO_FILE_RIGHTS = (1 << 28) - 1  # fileRights: every right from FD_DATASYNC to POLL_FD_READWRITE
GO_WRITE_RIGHTS = R_FD_DATASYNC | R_FD_WRITE | R_FD_ALLOCATE | R_PATH_FILESTAT_SET_SIZE
GO_RDONLY = GO_FILE_RIGHTS & ~GO_WRITE_RIGHTS


def test_go_opens_an_input_file_read_only_with_the_rights_it_asks_for() -> None:
    assert GO_RDONLY & R_FD_FILESTAT_SET_SIZE
    p = Probe()
    p.open(IN, "a.txt", rights=GO_RDONLY)
    p.check(p.call("read", FD, 1024, 100), 0)
    p.check("(call $count)", 5)
    p.check(p.call("write", FD, 1024, 1), E.BADF)  # not open for writing
    p.errno("fd_filestat_set_size", FD, 0, expected=E.PERM)  # an /input file never changes
    p.errno("fd_allocate", FD, 0, 10, expected=E.NOTSUP)
    p.check(p.call("fdstat", FD), 0)
    p.check("(call $fdstat_base_lo)", RIGHTS_ALL & ~R_FD_WRITE)
    p.check("(call $fdstat_inh_lo)", RIGHTS_ALL & ~R_FD_WRITE)
    # The same rights on an /output file: read-only too, and truncating it is EINVAL (as ftruncate
    # on a read-only descriptor).
    p.open(OUT, "o.txt", oflags=O_CREAT, rights=R_FD_WRITE)
    p.check(p.call("write", FD, 1024, 3), 0)
    p.open(OUT, "o.txt", rights=GO_RDONLY)
    p.check(p.call("write", FD, 1024, 1), E.BADF)
    p.errno("fd_filestat_set_size", FD, 0, expected=E.INVAL)
    p.check(p.call("filestat", FD), 0)
    p.check("(call $stat_size)", 3)
    p.verify(INPUTS)


def test_writability_comes_from_fd_write_or_creating_or_truncating_flags() -> None:
    p = Probe()
    # Rights other than FD_WRITE grant nothing: these open read-only, even under /input.
    for rights in (R_FD_ALLOCATE, R_FD_FILESTAT_SET_SIZE, R_FD_FILESTAT_SET_TIMES, R_FD_DATASYNC):
        p.open(IN, "a.txt", rights=R_FD_READ | rights)
        p.check(p.call("write", FD, 1024, 1), E.BADF)
    p.open(IN, "a.txt", rights=0)  # no rights at all: readable
    p.check(p.call("read", FD, 1024, 10), 0)
    # FD_WRITE, O_CREAT or O_TRUNC ask to change the file: refused under /input before the lookup.
    p.open(IN, "a.txt", rights=R_FD_WRITE, expected=E.PERM)
    p.open(IN, "a.txt", oflags=O_TRUNC, expected=E.PERM)
    p.open(IN, "a.txt", oflags=O_CREAT, expected=E.PERM)
    p.open(IN, "missing/x", oflags=O_CREAT, expected=E.PERM)
    p.open(IN, "a.txt", oflags=O_CREAT | O_EXCL, expected=E.PERM)
    p.open(IN, "d", rights=R_FD_WRITE, expected=E.PERM)
    p.open(IN, "d", oflags=O_CREAT | O_DIRECTORY, expected=E.INVAL)
    # Under /output, O_CREAT or O_TRUNC make the fd writable whatever the rights (as in wasmtime).
    p.open(OUT, "o.txt", oflags=O_CREAT, rights=R_FD_READ)
    p.check(p.call("write", FD, 256, 3), 0)
    p.open(OUT, "o.txt", oflags=O_TRUNC, rights=R_FD_READ)
    p.check(p.call("filestat", FD), 0)
    p.check("(call $stat_size)", 0)
    p.check(p.call("write", FD, 256, 2), 0)
    p.open(OUT, "o.txt", rights=R_FD_READ)
    p.check(p.call("write", FD, 256, 1), E.BADF)
    p.open(OUT, "o.txt", rights=R_FD_WRITE)  # write-only: reads are EBADF
    p.check(p.call("read", FD, 1024, 1), E.BADF)
    p.check(p.call("fdstat", FD), 0)
    p.check("(call $fdstat_base_lo)", RIGHTS_ALL & ~(R_FD_READ | R_FD_READDIR))
    p.verify(INPUTS)
