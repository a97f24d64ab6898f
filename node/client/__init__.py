"""The Python client for submitters, imported as `e31.client`: a typed API over the local node's HTTP
API for scripts and programs that send jobs and sweeps, follow them, and collect their results; and
batch inference (generate.py: a prompts file in, merge.py: the completions file out).

`Client` blocks; `AsyncClient` is the same for trio. Both drive the operations in ops.py (written once,
as generators), so they behave alike; errors are ClientError subclasses (errors.py), records what the
methods return (records.py). docs/submitting.md shows a sweep in five lines.

Its public names are imported lazily from their modules (node/__init__.py, `lazy_exports`).

`e31.client` and `e31.node.client` (the CLI's name for it) are one package: pyproject maps both names to
this directory, and when this file runs as `e31.client` it makes that name an alias of `e31.node.client`
(`same_package`), so every module, and every class (the errors a script catches), is loaded once.
"""

from typing import TYPE_CHECKING

from e31.node import lazy_exports, same_package

if __name__ == "e31.client":
    same_package(__name__, "e31.node.client")

if TYPE_CHECKING:
    from .async_client import AsyncClient
    from .errors import (
        AmbiguousId,
        BadId,
        Busy,
        ClientError,
        ConnectionFailed,
        DiskFull,
        Exists,
        Incomplete,
        InvalidRequest,
        LocalFileError,
        MergeError,
        ModelFileError,
        NodeNotRunning,
        NotFinished,
        NotFound,
        OptionError,
        PromptsError,
        Refused,
        Unauthorized,
    )
    from .records import Batch, Cancelled, Export, Generation, Job, JobSpan, Merged, Outcome, Progress, Result
    from .sync import Client

__all__ = [
    "AmbiguousId",
    "AsyncClient",
    "BadId",
    "Batch",
    "Busy",
    "Cancelled",
    "Client",
    "ClientError",
    "ConnectionFailed",
    "DiskFull",
    "Exists",
    "Export",
    "Generation",
    "Incomplete",
    "InvalidRequest",
    "Job",
    "JobSpan",
    "LocalFileError",
    "MergeError",
    "Merged",
    "ModelFileError",
    "NodeNotRunning",
    "NotFinished",
    "NotFound",
    "OptionError",
    "Outcome",
    "Progress",
    "PromptsError",
    "Refused",
    "Result",
    "Unauthorized",
]
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "AmbiguousId": "errors",
        "AsyncClient": "async_client",
        "BadId": "errors",
        "Batch": "records",
        "Busy": "errors",
        "Cancelled": "records",
        "Client": "sync",
        "ClientError": "errors",
        "ConnectionFailed": "errors",
        "DiskFull": "errors",
        "Exists": "errors",
        "Export": "records",
        "Generation": "records",
        "Incomplete": "errors",
        "InvalidRequest": "errors",
        "Job": "records",
        "JobSpan": "records",
        "LocalFileError": "errors",
        "MergeError": "errors",
        "Merged": "records",
        "ModelFileError": "errors",
        "NodeNotRunning": "errors",
        "NotFinished": "errors",
        "NotFound": "errors",
        "OptionError": "errors",
        "Outcome": "records",
        "Progress": "records",
        "PromptsError": "errors",
        "Refused": "errors",
        "Result": "records",
        "Unauthorized": "errors",
    },
)
