"""WASI preview 1 conformance: one test per function family, each refusal with its errno.

Every probe (wasi_probe.Probe) runs twice: under our WASI, and under wasmtime's own (wasmtime-py's
WasiConfig, two host directories preopened with the same mutability as /input and /output), and
each step must give the errno written next to it under both. A step where we differ from wasmtime
on purpose says so with `wasmtime=` and the reason is in docs/security.md ("WASI: where we differ
from the standard, and why").
"""

from __future__ import annotations

import dataclasses
import io
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from e31.sandbox.errors import JobSpecError
from e31.sandbox.job import JobSpec
from e31.sandbox.limits import Limits, Status
from e31.sandbox.runner import run
from e31.sandbox.vfs import E
from e31.sandbox.wasi import (
    R_FD_ALLOCATE,
    R_FD_DATASYNC,
    R_FD_FILESTAT_SET_SIZE,
    R_FD_FILESTAT_SET_TIMES,
    R_FD_READ,
    R_FD_READDIR,
    R_FD_SEEK,
    R_FD_WRITE,
    R_PATH_FILESTAT_SET_SIZE,
    RIGHTS_ALL,
    RIGHTS_PREOPEN,
    RIGHTS_PREOPEN_INHERITING,
)
from e31.sandbox.worker import ProtocolViolation, encode_spec, read_frame, serve, write_frame
from wasi_probe import FD, SKIP, Probe, Str, ours, run_ours, run_theirs

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


# -- args and environment ----------------------------------------------------------------------


def test_args_and_environ() -> None:
    p = Probe()
    p.errno("args_sizes_get", 16, 20, expected=0)
    p.check("(i32.load (i32.const 16))", 3)  # job.wasm, one, "two words"
    p.check("(i32.load (i32.const 20))", len(b"job.wasm\0one\0two words\0"))
    p.errno("args_get", 1024, 2048, expected=0)
    p.check("(i32.sub (i32.load (i32.const 1028)) (i32.const 2048))", len(b"job.wasm\0"))
    p.check("(i32.load8_u (i32.load (i32.const 1032)))", ord("t"))
    p.errno("environ_sizes_get", 16, 20, expected=0)
    p.check("(i32.load (i32.const 16))", 2)
    p.check("(i32.load (i32.const 20))", len(b"A=1\0B=x=y\0"))
    p.errno("environ_get", 1024, 2048, expected=0)
    p.check("(i32.load8_u (i32.add (i32.const 2048) (i32.const 6)))", ord("x"))
    p.verify(args=("one", "two words"), env=(("A", "1"), ("B", "x=y")))


def test_pointers_outside_the_guests_memory_are_efault() -> None:
    # wasmtime traps on a pointer outside memory; we answer EFAULT (docs/security.md).
    p = Probe()
    p.errno("args_sizes_get", 0x7FFFFFF0, 20, expected=E.FAULT)
    p.errno("args_get", 1024, 0x1FFFF, expected=E.FAULT)
    p.errno("environ_sizes_get", 16, -1, expected=E.FAULT)
    p.errno("environ_get", 0x20000, 2048, expected=E.FAULT)
    p.errno("clock_time_get", 0, 0, 0x1FFFC, expected=E.FAULT)
    p.errno("random_get", 0x1FFF0, 64, expected=E.FAULT)
    p.errno("fd_readdir", IN, 0x1FFF0, 4096, 0, 16, expected=E.FAULT)
    p.errno("path_open", IN, 0, 0x1FFFE, 5, 0, R_FD_READ, 0, 0, 8, expected=E.FAULT)
    p.verify(args=("one",), env=(("A", "1"),), against_wasmtime=False)


# -- clocks, random, scheduling ------------------------------------------------------------------


def test_clocks() -> None:
    p = Probe()
    for clock in range(2):  # REALTIME, MONOTONIC
        p.errno("clock_res_get", clock, 16, expected=0)
        p.check("(i32.wrap_i64 (i64.load (i32.const 16)))", 1000, wasmtime=SKIP)  # ours: 1 µs
        p.errno("clock_time_get", clock, 0, 16, expected=0)
    for clock in range(2, 4):  # the CPU-time clocks: none
        p.errno("clock_res_get", clock, 16, expected=E.BADF)
        p.errno("clock_time_get", clock, 0, 16, expected=E.BADF)
    # Two reads of one clock: the second is later (ours: by exactly one step).
    p.errno("clock_time_get", 1, 0, 16, expected=0)
    p.errno("clock_time_get", 1, 0, 24, expected=0)
    p.check("(i64.gt_u (i64.load (i32.const 24)) (i64.load (i32.const 16)))", 1)
    p.check(
        "(i32.wrap_i64 (i64.sub (i64.load (i32.const 24)) (i64.load (i32.const 16))))", 1000, wasmtime=SKIP
    )
    # REALTIME is 2024-01-01 plus the virtual time elapsed (ours), a real date after 2024 (theirs).
    p.errno("clock_time_get", 0, 0, 16, expected=0)
    p.check("(call $seconds (i32.const 16))", 1_704_067_200, wasmtime=SKIP)
    p.check("(i64.ge_u (i64.load (i32.const 16)) (i64.const 1704067200000000000))", 1)
    p.verify()


def test_clock_ids_that_do_not_exist_are_einval() -> None:
    # wasmtime traps on an unknown enum value; we answer EINVAL (docs/security.md).
    p = Probe()
    p.errno("clock_res_get", 4, 16, expected=E.INVAL)
    p.errno("clock_time_get", 4, 0, 16, expected=E.INVAL)
    p.errno("clock_time_get", -1, 0, 16, expected=E.INVAL)
    p.verify(against_wasmtime=False)


