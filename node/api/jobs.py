"""The jobs endpoints of the local control API: submit, list, show, wait, and write out results.

    POST /v1/jobs                    submit (fields in docs/submitting.md); answers {"job_id": ...}
    GET  /v1/jobs                    submitted jobs, oldest first (?role=executor: the jobs it ran)
    GET  /v1/jobs/{id}               one job
    GET  /v1/jobs/{id}/wait?timeout= the job once it has ended, or as it is after `timeout` seconds
    POST /v1/jobs/{id}/results       {"out": DIR}: write stdout, stderr, output files and the receipt
    POST /v1/jobs/{id}/cancel        {"text": WHY}: withdraw the job (signed `cancel`); answers its state
    POST /v1/batches                 {"module", "limits", "deadline", "jobs": [{args, env, inputs, stdin}]}
    GET  /v1/batches/{id}            the batch's jobs (?brief=1: id, state and reason only)
    GET  /v1/batches/{id}/wait?timeout= the batch once every job has ended, or after `timeout` seconds
    POST /v1/resolve                 {"ids": [...]}: ids, unique prefixes, batch ids -> job ids (resolve.py)

The CLI runs on the node's machine and the API listens on 127.0.0.1 only, so files travel by path: a
submission names absolute paths and the node reads the files itself; results are written by the node
into the directory the request names. A submission is checked completely before anything is stored:
the module is a WebAssembly binary (or a `.wat` text, translated here) that compiles under this node's
execution profile and imports only WASI preview 1, the limits are within range, the deadline is in the
future and the files exist.
"""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
from e31.protocol.blobs import MAX_BLOB_SIZE, BlobRef, blob_ref
from e31.protocol.codec import unpack_canonical
from e31.protocol.envelope import reopen_stored
from e31.protocol.errors import ProtocolError
from e31.protocol.ids import Digest
from e31.protocol.jobs import (
    ARG_MAX,
    MAX_ARGS,
    MAX_ENV,
    MAX_INPUTS,
    MAX_REPLICAS,
    EnvVar,
    FileRef,
    JobManifest,
    Limits,
    check_file_name,
)
from e31.protocol.messages import REASON_TEXT_MAX
from e31.protocol.receipts import UsageReceipt
from e31.protocol.results import outputs_of

from ..lifecycle import TERMINAL
from ..market.context import MarketContext
from ..market.outcomes import outcome_text
from ..market.submitter import Submitter, UnknownJob
from ..store import batches as batch
from ..store.blobs import BlobError, BlobStore, BlobStoreFull
from ..store.db import Store
from ..store.handoff import acked_receipts
from ..store.rows import JobRow
from .files import open_dir, open_named_file, read_capped, write_under
from .resolve import resolve_handler
from .server import HttpError, Request, Router

MAX_FUEL = 2**63 - 1
MIN_MEMORY = 64 * 1024
MAX_MEMORY = 4 * 1024**3
MAX_WALL_MS = 7 * 24 * 3600 * 1000
MIN_DEADLINE_MS = 1000
MAX_DEADLINE_MS = 30 * 24 * 3600 * 1000
MAX_MODULE_BYTES = 64 * 1024 * 1024
DEFAULT_LIMITS = {
    "fuel": 10_000_000_000,
    "memory": 256 * 1024 * 1024,
    "timeout": 60.0,
    "max_output": 64 * 1024 * 1024,
}
DEFAULT_DEADLINE_MS = 3600 * 1000
MAX_WAIT = 60.0
BATCH_POLL = 0.2
COMPILED_CACHE = 1024


def bad(message: str) -> HttpError:
    return HttpError(400, message, "invalid_job")


