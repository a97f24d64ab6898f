"""Realistic signed job records for the receipt-log, bundle and audit tests, built without a network.

Each job is a real sandbox run of a shipped workload (so fuel counts and output hashes are real),
wrapped in the envelopes the market would have produced: a signed offer (of that job alone, or of a
set of jobs: make_set), a bid and an assignment, the executor's receipt and the submitter's
acknowledgement. Runs are cached per process.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import nacl.signing
import wasmtime
from e31.protocol.blobs import BlobRef, ChunkList, blob_ref
from e31.protocol.envelope import node_id_of, sign_message, verify
from e31.protocol.ids import Digest, NodeId
from e31.protocol.jobs import FileRef, JobManifest, Limits
from e31.protocol.messages import BY_JOB, Ack, Assign, Bid, BidItem, Offer, UsageReceipt
from e31.protocol.receipts import Outcome
from e31.sandbox import limits as sandbox_limits
from e31.sandbox.job import JobSpec
from e31.sandbox.profile import PROFILE
from e31.sandbox.runner import compile_module, default_engine, run

NET = "e31-audit-test"
T0 = 1_767_225_600_000
WORKLOADS = Path(__file__).resolve().parents[2] / "sandbox" / "workloads"
LIMITS = Limits(fuel=2_000_000_000, memory_bytes=64 << 20, wall_ms=60_000, max_output_bytes=1 << 20)
MANDELBROT_ARGS = ("64", "48", "0", "0", "32", "24", "200")
MONTECARLO_ARGS = ("42", "20000", "--entropy")


def key(name: str) -> nacl.signing.SigningKey:
    return nacl.signing.SigningKey(hashlib.sha256(b"e31 audit test key " + name.encode()).digest())


def nid(name: str) -> NodeId:
    return node_id_of(key(name))


@dataclass(frozen=True)
class SignedJob:
    manifest: JobManifest
    offer: bytes
    assign: bytes
    receipt: bytes
    ack: bytes
    blobs: dict[bytes, bytes]
    submitter: str
    executor: str

    @property
    def job_id(self) -> Digest:
        return self.manifest.job_id

    @property
    def receipt_id(self) -> Digest:
        return verify(self.receipt).message_id

    @property
    def envelopes(self) -> list[bytes]:
        return [self.offer, self.assign, self.receipt, self.ack]


def _stream_ref(sha_hex: str, size: int) -> BlobRef:
    return ChunkList(size, (Digest(bytes.fromhex(sha_hex)),) if size else ()).ref


@functools.cache
def _compiled(module: str) -> wasmtime.Module:
    return compile_module(default_engine(), (WORKLOADS / module).read_bytes())


@functools.cache
def _run(
    module: str, args: tuple[str, ...], seed: bytes, stdin: bytes | None
) -> tuple[sandbox_limits.RunResult, tuple[FileRef, ...]]:
    with tempfile.TemporaryDirectory() as tmp:
        stdin_path = None
        if stdin is not None:
            stdin_path = Path(tmp) / "stdin"
            stdin_path.write_bytes(stdin)
        spec = JobSpec(
            module=(WORKLOADS / module).read_bytes(),
            args=args,
            stdin=stdin_path,
            limits=sandbox_limits.Limits(
                fuel=LIMITS.fuel,
                memory_bytes=LIMITS.memory_bytes,
                wall_seconds=LIMITS.wall_ms / 1000,
                max_output_bytes=LIMITS.max_output_bytes,
            ),
            seed=seed,
        )
        out = Path(tmp) / "out"
        result = run(spec, out, module=_compiled(module))
        files = tuple(
            sorted(
                (
                    FileRef(p.relative_to(out).as_posix(), blob_ref(p.read_bytes()))
                    for p in out.rglob("*")
                    if p.is_file()
                ),
                key=lambda f: f.name,
            )
        )
    return result, files


def make_job(
    module: str,
    args: tuple[str, ...],
    *,
    nonce: int = 0,
    submitter: str = "submitter",
    executor: str = "executor",
    stdin: bytes | None = None,
    t0: int = T0,
    profile: Digest | None = None,
) -> SignedJob:
    """A job that really ran: its offer, assignment, receipt and acknowledgement, all signed."""
    [job] = make_set(
        [(module, args, nonce, stdin)], submitter=submitter, executor=executor, t0=t0, profile=profile
    )
    return job


def make_set(
    specs: Sequence[tuple[str, tuple[str, ...], int, bytes | None]],
    *,
    submitter: str = "submitter",
    executor: str = "executor",
    t0: int = T0,
    profile: Digest | None = None,
) -> list[SignedJob]:
    """Jobs (module, args, nonce, stdin) offered in one offer and bid for in one bid, each assigned,
    run and acknowledged on its own; in the order of `specs`."""
    manifests, blobs = [], []
    for module, args, nonce, stdin in specs:
        module_bytes = (WORKLOADS / module).read_bytes()
        job_blobs = {blob_ref(module_bytes).root.raw: module_bytes}
        stdin_ref = None
        if stdin is not None:
            stdin_ref = blob_ref(stdin)
            job_blobs[stdin_ref.root.raw] = stdin
        manifests.append(
            JobManifest(
                module=blob_ref(module_bytes),
                inputs=(),
                args=args,
                env=(),
                stdin=stdin_ref,
                limits=LIMITS,
                deadline=t0 + 3_600_000,
                retention_ms=86_400_000,
                replicas=1,
                profile=profile or Digest(PROFILE.digest),
                submitter=nid(submitter),
                nonce=nonce.to_bytes(16, "big"),
                created_at=t0,
            )
        )
        blobs.append(job_blobs)
    offer = sign_message(
        Offer(NET, t0 + 300_000, nid(submitter), tuple(sorted(manifests, key=BY_JOB))), key(submitter)
    )
    items = tuple(sorted((BidItem(m.job_id, t0 + 1_000, t0 + 5_000) for m in manifests), key=BY_JOB))
    bid = sign_message(Bid(NET, verify(offer).message_id, nid(executor), t0 + 60_000, items), key(executor))
    jobs = []
    for (module, args, _, stdin), manifest, job_blobs in zip(specs, manifests, blobs, strict=True):
        assign = sign_message(
            Assign(
                NET, manifest.job_id, verify(bid).message_id, nid(submitter), nid(executor), 1, t0 + 600_000
            ),
            key(submitter),
        )
        receipt, ack = _run_and_sign(module, args, stdin, manifest, assign, submitter, executor, t0)
        jobs.append(
            SignedJob(
                manifest, offer, assign, receipt, ack, job_blobs, str(nid(submitter)), str(nid(executor))
            )
        )
    return jobs


def _run_and_sign(
    module: str,
    args: tuple[str, ...],
    stdin: bytes | None,
    manifest: JobManifest,
    assign: bytes,
    submitter: str,
    executor: str,
    t0: int,
) -> tuple[bytes, bytes]:
    """The executor's receipt of a real run of the job, and the submitter's acknowledgement of it."""
    result, outputs = _run(module, args, manifest.job_id.raw, stdin)
    status = str(result.status)
    receipt = UsageReceipt(
        network=NET,
        job_id=manifest.job_id,
        assignment_id=verify(assign).message_id,
        submitter=nid(submitter),
        executor=nid(executor),
        module=manifest.module,
        inputs=(),
        stdin=manifest.stdin,
        stdout=blob_ref(result.stdout),
        stderr=_stream_ref(result.stderr_sha256, result.stderr_bytes),
        outputs=outputs,
        profile=manifest.profile,
        limits=LIMITS,
        outcome=Outcome(
            status,
            result.exit_code if status == "exited" else None,
            result.trap if status == "trap" else None,
        ),
        fuel_used=result.fuel_used,
        peak_memory=result.peak_memory_bytes,
        compute_ms=max(1, int(result.wall_seconds * 1000)),
        queued_at=t0 + 2_000,
        started_at=t0 + 2_500,
        finished_at=t0 + 2_500 + max(1, int(result.wall_seconds * 1000)),
    )
    receipt_env = sign_message(receipt, key(executor))
    ack = sign_message(
        Ack(NET, nid(submitter), nid(executor), t0 + 9_000, (verify(receipt_env).message_id,)), key(submitter)
    )
    return receipt_env, ack


def resign_receipt(job: SignedJob, **changes: object) -> SignedJob:
    """The job with its receipt changed and re-signed by the same executor (and acknowledged again)."""
    receipt = dataclasses.replace(verify(job.receipt, UsageReceipt).message, **changes)
    receipt_env = sign_message(receipt, key_of(job.executor))
    ack = verify(job.ack, Ack).message
    ack_env = sign_message(
        dataclasses.replace(ack, receipt_ids=(verify(receipt_env).message_id,)), key_of(job.submitter)
    )
    return dataclasses.replace(job, receipt=receipt_env, ack=ack_env)


def key_of(node: str) -> nacl.signing.SigningKey:
    for name in ("submitter", "executor", "executor2", "submitter2"):
        if str(nid(name)) == node:
            return key(name)
    raise KeyError(node)


def mandelbrot(nonce: int = 0, **kw: object) -> SignedJob:
    return make_job("mandelbrot.wasm", MANDELBROT_ARGS, nonce=nonce, **kw)  # type: ignore[arg-type]


def mandelbrot_file(nonce: int = 0, **kw: object) -> SignedJob:
    return make_job(
        "mandelbrot.wasm", ("64", "48", "32", "24", "32", "24", "200", "/output/tile.pgm"), nonce=nonce, **kw
    )  # type: ignore[arg-type]


def montecarlo(nonce: int = 0, **kw: object) -> SignedJob:
    return make_job("montecarlo.wasm", MONTECARLO_ARGS, nonce=nonce, **kw)  # type: ignore[arg-type]


def offered_together(nonce: int = 0, **kw: object) -> list[SignedJob]:
    """A mandelbrot and a montecarlo job (different modules) in one offer, bid for in one bid."""
    return make_set(
        [
            ("mandelbrot.wasm", MANDELBROT_ARGS, nonce, None),
            ("montecarlo.wasm", MONTECARLO_ARGS, nonce, None),
        ],
        **kw,
    )  # type: ignore[arg-type]