def test_random_get_and_sched_yield() -> None:
    p = Probe()
    p.errno("random_get", 1024, 0, expected=0)
    p.errno("random_get", 1024, 64, expected=0)
    p.errno("random_get", 2048, 64, expected=0)
    p.check("(i64.ne (i64.load (i32.const 1024)) (i64.load (i32.const 2048)))", 1)
    p.errno("sched_yield", expected=0)
    p.verify()
    # Ours is seeded: the same job draws the same bytes.
    first, _ = ours(p.module())
    assert ours(p.module()) == (first, 0)


# -- fd_* on files -----------------------------------------------------------------------------


def test_fd_calls_on_files() -> None:
    p = Probe()
    p.open(IN, "a.txt")
    p.errno("fd_seek", FD, 1, 0, 16, expected=0)
    p.check(p.call("read", FD, 1024, 2), 0)
    p.check("(i32.load8_u (i32.const 1024))", ord("e"))
    p.errno("fd_tell", FD, 16, expected=0)
    p.check("(i32.load (i32.const 16))", 3)
    p.errno("fd_seek", FD, -1, 1, 16, expected=0)  # from the current position
    p.check("(i32.load (i32.const 16))", 2)
    p.errno("fd_seek", FD, -2, 2, 16, expected=0)  # from the end
    p.check("(i32.load (i32.const 16))", 3)
    p.errno("fd_seek", FD, -10, 0, 16, expected=E.INVAL)
    p.errno("fd_seek", FD, 100, 0, 16, expected=0)  # past the end is allowed; reads give 0 bytes
    p.check(p.call("read", FD, 1024, 4), 0)
    p.check("(call $count)", 0)
    p.errno("fd_pread", FD, 0, 1, 1, 16, expected=0)  # the iovec at 0 was set by $read: 4 bytes
    p.check("(i32.load (i32.const 16))", 4)
    p.errno("fd_pwrite", FD, 0, 1, 0, 16, expected=E.BADF)
    p.errno("fd_sync", FD, expected=0)
    p.errno("fd_datasync", FD, expected=0)
    p.errno("fd_advise", FD, 0, 5, 1, expected=0)
    p.errno("fd_allocate", FD, 0, 5, expected=E.NOTSUP)
    p.check(p.call("filestat", FD), 0)
    p.check("(call $stat_type)", 4)
    p.check("(call $stat_size)", 5)
    p.errno("fd_filestat_set_times", FD, 0, 0, ATIM, expected=E.PERM)
    p.errno("fd_fdstat_set_flags", FD, APPEND, expected=0)
    p.check(p.call("fdstat", FD), 0)
    p.check("(call $fdstat_type)", 4)
    p.check("(call $fdstat_flags)", APPEND)
    p.errno("fd_fdstat_set_flags", FD, NONBLOCK, expected=0)
    p.check(p.call("fdstat", FD), 0)
    p.check("(call $fdstat_flags)", NONBLOCK)
    for flag in (DSYNC, RSYNC, SYNC):
        p.errno("fd_fdstat_set_flags", FD, flag, expected=E.INVAL)
    # Writing, truncating, timestamps under /output.
    p.open(OUT, "o.txt", oflags=O_CREAT | O_EXCL, rights=R_FD_READ | R_FD_WRITE)
    p.open(OUT, "o.txt", oflags=O_CREAT | O_EXCL, rights=R_FD_WRITE, expected=E.EXIST)
    p.check(p.call("write", FD, p.addr("hello world"), 11), 0)
    p.errno("fd_pwrite", FD, 0, 1, 20, 16, expected=0)  # the iovec $write left: the same 11 bytes
    p.check(p.call("filestat", FD), 0)
    p.check("(call $stat_size)", 31)
    p.errno("fd_filestat_set_size", FD, 4, expected=0)
    p.check(p.call("filestat", FD), 0)
    p.check("(call $stat_size)", 4)
    p.errno("fd_filestat_set_size", FD, -1, expected=E.INVAL)
    p.errno("fd_filestat_set_times", FD, 5_000_000_000, 7_000_000_000, ATIM | MTIM, expected=0)
    p.check(p.call("filestat", FD), 0)
    p.check("(call $stat_atim_s)", 5)
    p.check("(call $stat_mtim_s)", 7)
    p.errno("fd_filestat_set_times", FD, 9_000_000_000, 0, ATIM, expected=0)  # MTIM unchanged
    p.check(p.call("filestat", FD), 0)
    p.check("(call $stat_atim_s)", 9)
    p.check("(call $stat_mtim_s)", 7)
    p.errno("fd_filestat_set_times", FD, 0, 0, ATIM | ATIM_NOW, expected=E.INVAL)
    p.errno("fd_filestat_set_times", FD, 0, 0, MTIM | MTIM_NOW, expected=E.INVAL)
    # NOW is the clock's now: ours the virtual realtime clock, so it stays 2024-01-01 here.
    p.errno("fd_filestat_set_times", FD, 0, 0, ATIM_NOW | MTIM_NOW, expected=0)
    p.check(p.call("filestat", FD), 0)
    p.check("(call $stat_mtim_s)", 1_704_067_200, wasmtime=SKIP)
    p.errno("fd_close", FD, expected=0)
    p.errno("fd_close", FD, expected=E.BADF)
    p.errno("fd_read", 99, 0, 1, 16, expected=E.BADF)
    p.verify(INPUTS)