@dataclass
class JobsApi:
    submitter: Submitter
    blobs: BlobStore
    profile: bytes
    compile_check: Callable[[bytes], str | None]
    """Compiles a module under this node's profile; returns why it is refused, or None."""
    _compiled: set[bytes] = field(default_factory=set)
    """SHA-256 of modules that compiled here: a sweep of one module is compiled once."""
    _modules: dict[Path, tuple[tuple[int, ...], BlobRef]] = field(default_factory=dict)
    """Module files already stored, by path, with the (device, inode, size, mtime, ctime) they had: a
    sweep of one module file is read, hashed and stored once, not once a job. The ctime changes with
    any write, even one that puts the mtime back (`cp -p`, `rsync --inplace -t`)."""
    _files: dict[Path, tuple[tuple[int, ...], BlobRef]] = field(default_factory=dict)
    """Input and stdin files already stored, keyed the same way (the opened file's own fstat): a batch
    whose jobs share one input (a model) reads, hashes and stores it once, not once a job."""

    def register(self, router: Router) -> None:
        router.add("POST", "/v1/jobs", self.submit)
        router.add("GET", "/v1/jobs", self.list_jobs)
        router.add("GET", "/v1/jobs/{id}", self.show)
        router.add("GET", "/v1/jobs/{id}/wait", self.wait)
        router.add("POST", "/v1/jobs/{id}/results", self.results)
        router.add("POST", "/v1/jobs/{id}/cancel", self.cancel)
        router.add("POST", "/v1/batches", self.submit_batch)
        router.add("GET", "/v1/batches/{id}", self.show_batch)
        router.add("GET", "/v1/batches/{id}/wait", self.wait_batch)
        router.add("POST", "/v1/resolve", resolve_handler(self.ctx.store))

    @property
    def ctx(self) -> MarketContext:
        return self.submitter.ctx

    # --- submit ---

    async def submit(self, request: Request) -> dict[str, Any]:
        body = request.body
        if not isinstance(body, dict):
            raise bad("the body is a JSON object describing the job")
        unknown = set(body) - {"module", "inputs", "args", "env", "stdin", "limits", "deadline", "replicas"}
        if unknown:
            raise bad(f"unknown field(s): {', '.join(sorted(unknown))}")
        now = self.ctx.clock()
        limits = _limits(body.get("limits") or {})
        deadline = _deadline(body.get("deadline"), now)
        replicas = _replicas(body.get("replicas"))
        module_ref = await self._module(_path(body.get("module"), "module"))
        manifest = await self._manifest(body, module_ref, limits, deadline, now, replicas)
        job_id = await self.submitter.submit(manifest)
        return {"job_id": job_id.hex(), "state": "queued"}

    async def submit_batch(self, request: Request) -> dict[str, Any]:
        body = request.body
        if not isinstance(body, dict):
            raise bad("the body is a JSON object describing the batch")
        unknown = set(body) - {"module", "limits", "deadline", "jobs", "replicas"}
        if unknown:
            raise bad(f"unknown field(s): {', '.join(sorted(unknown))}")
        lines = body.get("jobs")
        if not isinstance(lines, list) or not lines or len(lines) > batch.MAX_JOBS:
            raise bad(f"jobs is a list of 1..{batch.MAX_JOBS} job objects")
        now = self.ctx.clock()
        limits = _limits(body.get("limits") or {})
        deadline = _deadline(body.get("deadline"), now)
        replicas = _replicas(body.get("replicas"))
        module_ref = await self._module(_path(body.get("module"), "module"))
        manifests = []
        for number, line in enumerate(lines, 1):
            if not isinstance(line, dict) or not set(line) <= batch.LINE_FIELDS:
                raise bad(f"job {number}: an object with only {', '.join(sorted(batch.LINE_FIELDS))}")
            try:
                manifests.append(await self._manifest(line, module_ref, limits, deadline, now, replicas))
            except HttpError as e:
                raise bad(f"job {number}: {e.message}") from None
        bid = await self.submitter.submit_batch(manifests)
        return {"batch_id": bid, "job_ids": [m.job_id.hex() for m in manifests], "state": "queued"}

    async def _module(self, module_path: Path) -> BlobRef:
        try:
            st = os.lstat(module_path)  # microseconds; the read, when needed, runs in a thread
            key: tuple[int, ...] | None = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        except OSError:
            key = None  # _read_module says why
        known = self._modules.get(module_path)
        if key is not None and known is not None and known[0] == key and self.blobs.has(known[1].root.raw):
            return known[1]
        ref = await self._read_module(module_path)
        if key is not None:
            if len(self._modules) >= COMPILED_CACHE:
                self._modules.clear()
            self._modules[module_path] = (key, ref)
        return ref

    async def _read_module(self, module_path: Path) -> BlobRef:
        module = await trio.to_thread.run_sync(_read_module, module_path)
        digest = hashlib.sha256(module).digest()
        if digest not in self._compiled:
            why = await trio.to_thread.run_sync(self.compile_check, module)
            if why is not None:
                raise bad(f"module {module_path}: {why}")
            if len(self._compiled) >= COMPILED_CACHE:
                self._compiled.clear()
            self._compiled.add(digest)
        return await self._put_bytes(module)

    async def _manifest(
        self,
        body: dict[str, Any],
        module_ref: BlobRef,
        limits: Limits,
        deadline: int,
        now: int,
        replicas: int = 1,
    ) -> JobManifest:
        args = _strings(body.get("args") or [], "args", MAX_ARGS)
        env = _env(body.get("env") or [])
        inputs = _inputs(body.get("inputs") or [])
        stdin_path = None if body.get("stdin") is None else _path(body["stdin"], "stdin")
        files = []
        for name, path in inputs:
            files.append(FileRef(name, await self._put_file(path, f"input {name!r}")))
        stdin = None if stdin_path is None else await self._put_file(stdin_path, "stdin")
        try:
            manifest = JobManifest(
                module=module_ref,
                inputs=tuple(sorted(files, key=lambda f: f.name)),
                args=args,
                env=tuple(sorted(env, key=lambda e: e.name)),
                stdin=stdin,
                limits=limits,
                deadline=deadline,
                retention_ms=7 * 24 * 3600 * 1000,
                replicas=replicas,
                profile=Digest(self.profile),
                submitter=self.ctx.node,
                nonce=secrets.token_bytes(16),
                created_at=now,
            )
        except ProtocolError as e:
            raise bad(str(e)) from None
        return manifest

    # --- cancel ---

    async def cancel(self, request: Request) -> dict[str, Any]:
        job_id = _job_id(request.params["id"])
        body = request.body if isinstance(request.body, dict) else {}
        text = body.get("text") or ""
        if not isinstance(text, str) or "\x00" in text or len(text.encode()) > REASON_TEXT_MAX:
            raise bad(f"text is a string of at most {REASON_TEXT_MAX} bytes")
        try:
            state, withdrawn = await self.submitter.cancel(job_id, text)
        except UnknownJob:
            raise HttpError(404, f"no job {job_id.hex()} was submitted from this node") from None
        return {"job_id": job_id.hex(), "state": state, "cancelled": withdrawn}

    # --- batches ---

    async def _batch(self, request: Request) -> batch.BatchRow:
        text = request.params["id"]
        if not batch.is_batch_id(text):
            raise HttpError(
                400, f"not a batch id ({batch.PREFIX} and {batch.ID_HEX} hex digits): {text[:80]!r}"
            )
        row = await self.ctx.store.run(batch.get_batch, text)
        if row is None:
            raise HttpError(404, f"no batch {text} on this node")
        return row

    async def _batch_rows(self, row: batch.BatchRow) -> list[JobRow]:
        return await self.ctx.store.run(batch.batch_jobs, row.batch_id)

    async def _batch_doc(self, row: batch.BatchRow, brief: bool) -> dict[str, Any]:
        present = await self._batch_rows(row)
        states: dict[str, int] = {}
        for r in present:
            states[r.state] = states.get(r.state, 0) + 1
        docs: list[dict[str, Any]] = []
        handed = await self.submitter.handed_off(present)
        receipts = {} if brief else await self.ctx.store.run(acked_receipts, [r.job_id for r in present])
        for r in present:
            if brief:
                docs.append(
                    {
                        "job_id": r.job_id.hex(),
                        "state": r.state,
                        "reason": r.reason,
                        "handed_off": r.job_id in handed,
                    }
                )
            else:
                docs.append(await self._doc(r, handed, receipts))
        return {
            "batch_id": row.batch_id,
            "created": row.created,
            "total": len(row.job_ids),
            "states": states,
            "ended": sum(1 for r in present if r.state in TERMINAL),
            "jobs": docs,
        }

    async def show_batch(self, request: Request) -> dict[str, Any]:
        return await self._batch_doc(await self._batch(request), request.query.get("brief") == "1")

    async def wait_batch(self, request: Request) -> dict[str, Any]:
        timeout = _timeout(request)
        row = await self._batch(request)
        brief = request.query.get("brief") == "1"
        with trio.move_on_after(timeout):
            while True:
                changed = self.submitter.changed
                if not await self.ctx.store.run(batch.batch_unfinished, row.batch_id):
                    break
                await changed.wait()
                await trio.sleep(BATCH_POLL)  # let a burst of changes pass before scanning again
        return await self._batch_doc(row, brief)

    async def _put_bytes(self, data: bytes) -> BlobRef:
        root = await trio.to_thread.run_sync(self.blobs.put, data)
        return BlobRef(Digest(bytes.fromhex(root)), len(data))

    async def _put_file(self, path: Path, what: str) -> BlobRef:
        def put() -> BlobRef:
            fd = open_named_file(path, what, MAX_BLOB_SIZE)
            try:
                st = os.fstat(fd)
                key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
                known = self._files.get(path)
                if known is not None and known[0] == key and self.blobs.has(known[1].root.raw):
                    return known[1]
                root, size = self.blobs.put_stream(read_capped(fd, what, path, MAX_BLOB_SIZE))
            except OSError as e:
                raise bad(f"{what} {path}: {e.strerror or e}") from None
            except BlobError as e:
                raise HttpError(507 if isinstance(e, BlobStoreFull) else 500, f"{what} {path}: {e}") from None
            finally:
                os.close(fd)
            ref = BlobRef(Digest(bytes.fromhex(root)), size)
            if len(self._files) >= COMPILED_CACHE:
                self._files.clear()
            self._files[path] = (key, ref)
            return ref

        return await trio.to_thread.run_sync(put)

    # --- reading ---

    async def list_jobs(self, request: Request) -> list[dict[str, Any]]:
        role = request.query.get("role", "submitter")
        if role not in ("submitter", "executor"):
            raise bad("role is submitter or executor")
        rows = await self.ctx.store.run(Store.jobs, role=role)
        if role != "submitter":
            return [await self._doc(r) for r in rows]
        handed = await self.submitter.handed_off(rows)
        receipts = await self.ctx.store.run(acked_receipts, [r.job_id for r in rows if r.state == "done"])
        return [await self._doc(r, handed, receipts) for r in rows]

    async def _row(self, request: Request) -> JobRow:
        text = request.params["id"]
        job_id = _job_id(text)
        row = await self.ctx.store.run(Store.job, job_id, "submitter")
        if row is None:
            row = await self.ctx.store.run(Store.job, job_id, "executor")
        if row is None:
            raise HttpError(404, f"no job {text} on this node")
        return row

    async def show(self, request: Request) -> dict[str, Any]:
        return await self._doc(await self._row(request))

    async def wait(self, request: Request) -> dict[str, Any]:
        timeout = _timeout(request)
        row = await self._row(request)
        with trio.move_on_after(timeout):
            while row.state not in TERMINAL:
                changed = self.submitter.changed_for(row.job_id)  # taken before the re-read: no lost wake-up
                row = await self._row(request)
                if row.state in TERMINAL:
                    self.submitter.ended_for(row.job_id, changed)
                    break
                await changed.wait()
        return await self._doc(row)

    async def _doc(
        self, row: JobRow, handed: set[bytes] | None = None, receipts: dict[bytes, bytes] | None = None
    ) -> dict[str, Any]:
        manifest = JobManifest.from_wire(unpack_canonical(row.manifest))
        doc: dict[str, Any] = {
            "job_id": row.job_id.hex(),
            "role": row.role,
            "submitter": row.submitter,
            "state": row.state,
            "executor": row.executor,
            "attempt": row.attempt,
            "created": row.created,
            "updated": row.updated,
            "deadline": row.deadline,
            "started": row.started,
            "finished": row.finished,
            "fuel_limit": row.fuel_limit,
            "fuel_used": row.fuel_used,
            "reason": row.reason,
            "args": list(manifest.args),
        }
        if row.role == "submitter":
            if handed is None:
                handed = await self.submitter.handed_off([row])
            doc["handed_off"] = row.job_id in handed
        if receipts is not None and row.role == "submitter":
            raw = receipts.get(row.job_id) if row.state == "done" else None
            receipt = None if raw is None else reopen_stored(raw, UsageReceipt)
        else:
            receipt = await self._receipt(row)
        if receipt is not None:
            r = receipt.message
            doc["outcome"] = {
                "status": r.outcome.status,
                "exit_code": r.outcome.exit_code,
                "trap": r.outcome.trap,
                "text": outcome_text(r.outcome.status, r.outcome.exit_code, r.outcome.trap),
            }
            doc["receipt"] = {
                "id": receipt.message_id.hex(),
                "executor": str(r.executor),
                "fuel_used": r.fuel_used,
                "compute_ms": r.compute_ms,
                "queued_ms": r.waited_ms,
                "paused_ms": None if r.meter is None else r.meter.paused_ms,
                "fetch_ms": None if r.meter is None else r.meter.fetch_ms,
                "peak_memory": r.peak_memory,
                "outputs": [f.name for f in r.outputs],
            }
        doc["succeeded"] = (
            row.state == "done"
            and receipt is not None
            and receipt.message.outcome.status == "exited"
            and receipt.message.outcome.exit_code == 0
        )
        return doc

    async def _receipt(self, row: JobRow) -> Any:
        if row.state != "done":
            return None
        rows = await self.ctx.store.run(Store.receipts_for_job, row.job_id)
        wanted = [r for r in rows if row.role == "executor" or r.delivered is not None]
        if not wanted:
            return None
        env = await self.ctx.store.run(Store.envelope, wanted[-1].message_id)
        return None if env is None else reopen_stored(env.raw, UsageReceipt)

    # --- results ---

    async def results(self, request: Request) -> dict[str, Any]:
        row = await self._row(request)
        body = request.body if isinstance(request.body, dict) else {}
        out = _path(body.get("out"), "out")
        overwrite = body.get("overwrite", False)
        if not isinstance(overwrite, bool):
            raise bad("overwrite is true or false")
        receipt = await self._receipt(row)
        if row.state != "done" or receipt is None:
            raise HttpError(409, f"job {row.job_id.hex()} has no verified result yet (it is {row.state})")
        r: UsageReceipt = receipt.message
        small = await self.ctx.store.run(Store.small_blobs, [ref.root.hex() for ref in outputs_of(r)])
        written = await trio.to_thread.run_sync(self._write_results, out, receipt, small, overwrite)
        return {"job_id": row.job_id.hex(), "out": str(out), "files": written}

    def _write_results(
        self, out: Path, receipt: Any, small: dict[str, bytes], overwrite: bool = False
    ) -> list[str]:
        """Write the job's outputs (from the database's small blobs or the blob store, each checked
        against its hash) and its receipt into `out` (in a thread).

        `out` is created if missing and must not itself be a symbolic link; below it every directory and
        file is opened relative to its parent's descriptor with O_NOFOLLOW, so a link planted inside
        `out` is never followed. A file already there is kept unless `overwrite` (one with exactly the
        bytes to be written counts as written, so asking twice succeeds); with `overwrite` it is
        replaced by a rename, which replaces a link rather than writing through it.
        """
        r: UsageReceipt = receipt.message

        def read(ref: BlobRef) -> bytes:
            data = small.get(ref.root.hex())
            if data is None:
                return self.blobs.read(ref.root.raw)
            if blob_ref(data) != ref:
                raise BlobError(f"the stored output {ref.root.hex()} does not match its hash")
            return data

        files: list[tuple[str, Callable[[], bytes]]] = [
            ("stdout", lambda: read(r.stdout)),
            ("stderr", lambda: read(r.stderr)),
            *((f"output/{f.name}", lambda ref=f.blob: read(ref)) for f in r.outputs),
            ("receipt", lambda: bytes(receipt.raw)),
        ]
        try:
            out.mkdir(parents=True, exist_ok=True)
            top = open_dir(out, None, str(out))
        except OSError as e:
            raise HttpError(400, f"cannot write results to {out}: {e.strerror or e}") from None
        written = []
        try:
            for name, data in files:
                try:
                    write_under(top, name, data(), overwrite, str(out))
                except OSError as e:
                    raise HttpError(400, f"cannot write {out / name}: {e.strerror or e}") from None
                written.append(name)
        except BlobError as e:
            raise HttpError(500, f"a result blob is unavailable: {e}") from None
        finally:
            os.close(top)
        return written


