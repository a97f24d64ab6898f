"""The job manifest: everything an executor needs to run a job, and nothing about who runs it.

The job id is SHA-256 of the manifest's canonical msgpack encoding (the array of its fields).
An offer wraps a manifest with the offer's own expiry, so re-offering a job keeps its id.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .blobs import MAX_BLOB_SIZE, BlobRef
from .codec import pack
from .errors import InvalidMessage
from .ids import Digest, NodeId, sha256
from .schema import (
    BY_NAME,
    TIME,
    U32,
    Bin,
    Hash,
    Key,
    Opt,
    Record,
    Seq,
    Sub,
    Text,
    UInt,
    record,
    w,
)

NAME_MAX = 255
MAX_INPUTS = 1024
MAX_ARGS = 256
ARG_MAX = 4096
MAX_ENV = 256
MAX_REPLICAS = 16
NONCE_SIZE = 16


_PART = r"(?!\.\.?(?:/|$))[^/\x00-\x1f\x7f\\]+"
_FILE_NAME = re.compile(rf"{_PART}(?:/{_PART})*")


def check_file_name(name: str) -> str | None:
    """Why `name` is not a valid relative file name of a job's sandbox, or None if it is.

    Valid: '/'-separated parts, none empty, '.' or '..', no control character or backslash.
    """
    if _FILE_NAME.fullmatch(name) is None:
        return (
            f"file name {name!r} is not relative, or has an empty, '.' or '..' part, "
            "a control character or a backslash"
        )
    return None


def _env_name_rule(name: str) -> str | None:
    if "=" in name:
        return f"environment variable name {name!r} contains '='"
    return None


# ASCII file names (at least one character) that need no regex: printable (no control character),
# no backslash, no empty part, no part starting with "." (so none is "." or "..")
_QUICK_FILE_NAME = (
    '{x}.isprintable() and "\\\\" not in {x} and "//" not in {x} and "/." not in {x} '
    'and {x}[0] not in "/." and {x}[-1] != "/"'
)
FILE_NAME = Text(
    NAME_MAX,
    min_len=1,
    rule=check_file_name,
    label="relative file name (section 8)",
    quick=_QUICK_FILE_NAME,
    native=("file_name",),
)


@record
@dataclass(frozen=True, slots=True)
class Limits(Record):
    """Resource ceilings for one run. The job is stopped when any is reached."""

    fuel: int = field(metadata=w(UInt(minimum=1)))
    memory_bytes: int = field(metadata=w(UInt(minimum=1)))
    wall_ms: int = field(metadata=w(UInt(minimum=1)))
    max_output_bytes: int = field(metadata=w(UInt(MAX_BLOB_SIZE)))


@record
@dataclass(frozen=True, slots=True)
class FileRef(Record):
    """A file at a relative path: a job input, or an output file the job wrote."""

    name: str = field(metadata=w(FILE_NAME))
    blob: BlobRef = field(metadata=w(Sub(BlobRef)))


@record
@dataclass(frozen=True, slots=True)
class EnvVar(Record):
    name: str = field(
        metadata=w(
            Text(
                NAME_MAX,
                min_len=1,
                rule=_env_name_rule,
                label="no `=`",
                quick='"=" not in {x}',
                native=("exclude", "="),
            )
        )
    )
    value: str = field(metadata=w(Text(ARG_MAX)))


class _JobIdSlot(Record):
    """Room for a manifest's job id, computed once (a frozen dataclass with slots has no other)."""

    __slots__ = ("_job_id",)
    _job_id: Digest


@record
@dataclass(frozen=True, slots=True)
class JobManifest(_JobIdSlot):
    """What to run, on what, within which limits, by when, and who asks."""

    module: BlobRef = field(metadata=w(Sub(BlobRef)))
    inputs: tuple[FileRef, ...] = field(metadata=w(Seq(Sub(FileRef), MAX_INPUTS, order_key=BY_NAME)))
    args: tuple[str, ...] = field(metadata=w(Seq(Text(ARG_MAX), MAX_ARGS)))
    env: tuple[EnvVar, ...] = field(metadata=w(Seq(Sub(EnvVar), MAX_ENV, order_key=BY_NAME)))
    stdin: BlobRef | None = field(metadata=w(Opt(Sub(BlobRef))))
    limits: Limits = field(metadata=w(Sub(Limits)))
    deadline: int = field(metadata=w(TIME))
    retention_ms: int = field(metadata=w(UInt(U32)))
    replicas: int = field(metadata=w(UInt(MAX_REPLICAS, minimum=1)))
    profile: Digest = field(metadata=w(Hash()))
    submitter: NodeId = field(metadata=w(Key()))
    nonce: bytes = field(metadata=w(Bin(NONCE_SIZE, NONCE_SIZE)))
    created_at: int = field(metadata=w(TIME))

    def _validate(self) -> None:
        if self.deadline <= self.created_at:
            raise InvalidMessage("JobManifest: the deadline is not after the creation time")
        inputs = self.inputs
        if len(inputs) > 1:  # a file can only lie under another file
            names = set(map(BY_NAME, inputs))
            for name in map(BY_NAME, inputs):
                cut = name.rfind("/")
                while cut > 0:
                    if name[:cut] in names:
                        raise InvalidMessage(
                            f"JobManifest.inputs: {name!r} lies under the file {name[:cut]!r}"
                        )
                    cut = name.rfind("/", 0, cut)

    @property
    def job_id(self) -> Digest:
        """SHA-256 of the manifest's canonical encoding."""
        try:
            return self._job_id
        except AttributeError:
            pass
        value = sha256(pack(self.to_wire()))
        object.__setattr__(self, "_job_id", value)
        return value
