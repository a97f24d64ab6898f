"""`e31 sandbox run MODULE`: run one WebAssembly module locally, exactly as a job would run.

The module is compiled through the compiled-module cache the node's workers use (sandbox/cache.py),
in `<data dir>/module-cache`: a module compiles once per machine, later runs load it in milliseconds.
`--no-cache` compiles in memory only.

Exit codes (docs/submitting.md has the table): the guest's own exit code when it exits (0 for
success; 1-119 passed through; a larger code exits 119), then one code per other outcome
(`OUTCOME_EXIT_CODES`: invalid_module 120, trap 121, out_of_fuel 122, memory_limit 123,
timeout 124, output_limit 125). e31's own failures keep the CLI's codes: 2 for usage errors
(missing files, bad options), 1 for host failures; their one line starts with "e31: error:".
The guest's stdout goes to stdout and its stderr to stderr, whole, then the summary to stderr.

wasmtime is imported only through e31.sandbox, and only once a run is asked for.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from ..config import add_data_dir_argument, resolve_data_dir
from . import options
from .main import CliError

if TYPE_CHECKING:
    from e31.sandbox.cache import ModuleCache
    from e31.sandbox.limits import Limits, RunResult

CACHE_SUBDIR = "module-cache"
"""The cache's directory under the data dir: the one the node's workers use (market/service.py)."""

GUEST_EXIT_MAX = 119
"""The largest guest exit code passed through as it is; a larger one exits with this."""

OUTCOME_EXIT_CODES = {
    "invalid_module": 120,
    "trap": 121,
    "out_of_fuel": 122,
    "memory_limit": 123,
    "timeout": 124,
    "output_limit": 125,
}


def _seed(text: str) -> bytes:
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise argparse.ArgumentTypeError("seed must be 64 hex digits (32 bytes)")
    return raw


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="sandbox_command", metavar="ACTION", required=True)
    p = sub.add_parser(
        "run",
        help="run one module under the job limits and report the outcome",
        description="Run one WebAssembly/WASI module (.wasm or .wat) in the e31 sandbox.",
        epilog="example: e31 sandbox run --input data/ wordfreq.wasm -- 10",
    )
    p.add_argument("module", metavar="MODULE", type=Path, help="the module: a .wasm binary or .wat text")
    p.add_argument(
        "guest_args",
        nargs="*",
        metavar="ARG",
        help="arguments for the guest after MODULE (put any that start with '-' after `--`); "
        "appended to any --arg",
    )
    p.set_defaults(accepts_passthrough=True)
    options.add_job_arguments(p)  # --input, --arg, --env, --stdin: as `e31 submit` has them
    p.add_argument(
        "--output",
        type=Path,
        metavar="DIR",
        help="directory where the guest's /output files are written after the run",
    )
    options.add_limit_arguments(p)
    p.add_argument("--seed", type=_seed, metavar="HEX", help="32-byte seed for random_get (default zeros)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a summary")
    add_run_arguments(p)


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of a local run only: the module cache and the conformance root."""
    add_data_dir_argument(parser)
    parser.add_argument(
        "--no-cache",
        action="store_true",
        help="compile the module in memory only (default: through <data dir>/module-cache)",
    )
    parser.add_argument(
        "--writable-root",
        type=Path,
        metavar="DIR",
        help="conformance runs: give the guest one writable directory preopened as / (starting as a "
        "copy of DIR, which is never changed; the final tree goes to --output) instead of /input "
        "and /output. Local runs only: no job from the network can ask for it",
    )


def limits_from(args: argparse.Namespace) -> Limits:
    """The job limits the options ask for, the sandbox's defaults for the rest (raises JobSpecError)."""
    from e31.sandbox.limits import Limits

    chosen = {
        k: v
        for k, v in (
            ("fuel", args.fuel),
            ("memory_bytes", args.memory),
            ("wall_seconds", args.timeout),
            ("max_output_bytes", args.max_output),
        )
        if v is not None
    }
    return Limits(**chosen)


def _read_module(path: Path) -> bytes:
    from e31.sandbox.job import MAX_MODULE_BYTES

    if not path.is_file():
        raise CliError(f"module {str(path)!r}: no such file", 2)
    try:
        with path.open("rb") as f:
            return f.read(MAX_MODULE_BYTES + 1)
    except OSError as e:
        raise CliError(f"module {str(path)!r}: {e.strerror or e}", 2) from e


