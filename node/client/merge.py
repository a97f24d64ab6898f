"""One completions file from the jobs of a generate batch: the client's `merge`, and
`e31 results BATCH --merge FILE`, which runs it.

Each job of the batch carries a span of the prompts file (generate.py names it in the job's --prompts
argument) and wrote one completion line per prompt line of it, in order. The merge checks that the
batch's spans follow each other from line 1 without a gap or an overlap, writes every finished job's
results (stdout, stderr, output/, and its receipt: the signed receipt envelope, exact bytes) into
`FILE.jobs/NNNN-JOBID/` (NNNN its place in the batch), and concatenates the jobs' completions into FILE
in the batch's order, so the completions stand in the prompts' order. An error line's `line` is the
guest's line number in its job's span: it is turned back into the prompts file's own line number.

A batch with any job not finished well (still running, failed, out of fuel, cancelled) is refused,
naming those jobs and their lines (Incomplete), unless `partial`: then the others' completions are
written, and what is missing is listed. FILE is written whole under a temporary name and renamed into
place; an existing FILE (or a job's results directory that holds other files) is kept unless
`overwrite`.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any

from .errors import Incomplete, MergeError
from .generate import span_of
from .ops import Call, Op, PathLike, _absolute, _batch_id
from .records import JobSpan, Merged

FINISH_REASONS = frozenset({"stop", "length", "error"})
OUTPUT = "completions.jsonl"


def parts_of(batch: dict[str, Any]) -> list[JobSpan]:
    """The batch's jobs as spans of the prompts file, checked to tile it from line 1 in order."""
    parts: list[JobSpan] = []
    batch_id = batch.get("batch_id")
    jobs = batch.get("jobs") or []
    if len(jobs) != batch.get("total"):
        raise MergeError(f"batch {batch_id}: this node holds {len(jobs)} of its {batch.get('total')} jobs")
    expected_first = 1
    for seq, job in enumerate(jobs, 1):
        args = job.get("args")
        span = span_of(args) if isinstance(args, list) else None
        if span is None:
            raise MergeError(f"batch {batch_id}: job {job.get('job_id')} is not an `e31 generate` job")
        first, last = span
        if first != expected_first:
            raise MergeError(
                f"batch {batch_id}: job {seq} carries lines {first}-{last}, expected to start at line "
                f"{expected_first}"
            )
        expected_first = last + 1
        outcome = job.get("outcome") if isinstance(job.get("outcome"), dict) else {}
        why = str(outcome.get("text") or job.get("reason") or job.get("state"))
        parts.append(
            JobSpan(
                seq, str(job["job_id"]), first, last, str(job.get("state")), job.get("succeeded") is True, why
            )
        )
    return parts


def completion_lines(text: str, part: JobSpan) -> tuple[list[str], int]:
    """The job's completion lines, each checked, with error lines' numbers made the prompts file's;
    and how many of them are error lines."""
    out: list[str] = []
    errors = 0
    rows = text.split("\n")  # not splitlines(): U+2028 or U+0085 may stand raw inside a JSON string
    if rows[-1] == "":
        rows.pop()
    for number, row in enumerate(rows, 1):
        line = row.removesuffix("\r")
        where = f"job {part.seq} ({part.job_id[:12]}), completion line {number}"
        try:
            doc = json.loads(line)
        except (json.JSONDecodeError, RecursionError):
            raise MergeError(f"{where}: not JSON") from None
        except ValueError:  # an integer of more digits than int() reads (sys.set_int_max_str_digits)
            raise MergeError(f"{where}: a number too long to read") from None
        reason = doc.get("finish_reason") if isinstance(doc, dict) else None
        if not isinstance(reason, str) or reason not in FINISH_REASONS:
            raise MergeError(f"{where}: not a completion (no finish_reason stop, length or error)")
        errors += doc["finish_reason"] == "error"
        if "line" in doc:
            local = doc["line"]
            if (
                isinstance(local, bool)
                or not isinstance(local, int)
                or not 1 <= local <= part.last - part.first + 1
            ):
                raise MergeError(f"{where}: line {local!r} is outside its {part.last - part.first + 1} lines")
            doc["line"] = part.first + local - 1
            line = json.dumps(doc, ensure_ascii=False)
        out.append(line)
    return out, errors


def write_merged(out: Path, lines: list[str], overwrite: bool) -> None:
    """Write FILE whole under a temporary name beside it, then rename (or link, refusing an existing
    name unless `overwrite`) it into place."""
    tmp = out.with_name(f".{out.name}.{secrets.token_hex(4)}")
    try:
        with open(tmp, "x", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))
            f.flush()
            os.fsync(f.fileno())
        if overwrite:
            os.replace(tmp, out)
        else:
            try:
                os.link(tmp, out)
            except FileExistsError:
                raise MergeError(f"{out} exists: not overwritten (pass --overwrite to replace it)") from None
    except OSError as e:
        raise MergeError(f"cannot write {out}: {e.strerror or e}") from None
    finally:
        tmp.unlink(missing_ok=True)


def merge(
    batch: str,
    out: PathLike,
    *,
    partial: bool = False,
    overwrite: bool = False,
    jobs_dir: PathLike | None = None,
) -> Op[Merged]:
    """Merge the completions of the generate batch `batch` into the file `out`, in the prompts' order
    (see the module's docstring); each job's results and receipt go into `jobs_dir` (default: `out`
    with `.jobs` added), one folder NNNN-JOBID each."""
    batch_id = _batch_id(batch)
    target = Path(_absolute(out, "out"))
    if target.is_dir():
        raise MergeError(f"{target} is a directory; give the completions file's name")
    folder = (
        target.with_name(target.name + ".jobs") if jobs_dir is None else Path(_absolute(jobs_dir, "jobs_dir"))
    )
    doc = yield Call("GET", f"/v1/batches/{batch_id}")
    parts = parts_of(doc)
    missing = tuple(p for p in parts if not (p.state == "done" and p.succeeded))
    if missing and not partial:
        shown = "; ".join(f"lines {m.first}-{m.last} (job {m.job_id[:12]}: {m.why})" for m in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise Incomplete(
            f"batch {batch_id}: {len(missing)} of {len(parts)} jobs have not finished well: {shown}{more}; "
            "wait for them (e31 wait), or merge the others (--partial, partial=True)",
            409,
            "incomplete",
        )
    lines: list[str] = []
    merged = errors = 0
    for part in parts:
        if part in missing:
            continue
        where = folder / f"{part.seq:04d}-{part.job_id}"
        yield Call("POST", f"/v1/jobs/{part.job_id}/results", {"out": str(where), "overwrite": overwrite})
        try:
            text = (where / "output" / OUTPUT).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise MergeError(f"job {part.seq} ({part.job_id[:12]}) wrote no /output/{OUTPUT}") from None
        except (OSError, UnicodeDecodeError) as e:
            raise MergeError(f"cannot read {where / 'output' / OUTPUT}: {e}") from None
        got, bad = completion_lines(text, part)
        merged += 1
        errors += bad
        lines += got
    write_merged(target, lines, overwrite)
    return Merged(target, folder, len(parts), merged, len(lines), errors, missing)
