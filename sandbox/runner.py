"""Run one job: compile, link against our virtual WASI, execute under limits, report a RunResult.

Fences, in the order a guest meets them:
- compile_module refuses malformed, truncated, oversized and text modules, and any import other
  than a preview-1 WASI function with its exact signature (`invalid_module`, nothing runs).
- Store limits: linear memory <= memory_bytes (memory.grow returns -1 past it; a module whose
  declared minimum exceeds it fails to instantiate -> `memory_limit`), one memory, one instance,
  bounded tables.
- Fuel: the store gets exactly `fuel`; running dry is `out_of_fuel` with fuel_used == fuel.
- Wall clock: a watchdog thread bumps the engine epoch once `wall_seconds` have elapsed; the guest
  traps at its next loop back-edge or call -> `timeout`. wasmtime under-reports fuel after an epoch
  stop, so a timeout is charged its whole fuel budget and is not re-verifiable.
- Output: stdout + stderr + /output growth are charged as they happen (vfs.OutputBudget); the write
  that would pass max_output_bytes stops the guest -> `output_limit`.

Streams: RunResult keeps the first DISPLAY_CAP (1 MiB) bytes of stdout and of stderr, and the hashes
and sizes of both. A caller that needs the whole streams (an executor serving them as blobs) passes
`streams_dir`: a stream that outgrows DISPLAY_CAP goes on to `streams_dir/stdout` or `/stderr` (what was
held first, then every byte as it is written, after it is charged), so the file holds it whole; a
shorter one never touches the disk and the result holds it whole. `whole_stream` (limits) says which.
Likewise `output_dir` is created only for a run that leaves something in /output. A tiny job thus
creates no file: on the ext4 these nodes were measured on, each new file or directory costs 0.2-1 ms
of kernel time, more than the job's run.

Memory-limit rule: a guest that traps while its memory is within one 64 KiB page of the limit is
reported as `memory_limit` (a refused memory.grow followed by abort() or a null dereference looks
exactly like that). A guest that handles the refusal itself and exits keeps `exited`.

Elapsed time and pauses: the watchdog samples `clock` (default time.monotonic) every tick and adds
each step to the elapsed total, but never more than MAX_STEP per sample. If the whole process is
stopped (SIGSTOP ... SIGCONT, as a worker pool does to pause a job), the first sample after the stop
sees a large step and counts only MAX_STEP of it, so paused time does not count against
wall_seconds. A caller with a better notion of "time the job held the CPU" passes its own `clock`.

Engines and threads: one Linker (its WASI functions linked by hostcall.py) and one watchdog thread per
engine are built once and reused (instantiating a cached module then costs microseconds). Runs in one
process are serialised by one lock, for two reasons: the epoch is engine-wide, and wasmtime-py hands
an exception raised in a host function back to the caller through a single process-wide slot, so two
guests stopping at once in two threads could swap their outcomes. Run jobs in parallel in separate
processes (the worker pool does).
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import wasmtime

from . import hostcall, wasi
from .errors import InvalidModule, JobSpecError, SandboxError
from .job import MAX_MODULE_BYTES, JobSpec
from .limits import REVERIFIABLE, WASM_PAGE, Limits, RunResult, Status
from .profile import PROFILE, new_engine
from .vfs import Errno, InputFile, OutputBudget, OutputLimit, Tree, make_private_dirs, seed_from_dir

ENTRY = "_start"
MAX_TABLES = 16
TICK_SECONDS = 0.02
MAX_STEP = 0.25
"""Most seconds one watchdog sample may add: larger gaps are a paused process, not guest time."""
IDLE_TICKS = 50
"""Ticks the watchdog thread goes on ticking after a run (a second): the next run then needs no wake-up."""

SINK_BUFFER = 1 << 20
"""Write buffer of each stream file: a guest's many small writes reach the disk in large ones."""

_EMPTY_SHA = hashlib.sha256(b"").hexdigest()

if TYPE_CHECKING:
    from .cache import ModuleCache


