"""The rows the store returns: one frozen dataclass per table read, its fields the table's columns.

JobRow and ReceiptRow are built straight from a row (`JobRow(*row)`), so their fields are in the order
of `columns(...)`, the select list their queries use.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PeerRow:
    node_id: str
    network: str
    addresses: tuple[str, ...]
    source: str
    first_seen: float
    last_seen: float
    failures: int
    last_failure: float | None
    contact: bytes | None


@dataclass(frozen=True, slots=True)
class JobRow:
    job_id: bytes
    role: str
    manifest: bytes
    state: str
    submitter: str
    executor: str | None
    attempt: int
    created: float
    deadline: float
    updated: float
    started: float | None
    finished: float | None
    fuel_limit: int | None
    fuel_used: int | None
    reason: str | None


@dataclass(frozen=True, slots=True)
class EnvelopeRow:
    message_id: bytes
    kind: str
    raw: bytes
    job_id: bytes | None
    """The job it was stored for; None for one stored alone or shared by several jobs."""
    received: float


@dataclass(frozen=True, slots=True)
class ResultRow:
    job_id: bytes
    attempt: int
    executor: str
    message_id: bytes
    status: str
    fuel_used: int | None
    outputs: dict[str, str]
    created: float


@dataclass(frozen=True, slots=True)
class ReceiptRow:
    digest: bytes
    job_id: bytes
    attempt: int
    executor: str
    message_id: bytes
    log_index: int | None
    created: float
    delivered: float | None
    next_delivery: float | None
    delivery_tries: int


def columns(row: type[JobRow | ReceiptRow], table: str = "") -> str:
    """The select list of `row`'s columns in its fields' order, qualified by `table` when given."""
    return ", ".join(f"{table}.{name}" if table else name for name in row.__slots__)
