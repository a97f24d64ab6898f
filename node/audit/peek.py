"""What an envelope that does not verify claims to be: its kind, signer and job, only to label a finding
(never trusted)."""

from __future__ import annotations

from e31.protocol.codec import unpack
from e31.protocol.errors import ProtocolError
from e31.protocol.ids import NodeId

_JOB_ID_FIELD: dict[str, tuple[int, str]] = {
    "receipt": (1, "one"),
    "assign": (1, "one"),
    "assigns": (5, "items"),
    "result": (1, "one"),
    "accepted": (1, "one"),
    "release": (1, "one"),
    "cancel": (1, "one"),
    "withdraw": (1, "one"),
    "decline": (1, "list"),
    "award": (4, "list"),
    "bid": (4, "items"),
    "results": (2, "items"),
}
"""Where the body of an envelope of each kind names its jobs, for labelling one that does not verify:
(field index, "one" job id, a "list" of job ids, or "items" records whose first field is a job id).
An offer names its jobs only through its manifests' hashes, which a broken envelope cannot be
trusted to encode canonically: it gets no label."""


def peek(raw: bytes) -> tuple[str, str | None, str | None]:
    """Kind, signer and job id an unverifiable envelope claims, for the report (never trusted); the job
    only when the envelope names exactly one (a finding is about one job)."""
    try:
        env = unpack(raw)
        kind, body, signer = env[1], env[2], env[3]
        kind = kind if isinstance(kind, str) and kind.isascii() and len(kind) <= 16 else "unknown"
        node = str(NodeId(signer)) if isinstance(signer, bytes) and len(signer) == 32 else None
    except Exception:  # anything at all: this is only a label for a broken envelope
        return "unreadable", None, None
    jobs = _claimed_jobs(kind, body)
    return kind, node, jobs[0].hex() if len(jobs) == 1 else None


def _claimed_jobs(kind: str, body: object) -> list[bytes]:
    """The job ids the body of a `kind` envelope names where _JOB_ID_FIELD says (none if it is not so)."""
    where = _JOB_ID_FIELD.get(kind)
    if where is None or not isinstance(body, bytes):
        return []
    index, shape = where
    try:
        fields = unpack(body)
    except ProtocolError:
        return []
    if not isinstance(fields, tuple) or len(fields) <= index:
        return []
    value = fields[index]
    if shape == "one":
        candidates = [value]
    elif not isinstance(value, tuple):
        return []
    elif shape == "list":
        candidates = list(value)
    else:
        candidates = [item[0] if isinstance(item, tuple) and item else None for item in value]
    if not all(isinstance(c, bytes) and len(c) == 32 for c in candidates):
        return []
    return candidates