# --- request checks ---


def _job_id(text: str) -> bytes:
    try:
        return Digest.parse(text).raw
    except ProtocolError:
        raise HttpError(400, f"not a job id (64 hex digits): {text[:80]!r}") from None


def _replicas(value: object) -> int:
    return 1 if value is None else _int(value, "replicas", 1, MAX_REPLICAS)


def _timeout(request: Request) -> float:
    try:
        timeout = float(request.query.get("timeout", "30"))
    except ValueError:
        raise bad("timeout is a number of seconds") from None
    if timeout != timeout:
        raise bad("timeout is a number of seconds")
    return max(0.0, min(timeout, MAX_WAIT))


def _path(value: object, what: str) -> Path:
    if not isinstance(value, str) or not value:
        raise bad(f"{what} is an absolute path")
    path = Path(value)
    if not path.is_absolute():
        raise bad(f"{what} {value!r} is not an absolute path (the node reads files itself)")
    return path


def _read_module(path: Path) -> bytes:
    """The module's binary: the file's bytes, or for a `.wat` file its text translated by the sandbox
    (the job names the binary, so its id, receipts and audits are the same as for the compiled file)."""
    fd = open_named_file(path, "module", MAX_MODULE_BYTES)
    try:
        data = b"".join(read_capped(fd, "module", path, MAX_MODULE_BYTES))
    finally:
        os.close(fd)
    if path.suffix.lower() != ".wat":
        return data
    from e31.sandbox.errors import InvalidModule
    from e31.sandbox.runner import wat_to_wasm

    try:
        return wat_to_wasm(data)
    except InvalidModule as e:
        raise bad(f"module {path}: {e}") from None


