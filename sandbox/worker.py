"""The worker process: runs jobs one at a time for a WorkerPool (pool.py), and the pipe protocol both
sides speak.

A worker is `python -m e31.sandbox.worker` started by the pool with three inherited descriptors: a
pipe it reads requests from, a pipe it writes replies to, and an 8-byte shared page holding the
nanoseconds the pool has kept it stopped (SIGSTOP) in total. On start it applies its OS limits (a
second fence behind wasmtime's: RLIMIT_DATA, RLIMIT_FSIZE, RLIMIT_CORE=0; never RLIMIT_AS, which
wasmtime's 4 GiB+ reservations per memory would break), builds one engine and a module cache, says
`ready`, then serves requests until its request pipe closes.

Frames are a 4-byte big-endian length and a msgpack array. Requests:
`["run", id, spec, output_dir, streams_dir]` (the directories as bytes or nil) and `["quit"]`. A spec's
module is its bytes, or `[digest]` (a one-element array of its 32-byte SHA-256) for a module the pool sent
this worker before and both sides still remember: each keeps the same ModuleMemo of the modules sent
(fed the same requests in the same order), so a job of a module the worker has costs no module bytes
on the pipe and no hashing of them; a reference the worker does not hold breaks the protocol.
Replies: `["ready", pid]`, `["started", id]`, `["result", id, result]`, `["error", id, class_name,
message]` (a SandboxError from the host side, re-raised in the caller). `started` says the module is
compiled or loaded and the job's own wall clock runs; the runner's watchdog thread sends it at its first
sample of the run, at most a tick (20 ms) late, and not at all for a job whose result comes first,
which says as much: a tiny job costs one reply frame and one wake-up of the pool's thread, not two.
Results travel as plain msgpack, never pickle: the worker runs untrusted code, and a worker taken over
through a wasmtime bug must not be able to run code in the node by what it sends back; the pool
validates every reply field by field.

Paused time: the job's clock is CLOCK_MONOTONIC minus the shared stopped-time counter. The pool writes
the counter only while the worker is stopped, before SIGCONT, so the worker never sees a jump and a
paused job's wall limit is not consumed while it is paused.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import mmap
import os
import resource
import signal
import struct
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import msgpack

from .errors import InvalidModule, JobSpecError, ProfileMismatch, SandboxError
from .job import JobSpec, module_digest
from .limits import Limits, RunResult, Status

MAX_FRAME = 256 * 1024 * 1024
SHM_BYTES = 8
EXIT_PROTOCOL = 3
EXIT_OUT_OF_MEMORY = 86
"""Exit status of a worker whose Python heap hit RLIMIT_DATA (the pool reports `worker_limit`)."""
EXIT_ORPHANED = 87
"""Exit status of a worker whose pool process died (it must not go on running a job nobody awaits)."""
PARENT_CHECK_SECONDS = 0.2
_LEN = struct.Struct(">I")
_NS = struct.Struct("<q")

ERRORS: dict[str, type[SandboxError]] = {
    c.__name__: c for c in (SandboxError, JobSpecError, InvalidModule, ProfileMismatch)
}
"""The host-side errors a worker may report; anything else is reported as SandboxError."""


class ProtocolViolation(Exception):
    """A frame or message that breaks the worker protocol."""


# -- framing -------------------------------------------------------------------------------------


def write_frame(out: BinaryIO, message: list[Any]) -> None:
    payload = msgpack.packb(message, use_bin_type=True)
    out.write(_LEN.pack(len(payload)) + payload)
    out.flush()


def read_frame(inp: BinaryIO) -> list[Any] | None:
    """The next message, or None at a clean end of stream."""
    head = _read_exact(inp, _LEN.size, eof_ok=True)
    if head is None:
        return None
    (n,) = _LEN.unpack(head)
    if n > MAX_FRAME:
        raise ProtocolViolation(f"frame of {n} bytes exceeds {MAX_FRAME}")
    payload = _read_exact(inp, n, eof_ok=False)
    assert payload is not None
    try:
        message = msgpack.unpackb(payload, raw=False, strict_map_key=True, use_list=True)
    except Exception as e:  # msgpack raises several unrelated types
        raise ProtocolViolation(f"undecodable frame: {e}") from None
    if not isinstance(message, list) or not message or not isinstance(message[0], str):
        raise ProtocolViolation("a frame must be a non-empty array starting with its kind")
    return message


def _read_exact(inp: BinaryIO, n: int, *, eof_ok: bool) -> bytes | None:
    first = inp.read(n)  # a buffered pipe gives all n bytes at once unless the stream ends
    if len(first) == n:
        return first
    buf = bytearray(first)
    if not first and eof_ok:
        return None
    while len(buf) < n:
        chunk = inp.read(n - len(buf))
        if not chunk:
            if eof_ok and not buf:
                return None
            raise ProtocolViolation("stream ended inside a frame")
        buf += chunk
    return bytes(buf)


# -- job specs and results on the wire -----------------------------------------------------------

MEMO_MODULES = 8
MEMO_BYTES = 64 * 1024 * 1024


class ModuleMemo:
    """The modules a worker was sent and keeps (the worker's memo, `keep=True`, holds their bytes) or is
    known to keep (the pool's, which holds only their sizes), most recently used last: at most
    MEMO_MODULES of them and MEMO_BYTES in all. The pool and its worker apply `sent` and `get` to the
    same modules in the same order, so they always agree on what the worker holds."""

    def __init__(self, *, keep: bool) -> None:
        self._keep = keep
        self._modules: OrderedDict[bytes, tuple[int, bytes | None]] = OrderedDict()
        self._bytes = 0

    def get(self, digest: bytes) -> bytes | None:
        """The module (its bytes; b"" in the pool's memo) if held, marked as just used; else None."""
        entry = self._modules.get(digest)
        if entry is None:
            return None
        self._modules.move_to_end(digest)
        return entry[1] if entry[1] is not None else b""

    def sent(self, digest: bytes, module: bytes) -> None:
        if digest in self._modules:
            self._modules.move_to_end(digest)
            return
        if len(module) > MEMO_BYTES:
            return
        self._modules[digest] = (len(module), module if self._keep else None)
        self._bytes += len(module)
        while len(self._modules) > MEMO_MODULES or self._bytes > MEMO_BYTES:
            _, (size, _) = self._modules.popitem(last=False)
            self._bytes -= size


def encode_spec(spec: JobSpec, memo: ModuleMemo | None = None) -> list[Any]:
    """Host paths travel absolute: a worker's working directory is the pool's at spawn time. With `memo`
    (the pool's copy of what the worker holds), a module it holds travels as `[digest]`."""
    lim = spec.limits
    module: bytes | list[bytes] = spec.module
    if memo is not None:
        digest = bytes.fromhex(spec.module_sha256)
        if memo.get(digest) is not None:
            module = [digest]
        else:
            memo.sent(digest, spec.module)
    return [
        module,
        list(spec.args),
        [list(kv) for kv in spec.env],
        None if spec.stdin is None else os.fsencode(os.path.abspath(spec.stdin)),
        [[name, os.fsencode(os.path.abspath(path))] for name, path in spec.inputs.items()],
        [lim.fuel, lim.memory_bytes, lim.wall_seconds, lim.max_output_bytes],
        spec.seed,
    ]


def decode_spec(obj: Any, memo: ModuleMemo | None = None) -> JobSpec:
    """Rebuilds (and so re-validates) a JobSpec; raises ProtocolViolation or JobSpecError. With `memo` (the
    worker's), a module sent as `[digest]` is taken from it, and a module sent whole is remembered."""
    try:
        module, args, env, stdin, inputs, limits, seed = obj
        if memo is not None and isinstance(module, list):
            held = memo.get(module[0]) if len(module) == 1 and isinstance(module[0], bytes) else None
            if held is None:
                raise ProtocolViolation("a module reference this worker does not hold")
            module = held
        elif memo is not None and isinstance(module, bytes):
            memo.sent(bytes.fromhex(module_digest(module)), module)
        fuel, memory_bytes, wall_seconds, max_output_bytes = limits
        return JobSpec(
            module=module,
            args=tuple(args),
            env=tuple((k, v) for k, v in env),
            stdin=None if stdin is None else Path(os.fsdecode(stdin)),
            inputs={name: Path(os.fsdecode(path)) for name, path in inputs},
            limits=Limits(fuel, memory_bytes, wall_seconds, max_output_bytes),
            seed=seed,
        )
    except (TypeError, ValueError) as e:
        if isinstance(e, JobSpecError):
            raise
        raise ProtocolViolation(f"malformed job spec: {e}") from None


_RESULT_FIELDS = tuple(f.name for f in dataclasses.fields(RunResult))
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "Status": (str,),
    "int": (int,),
    "float": (float, int),
    "str": (str,),
    "bytes": (bytes,),
    "bool": (bool,),
    "None": (type(None),),
    "dict[str, str]": (dict,),
}


def _allowed(annotation: object) -> tuple[type, ...]:
    allowed: tuple[type, ...] = ()
    for part in str(annotation).split("|"):
        allowed += _FIELD_TYPES[part.strip()]
    return allowed


_RESULT_TYPES = {f.name: _allowed(f.type) for f in dataclasses.fields(RunResult)}


def encode_result(result: RunResult) -> list[Any]:
    return [
        str(v) if isinstance(v, Status) else v for v in (getattr(result, name) for name in _RESULT_FIELDS)
    ]


def decode_result(obj: Any) -> RunResult:
    """Rebuilds a RunResult from a worker's reply, checking every field; raises ProtocolViolation."""
    if not isinstance(obj, list) or len(obj) != len(_RESULT_FIELDS):
        raise ProtocolViolation("a result must be an array of the RunResult fields")
    values: dict[str, Any] = {}
    for name, value in zip(_RESULT_FIELDS, obj, strict=True):
        allowed = _RESULT_TYPES[name]
        if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
            raise ProtocolViolation(f"result field {name} has type {type(value).__name__}")
        values[name] = value
    try:
        values["status"] = Status(values["status"])
    except ValueError:
        raise ProtocolViolation(f"unknown status {values['status']!r}") from None
    files = values["output_files"]
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
        raise ProtocolViolation("output_files must map names to hex digests")
    return RunResult(**values)


# -- the worker process ----------------------------------------------------------------------------


def apply_limits(data_bytes: int | None, file_bytes: int | None) -> None:
    """The worker's OS limits. Lowering a soft limit is always allowed; the hard limit is kept.
    Python ignores SIGXFSZ; a worker takes the default again, so passing RLIMIT_FSIZE kills it
    (the pool reports `worker_limit`) instead of failing one write in some layer that may retry."""
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    for which, value in (
        (resource.RLIMIT_DATA, data_bytes),
        (resource.RLIMIT_FSIZE, file_bytes),
        (resource.RLIMIT_CORE, 0),
    ):
        if value is None:
            continue
        _, hard = resource.getrlimit(which)
        soft = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (soft, hard))


def paused_clock(shm: mmap.mmap) -> Callable[[], float]:
    """CLOCK_MONOTONIC minus the time the pool has kept this process stopped."""
    monotonic, unpack = time.monotonic, _NS.unpack_from

    def clock() -> float:
        paused_ns: int = unpack(shm, 0)[0]
        return monotonic() - paused_ns / 1e9

    return clock


class Replies:
    """The reply pipe, shared by the serving thread and the runner's watchdog thread, which sends a
    running job's `started` late (runner.run's `on_tick`): the serving thread only notes the job (no
    wake-up of anyone), and a job that ends before the watchdog's next sample never has it sent."""

    def __init__(self, out: BinaryIO, *, late_started: bool) -> None:
        self._out = out
        self._lock = threading.Lock()
        self._late = late_started
        self._pending: int | None = None

    def write(self, message: list[Any]) -> None:
        with self._lock:
            self._pending = None
            write_frame(self._out, message)

    def started(self, job_id: int) -> None:
        if not self._late:
            self.write(["started", job_id])
            return
        with self._lock:
            self._pending = job_id

    def tick(self) -> None:
        """Send the running job's `started` if it is not sent yet (called by the watchdog thread)."""
        with self._lock:
            if self._pending is not None:
                job_id, self._pending = self._pending, None
                with contextlib.suppress(OSError, ValueError):  # the pool is gone: serve() finds out
                    write_frame(self._out, ["started", job_id])


def serve(
    inp: BinaryIO,
    out: BinaryIO,
    cache_dir: Path,
    clock: Callable[[], float],
    *,
    late_started: bool = True,
) -> int:
    """Serve requests until the request pipe closes. `started` is sent late (Replies), unless
    `late_started` is False: then at once."""
    from .cache import ModuleCache
    from .profile import new_engine
    from .runner import run

    engine = new_engine()
    cache = ModuleCache(cache_dir)
    memo = ModuleMemo(keep=True)
    replies = Replies(out, late_started=late_started)
    replies.write(["ready", os.getpid()])
    while True:
        message = read_frame(inp)
        if message is None or message[0] == "quit":
            return 0
        if message[0] != "run" or len(message) != 5 or not isinstance(message[1], int):
            raise ProtocolViolation(f"unexpected request {message[0]!r}")
        _, job_id, raw_spec, raw_dir, raw_streams = message
        try:
            spec = decode_spec(raw_spec, memo)
            output_dir = _decode_dir(raw_dir, "output_dir")
            streams_dir = _decode_dir(raw_streams, "streams_dir")
            try:
                module = cache.get(engine, spec.module, bytes.fromhex(spec.module_sha256))
            except InvalidModule:
                module = None  # the runner reports it as an invalid_module result
            replies.started(job_id)
            result = run(
                spec,
                output_dir,
                engine=engine,
                module=module,
                clock=clock,
                streams_dir=streams_dir,
                on_tick=replies.tick,
            )
        except SandboxError as e:
            name = type(e).__name__ if type(e).__name__ in ERRORS else "SandboxError"
            replies.write(["error", job_id, name, str(e)])
            continue
        replies.write(["result", job_id, encode_result(result)])


def _decode_dir(raw: object, what: str) -> Path | None:
    if raw is None:
        return None
    if not isinstance(raw, bytes) or not raw:
        raise ProtocolViolation(f"{what} must be bytes or nil")
    return Path(os.fsdecode(raw))


def watch_parent(interval: float = PARENT_CHECK_SECONDS, parent: int | None = None) -> threading.Thread:
    """Exit at once when the process that started this worker dies (a node killed with SIGKILL), even
    in the middle of a job: its restarted node runs the job again, and two runs of it must not overlap.
    Workers live in their own session (so a terminal's ^C reaches only the node), which is why the kernel
    would not stop them; PR_SET_PDEATHSIG cannot be used either, as it fires when the *thread* that
    spawned the worker ends, and the pool spawns from short-lived threads. `parent` is the pool's pid as
    it passed it (`--parent`), so a pool that died before this line ran is noticed too; a worker that
    is stopped cannot notice at all, and the next pool kills it (sandbox/orphans.py)."""
    parent = os.getppid() if parent is None else parent

    def loop() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        os._exit(EXIT_ORPHANED)

    thread = threading.Thread(target=loop, name="e31-worker-parent-watch", daemon=True)
    thread.start()
    return thread


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m e31.sandbox.worker",
        description="An e31 sandbox worker (started by WorkerPool, not by hand).",
    )
    p.add_argument("--request-fd", type=int, required=True)
    p.add_argument("--reply-fd", type=int, required=True)
    p.add_argument("--paused-fd", type=int, required=True)
    p.add_argument("--cache-dir", type=Path, required=True)
    p.add_argument("--data-limit", type=int)
    p.add_argument("--file-size-limit", type=int)
    p.add_argument("--parent", type=int, help="the pid of the pool process (default: the parent)")
    args = p.parse_args(argv)
    watch_parent(parent=args.parent)
    apply_limits(args.data_limit, args.file_size_limit)
    shm = mmap.mmap(args.paused_fd, SHM_BYTES, mmap.MAP_SHARED, mmap.PROT_READ)
    os.close(args.paused_fd)
    with open(args.request_fd, "rb") as inp, open(args.reply_fd, "wb") as out:
        try:
            return serve(inp, out, args.cache_dir, paused_clock(shm))
        except ProtocolViolation as e:
            print(f"e31 worker {os.getpid()}: {e}", file=sys.stderr)
            return EXIT_PROTOCOL
        except MemoryError:
            return EXIT_OUT_OF_MEMORY
        except BrokenPipeError:
            return 0


if __name__ == "__main__":
    sys.exit(main())
