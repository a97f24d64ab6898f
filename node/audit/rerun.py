"""Re-running a job from a bundle in the local sandbox, and comparing the run with a receipt.

The run uses what the executor used: the manifest's arguments, environment and limits (the wall clock
allowing WALL_FACTOR times the job's, as this machine may be slower), the bundle's module, input and
stdin blobs, and the job's seed (its job id). The comparison is exact: outcome, fuel, and stdout,
stderr and output files by blob root and size. The sandbox writes the whole stdout and stderr into a
streams directory as the guest writes them, so both streams are compared by root, whatever their size.
The sandbox (wasmtime) is imported only when a job actually runs.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from e31.protocol.blobs import CHUNK_SIZE, BlobHasher, BlobRef, ChunkList, blob_ref
from e31.protocol.ids import Digest
from e31.protocol.jobs import FileRef, JobManifest
from e31.protocol.receipts import TRAP_MAX, Outcome, UsageReceipt

if TYPE_CHECKING:
    from e31.sandbox.limits import RunResult

WALL_FACTOR = 4
"""A re-run may take this many times the job's wall-clock limit: this machine may be slower."""


def job_seed(job_id: Digest) -> bytes:
    """The 32-byte seed of a job's `random_get` stream: its job id."""
    return job_id.raw


@dataclass(frozen=True, slots=True)
class Rerun:
    """What a local re-run of a job produced, in the receipt's terms."""

    outcome: Outcome
    fuel_used: int
    stdout: BlobRef | None
    stdout_size: int
    stderr: BlobRef | None
    stderr_size: int
    outputs: tuple[FileRef, ...]
    stopped_by_clock: bool
    wall_seconds: float
    unchecked: tuple[str, ...] = ()
    error: str | None = None
    """Why the sandbox could not run the job here at all (then nothing else is meaningful)."""

    def differences(self, r: UsageReceipt) -> list[str]:
        out = []
        if self.outcome != r.outcome:
            out.append(f"outcome {outcome_text(r.outcome)} claimed, {outcome_text(self.outcome)} measured")
        if self.fuel_used != r.fuel_used:
            out.append(f"fuel_used {r.fuel_used} claimed, {self.fuel_used} measured")
        for name, mine, size, theirs in (
            ("stdout", self.stdout, self.stdout_size, r.stdout),
            ("stderr", self.stderr, self.stderr_size, r.stderr),
        ):
            if size != theirs.size:
                out.append(f"{name} of {theirs.size} bytes claimed, {size} measured")
            elif mine is not None and mine != theirs:
                out.append(f"{name} hash {theirs.root.hex()[:16]} claimed, {mine.root.hex()[:16]} measured")
        if self.outputs != r.outputs:
            claimed = {f.name: f.blob for f in r.outputs}
            mine_files = {f.name: f.blob for f in self.outputs}
            names = sorted(set(claimed) ^ set(mine_files))
            changed = sorted(n for n in set(claimed) & set(mine_files) if claimed[n] != mine_files[n])
            if names:
                out.append(
                    f"output files {', '.join(names[:5])} are in only one of the receipt and the re-run"
                )
            if changed:
                out.append(f"output files {', '.join(changed[:5])} differ")
        return out


def rerun_job(
    manifest: JobManifest, blobs: dict[bytes, bytes], *, modules: dict[bytes, Any] | None = None
) -> Rerun:
    """Run a job again in the local sandbox from the bundle's blobs (which must hold all it needs).

    `modules` caches compiled modules by blob root across calls (many jobs share one module)."""
    from e31.sandbox.errors import InvalidModule, SandboxError
    from e31.sandbox.job import JobSpec
    from e31.sandbox.limits import Limits
    from e31.sandbox.runner import compile_module, default_engine, run

    compiled = None
    if modules is not None:
        name = manifest.module.root.raw
        if name not in modules:
            try:
                modules[name] = compile_module(default_engine(), blobs[name])
            except InvalidModule:
                modules[name] = None  # run() reports it as the invalid_module outcome
        compiled = modules[name]

    lim = manifest.limits
    wall = min(max(lim.wall_ms / 1000 * WALL_FACTOR, 1.0), Limits.MAX_WALL_SECONDS)
    with tempfile.TemporaryDirectory(prefix="e31-audit-") as tmp:
        root = Path(tmp)
        try:
            inputs = {}
            for i, f in enumerate(manifest.inputs):
                path = root / f"input-{i}"
                path.write_bytes(blobs[f.blob.root.raw])
                inputs[f.name] = path
            stdin = None
            if manifest.stdin is not None:
                stdin = root / "stdin"
                stdin.write_bytes(blobs[manifest.stdin.root.raw])
            spec = JobSpec(
                module=blobs[manifest.module.root.raw],
                args=manifest.args,
                env=tuple((e.name, e.value) for e in manifest.env),
                stdin=stdin,
                inputs=inputs,
                limits=Limits(
                    fuel=lim.fuel,
                    memory_bytes=lim.memory_bytes,
                    wall_seconds=wall,
                    max_output_bytes=lim.max_output_bytes,
                ),
                seed=job_seed(manifest.job_id),
            )
            result = run(spec, root / "output", module=compiled, streams_dir=root / "streams")
            outputs = _output_files(root / "output")
            streams = (
                _stream_ref(result, root / "streams", "stdout"),
                _stream_ref(result, root / "streams", "stderr"),
            )
        except (SandboxError, OSError) as e:
            return _failed_rerun(f"the sandbox could not run the job here: {e}")
    return _rerun_from(result, outputs, streams)


