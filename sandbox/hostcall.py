"""How a guest's WASI call reaches our Python functions (wasi.py): wasmtime's raw ("unchecked") callbacks.

wasmtime-py's `Linker.define_func` runs every host call through a generic trampoline: a Caller object,
each parameter turned into a Val after reading its type back from wasmtime, the result checked against
the declared type by building ValTypes and comparing them, and our own wrapper building a Memory view
(two more calls into wasmtime and a ctypes cast) at every call. For a tiny job that is most of the time
of its WASI calls (docs/benchmarks.md, "The sandbox's cost per tiny job").

Here each WASI function is linked with `wasmtime_linker_define_func_unchecked` and its own ctypes
callback:
- the parameters are read from wasmtime's raw value array with one `struct.unpack` (the signatures are
  fixed: runner.check_imports refuses a module importing one with any other), the i32 result is written
  back in place;
- the guest's memory is one `wasi.Memory` per run, looked up by its export name at the first call that
  needs it; at each call only its size is read, and its base address again only when the size changed
  (a linear memory never shrinks, and its base can move only when it grows);
- an exception a function raises (GuestExit, OutputLimit, SinkFailed, a bug of ours) reaches the runner
  as it did through wasmtime-py's trampoline: parked in wasmtime-py's process-wide LAST_EXCEPTION slot
  and a trap returned, which wasmtime-py's call raises again (why runs are serialised: runner.py).

The runner's one call into the guest, its `_start`, goes the same way (`call_start`): the export looked
up by name and called unchecked, its type () -> () having been checked with the module's imports
(runner.check_imports), instead of building every export and reading the type back.

This reaches into wasmtime-py's private `_ffi` and `_func` modules, so it holds for the exact wasmtime
version pinned in pyproject.toml; tests/sandbox/test_hostcall.py checks the pieces it relies on.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable
from typing import Any

import wasmtime
from wasmtime import _ffi as ffi
from wasmtime import _func as wasmtime_func

from .vfs import E, Errno
from .wasi import FUNCTIONS, MODULE, Context, Fault, Memory, func_type

_P = ctypes.c_void_p
_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_size_t, _P, _P, _P, ctypes.c_size_t)
"""wasmtime_func_unchecked_callback_t with plain addresses: (env, caller, args_and_results, count)."""
_caller_context = ctypes.CFUNCTYPE(_P, _P)(("wasmtime_caller_context", ffi.dll))
_caller_export_get = ctypes.CFUNCTYPE(ctypes.c_bool, _P, ctypes.c_char_p, ctypes.c_size_t, _P)(
    ("wasmtime_caller_export_get", ffi.dll)
)
_memory_data = ctypes.CFUNCTYPE(_P, _P, _P)(("wasmtime_memory_data", ffi.dll))
_memory_data_size = ctypes.CFUNCTYPE(ctypes.c_size_t, _P, _P)(("wasmtime_memory_data_size", ffi.dll))

_NO_FINALIZER = ctypes.CFUNCTYPE(None, _P)()
"""A null finalizer: the callbacks' lifetime is the caller's (define_all)."""
RAW_SIZE = ctypes.sizeof(ffi.wasmtime_val_raw_t)
_RAW_FIELD = {"i": f"i{RAW_SIZE - 4}x", "I": f"q{RAW_SIZE - 8}x"}
"""A parameter's slot in the raw array: an i32 or i64 at its start (little-endian, as wasmtime stores
them), padding to the slot's size."""
_MEMORY_NAME = b"memory"
ENTRY = b"_start"
_ENTRY_NAME = ctypes.create_string_buffer(ENTRY)


class GuestMemory:
    """The run's guest memory as the host functions see it: found once, its view refreshed on growth."""

    __slots__ = ("extern", "found", "view")

    def __init__(self) -> None:
        self.extern: Any = None
        """The wasmtime_extern_t of the guest's exported `memory` (None: not looked up or not there)."""
        self.found = False
        self.view = Memory(0, 0)

    def current(self, caller: int) -> Memory:
        """The view, checked against the memory's size now (its base read again if the size changed)."""
        context = _caller_context(caller)
        if not self.found and not self._find(caller):
            return self.view
        mem = ctypes.addressof(self.extern.of.memory)
        size = _memory_data_size(context, mem)
        view = self.view
        if size != view.size:
            view.base = (_memory_data(context, mem) or 0) if size else 0
            view.size = size
        return view

    def _find(self, caller: int) -> bool:
        ext: Any = ffi.wasmtime_extern_t()
        ok = _caller_export_get(caller, _MEMORY_NAME, len(_MEMORY_NAME), ctypes.addressof(ext))
        if not ok or ext.kind != ffi.WASMTIME_EXTERN_MEMORY.value:
            return False
        self.extern, self.found = ext, True
        return True

    def as_wasmtime(self) -> wasmtime.Memory | None:
        """The memory as a wasmtime-py object (for the runner's peak size), once it has been found."""
        if not self.found:
            return None
        return wasmtime.Memory._from_raw(type(self.extern.of.memory).from_buffer_copy(self.extern.of.memory))