@dataclass
class _EngineState:
    linker: wasmtime.Linker
    slot: hostcall.Slot
    watchdog: _Watchdog
    callbacks: list[object]
    """The host functions' ctypes callbacks, alive as long as the linker that calls them."""


_STATES: weakref.WeakKeyDictionary[wasmtime.Engine, _EngineState] = weakref.WeakKeyDictionary()
_STATES_LOCK = threading.Lock()
_RUN_LOCK = threading.Lock()
_default_engine: wasmtime.Engine | None = None


def default_engine() -> wasmtime.Engine:
    global _default_engine
    with _STATES_LOCK:
        if _default_engine is None:
            _default_engine = new_engine()
        return _default_engine


def _state(engine: wasmtime.Engine) -> _EngineState:
    with _STATES_LOCK:
        st = _STATES.get(engine)
        if st is None:
            linker = wasmtime.Linker(engine)
            slot = hostcall.Slot()
            callbacks = hostcall.define_all(linker, slot)
            st = _EngineState(linker, slot, _Watchdog(engine), callbacks)
            _STATES[engine] = st
        return st


_CHECKED: weakref.WeakSet[wasmtime.Module] = weakref.WeakSet()


def check_imports(module: wasmtime.Module) -> None:
    """Refuse any import that is not one of our WASI functions with its exact signature."""
    if module in _CHECKED:
        return
    _check_imports(module)
    _CHECKED.add(module)


def _check_imports(module: wasmtime.Module) -> None:
    for imp in module.imports:
        where = f"{imp.module}.{imp.name}"
        if imp.module != wasi.MODULE or imp.name not in wasi.SIGNATURES:
            raise InvalidModule(f"imports {where}, which the sandbox does not provide")
        ty = imp.type
        want = wasi.func_type(imp.name)
        if not isinstance(ty, wasmtime.FuncType) or ty.params != want.params or ty.results != want.results:
            raise InvalidModule(f"imports {where} with a signature other than WASI preview 1's")
    exports = {e.name: e.type for e in module.exports}
    start = exports.get(ENTRY)
    if not isinstance(start, wasmtime.FuncType) or start.params or start.results:
        raise InvalidModule(f"exports no function {ENTRY}: () -> () (only WASI commands are run)")


def compile_module(engine: wasmtime.Engine, module_bytes: bytes) -> wasmtime.Module:
    """Compile a binary module for `engine`, or raise InvalidModule saying why not."""
    if len(module_bytes) > MAX_MODULE_BYTES:
        raise InvalidModule(f"module is {len(module_bytes)} bytes, more than the {MAX_MODULE_BYTES} allowed")
    if not module_bytes.startswith(b"\x00asm"):
        raise InvalidModule("not a WebAssembly binary (no \\0asm header)")
    try:
        module = wasmtime.Module(engine, module_bytes)
    except wasmtime.WasmtimeError as e:
        raise InvalidModule(_first_line(str(e), "module does not validate")) from None
    check_imports(module)
    return module


def wat_to_wasm(text: str | bytes) -> bytes:
    """Translate the WebAssembly text format to a binary module, or raise InvalidModule."""
    try:
        return bytes(wasmtime.wat2wasm(text))
    except wasmtime.WasmtimeError as e:
        raise InvalidModule(_first_line(str(e), "not valid WebAssembly text")) from None