def _int(value: object, what: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(f"{what} is a whole number, got {value!r}")
    if not lo <= value <= hi:
        raise bad(f"{what} {value} is outside {lo}..{hi}")
    return value


def _limits(doc: object) -> Limits:
    if not isinstance(doc, dict):
        raise bad("limits is an object")
    unknown = set(doc) - set(DEFAULT_LIMITS)
    if unknown:
        raise bad(f"unknown limit(s): {', '.join(sorted(unknown))}")
    merged = {**DEFAULT_LIMITS, **{k: v for k, v in doc.items() if v is not None}}
    timeout = merged["timeout"]
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not 0 < timeout * 1000 <= MAX_WALL_MS
    ):
        raise bad(f"timeout {timeout!r} is outside (0, {MAX_WALL_MS // 1000}] seconds")
    return Limits(
        fuel=_int(merged["fuel"], "fuel", 1, MAX_FUEL),
        memory_bytes=_int(merged["memory"], "memory", MIN_MEMORY, MAX_MEMORY),
        wall_ms=max(1, round(timeout * 1000)),
        max_output_bytes=_int(merged["max_output"], "max_output", 0, MAX_BLOB_SIZE),
    )


def _deadline(value: object, now: int) -> int:
    if value is None:
        return now + DEFAULT_DEADLINE_MS
    deadline = _int(value, "deadline (ms since the Unix epoch)", 0, 2**63 - 1)
    if deadline <= now:
        raise bad(f"the deadline is {_span((now - deadline) / 1000)} in the past")
    if deadline < now + MIN_DEADLINE_MS:
        raise bad(f"the deadline is less than {MIN_DEADLINE_MS // 1000} s away")
    if deadline > now + MAX_DEADLINE_MS:
        raise bad(f"the deadline is more than {MAX_DEADLINE_MS // 86_400_000} days away")
    return deadline