def test_fd_calls_on_stdio() -> None:
    p = Probe()
    p.errno("fd_seek", 1, 0, 0, 16, expected=E.SPIPE)
    p.errno("fd_tell", 1, 16, expected=E.SPIPE)
    p.errno("fd_pwrite", 1, 0, 1, 0, 16, expected=E.SPIPE)
    p.errno("fd_read", 1, 0, 1, 16, expected=E.BADF)
    p.errno("fd_write", 0, 0, 1, 16, expected=E.BADF)
    for name in ("fd_sync", "fd_datasync"):
        p.errno(name, 1, expected=E.BADF)
    p.errno("fd_advise", 1, 0, 0, 0, expected=E.BADF)
    p.errno("fd_allocate", 1, 0, 1, expected=E.BADF)
    p.errno("fd_filestat_set_size", 1, 0, expected=E.BADF)
    p.errno("fd_filestat_set_times", 1, 0, 0, ATIM, expected=E.BADF)
    p.errno("fd_fdstat_set_flags", 1, APPEND, expected=E.BADF)
    p.errno("fd_readdir", 1, 1024, 100, 0, 16, expected=E.BADF)
    p.errno("fd_prestat_get", 0, 16, expected=E.BADF)
    p.errno("fd_filestat_get", 1, 64, expected=0)
    p.check(p.call("fdstat", 1), 0)
    # Ours: a character device (a terminal to libc), so shipped modules keep their buffering and fuel.
    p.check("(call $fdstat_type)", 2, wasmtime=0)
    p.verify()


def test_fd_renumber_and_close() -> None:
    p = Probe()
    p.open(IN, "a.txt")
    p.errno("fd_renumber", FD, 40, expected=E.BADF)  # the target must be open
    p.errno("fd_renumber", FD, 0, expected=0)  # stdin is now a.txt
    p.check(p.call("read", 0, 1024, 5), 0)
    p.check("(call $count)", 5)
    p.errno("fd_close", FD, expected=E.BADF)  # moved away
    p.errno("fd_renumber", 99, 0, expected=E.BADF)
    p.errno("fd_close", IN, expected=0)  # a preopen may be closed
    p.errno("path_open", IN, 0, Str("a.txt"), 0, R_FD_READ, 0, 0, 8, expected=E.BADF)
    p.verify(INPUTS)


# -- fd_* on directories -----------------------------------------------------------------------


def test_fd_calls_on_directories() -> None:
    p = Probe()
    p.open(IN, "d", oflags=O_DIRECTORY, rights=0)
    for fd in (IN, OUT, FD):
        p.errno("fd_read", fd, 0, 1, 16, expected=E.BADF)
        p.errno("fd_write", fd, 0, 1, 16, expected=E.BADF)
        p.errno("fd_pread", fd, 0, 1, 0, 16, expected=E.BADF)
        p.errno("fd_pwrite", fd, 0, 1, 0, 16, expected=E.BADF)
        p.errno("fd_seek", fd, 0, 0, 16, expected=E.BADF)
        p.errno("fd_tell", fd, 16, expected=E.BADF)
        p.errno("fd_sync", fd, expected=E.BADF)
        p.errno("fd_datasync", fd, expected=E.BADF)
        p.errno("fd_advise", fd, 0, 0, 0, expected=E.BADF)
        p.errno("fd_allocate", fd, 0, 10, expected=E.BADF)
        p.errno("fd_filestat_set_size", fd, 0, expected=E.BADF)
        p.errno("fd_fdstat_set_flags", fd, 0, expected=E.BADF)
        p.errno("fd_filestat_get", fd, 64, expected=0)
        p.check("(call $stat_type)", 3)
        p.check(p.call("fdstat", fd), 0)
        p.check("(call $fdstat_type)", 3)
    p.errno("fd_prestat_get", FD, 16, expected=E.BADF)  # an opened directory is not a preopen
    p.errno("fd_prestat_get", IN, 16, expected=0)
    p.check("(i32.load (i32.const 20))", len("/input"))
    p.errno("fd_prestat_dir_name", IN, 1024, 5, expected=E.NAMETOOLONG)
    p.errno("fd_prestat_dir_name", OUT, 1024, 7, expected=0)
    p.check("(i32.load8_u (i32.const 1025))", ord("o"))
    # Timestamps: /input's never change; /output's are kept.
    p.errno("fd_filestat_set_times", IN, 0, 0, ATIM, expected=E.PERM)
    p.errno("fd_filestat_set_times", IN, 0, 0, ATIM | ATIM_NOW, expected=E.INVAL)
    p.errno("fd_filestat_set_times", OUT, 3_000_000_000, 4_000_000_000, ATIM | MTIM, expected=0)
    p.check(p.call("filestat", OUT), 0)
    p.check("(call $stat_atim_s)", 3)
    p.check("(call $stat_mtim_s)", 4)
    p.verify(INPUTS)


def test_fd_readdir() -> None:
    p = Probe()
    p.errno("fd_readdir", IN, 1024, 4096, 0, 16, expected=0)
    # ".", "..", "a.txt", "d": 4 entries of 24 bytes plus their names, "." first, cookies 1, 2, ...
    p.check("(i32.load (i32.const 16))", 4 * 24 + 1 + 2 + 5 + 1)
    p.check("(i32.load (i32.const 1024))", 1)  # d_next
    p.check("(i32.load (i32.const 1040))", 1)  # d_namlen
    p.check("(i32.load8_u (i32.const 1044))", 3)  # d_type: a directory
    p.check("(i32.load8_u (i32.const 1048))", ord("."))
    p.errno("fd_readdir", IN, 1024, 4096, 2, 16, expected=0)  # from cookie 2: "a.txt", "d"
    p.check("(i32.load (i32.const 16))", 2 * 24 + 5 + 1)
    p.check("(i32.load8_u (i32.const 1048))", ord("a"), wasmtime=SKIP)  # ours sorted; wasmtime: host order
    p.errno("fd_readdir", IN, 1024, 10, 0, 16, expected=0)  # a short buffer is filled, not refused
    p.check("(i32.load (i32.const 16))", 10)
    p.open(IN, "a.txt")
    p.errno("fd_readdir", FD, 1024, 100, 0, 16, expected=E.BADF)
    p.verify(INPUTS)


