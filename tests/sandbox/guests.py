"""Guest modules for the sandbox tests, written in the WebAssembly text format.

`command(body)` wraps a `_start` body in a module that imports the WASI functions the tests use
and one page of exported memory. Memory layout the helpers rely on: 0..8 an iovec, 8..12 a
result word, 12..16 an opened fd, 16..64 scratch; tests put their strings at 256 and up and
their buffers at 1024 and up.
"""

from __future__ import annotations

import wasmtime

IMPORTS = """
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_read" (func $fd_read (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_seek" (func $fd_seek (param i32 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_close" (func $fd_close (param i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_readdir" (func $fd_readdir (param i32 i32 i32 i64 i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_open"
    (func $path_open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_filestat_get"
    (func $path_filestat_get (param i32 i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "path_create_directory"
    (func $path_create_directory (param i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "clock_time_get" (func $clock_time_get (param i32 i64 i32) (result i32)))
  (import "wasi_snapshot_preview1" "poll_oneoff" (func $poll_oneoff (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "random_get" (func $random_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $proc_exit (param i32)))
  (import "wasi_snapshot_preview1" "args_sizes_get" (func $args_sizes_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "args_get" (func $args_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "environ_sizes_get" (func $environ_sizes_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "environ_get" (func $environ_get (param i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_prestat_dir_name"
    (func $fd_prestat_dir_name (param i32 i32 i32) (result i32)))
"""

HELPERS = """
  ;; write len bytes at ptr to fd; returns the errno
  (func $write (param $fd i32) (param $ptr i32) (param $len i32) (result i32)
    (i32.store (i32.const 0) (local.get $ptr))
    (i32.store (i32.const 4) (local.get $len))
    (call $fd_write (local.get $fd) (i32.const 0) (i32.const 1) (i32.const 8)))
  (func $print (param $ptr i32) (param $len i32)
    (drop (call $write (i32.const 1) (local.get $ptr) (local.get $len))))
  ;; open path (ptr, len) under dirfd with oflags and rights; the fd lands at 12; returns the errno
  (func $open (param $dir i32) (param $ptr i32) (param $len i32) (param $oflags i32) (param $rights i64)
    (result i32)
    (call $path_open (local.get $dir) (i32.const 0) (local.get $ptr) (local.get $len) (local.get $oflags)
      (local.get $rights) (i64.const 0) (i32.const 0) (i32.const 12)))
  ;; exit with the errno if it is not 0
  (func $check (param $errno i32)
    (if (local.get $errno) (then (call $proc_exit (i32.add (i32.const 100) (local.get $errno))))))
"""

RIGHTS_READ = 2
RIGHTS_WRITE = 64
O_CREAT = 1
O_TRUNC = 8


def command(
    body: str,
    *,
    data: str = "",
    funcs: str = "",
    memory: str = '(memory (export "memory") 1)',
    start: str = "",
) -> bytes:
    text = f"""(module {IMPORTS} {memory} {data} {HELPERS} {funcs} {start}
      (func (export "_start") {body}))"""
    return bytes(wasmtime.wat2wasm(text))


def wat(text: str) -> bytes:
    return bytes(wasmtime.wat2wasm(text))