def _first_line(text: str, fallback: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return fallback
    cause = next((ln for ln in lines[1:] if not ln.startswith("Caused by")), "")
    return f"{lines[0]}: {cause}" if cause else lines[0]


class _Watchdog:
    """One thread per engine that counts a run's elapsed (unpaused) time and interrupts the engine
    once the run's limit has passed. Started with the first run. Between runs it keeps ticking for
    IDLE_TICKS ticks, then sleeps until the next run: so a run that starts while it ticks (back-to-back
    short jobs) only sets the watchdog's fields, with no notify and no wake-up of the thread; its first
    sample comes at most one tick after the start, as with a notify."""

    def __init__(self, engine: wasmtime.Engine) -> None:
        self._engine = weakref.ref(engine)
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._limit = 0.0
        self._clock: Callable[[], float] = time.monotonic
        self._armed = False
        self._elapsed = 0.0
        self._last = 0.0
        self._fired = False
        self._idle = 0
        self._waiting: float | None = None
        """The tick of the thread's timed wait in progress (None: not in one, or waiting for a run)."""
        self.on_tick: Callable[[], None] | None = None
        """Called at each sample while a run is armed, after the limit is checked (run's `on_tick`)."""

    def arm(self, limit: float, clock: Callable[[], float]) -> None:
        with self._cond:
            self._limit, self._clock = limit, clock
            self._elapsed, self._fired, self._armed = 0.0, False, True
            self._last = clock()
            self._idle = 0
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="e31-sandbox-watchdog", daemon=True)
                self._thread.start()
            elif self._waiting is None or self._waiting > _tick(limit):
                self._cond.notify()  # asleep, or on a longer tick than this run needs

    def disarm(self) -> tuple[float, bool]:
        """Stop watching; return (elapsed seconds, whether the limit was reached)."""
        with self._cond:
            self._sample()
            self._armed = False
            return self._elapsed, self._fired

    def _sample(self) -> None:
        now = self._clock()
        self._elapsed += min(max(0.0, now - self._last), MAX_STEP)
        self._last = now

    def _loop(self) -> None:
        with self._cond:
            while True:
                if self._armed and not self._fired:
                    self._waiting = _tick(self._limit)
                elif self._idle < IDLE_TICKS:
                    self._waiting = TICK_SECONDS
                    self._idle += 1
                else:
                    self._waiting = None
                self._cond.wait(self._waiting)
                self._waiting = None
                engine = self._engine()
                if engine is None:
                    return
                if self._armed and not self._fired:
                    self._sample()
                    if self._elapsed >= self._limit:
                        self._fired = True
                        engine.increment_epoch()
                    elif self.on_tick is not None:
                        self.on_tick()
                del engine


def _tick(limit: float) -> float:
    return min(TICK_SECONDS, limit / 10)


@dataclass
class _Ending:
    status: Status
    exit_code: int | None = None
    trap: str | None = None
    message: str = ""
    host_fault: bool = False


def run(
    spec: JobSpec,
    output_dir: Path | None = None,
    *,
    engine: wasmtime.Engine | None = None,
    module: wasmtime.Module | None = None,
    clock: Callable[[], float] = time.monotonic,
    streams_dir: Path | None = None,
    writable_root: Path | None = None,
    cache: ModuleCache | None = None,
    on_tick: Callable[[], None] | None = None,
) -> RunResult:
    """Run one job to its end. Never raises for anything the guest does; raises SandboxError only
    for host-side failures (an input file that vanished, an output_dir or streams_dir that cannot
    be written).

    `writable_root` (local conformance runs: `e31 sandbox run --writable-root`) gives the guest one
    writable directory preopened as "/" instead of /input and /output, starting with a copy of that
    host directory (never written back: the final tree goes to output_dir). It is a keyword of this
    function only, not part of a JobSpec: nothing that travels (a job, a worker request) can ask
    for it.

    `cache`, when no `module` is given, compiles the module through that compiled-module cache (or
    loads it from there).

    `on_tick` is called by the watchdog thread at each of its samples while the guest runs (about
    every TICK_SECONDS, the first one at most a tick after the start; none for a run shorter than
    that when the thread was ticking already): it must be quick and must not raise."""
    engine = engine or default_engine()
    state = _state(engine)
    if module is None and cache is not None:
        try:
            module = cache.get(engine, spec.module)
        except InvalidModule as e:
            return invalid_result(spec.limits, str(e))
    with _RUN_LOCK, contextlib.ExitStack() as files:
        spills = None if streams_dir is None else _spills(files, streams_dir)
        state.watchdog.on_tick = on_tick
        try:
            result, ctx = _run_locked(spec, output_dir, engine, module, clock, state, spills, writable_root)
        finally:
            state.watchdog.on_tick = None
        try:
            for stream in () if ctx is None else (ctx.stdout, ctx.stderr):
                if stream.error is not None:
                    raise stream.error
                if stream.sink is not None:
                    stream.sink.flush()
        except OSError as e:
            raise SandboxError(f"cannot write streams to {str(streams_dir)!r}: {e}") from e
        return result