def run(args: argparse.Namespace) -> int:
    from e31.sandbox.errors import InvalidModule, JobSpecError, SandboxError
    from e31.sandbox.job import JobSpec
    from e31.sandbox.profile import PROFILE
    from e31.sandbox.runner import invalid_result, run, wat_to_wasm

    raw = _read_module(args.module)
    if args.output is not None and args.output.exists() and not args.output.is_dir():
        raise CliError(f"--output {str(args.output)!r} exists and is not a directory", 2)
    if args.stdin is not None and not args.stdin.is_file():
        raise CliError(f"--stdin {str(args.stdin)!r}: no such file", 2)
    if args.writable_root is not None:
        if args.input:
            raise CliError("--writable-root replaces /input: give one of --input and --writable-root", 2)
        if not args.writable_root.is_dir():
            raise CliError(f"--writable-root {str(args.writable_root)!r}: not a directory", 2)
    try:
        limits = limits_from(args)
        inputs = dict(options.input_entries(args.input))
    except JobSpecError as e:
        raise CliError(str(e), 2) from e

    module: bytes | None = raw
    refused: str | None = None
    if args.module.suffix.lower() == ".wat":
        try:
            module = wat_to_wasm(raw)
        except InvalidModule as e:
            module, refused = None, str(e)
    try:
        spec = JobSpec(
            module=module or b"",
            args=(*args.arg, *args.guest_args, *args.passthrough),
            env=tuple(args.env),
            stdin=args.stdin,
            inputs=inputs,
            limits=limits,
            **({"seed": args.seed} if args.seed else {}),
        )
    except JobSpecError as e:
        raise CliError(str(e), 2) from e
    with tempfile.TemporaryDirectory(prefix="e31-sandbox-run-") as tmp:
        streams = Path(tmp) / "streams"
        if refused is not None:
            result = invalid_result(limits, refused)
        else:
            try:
                result = run(
                    spec,
                    args.output,
                    streams_dir=streams,
                    writable_root=args.writable_root,
                    cache=_cache(args),
                )
            except JobSpecError as e:
                raise CliError(str(e), 2) from e
            except SandboxError as e:
                raise CliError(str(e), 1) from e

        if args.json:
            doc: dict[str, Any] = result.to_json_dict()
            doc["module_sha256"] = spec.module_sha256
            doc["profile"] = {"digest": PROFILE.digest_hex, **PROFILE.as_dict()}
            print(json.dumps(doc, indent=2, sort_keys=False))
        else:
            _copy_stream(result, streams, "stdout", sys.stdout.buffer)
            sys.stderr.flush()
            _copy_stream(result, streams, "stderr", sys.stderr.buffer)
            print(_summary(result), file=sys.stderr)
    return exit_code(result)


def exit_code(r: RunResult) -> int:
    """The process's exit code for an outcome (the table in the module's docstring)."""
    if str(r.status) == "exited":
        code = r.exit_code or 0
        return code if 0 <= code <= GUEST_EXIT_MAX else GUEST_EXIT_MAX
    return OUTCOME_EXIT_CODES[str(r.status)]


def _cache(args: argparse.Namespace) -> ModuleCache | None:
    """The compiled-module cache under the data dir, or None to compile in memory (--no-cache, or a
    cache directory that cannot be used: a warning says why)."""
    from e31.sandbox.cache import CacheError, ModuleCache

    if args.no_cache:
        return None
    directory = resolve_data_dir(args.data_dir) / CACHE_SUBDIR
    try:
        return ModuleCache(directory, memory_entries=0)
    except (CacheError, OSError) as e:
        print(f"e31: warning: compiling without the module cache: {e}", file=sys.stderr)
        return None


def _copy_stream(r: RunResult, streams: Path, name: str, out: BinaryIO) -> None:
    """Write the guest's whole stdout or stderr (held in the result, or spilled under `streams`)."""
    from e31.sandbox.limits import whole_stream

    whole = whole_stream(r, streams, name)
    if isinstance(whole, bytes):
        out.write(whole)
    else:
        with whole.open("rb") as f:
            shutil.copyfileobj(f, out)
    out.flush()


def _summary(r: RunResult) -> str:
    outcome = str(r.status)
    if r.exit_code is not None:
        outcome += f" (exit code {r.exit_code})"
    if r.trap:
        outcome += f" (trap: {r.trap})"
    lines = [f"e31 sandbox: {outcome}"]
    if r.message:
        lines.append(f"  {r.message}")
    lines.append(
        f"  fuel {r.fuel_used:,} of {r.fuel_limit:,}; {r.wall_seconds:.3f} s; "
        f"memory {r.peak_memory_bytes:,} bytes; output {r.output_bytes:,} bytes"
    )
    for name, digest in sorted(r.output_files.items()):
        lines.append(f"  /output/{name}  sha256 {digest}")
    if not r.reverifiable:
        lines.append("  not re-verifiable (stopped by the wall clock or a host fault)")
    return "\n".join(lines)