# -- rights ------------------------------------------------------------------------------------


def test_preopens_have_the_rights_wasmtime_gives_them() -> None:
    p = Probe()
    for fd in (IN, OUT):
        p.check(p.call("fdstat", fd), 0)
        p.check("(call $fdstat_base_lo)", RIGHTS_PREOPEN)
        p.check("(call $fdstat_base_hi)", 0)
        p.check("(call $fdstat_inh_lo)", RIGHTS_PREOPEN_INHERITING)
        p.check("(call $fdstat_inh_hi)", 0)
    p.open(OUT, "o.txt", oflags=O_CREAT, rights=R_FD_READ | R_FD_WRITE)
    p.check(p.call("fdstat", FD), 0)
    p.check("(call $fdstat_base_lo)", RIGHTS_ALL)
    p.check("(call $fdstat_inh_lo)", RIGHTS_ALL)
    p.verify(INPUTS)


def test_fd_fdstat_set_rights_only_drops_rights_and_dropped_rights_are_enforced() -> None:
    # wasmtime's preview 1 no longer implements rights (ENOTSUP); we follow the standard here.
    p = Probe()
    p.open(OUT, "o.txt", oflags=O_CREAT, rights=R_FD_READ | R_FD_WRITE)
    p.errno("fd_fdstat_set_rights", FD, RIGHTS_ALL & ~R_FD_WRITE, 0, expected=0)
    p.check(p.call("write", FD, 256, 1), E.NOTCAPABLE)
    p.check(p.call("read", FD, 1024, 1), 0)
    p.check(p.call("fdstat", FD), 0)
    p.check("(call $fdstat_base_lo)", RIGHTS_ALL & ~R_FD_WRITE)
    p.check("(call $fdstat_inh_lo)", 0)
    p.errno("fd_fdstat_set_rights", FD, RIGHTS_ALL, 0, expected=E.NOTCAPABLE)  # no way back
    p.errno("fd_fdstat_set_rights", FD, R_FD_READ, 1, expected=E.NOTCAPABLE)
    p.errno("fd_fdstat_set_rights", FD, R_FD_READ | R_FD_SEEK, 0, expected=0)
    p.errno("fd_tell", FD, 16, expected=E.NOTCAPABLE)
    p.errno("fd_filestat_get", FD, 64, expected=E.NOTCAPABLE)
    p.errno("fd_fdstat_set_flags", FD, APPEND, expected=E.NOTCAPABLE)
    p.errno("fd_fdstat_set_rights", 99, 0, 0, expected=E.BADF)
    # Dropped from a directory's inheriting rights: not granted to what is opened below it.
    p.errno("fd_fdstat_set_rights", OUT, RIGHTS_PREOPEN, RIGHTS_PREOPEN_INHERITING & ~R_FD_WRITE, expected=0)
    p.open(OUT, "o.txt", rights=R_FD_WRITE, expected=E.NOTCAPABLE)
    p.open(OUT, "o.txt", rights=R_FD_READ)
    p.check(p.call("fdstat", FD), 0)
    p.check("(call $fdstat_base_lo)", RIGHTS_ALL & ~R_FD_WRITE)
    p.errno("fd_fdstat_set_rights", OUT, RIGHTS_PREOPEN & ~R_FD_READDIR, 0, expected=0)
    p.errno("fd_readdir", OUT, 1024, 100, 0, 16, expected=E.NOTCAPABLE)
    p.verify(INPUTS, against_wasmtime=False)


# -- poll_oneoff -------------------------------------------------------------------------------

SUBS, EVENTS = 1024, 2048
EVENT_CLOCK, EVENT_FD_READ, EVENT_FD_WRITE = 0, 1, 2


def _subscribe_clock(p: Probe, i: int, userdata: int, clock: int, timeout: int, flags: int = 0) -> None:
    at = SUBS + 48 * i
    p.do(
        f"(i64.store (i32.const {at}) (i64.const {userdata})) (i32.store8 (i32.const {at + 8}) (i32.const 0))"
    )
    p.do(f"(i32.store (i32.const {at + 16}) (i32.const {clock}))")
    p.do(f"(i64.store (i32.const {at + 24}) (i64.const {timeout}))")
    p.do(f"(i64.store (i32.const {at + 32}) (i64.const 0))")
    p.do(f"(i32.store16 (i32.const {at + 40}) (i32.const {flags}))")


def _subscribe_fd(p: Probe, i: int, userdata: int, tag: int, fd: int | str) -> None:
    at = SUBS + 48 * i
    fd_expr = fd if isinstance(fd, str) else f"(i32.const {fd})"
    p.do(f"(i64.store (i32.const {at}) (i64.const {userdata}))")
    p.do(f"(i32.store8 (i32.const {at + 8}) (i32.const {tag}))")
    p.do(f"(i32.store (i32.const {at + 16}) {fd_expr})")


def _event(p: Probe, i: int, userdata: int, error: int, tag: int) -> None:
    at = EVENTS + 32 * i
    p.check(f"(i32.wrap_i64 (i64.load (i32.const {at})))", userdata)
    p.check(f"(i32.load16_u (i32.const {at + 8}))", error)
    p.check(f"(i32.load8_u (i32.const {at + 10}))", tag)