Opener = Callable[[], BinaryIO]


def _spills(files: contextlib.ExitStack, streams_dir: Path) -> tuple[Opener, Opener]:
    """The openers of `streams_dir/stdout` and `/stderr`, called only for a stream that outgrows memory."""

    def opener(name: str) -> Opener:
        def open_sink() -> BinaryIO:
            make_private_dirs(streams_dir)
            return files.enter_context(open(streams_dir / name, "wb", buffering=SINK_BUFFER))

        return open_sink

    return opener("stdout"), opener("stderr")


def _run_locked(
    spec: JobSpec,
    output_dir: Path | None,
    engine: wasmtime.Engine,
    module: wasmtime.Module | None,
    clock: Callable[[], float],
    state: _EngineState,
    spills: tuple[Opener, Opener] | None,
    writable_root: Path | None,
) -> tuple[RunResult, wasi.Context | None]:
    limits = spec.limits
    if module is None:
        try:
            module = compile_module(engine, spec.module)
        except InvalidModule as e:
            return invalid_result(limits, str(e)), None
    else:
        try:
            check_imports(module)
        except InvalidModule as e:
            return invalid_result(limits, str(e)), None

    budget = OutputBudget(limits.max_output_bytes)
    tree = Tree(budget, writable_root=writable_root is not None)
    if writable_root is not None:
        if spec.input_files:
            raise JobSpecError("a writable root replaces /input: a job cannot have both")
        seed_from_dir(tree, writable_root)
    for f in spec.input_files:
        tree.add_input(f.parts, f.host_path, f.size)
    stdin = InputFile(0, 0, tree.input, spec.stdin, spec.stdin_size) if spec.stdin is not None else None
    try:
        ctx = wasi.Context(spec.args, spec.env, spec.seed, tree, budget, stdin, spills)
    except Errno as e:
        raise SandboxError(f"cannot open stdin file {str(spec.stdin)!r}") from e

    store = wasmtime.Store(engine)
    watchdog = state.watchdog
    instance: wasmtime.Instance | None = None
    try:
        store.set_limits(
            memory_size=limits.memory_bytes,
            table_elements=PROFILE.max_table_elements,
            instances=1,
            tables=MAX_TABLES,
            memories=1,
        )
        store.set_fuel(limits.fuel)
        store.set_epoch_deadline(1)
        guest_memory = state.slot.start(ctx)
        watchdog.arm(limits.wall_seconds, clock)
        try:
            instance = state.linker.instantiate(store, module)
            hostcall.call_start(store, instance)
            ending = _Ending(Status.EXITED, exit_code=0)
        except wasi.GuestExit as e:
            ending = _Ending(Status.EXITED, exit_code=e.code)
        except OutputLimit as e:
            ending = _Ending(Status.OUTPUT_LIMIT, message=str(e))
        except wasmtime.Trap as e:
            ending = _classify_trap(e)
        except wasmtime.WasmtimeError as e:
            ending = _classify_error(str(e))
        except Exception as e:  # a bug on our side, not the guest's: reported, never hidden
            ending = _Ending(
                Status.TRAP, trap="host_error", message=f"{type(e).__name__}: {e}", host_fault=True
            )
        finally:
            state.slot.end()
            elapsed, fired = watchdog.disarm()
        if fired and ending.status is Status.TRAP and ending.trap == "interrupt":
            ending = _Ending(Status.TIMEOUT, message=f"wall-clock limit of {limits.wall_seconds:g} s reached")
        peak = _memory_size(store, instance, guest_memory)
        if ending.status is Status.TRAP and not ending.host_fault and peak + WASM_PAGE > limits.memory_bytes:
            ending = _Ending(
                Status.MEMORY_LIMIT,
                trap=ending.trap,
                message=f"trapped at the memory limit ({limits.memory_bytes} bytes): {ending.message}",
            )
        # wasmtime under-reports fuel after an epoch stop: a timeout is charged its whole budget.
        fuel_used = limits.fuel if ending.status is Status.TIMEOUT else limits.fuel - store.get_fuel()
    finally:
        state.slot.end()
        ctx.close()
        store.close()

    if output_dir is not None:
        try:
            tree.write_output_dir(output_dir)
        except OSError as e:
            raise SandboxError(f"cannot write outputs to {str(output_dir)!r}: {e}") from e
    result = RunResult(
        status=ending.status,
        exit_code=ending.exit_code,
        trap=ending.trap,
        message=ending.message,
        fuel_used=fuel_used,
        fuel_limit=limits.fuel,
        wall_seconds=round(elapsed, 6),
        peak_memory_bytes=peak,
        stdout=bytes(ctx.stdout.kept),
        stderr=bytes(ctx.stderr.kept),
        stdout_sha256=ctx.stdout.sha.hexdigest(),
        stderr_sha256=ctx.stderr.sha.hexdigest(),
        output_files=tree.output_hashes(),
        output_bytes=budget.used,
        stdout_bytes=ctx.stdout.total,
        stderr_bytes=ctx.stderr.total,
        profile_digest=PROFILE.digest_hex,
        reverifiable=ending.status in REVERIFIABLE and not ending.host_fault,
    )
    return result, ctx


