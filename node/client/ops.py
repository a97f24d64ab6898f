"""The client's operations, written once as generators that the two flavours drive.

Each operation is a generator that yields what it needs done, a `Call` (one request to the local API)
or a `Sleep`, and gets the answer back (or the request's error, thrown in as a ClientError); its
return value is the method's result. `Client` (sync.py) drives them with blocking HTTP and
time.sleep, `AsyncClient` (async_client.py) with trio, so the logic (resolving ids, following a
sweep, writing results, progress and rates) exists once and the sync flavour never imports trio.

Paths are made absolute here: the node reads module, input and stdin files itself and writes results
into the directory named, as this user (the API listens on 127.0.0.1 only; docs/submitting.md).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from e31.node.lifecycle import TERMINAL
from e31.node.units import UnitError, parse_count, parse_duration, parse_size

from .errors import NotFinished, OptionError
from .records import Batch, Cancelled, Export, Job, Progress, Result

T = TypeVar("T")

PathLike = str | os.PathLike[str]
Inputs = Mapping[str, PathLike] | Sequence[PathLike]
Deadline = float | int | str | datetime
"""Seconds from now, a duration ("90s", "2h"), an ISO-8601 time, or a datetime (naive: local time)."""
ProgressCallback = Callable[[Progress], None]

POLL = 5.0
"""Seconds one long-poll of a wait lasts (the node caps it at 60)."""
INDEX = "index.json"
_HEX = "0123456789abcdef"


@dataclass(frozen=True, slots=True)
class Call:
    method: str
    path: str
    body: Any = None


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


Effect = Call | Sleep
Op = Generator[Effect, Any, T]


# --- arguments ---


def _absolute(path: PathLike, what: str) -> str:
    text = os.fspath(path)
    if not isinstance(text, str) or not text:
        raise OptionError(f"{what}: a path is a non-empty string")
    return str(Path(text).expanduser().absolute())


def _unit(value: int | float | str | None, parse: Callable[[Any], Any], what: str) -> Any:
    if value is None:
        return None
    try:
        return parse(value)
    except UnitError as e:
        raise OptionError(f"{what}: {e}") from None


def parse_deadline(value: Deadline, now: float) -> int:
    """Milliseconds since the Unix epoch for a deadline given as seconds from now, a duration text, an
    ISO-8601 time or a datetime (a naive time is local time); OptionError if it is none of them."""
    if isinstance(value, datetime):
        when = value
    elif isinstance(value, bool):
        raise OptionError(f"deadline: not a time: {value!r}")
    elif isinstance(value, int | float):
        return round((now + float(value)) * 1000)
    else:
        try:
            return round((now + parse_duration(value)) * 1000)
        except UnitError:
            pass
        try:
            when = datetime.fromisoformat(value.strip().replace("z", "Z").replace("Z", "+00:00"))
        except ValueError:
            raise OptionError(
                f"deadline {value!r}: not a duration (90s, 10m, 2h, 1d, 1h30m) nor an ISO-8601 time "
                "(2026-12-01T08:00:00Z)"
            ) from None
    if when.tzinfo is None:
        when = when.astimezone()
    return round(when.astimezone(UTC).timestamp() * 1000)


def limits_body(
    fuel: int | str | None = None,
    memory: int | str | None = None,
    timeout: float | str | None = None,
    max_output: int | str | None = None,
) -> dict[str, Any]:
    """The API's "limits" object: counts and sizes as numbers or texts ("10G", "256MiB", "90s")."""
    values = {
        "fuel": _unit(fuel, parse_count, "fuel"),
        "memory": _unit(memory, parse_size, "memory"),
        "timeout": _unit(timeout, parse_duration, "timeout"),
        "max_output": _unit(max_output, parse_size, "max_output"),
    }
    return {k: v for k, v in values.items() if v is not None}