def test_poll_oneoff() -> None:
    p = Probe()
    p.errno("poll_oneoff", SUBS, EVENTS, 0, 16, expected=E.INVAL)  # nothing to wait for
    # One relative clock wait: it fires (ours at once, advancing the virtual clock by the timeout).
    _subscribe_clock(p, 0, 7, 1, 1000)
    p.errno("poll_oneoff", SUBS, EVENTS, 1, 16, expected=0)
    p.check("(i32.load (i32.const 16))", 1)
    _event(p, 0, 7, 0, EVENT_CLOCK)
    # An absolute REALTIME wait in the past fires at once.
    _subscribe_clock(p, 0, 8, 0, 1000, flags=1)
    p.errno("poll_oneoff", SUBS, EVENTS, 1, 16, expected=0)
    _event(p, 0, 8, 0, EVENT_CLOCK)
    # An fd that is ready (files always are) wins over a clock: nbytes 1, HANGUP once at the end.
    p.open(IN, "a.txt")
    _subscribe_fd(p, 0, 11, EVENT_FD_READ, "(call $fd)")
    _subscribe_clock(p, 1, 12, 1, 10_000_000_000)
    p.errno("poll_oneoff", SUBS, EVENTS, 2, 16, expected=0)
    p.check("(i32.load (i32.const 16))", 1)
    _event(p, 0, 11, 0, EVENT_FD_READ)
    p.check(f"(i32.wrap_i64 (i64.load (i32.const {EVENTS + 16})))", 1)
    p.check(f"(i32.load16_u (i32.const {EVENTS + 24}))", 0)
    p.check(p.call("read", FD, 1024, 10), 0)
    p.errno("poll_oneoff", SUBS, EVENTS, 1, 16, expected=0)
    p.check(f"(i32.load16_u (i32.const {EVENTS + 24}))", 1)  # FD_READWRITE_HANGUP
    _subscribe_fd(p, 0, 13, EVENT_FD_WRITE, 1)
    p.errno("poll_oneoff", SUBS, EVENTS, 1, 16, expected=0)
    _event(p, 0, 13, 0, EVENT_FD_WRITE)
    # What cannot be polled fails the whole call: a closed fd, a directory, stdout for reading,
    # a CPU-time clock.
    for fd in (99, IN, 1):
        _subscribe_fd(p, 0, 14, EVENT_FD_READ, fd)
        p.errno("poll_oneoff", SUBS, EVENTS, 1, 16, expected=E.BADF)
    _subscribe_fd(p, 0, 15, EVENT_FD_WRITE, 0)
    p.errno("poll_oneoff", SUBS, EVENTS, 1, 16, expected=E.BADF)
    _subscribe_clock(p, 0, 16, 2, 1000)
    p.errno("poll_oneoff", SUBS, EVENTS, 1, 16, expected=E.INVAL)
    p.verify(INPUTS)


# -- path_* ------------------------------------------------------------------------------------


def test_path_open_resolves_inside_the_directory_it_starts_from() -> None:
    p = Probe()
    p.open(IN, "a.txt")
    p.open(IN, "./a.txt")
    p.open(IN, "d/../a.txt")  # stays at or below fd 3 all along
    p.open(IN, "d/b.txt")
    p.open(IN, "d/")
    p.open(IN, "d/..")
    p.open(IN, ".")
    p.open(IN, "missing", expected=E.NOENT)
    p.open(IN, "x/../../a.txt", expected=E.NOENT)  # "x" is missing before ".." is reached
    p.open(IN, "a.txt/", expected=E.NOTDIR)
    p.open(IN, "a.txt", oflags=O_DIRECTORY, expected=E.NOTDIR)
    p.open(IN, "", expected=E.NOENT)
    # Above the starting fd: EPERM, even where the result would be inside the preopen.
    p.open(IN, "d", oflags=O_DIRECTORY, rights=0)
    p.open(FD, "../a.txt", expected=E.PERM)
    p.open(IN, "d", oflags=O_DIRECTORY, rights=0)
    p.open(FD, "./../a.txt", expected=E.PERM)
    p.open(IN, "d", oflags=O_DIRECTORY, rights=0)
    p.errno("path_filestat_get", FD, 0, Str(".."), 64, expected=E.PERM)
    for path in ("..", "../a.txt", "../../etc/passwd", "./../in/a.txt", "/etc/passwd", "/input/a.txt"):
        p.open(IN, path, expected=E.PERM)
    p.open(OUT, "..", expected=E.PERM)
    # Creating: in /output only; trailing slashes and directories as Linux answers.
    p.open(OUT, "n/", oflags=O_CREAT, rights=R_FD_WRITE, expected=E.ISDIR)
    p.open(OUT, "o.txt", oflags=O_CREAT, rights=R_FD_WRITE)
    p.open(OUT, "o.txt/", oflags=O_CREAT, rights=R_FD_WRITE, expected=E.ISDIR)
    p.open(OUT, ".", oflags=O_CREAT, expected=E.ISDIR)
    p.open(OUT, "q", oflags=O_CREAT | O_DIRECTORY, rights=R_FD_WRITE, expected=E.INVAL)
    p.open(OUT, "no/such/dir/x", oflags=O_CREAT, rights=R_FD_WRITE, expected=E.NOENT)
    p.open(OUT, "d", oflags=O_CREAT | O_DIRECTORY, expected=E.INVAL)
    # The SYNC fdflags are refused at open (ENOTSUP, before anything else), NONBLOCK is kept.
    for flag in (DSYNC, RSYNC, SYNC):
        p.open(IN, "missing", fdflags=flag, expected=E.NOTSUP)
        p.open(OUT, "o.txt", rights=R_FD_WRITE, fdflags=flag, expected=E.NOTSUP)
    p.open(OUT, "o.txt", rights=R_FD_WRITE, fdflags=NONBLOCK | APPEND)
    p.check(p.call("fdstat", FD), 0)
    p.check("(call $fdstat_flags)", NONBLOCK | APPEND)
    p.errno("path_open", 1, 0, Str("a.txt"), 0, R_FD_READ, 0, 0, 8, expected=E.BADF)
    p.open(IN, "a.txt")
    p.errno("path_open", FD, 0, Str("a.txt"), 0, R_FD_READ, 0, 0, 8, expected=E.NOTDIR)
    p.errno("path_open", 99, 0, Str("a.txt"), 0, R_FD_READ, 0, 0, 8, expected=E.BADF)
    p.verify(INPUTS)


