"""The client's errors: one base, and a class for each thing a caller may want to catch.

Every one derives from e31.node.errors' parties too (UsageError, Unavailable, StoreError), so the CLI
prints it as one line with the right exit code. `from_api` turns what the local API answered (its HTTP
status and error `code`, docs/submitting.md) into the matching class; the node's own message is kept.
"""

from __future__ import annotations

from typing import Any

from e31.node.api.client import ApiClientError, ApiError
from e31.node.api.client import NodeNotRunning as _ApiNodeNotRunning
from e31.node.errors import NodeError, StoreError, Unavailable, UsageError


class ClientError(NodeError):
    """Base of the client's errors; `str(e)` is one line fit for a user."""


class NodeNotRunning(ClientError, Unavailable):
    """No node runs with this data dir (no api.json, or nothing listens at the port it names)."""


class ConnectionFailed(ClientError, Unavailable):
    """The node did not answer in time, or the connection to it failed."""


class Refused(ClientError):
    """The node answered with an error. `status` is the HTTP status, `code` the API's error code."""

    def __init__(self, message: str, status: int = 0, code: str = "error") -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class InvalidRequest(Refused, UsageError):
    """The request is wrong: a job the node refuses (invalid module, limits, files), a bad argument."""


class BadId(InvalidRequest):
    """Not a job id, a prefix of one (at least 6 hex digits) or a batch id."""


class NotFound(Refused):
    """No such job or batch on this node (exit 1, as the CLI always had for an unknown job)."""


class AmbiguousId(Refused, UsageError):
    """A job id prefix that matches more than one job; `candidates` holds their full ids."""

    def __init__(self, message: str, candidates: list[str], status: int = 409) -> None:
        super().__init__(message, status, "ambiguous_id")
        self.candidates = candidates


class NotFinished(Refused):
    """The job has no verified result yet (it has not ended, or ended without one)."""


class Exists(Refused, UsageError):
    """A file the node was asked to write is there already (pass overwrite=True to replace it)."""


class Unauthorized(Refused, UsageError):
    """The node refused the bearer token (api.json belongs to another node run)."""


class Busy(Refused, Unavailable):
    """The node is too busy to answer now (too many connections); try again."""


class DiskFull(Refused, StoreError):
    """The node's disk is full; free space on it, then try again."""


class OptionError(ClientError, UsageError):
    """An argument of a client method is wrong before anything is sent (a bad size, deadline, path)."""


class PromptsError(OptionError):
    """A prompts file that cannot be used (generate); the message names the file (and lines) and why."""


class ModelFileError(OptionError):
    """A model, tokenizer or inference module that cannot be used (generate); the message names the
    file and what is wrong."""


class MergeError(ClientError, UsageError):
    """A batch that cannot be merged (merge): not a generate batch, spans that do not tile the prompts
    file, a bad completion line, a completions file that cannot be written."""


class LocalFileError(ClientError, StoreError):
    """A file the client itself had to write on this machine could not be (generate's span files in a
    temporary directory): the disk is full, the directory is missing or not writable. The message
    names the file and the system's reason."""


class Incomplete(NotFinished):
    """Some jobs of the batch to merge have not finished well (yet); the message lists them."""


_BY_CODE: dict[str, type[Refused]] = {
    "bad_id": BadId,
    "invalid_job": InvalidRequest,
    "bad_request": InvalidRequest,
    "unknown_id": NotFound,
    "unknown_job": NotFound,
    "not_found": NotFound,
    "exists": Exists,
    "unauthorized": Unauthorized,
    "busy": Busy,
    "disk_full": DiskFull,
}


def from_api(e: ApiClientError) -> ClientError:
    """The client error for an error of the raw API client (node/api/client.py)."""
    if isinstance(e, _ApiNodeNotRunning):
        return NodeNotRunning(str(e))
    if not isinstance(e, ApiError):
        return ConnectionFailed(str(e))
    message = e.message or str(e)
    if e.code == "ambiguous_id":
        candidates: Any = e.details.get("candidates")
        ok = isinstance(candidates, list) and all(isinstance(c, str) for c in candidates)
        return AmbiguousId(message, list(candidates) if ok else [], e.status)
    cls = _BY_CODE.get(e.code)
    if cls is None:
        cls = {400: InvalidRequest, 404: NotFound, 409: NotFinished, 507: DiskFull}.get(e.status, Refused)
    return cls(message, e.status, e.code)