def job_fields(
    inputs: Inputs | None = None,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    stdin: PathLike | None = None,
) -> dict[str, Any]:
    """The fields in which the jobs of a batch may differ, as the API takes them."""
    if isinstance(args, str):
        raise OptionError(f"args is a list of strings, not one string: {args[:40]!r}")
    named: list[dict[str, str]] = []
    if isinstance(inputs, Mapping):
        named = [{"name": str(k), "path": _absolute(v, f"input {k!r}")} for k, v in inputs.items()]
    elif inputs is not None:
        if isinstance(inputs, str):
            inputs = [inputs]
        named = [{"name": Path(os.fspath(p)).name, "path": _absolute(p, "input")} for p in inputs]
    body: dict[str, Any] = {
        "args": [str(a) for a in args],
        "env": [[str(k), str(v)] for k, v in (env or {}).items()],
        "inputs": named,
    }
    if stdin is not None:
        body["stdin"] = _absolute(stdin, "stdin")
    return body


def _common(
    module: PathLike, deadline: Deadline | None, replicas: int | None, limits: dict[str, Any]
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "module": _absolute(module, "module"),
        "limits": limits,
        "deadline": None if deadline is None else parse_deadline(deadline, time.time()),
    }
    if replicas is not None:
        body["replicas"] = replicas
    return body


# --- operations ---


def resolve(ids: str | Iterable[str]) -> Op[list[str]]:
    """Full job ids for job ids, unique prefixes and batch ids, in the order given, each once."""
    given = [ids] if isinstance(ids, str) else list(ids)
    whole = [t.strip().lower() for t in given]
    if all(len(t) == 64 and not t.strip(_HEX) for t in whole):
        return list(dict.fromkeys(whole))  # nothing to resolve (the node would pass them on as they are)
    answer = yield Call("POST", "/v1/resolve", {"ids": given})
    return list(answer["job_ids"])


def submit(
    module: PathLike,
    *,
    inputs: Inputs | None = None,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    stdin: PathLike | None = None,
    deadline: Deadline | None = None,
    fuel: int | str | None = None,
    memory: int | str | None = None,
    timeout: float | str | None = None,
    max_output: int | str | None = None,
    replicas: int | None = None,
) -> Op[str]:
    """Submit one job; returns its job id. `module` is a .wasm (or .wat) file; `inputs` maps names in
    /input to files (or lists files, named by their file names); limits as numbers or texts."""
    body = _common(module, deadline, replicas, limits_body(fuel, memory, timeout, max_output))
    body.update(job_fields(inputs, args, env, stdin))
    answer = yield Call("POST", "/v1/jobs", body)
    return str(answer["job_id"])


def submit_batch(
    module: PathLike,
    jobs: Iterable[Mapping[str, Any]],
    *,
    deadline: Deadline | None = None,
    fuel: int | str | None = None,
    memory: int | str | None = None,
    timeout: float | str | None = None,
    max_output: int | str | None = None,
    replicas: int | None = None,
) -> Op[Batch]:
    """Submit many jobs of one module as one batch: each job a mapping of any of `args`, `env`,
    `inputs`, `stdin` (as submit takes them). Returns the Batch (its id stands for all its jobs)."""
    lines = []
    for number, job in enumerate(jobs, 1):
        if not isinstance(job, Mapping):
            raise OptionError(
                f"job {number}: a mapping of args, env, inputs, stdin, got {type(job).__name__}"
            )
        unknown = set(job) - {"args", "env", "inputs", "stdin"}
        if unknown:
            raise OptionError(f"job {number}: unknown field(s) {', '.join(sorted(map(str, unknown)))}")
        lines.append(job_fields(job.get("inputs"), job.get("args", ()), job.get("env"), job.get("stdin")))
    if not lines:
        raise OptionError("a batch needs at least one job")
    body = _common(module, deadline, replicas, limits_body(fuel, memory, timeout, max_output))
    body["jobs"] = lines
    answer = yield Call("POST", "/v1/batches", body)
    return Batch(str(answer["batch_id"]), tuple(answer["job_ids"]))