def test_path_changes_to_the_tree() -> None:
    p = Probe()
    # Under /input every change is EPERM, before the path is even looked up.
    p.errno("path_create_directory", IN, Str("x"), expected=E.PERM)
    p.errno("path_create_directory", IN, Str("d"), expected=E.PERM)
    p.errno("path_unlink_file", IN, Str("a.txt"), expected=E.PERM)
    p.errno("path_unlink_file", IN, Str("zz"), expected=E.PERM)
    p.errno("path_remove_directory", IN, Str("d"), expected=E.PERM)
    p.errno("path_remove_directory", IN, Str("."), expected=E.PERM)
    p.errno("path_rename", IN, Str("a.txt"), OUT, Str("a.txt"), expected=E.PERM)
    p.errno("path_filestat_set_times", IN, 0, Str("a.txt"), 0, 0, ATIM, expected=E.PERM)
    p.errno("path_filestat_set_times", IN, 0, Str("a.txt"), 0, 0, ATIM | ATIM_NOW, expected=E.INVAL)
    # Under /output, as POSIX answers.
    p.errno("path_create_directory", OUT, Str("x"), expected=0)
    p.errno("path_create_directory", OUT, Str("x"), expected=E.EXIST)
    p.errno("path_create_directory", OUT, Str("y/"), expected=0)
    p.errno("path_create_directory", OUT, Str("x/.."), expected=E.EXIST)
    p.errno("path_create_directory", OUT, Str(""), expected=E.NOENT)
    p.errno("path_create_directory", OUT, Str("../x"), expected=E.PERM)
    p.errno("path_unlink_file", OUT, Str("x"), expected=E.ISDIR)
    p.errno("path_unlink_file", OUT, Str("zz"), expected=E.NOENT)
    p.errno("path_remove_directory", OUT, Str("zz"), expected=E.NOENT)
    p.errno("path_remove_directory", OUT, Str("."), expected=E.INVAL)
    p.errno("path_remove_directory", OUT, Str(".."), expected=E.PERM)
    p.open(OUT, "x/f", oflags=O_CREAT, rights=R_FD_WRITE)
    p.errno("path_remove_directory", OUT, Str("x"), expected=E.NOTEMPTY)
    p.errno("path_remove_directory", OUT, Str("x/f"), expected=E.NOTDIR)
    p.errno("path_unlink_file", OUT, Str("x/f/"), expected=E.NOTDIR)
    p.errno("path_rename", OUT, Str("x/f"), IN, Str("f"), expected=E.PERM)
    p.errno("path_rename", OUT, Str("x"), OUT, Str("x/y"), expected=E.INVAL)
    p.errno("path_rename", OUT, Str("zz"), OUT, Str("g2"), expected=E.NOENT)
    p.errno("path_rename", OUT, Str("x/f"), OUT, Str("g"), expected=0)
    p.errno("path_rename", OUT, Str("g"), OUT, Str("x"), expected=E.ISDIR)
    p.errno("path_rename", OUT, Str("x"), OUT, Str("g"), expected=E.NOTDIR)
    p.errno("path_rename", OUT, Str("x"), OUT, Str("y"), expected=0)  # onto an empty directory
    p.errno("path_filestat_get", OUT, 0, Str("x"), 64, expected=E.NOENT)
    p.errno("path_filestat_get", OUT, 0, Str("g"), 64, expected=0)
    p.check("(call $stat_type)", 4)
    p.errno("path_filestat_get", OUT, 0, Str("g/"), 64, expected=E.NOTDIR)
    p.errno("path_filestat_get", OUT, 0, Str(""), 64, expected=E.NOENT)
    p.errno(
        "path_filestat_set_times", OUT, 0, Str("g"), 9_000_000_000, 11_000_000_000, ATIM | MTIM, expected=0
    )
    p.errno("path_filestat_get", OUT, 0, Str("g"), 64, expected=0)
    p.check("(call $stat_atim_s)", 9)
    p.check("(call $stat_mtim_s)", 11)
    p.errno("path_filestat_set_times", OUT, 0, Str("g"), 0, 0, MTIM | MTIM_NOW, expected=E.INVAL)
    p.errno("path_filestat_set_times", OUT, 0, Str("zz"), 0, 0, ATIM, expected=E.NOENT)
    p.errno("path_unlink_file", OUT, Str("g"), expected=0)
    p.errno("path_readlink", IN, Str("a.txt"), 1024, 100, 16, expected=E.INVAL)  # not a link
    p.errno("path_readlink", IN, Str("zz"), 1024, 100, 16, expected=E.NOENT)
    p.errno("path_create_directory", 1, Str("x"), expected=E.BADF)
    p.open(IN, "a.txt")  # a file is no directory to start from: EBADF (path_open: ENOTDIR)
    p.errno("path_create_directory", FD, Str("x"), expected=E.BADF)
    p.errno("path_filestat_get", FD, 0, Str("x"), 64, expected=E.BADF)
    p.errno("path_rename", OUT, Str("x"), FD, Str("y"), expected=E.BADF)
    p.errno("path_unlink_file", 99, Str("x"), expected=E.BADF)
    p.verify(INPUTS)