def invalid_result(limits: Limits, message: str) -> RunResult:
    """The result of a job whose module was refused before it ran (reverifiable: compilation is)."""
    return RunResult(
        status=Status.INVALID_MODULE,
        exit_code=None,
        trap=None,
        message=message,
        fuel_used=0,
        fuel_limit=limits.fuel,
        wall_seconds=0.0,
        peak_memory_bytes=0,
        stdout=b"",
        stdout_sha256=_EMPTY_SHA,
        stderr_sha256=_EMPTY_SHA,
        output_files={},
        output_bytes=0,
        profile_digest=PROFILE.digest_hex,
        reverifiable=True,
    )


def _classify_trap(trap: wasmtime.Trap) -> _Ending:
    code = trap.trap_code
    message = _first_line(trap.message, "trap")
    if code is wasmtime.TrapCode.OUT_OF_FUEL:
        return _Ending(Status.OUT_OF_FUEL, message="fuel budget exhausted")
    if code is None:
        return _Ending(Status.TRAP, trap="unknown", message=message)
    return _Ending(Status.TRAP, trap=code.name.lower(), message=message)


def _classify_error(text: str) -> _Ending:
    """Instantiation failures that are not traps: limits the module's declarations break."""
    message = _first_line(text, "instantiation failed")
    if "exceeds memory limits" in text or "memory minimum size" in text:
        return _Ending(Status.MEMORY_LIMIT, message=message)
    if "table minimum size" in text or "exceeds table limits" in text:
        return _Ending(Status.MEMORY_LIMIT, message=message)
    return _Ending(Status.TRAP, trap="instantiation", message=message)


def _memory_size(
    store: wasmtime.Store, instance: wasmtime.Instance | None, guest_memory: hostcall.GuestMemory
) -> int:
    """Bytes of linear memory at the end (memory never shrinks, so this is the peak)."""
    mem = guest_memory.as_wasmtime()
    if mem is None and instance is not None:
        mem = next((x for x in instance.exports(store).by_index if isinstance(x, wasmtime.Memory)), None)
    return mem.data_len(store) if mem is not None else 0


__all__ = ["check_imports", "compile_module", "default_engine", "invalid_result", "run", "wat_to_wasm"]