class Slot:
    """Which run the linked functions serve right now (one run per engine at a time): its Context and
    its guest memory."""

    def __init__(self) -> None:
        self.ctx: Context | None = None
        self.memory = GuestMemory()

    def start(self, ctx: Context) -> GuestMemory:
        self.ctx, self.memory = ctx, GuestMemory()
        return self.memory

    def end(self) -> None:
        self.ctx = None


def _trap_for(exc: BaseException) -> int:
    """Park `exc` where wasmtime-py's call raises it again, and return the trap that unwinds the guest."""
    wasmtime_func.LAST_EXCEPTION = exc  # type: ignore[assignment]  # (its own trampoline parks any)
    trap = wasmtime.Trap("python exception")._consume()
    return ctypes.cast(trap, _P).value or 0


def _bind(slot: Slot, fn: Callable[..., Any], params: str, has_result: bool) -> Any:
    unpack = struct.Struct("<" + "".join(_RAW_FIELD[k] for k in params)).unpack
    size = RAW_SIZE * len(params)
    string_at = ctypes.string_at
    result_at = ctypes.c_int32.from_address

    def host(env: int, caller: int, raw: int, count: int) -> int:
        try:
            ctx = slot.ctx
            if ctx is None:
                raise RuntimeError("WASI function called outside a run")
            args = unpack(string_at(raw, size)) if size else ()
            if not has_result:
                fn(ctx, None, *args)
                return 0
            try:
                code = int(fn(ctx, slot.memory.current(caller), *args))
            except Errno as e:
                code = int(e.code)
            except Fault:
                code = int(E.FAULT)
            result_at(raw).value = code
            return 0
        except BaseException as e:  # GuestExit, OutputLimit, SinkFailed, or a bug: the runner sorts them
            return _trap_for(e)

    return _CALLBACK(host)


def define_all(linker: wasmtime.Linker, slot: Slot) -> list[Any]:
    """Link every WASI function of wasi.py into `linker`, serving `slot.ctx`. Returns the callbacks: the
    caller keeps them alive as long as the linker (wasmtime holds only their addresses)."""
    keep: list[Any] = []
    module = MODULE.encode()
    for name, (params, has_result, fn) in FUNCTIONS.items():
        callback = _bind(slot, fn, params, has_result)
        keep.append(callback)
        raw_name = name.encode()
        ty = func_type(name)  # alive until wasmtime has copied it
        error = ffi.wasmtime_linker_define_func_unchecked(
            linker.ptr(),
            ctypes.create_string_buffer(module),
            len(module),
            ctypes.create_string_buffer(raw_name),
            len(raw_name),
            ty.ptr(),
            ctypes.cast(callback, ffi.wasmtime_func_unchecked_callback_t),
            None,
            _NO_FINALIZER,
        )
        if error:
            raise wasmtime.WasmtimeError._from_ptr(error)
    return keep


def call_start(store: wasmtime.Store, instance: wasmtime.Instance) -> None:
    """Run the instance's `_start` (a () -> () function: runner.check_imports made sure). Raises as
    wasmtime-py's own call does: the exception a host function raised, a Trap or a WasmtimeError."""
    context = store._context()
    ext: Any = ffi.wasmtime_extern_t()
    found = ffi.wasmtime_instance_export_get(
        context, ctypes.byref(instance._instance), _ENTRY_NAME, len(ENTRY), ctypes.byref(ext)
    )
    if not found or ext.kind != ffi.WASMTIME_EXTERN_FUNC.value:
        raise wasmtime.WasmtimeError("the module exports no _start function")
    slot = (ffi.wasmtime_val_raw_t * 1)()
    with wasmtime_func.enter_wasm(store) as trap:
        error = ffi.wasmtime_func_call_unchecked(context, ctypes.byref(ext.of.func), slot, 0, trap)
        if error:
            raise wasmtime.WasmtimeError._from_ptr(error)


__all__ = ["RAW_SIZE", "GuestMemory", "Slot", "call_start", "define_all"]