def test_symbolic_and_hard_links_are_not_supported() -> None:
    # wasmtime makes them on the host directory (0); we have none: ENOTSUP (EPERM under /input).
    p = Probe()
    p.errno("path_symlink", Str("a"), OUT, Str("l"), expected=E.NOTSUP, wasmtime=0)
    p.errno("path_symlink", Str("a"), IN, Str("l"), expected=E.PERM)
    p.open(OUT, "f", oflags=O_CREAT, rights=R_FD_WRITE)
    p.errno("path_link", OUT, 0, Str("f"), OUT, Str("h"), expected=E.NOTSUP, wasmtime=0)
    p.errno("path_link", IN, 0, Str("a.txt"), OUT, Str("h2"), expected=E.PERM)
    p.verify(INPUTS)


# -- proc_exit, proc_raise -----------------------------------------------------------------------


def test_proc_exit_ends_the_guest_with_its_code() -> None:
    for code in (0, 1, 42, 125):
        p = Probe()
        p.errno("proc_raise", 6, expected=E.NOTSUP)
        p.do(f"(call $flush) (call $proc_exit (i32.const {code}))")
        p.verify(exit_code=code)
    # wasmtime traps on a code of 126 or more; ours keeps it as the job's exit code (docs/security.md).
    for code in (126, 255, 2**32 - 1):
        p = Probe()
        p.do(f"(call $flush) (call $proc_exit (i32.const {code - 2**32 if code >= 2**31 else code}))")
        p.verify(exit_code=code, against_wasmtime=False)


# -- sock_* ------------------------------------------------------------------------------------


def test_sockets_none_exist_so_every_fd_is_not_one() -> None:
    p = Probe()
    p.open(IN, "a.txt")
    for fd in (0, 1, IN, FD):
        p.errno("sock_accept", fd, 0, 16, expected=E.NOTSOCK)
        p.errno("sock_recv", fd, 0, 1, 0, 16, 20, expected=E.NOTSOCK)
        p.errno("sock_send", fd, 0, 1, 0, 16, expected=E.NOTSOCK)
        p.errno("sock_shutdown", fd, 0, expected=E.NOTSOCK)
    p.errno("sock_accept", 99, 0, 16, expected=E.BADF)
    p.errno("sock_recv", 99, 0, 1, 0, 16, 20, expected=E.BADF)
    p.errno("sock_send", 99, 0, 1, 0, 16, expected=E.BADF)
    p.errno("sock_shutdown", 99, 0, expected=E.BADF)
    p.verify(INPUTS)


# -- a writable root (e31 sandbox run --writable-root), for standard test programs --------------

ROOT_FILES = {"sub/f.txt": b"seeded", "top.txt": b"t"}


def test_a_writable_root_behaves_as_wasmtime_with_dir_mapped_to_root() -> None:
    p = Probe()
    p.errno("fd_prestat_get", 3, 16, expected=0)
    p.check("(i32.load (i32.const 20))", 1)
    p.errno("fd_prestat_dir_name", 3, 1024, 1, expected=0)
    p.check("(i32.load8_u (i32.const 1024))", ord("/"))
    p.errno("fd_prestat_get", 4, 16, expected=E.BADF)  # the only preopen
    p.open(3, "sub/f.txt")
    p.check("(call $fd)", 4)  # new fds start right after it
    p.check(p.call("read", FD, 1024, 100), 0)
    p.check("(call $count)", 6)
    p.errno("path_create_directory", 3, Str("new"), expected=0)
    p.open(3, "new/g.txt", oflags=O_CREAT, rights=R_FD_WRITE)
    p.check(p.call("write", FD, p.addr("hello"), 5), 0)
    p.errno("path_unlink_file", 3, Str("top.txt"), expected=0)
    p.errno("path_rename", 3, Str("sub/f.txt"), 3, Str("moved.txt"), expected=0)
    p.errno("path_remove_directory", 3, Str("sub"), expected=0)
    p.errno("path_filestat_set_times", 3, 0, Str("moved.txt"), 2_000_000_000, 0, ATIM, expected=0)
    p.errno("path_filestat_get", 3, 0, Str("moved.txt"), 64, expected=0)
    p.check("(call $stat_atim_s)", 2)
    p.open(3, "..", expected=E.PERM)
    p.open(3, "/top.txt", expected=E.PERM)
    p.verify(root=ROOT_FILES)


def test_a_writable_root_starts_as_a_copy_and_ends_in_the_output_dir(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "f.txt").write_bytes(b"seeded")
    (root / "empty").mkdir()
    p = Probe()
    p.open(3, "sub/f.txt", oflags=O_TRUNC, rights=R_FD_WRITE)
    p.check(p.call("write", FD, p.addr("changed"), 7), 0)
    p.errno("path_create_directory", 3, Str("made"), expected=0)
    out = tmp_path / "out"
    r = run(JobSpec(p.module()), out, writable_root=root)
    assert (r.status, r.exit_code) == (Status.EXITED, 0)
    assert (root / "sub" / "f.txt").read_bytes() == b"seeded"  # never written back
    assert sorted(str(q.relative_to(out)) for q in out.rglob("*")) == ["empty", "made", "sub", "sub/f.txt"]
    assert (out / "sub" / "f.txt").read_bytes() == b"changed"
    # The copy counts against the output budget, as the guest's writes and stdout do.
    assert r.output_bytes == len(b"seeded") + len(b"changed") + r.stdout_bytes