def _span(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.0f} days"


def _strings(value: object, what: str, most: int) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise bad(f"{what} is a list of strings")
    if len(value) > most:
        raise bad(f"more than {most} {what}")
    for v in value:
        if "\x00" in v or len(v.encode("utf-8", "surrogatepass")) > ARG_MAX:
            raise bad(f"{what}: {v[:40]!r} has a NUL byte or is over {ARG_MAX} bytes")
    return tuple(value)


def _env(value: object) -> list[EnvVar]:
    if not isinstance(value, list) or len(value) > MAX_ENV:
        raise bad(f"env is a list of [NAME, VALUE] pairs (at most {MAX_ENV})")
    out: dict[str, EnvVar] = {}
    for pair in value:
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) for p in pair)):
            raise bad("env is a list of [NAME, VALUE] pairs")
        name, val = pair
        if name in out:
            raise bad(f"environment variable {name!r} given twice")
        try:
            out[name] = EnvVar(name, val)
        except ProtocolError as e:
            raise bad(f"environment variable {name!r}: {e}") from None
    return list(out.values())


def _inputs(value: object) -> list[tuple[str, Path]]:
    if not isinstance(value, list) or len(value) > MAX_INPUTS:
        raise bad(f"inputs is a list of {{name, path}} objects (at most {MAX_INPUTS})")
    seen: dict[str, Path] = {}
    for item in value:
        if not isinstance(item, dict) or set(item) != {"name", "path"}:
            raise bad("each input is an object with a name and a path")
        name = item["name"]
        path = _path(item["path"], "input path")
        if not isinstance(name, str):
            raise bad("an input name is a string")
        why = check_file_name(name)
        if why is not None:
            raise bad(f"input {why}")
        if name in seen:
            raise bad(f"two inputs are named {name!r}")
        seen[name] = path
    return list(seen.items())


def compile_check(module: bytes) -> str | None:
    """Why the sandbox refuses `module` (not WebAssembly, does not validate, imports beyond WASI
    preview 1, no _start), or None when it compiles under this node's execution profile."""
    from e31.sandbox.errors import InvalidModule
    from e31.sandbox.runner import compile_module, default_engine

    try:
        compile_module(default_engine(), module)
    except InvalidModule as e:
        return str(e)
    return None
