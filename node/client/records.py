"""What the client's methods return: frozen records read from the local API's JSON.

Each keeps the node's whole answer in `raw` (fields this client does not name yet are not lost).
Times are Unix seconds (float), sizes bytes, fuel units.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e31.node.lifecycle import TERMINAL


@dataclass(frozen=True, slots=True)
class Outcome:
    """How the guest ended: `status` exited, trap, timeout, ...; `text` as `e31 jobs` shows it."""

    status: str
    exit_code: int | None
    trap: str | None
    text: str


@dataclass(frozen=True, slots=True)
class Job:
    """One job as the node knows it (GET /v1/jobs/ID)."""

    job_id: str
    state: str
    role: str
    reason: str | None
    executor: str | None
    attempt: int
    args: tuple[str, ...]
    created: float | None
    finished: float | None
    deadline: float | None
    fuel_used: int | None
    handed_off: bool | None
    outcome: Outcome | None
    succeeded: bool
    """done, with a verified receipt, and the guest exited 0."""
    raw: dict[str, Any] = field(repr=False, compare=False)

    @property
    def ended(self) -> bool:
        return self.state in TERMINAL

    @property
    def why(self) -> str:
        """The outcome's text, else the reason the job ended, else ''."""
        return (self.outcome.text if self.outcome else "") or (self.reason or "")

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Job:
        out = doc.get("outcome")
        outcome = None
        if isinstance(out, dict):
            outcome = Outcome(
                str(out.get("status")), out.get("exit_code"), out.get("trap"), str(out.get("text") or "")
            )
        return cls(
            job_id=str(doc["job_id"]),
            state=str(doc["state"]),
            role=str(doc.get("role", "submitter")),
            reason=doc.get("reason"),
            executor=doc.get("executor"),
            attempt=int(doc.get("attempt") or 0),
            args=tuple(doc.get("args") or ()),
            created=doc.get("created"),
            finished=doc.get("finished"),
            deadline=doc.get("deadline"),
            fuel_used=doc.get("fuel_used"),
            handed_off=doc.get("handed_off"),
            outcome=outcome,
            succeeded=bool(doc.get("succeeded")),
            raw=doc,
        )


@dataclass(frozen=True, slots=True)
class Batch:
    """Jobs submitted together (submit_batch, map): the batch id stands for all of them."""

    batch_id: str
    job_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Generation(Batch):
    """A batch of inference jobs (generate): the Batch, how many prompts it carries, how many of them
    are malformed (each is answered with an error line), and the limits its jobs were given."""

    prompts: int
    malformed: int
    limits: dict[str, Any] = field(compare=False)


@dataclass(frozen=True, slots=True)
class JobSpan:
    """One job of a generate batch: its place in the batch (`seq`, from 1), the lines of the prompts
    file it carries (`first` to `last`), and how it stands."""

    seq: int
    job_id: str
    first: int
    last: int
    state: str
    succeeded: bool
    why: str


@dataclass(frozen=True, slots=True)
class Merged:
    """What a merge (merge) wrote: the completions file `out`, each job's results and receipt under
    `jobs_dir`; `completions` lines (`error_lines` of them errors) from `merged_jobs` of the batch's
    `jobs` jobs; `missing` the jobs left out (only with partial=True)."""

    out: Path
    jobs_dir: Path
    jobs: int
    merged_jobs: int
    completions: int
    error_lines: int
    missing: tuple[JobSpan, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "out": str(self.out),
            "jobs_dir": str(self.jobs_dir),
            "jobs": self.jobs,
            "merged_jobs": self.merged_jobs,
            "completions": self.completions,
            "error_lines": self.error_lines,
            "missing": [
                {"job_id": m.job_id, "lines": [m.first, m.last], "state": m.state, "why": m.why}
                for m in self.missing
            ],
        }


@dataclass(frozen=True, slots=True)
class Progress:
    """What a wait has seen so far, passed to its progress callback after every look.

    `rate` is jobs ended per second over the time this wait has watched (jobs that had ended before it
    began do not count), None until one has ended while watched; `eta` the seconds left at that rate.
    """

    total: int
    ended: int
    states: dict[str, int]
    """How many jobs are in each state."""
    elapsed: float
    rate: float | None
    eta: float | None

    @property
    def done(self) -> bool:
        return self.ended >= self.total


@dataclass(frozen=True, slots=True)
class Result:
    """A finished job's results: written under `directory`, or held in memory (`directory` None).

    `files` names what there is (stdout, stderr, output/NAME..., receipt); `read(name)` returns its
    bytes either way. A job without a verified result has no files and its `state` says why.
    """

    job_id: str
    state: str
    succeeded: bool
    directory: Path | None
    files: tuple[str, ...]
    data: dict[str, bytes] = field(default_factory=dict, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return bool(self.files)

    def read(self, name: str) -> bytes:
        if name in self.data:
            return self.data[name]
        if self.directory is None or name not in self.files:
            raise KeyError(f"job {self.job_id[:12]} has no result file {name!r}")
        return (self.directory / name).read_bytes()

    @property
    def stdout(self) -> bytes:
        return self.read("stdout")

    @property
    def stderr(self) -> bytes:
        return self.read("stderr")

    @property
    def outputs(self) -> tuple[str, ...]:
        """The names of the files the guest left in /output."""
        return tuple(f.removeprefix("output/") for f in self.files if f.startswith("output/"))


@dataclass(frozen=True, slots=True)
class Cancelled:
    job_id: str
    state: str
    cancelled: bool
    """False when the job had already ended (it keeps its state)."""


@dataclass(frozen=True, slots=True)
class Export:
    """A receipts bundle the node wrote (receipts()): where, and what it holds."""

    path: Path
    bytes: int
    jobs: int
    envelopes: int
    blobs: int
    missing_blobs: tuple[str, ...]
    corrupt_blobs: tuple[str, ...]