def _stream_ref(result: RunResult, streams: Path, name: str) -> BlobRef | None:
    """The blob root of a run's whole stream: from the result when it holds it whole, else from the
    file the run spilled it to, hashed in pieces; None when the run left no such file."""
    from e31.sandbox.limits import whole_stream

    where = whole_stream(result, streams, name)
    return blob_ref(where) if isinstance(where, bytes) else _file_ref(where)


def _file_ref(path: Path) -> BlobRef | None:
    """The blob root of a stream file, hashed in pieces; None when the run left no such file."""
    if not path.is_file():
        return None
    hasher = BlobHasher()
    with path.open("rb") as f:
        while piece := f.read(CHUNK_SIZE):
            hasher.update(piece)
    return hasher.finish().ref


def _rerun_from(
    result: RunResult, outputs: tuple[FileRef, ...], streams: tuple[BlobRef | None, BlobRef | None]
) -> Rerun:
    unchecked = []
    refs = []
    for name, ref in zip(("stdout", "stderr"), streams, strict=True):
        _, size, sha = result.stream(name)
        if ref is None:  # its file went missing: a stream of one chunk still has its root from the hash
            ref = _ref_from_hash(sha, size)
        if ref is None:
            unchecked.append(
                f"{name} of {size} bytes was compared by size only (the sandbox keeps "
                "only the SHA-256 of that much output)"
            )
        refs.append(ref)
    stdout_ref, stderr_ref = refs
    status = str(result.status)
    exit_code = (result.exit_code or 0) if status == "exited" else None
    outcome = Outcome(
        status, exit_code, ((result.trap or "unknown")[:TRAP_MAX] or "unknown") if status == "trap" else None
    )
    return Rerun(
        outcome,
        result.fuel_used,
        stdout_ref,
        result.stdout_bytes,
        stderr_ref,
        result.stderr_bytes,
        outputs,
        status == "timeout",
        result.wall_seconds,
        tuple(unchecked),
    )


def _failed_rerun(message: str) -> Rerun:
    return Rerun(Outcome("trap", None, "host_error"), 0, None, 0, None, 0, (), False, 0.0, error=message)


def _ref_from_hash(sha_hex: str, size: int) -> BlobRef | None:
    """A blob's root from its plain SHA-256, possible when it fits in one chunk."""
    if size == 0:
        return ChunkList(0, ()).ref
    if size <= CHUNK_SIZE:
        return ChunkList(size, (Digest(bytes.fromhex(sha_hex)),)).ref
    return None


def _output_files(root: Path) -> tuple[FileRef, ...]:
    if not root.is_dir():
        return ()
    files = [
        FileRef(p.relative_to(root).as_posix(), blob_ref(p.read_bytes()))
        for p in root.rglob("*")
        if p.is_file()
    ]
    return tuple(sorted(files, key=lambda f: f.name))


def blobs_of(manifest: JobManifest) -> Iterable[tuple[str, BlobRef]]:
    yield "module", manifest.module
    for f in manifest.inputs:
        yield f"input {f.name!r}", f.blob
    if manifest.stdin is not None:
        yield "stdin", manifest.stdin


def outcome_text(o: Outcome) -> str:
    if o.status == "exited":
        return f"exited({o.exit_code})"
    if o.status == "trap":
        return f"trap({o.trap})"
    return o.status