def test_a_writable_root_refuses_links_special_files_and_too_much(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "a").write_bytes(b"12345")
    module = Probe().module()
    with pytest.raises(JobSpecError, match="output limit"):
        run(JobSpec(module, limits=Limits(max_output_bytes=4)), writable_root=root)
    (root / "link").symlink_to(root / "a")
    with pytest.raises(JobSpecError, match="symbolic link"):
        run(JobSpec(module), writable_root=root)
    (root / "link").unlink()
    os.mkfifo(root / "fifo")
    with pytest.raises(JobSpecError, match="neither a regular file nor a directory"):
        run(JobSpec(module), writable_root=root)
    (root / "fifo").unlink()
    inp = tmp_path / "in.txt"
    inp.write_bytes(b"x")
    with pytest.raises(JobSpecError, match="cannot have both"):
        run(JobSpec(module, inputs={"in.txt": inp}), writable_root=root)


def test_no_job_from_the_network_can_ask_for_a_writable_root(tmp_path: Path) -> None:
    # A job reaches a worker as a JobSpec inside a 5-field run request. A JobSpec has no field for a
    # root, and the worker refuses a request with any other field count before it runs anything.
    assert not any("root" in f.name for f in dataclasses.fields(JobSpec))
    spec = JobSpec(Probe().module())
    requests, replies = io.BytesIO(), io.BytesIO()
    write_frame(requests, ["run", 1, encode_spec(spec), None, None, os.fsencode(tmp_path)])
    requests.seek(0)
    with pytest.raises(ProtocolViolation):
        serve(requests, replies, tmp_path / "cache", time.monotonic)
    assert [m[0] for m in _frames(replies)] == ["ready"]


def _frames(buf: io.BytesIO) -> list[list[object]]:
    buf.seek(0)
    frames = []
    while (frame := read_frame(buf)) is not None:
        frames.append(frame)
    return frames


def test_e31_sandbox_run_writable_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from e31.node.cli.main import main

    monkeypatch.setenv("E31_DATA_DIR", str(tmp_path / "data"))
    root = tmp_path / "root"
    root.mkdir()
    (root / "top.txt").write_bytes(b"t")
    p = Probe()
    p.errno("path_unlink_file", 3, Str("top.txt"), expected=0)
    p.do("(call $flush) (call $proc_exit (i32.const 9))")
    module = tmp_path / "probe.wasm"
    module.write_bytes(p.module())
    out = tmp_path / "out"
    argv = ["sandbox", "run", "--no-cache", "--writable-root", str(root), "--output", str(out), str(module)]
    assert main(argv) == 9
    assert (root / "top.txt").exists() and not out.exists()  # the guest emptied its copy
    assert main(["sandbox", "run", "--writable-root", str(root), "--input", str(root), str(module)]) == 2
    assert main(["sandbox", "run", "--writable-root", str(tmp_path / "missing"), str(module)]) == 2
    (root / "link").symlink_to(root / "top.txt")
    assert main(["sandbox", "run", "--writable-root", str(root), str(module)]) == 2


# -- wasi-libc on top: a C program's view, compared line by line ----------------------------------

GUESTS = Path(__file__).parent / "wasi_guests"
LIBC_PROBE = GUESTS / "libc_probe.wasm"
LIBC_INPUTS = {"a.txt": b"hello", "d/b.txt": b"bb"}


def test_a_c_program_sees_through_wasi_libc_what_it_sees_under_wasmtime() -> None:
    module = LIBC_PROBE.read_bytes()
    args = ("/input", "/output", "read-only")
    mine, code = run_ours(module, LIBC_INPUTS, args=args)
    assert code == 0
    assert (mine, code) == run_theirs(module, LIBC_INPUTS, args=args)
    lines = set(mine.decode().splitlines())
    errno = {e.name: int(e) for e in E}
    assert {
        "open_read 5 0",  # the read-only open libc makes succeeds, and so does the read
        f"ftruncate_read_only -1 {errno['PERM']}",
        f"write_read_only -1 {errno['BADF']}",
        f"ro_open_rdwr -1 {errno['PERM']}",
        f"ro_creat -1 {errno['PERM']}",
        "dotdot_inside 5 0",
        f"rmdir_not_empty -1 {errno['NOTEMPTY']}",
        "atime 5 0",  # utimensat kept the times it set
        "mtime 7 0",
    } <= lines
    # The same program in a writable root, as `wasmtime --dir DIR::/` runs it.
    root = {"in/a.txt": b"hello", "in/d/b.txt": b"bb", "out/.keep": b""}
    mine, code = run_ours(module, args=("/in", "/out"), root=root)
    assert code == 0
    assert (mine, code) == run_theirs(module, args=("/in", "/out"), root=root)
    assert "ro_open_rdwr" not in mine.decode()


def test_the_libc_probe_is_what_its_source_builds_to(tmp_path: Path) -> None:
    if shutil.which(os.environ.get("CC", "clang")) is None:
        pytest.skip("no clang (Debian: apt-get install clang lld wasi-libc libclang-rt-dev-wasm32)")
    proc = subprocess.run(
        ["sh", str(GUESTS / "build.sh"), str(tmp_path)], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0 and "wasm32-wasi" in proc.stderr + proc.stdout:
        pytest.skip(f"clang cannot build for wasm32-wasi here: {proc.stderr.strip()[:200]}")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "libc_probe.wasm").read_bytes() == LIBC_PROBE.read_bytes()