def map_jobs(
    module: PathLike,
    params: Iterable[Any],
    *,
    deadline: Deadline | None = None,
    fuel: int | str | None = None,
    memory: int | str | None = None,
    timeout: float | str | None = None,
    max_output: int | str | None = None,
    replicas: int | None = None,
) -> Op[Batch]:
    """A sweep: one job of `module` per item of `params`, as one batch. An item that is a mapping holds
    job fields (args, env, inputs, stdin); a list or tuple is the job's arguments; anything else is
    its one argument (str(item))."""
    jobs: list[Mapping[str, Any]] = []
    for p in params:
        if isinstance(p, Mapping):
            jobs.append(p)
        elif isinstance(p, list | tuple):
            jobs.append({"args": [str(a) for a in p]})
        else:
            jobs.append({"args": [str(p)]})
    batch: Batch = yield from submit_batch(
        module,
        jobs,
        deadline=deadline,
        fuel=fuel,
        memory=memory,
        timeout=timeout,
        max_output=max_output,
        replicas=replicas,
    )
    return batch


def job(id: str) -> Op[Job]:
    """One job, by id, unique prefix."""
    (job_id,) = yield from _single(id)
    doc = yield Call("GET", f"/v1/jobs/{job_id}")
    return Job.from_json(doc)


SORT_KEYS = ("created", "finished", "deadline", "state", "fuel", "id")


def jobs(
    ids: Iterable[str] | None = None,
    *,
    state: str | Iterable[str] | None = None,
    batch: str | None = None,
    executed: bool = False,
    sort: str = "created",
    limit: int | None = None,
) -> Op[list[Job]]:
    """Jobs this node submitted (or with `executed`, ran for others): only `ids` (ids, prefixes,
    batch ids), only those in `state` (one or several), only those of `batch`; sorted by `sort` (one
    of SORT_KEYS, `-` first for descending: "-created" is newest first); the first `limit` of them."""
    descending = sort.startswith("-")
    key_name = sort.removeprefix("-")
    if key_name not in SORT_KEYS:
        raise OptionError(f"sort by one of {', '.join(SORT_KEYS)} (a leading - for descending), got {sort!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise OptionError(f"limit is a whole number of at least 0, got {limit!r}")
    states = None if state is None else ({state} if isinstance(state, str) else set(state))
    if states is not None:
        from e31.node.lifecycle import JobState

        known = {s.value for s in JobState}
        if not states <= known:
            raise OptionError(
                f"unknown state(s) {', '.join(sorted(states - known))}: one of {', '.join(sorted(known))}"
            )
    if batch is not None:
        doc = yield Call("GET", f"/v1/batches/{_batch_id(batch)}")
        docs: list[dict[str, Any]] = doc["jobs"]
    else:
        docs = yield Call("GET", f"/v1/jobs?role={'executor' if executed else 'submitter'}")
    if ids is not None:
        wanted = yield from resolve(ids)
        by_id = {d["job_id"]: d for d in docs}
        docs = [by_id[j] for j in wanted if j in by_id]
    found = [Job.from_json(d) for d in docs if states is None or d["state"] in states]

    def key(j: Job) -> tuple[Any, ...]:
        value: Any = {
            "created": j.created,
            "finished": j.finished,
            "deadline": j.deadline,
            "state": j.state,
            "fuel": j.fuel_used,
            "id": j.job_id,
        }[key_name]
        return (value is None, value if value is not None else 0)  # ties keep the node's (batch) order

    found.sort(key=key, reverse=descending)
    return found if limit is None else found[:limit]


def _batch_id(text: str) -> str:
    from e31.node.store.batches import is_batch_id

    t = text.strip().lower()
    if not is_batch_id(t):
        raise OptionError(f"not a batch id (batch- and 16 hex digits): {text[:80]!r}")
    return t


def _single(id: str) -> Op[list[str]]:
    found = yield from resolve([id])
    if len(found) != 1:
        raise OptionError(f"{id!r} names {len(found)} jobs; give one job id")
    return found


def wait(
    ids: str | Iterable[str],
    *,
    timeout: float | None = None,
    progress: ProgressCallback | None = None,
    poll: float = POLL,
) -> Op[list[Job]]:
    """Wait until every job (ids, prefixes, batch ids) has ended, or `timeout` seconds have passed;
    returns the jobs in order, as they are then (`job.ended` False for one still going). `progress`
    is called with a Progress after every look at the node (at most about once per `poll` seconds
    while nothing ends)."""
    given = [ids] if isinstance(ids, str) else list(ids)
    answer = yield Call("POST", "/v1/resolve", {"ids": given})
    order: list[str] = list(answer["job_ids"])
    batches: list[str] = list(answer["batches"])
    in_batch: set[str] = set()
    start = time.monotonic()
    end = None if timeout is None else start + max(0.0, timeout)
    states: dict[str, str] = {}
    first_ended: int | None = None
    finished_batches: set[str] = set()
    for b in batches:
        doc = yield Call("GET", f"/v1/batches/{b}?brief=1")
        for d in doc["jobs"]:
            states[d["job_id"]] = d["state"]
            in_batch.add(d["job_id"])
    singles = [j for j in order if j not in in_batch]
    full: dict[str, dict[str, Any]] = {}
    while True:
        for j in singles:
            if states.get(j) not in TERMINAL:
                full[j] = yield Call("GET", f"/v1/jobs/{j}")
                states[j] = full[j]["state"]
        ended = sum(1 for j in order if states.get(j) in TERMINAL)
        now = time.monotonic()
        if first_ended is None:
            first_ended = ended
        if progress is not None:
            progress(_progress(order, states, ended, first_ended, now - start))
        if ended == len(order):
            break
        left = poll if end is None else min(poll, end - now)
        if left <= 0:
            break
        pending_batch = next((b for b in batches if b not in finished_batches), None)
        if pending_batch is not None:
            doc = yield Call("GET", f"/v1/batches/{pending_batch}/wait?timeout={left:.3f}&brief=1")
            for d in doc["jobs"]:
                states[d["job_id"]] = d["state"]
            if doc["ended"] == doc["total"]:
                finished_batches.add(pending_batch)
            for b in batches:  # the others, as they are now
                if b != pending_batch and b not in finished_batches:
                    other = yield Call("GET", f"/v1/batches/{b}?brief=1")
                    for d in other["jobs"]:
                        states[d["job_id"]] = d["state"]
                    if other["ended"] == other["total"]:
                        finished_batches.add(b)
        else:
            going = next((j for j in singles if states.get(j) not in TERMINAL), None)
            if going is None:
                break  # every batch says it has ended: jobs it no longer lists are gone from the node
            full[going] = yield Call("GET", f"/v1/jobs/{going}/wait?timeout={left:.3f}")
            states[going] = full[going]["state"]
    for b in batches:
        doc = yield Call("GET", f"/v1/batches/{b}")
        for d in doc["jobs"]:
            full[d["job_id"]] = d
    for j in order:
        if j not in full:  # a job of a batch that the node no longer lists (pruned)
            full[j] = yield Call("GET", f"/v1/jobs/{j}")
    return [Job.from_json(full[j]) for j in order]


def _progress(
    order: list[str],
    states: dict[str, str],
    ended: int,
    first_ended: int,
    elapsed: float,
) -> Progress:
    counts: dict[str, int] = {}
    for j in order:
        s = states.get(j, "unknown")
        counts[s] = counts.get(s, 0) + 1
    watched = ended - first_ended
    rate = watched / elapsed if watched > 0 and elapsed > 0 else None
    eta = None if rate is None else (len(order) - ended) / rate
    return Progress(len(order), ended, counts, elapsed, rate, eta)


def results(
    ids: str | Iterable[str],
    *,
    out: PathLike | None = None,
    overwrite: bool = False,
) -> Op[list[Result]]:
    """The results of finished jobs (ids, prefixes, batch ids), in order.

    With `out`, one job named by a job id or prefix is written into `out` itself; any other selection
    (a batch, several jobs) into one subfolder per job (NNNN-JOBIDPREFIX, in order) with an index
    (index.json: each job's folder, state, outcome, arguments and files). Without `out` the files are
    read into memory. A single job without a verified result raises NotFinished; in a selection of
    several, such a job comes back with no files (and its state in the index)."""
    given = [ids] if isinstance(ids, str) else list(ids)
    answer = yield Call("POST", "/v1/resolve", {"ids": given})
    order: list[str] = list(answer["job_ids"])
    flat = len(order) == 1 and not answer["batches"]
    if out is None:
        scratch = Path(tempfile.mkdtemp(prefix="e31-results-"))
        try:
            found = yield from _write_all(
                order, scratch, flat=False, single=flat, overwrite=False, keep=False
            )
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return found
    target = Path(_absolute(out, "out"))
    found = yield from _write_all(order, target, flat=flat, single=flat, overwrite=overwrite, keep=True)
    return found


def _write_all(
    order: list[str], base: Path, *, flat: bool, single: bool, overwrite: bool, keep: bool
) -> Op[list[Result]]:
    """Write each job's results under `base` (`flat`: into it; else a folder each and the index); a
    `single` job without a result raises NotFinished; without `keep` the files are read back."""
    width = max(4, len(str(len(order))))
    found: list[Result] = []
    index: list[dict[str, Any]] = []
    for number, job_id in enumerate(order, 1):
        folder = base if flat else base / f"{number:0{width}d}-{job_id[:12]}"
        doc = yield Call("GET", f"/v1/jobs/{job_id}")
        files: tuple[str, ...] = ()
        if doc["state"] == "done":
            try:
                written = yield Call(
                    "POST", f"/v1/jobs/{job_id}/results", {"out": str(folder), "overwrite": overwrite}
                )
                files = tuple(written["files"])
            except NotFinished:
                if single:
                    raise
        elif single:
            raise NotFinished(
                f"job {job_id} has no verified result yet (it is {doc['state']})", 409, "conflict"
            )
        data = {} if keep else {name: (folder / name).read_bytes() for name in files}
        found.append(
            Result(job_id, doc["state"], bool(doc.get("succeeded")), folder if keep else None, files, data)
        )
        outcome = doc.get("outcome") or {}
        index.append(
            {
                "job_id": job_id,
                "dir": folder.name if files else None,
                "state": doc["state"],
                "succeeded": bool(doc.get("succeeded")),
                "outcome": outcome.get("text") or doc.get("reason"),
                "args": doc.get("args", []),
                "files": list(files),
            }
        )
    if keep and not flat:
        _write_index(base / INDEX, {"version": 1, "jobs": index})
    return found


def _write_index(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    os.replace(tmp, path)


def cancel(ids: str | Iterable[str], reason: str = "") -> Op[list[Cancelled]]:
    """Withdraw jobs (ids, prefixes, batch ids) with a signed cancel; a job already ended keeps its state."""
    order = yield from resolve(ids)
    out = []
    for job_id in order:
        a = yield Call("POST", f"/v1/jobs/{job_id}/cancel", {"text": reason})
        out.append(Cancelled(str(a["job_id"]), str(a["state"]), bool(a["cancelled"])))
    return out


def receipts(
    ids: str | Iterable[str] | None = None,
    *,
    out: PathLike,
    with_blobs: bool = False,
    overwrite: bool = False,
) -> Op[Export]:
    """Have the node write a receipts bundle of these jobs (ids, prefixes, batch ids; None: every job)
    to the file `out`, for `e31 audit`; `with_blobs` adds what a re-execution needs."""
    target = Path(_absolute(out, "out"))
    if target.is_dir():
        raise OptionError(f"out {target} is a directory; give a file name")
    if not target.parent.is_dir():
        raise OptionError(f"out {target}: the directory {target.parent} does not exist")
    job_ids = None if ids is None else (yield from resolve(ids))
    body = {"jobs": job_ids, "with_blobs": with_blobs, "out": str(target), "overwrite": overwrite}
    a = yield Call("POST", "/v1/receipts/export", body)
    return Export(
        Path(a["path"]),
        int(a["bytes"]),
        int(a["jobs"]),
        int(a["envelopes"]),
        int(a["blobs"]),
        tuple(a.get("missing_blobs") or ()),
        tuple(a.get("corrupt_blobs") or ()),
    )


def status() -> Op[dict[str, Any]]:
    """The node's status (GET /v1/status): its id, network, listen address, capacity, peers."""
    doc = yield Call("GET", "/v1/status")
    return dict(doc)


def sleep(seconds: float) -> Op[None]:
    yield Sleep(seconds)
