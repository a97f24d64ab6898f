"""The job path between nodes: the router of job messages, the submitter (offering, answers, hand-off,
outcomes, inclusion proofs, acknowledgements) and the executor (bids, held jobs, runs, delivery until
acknowledged), their pure rules, the scheduler over the sandbox pool, admission, blob transfer, the
capacity adverts, and the wiring of all of it (service.py).

Its public names are imported lazily from their modules (node/__init__.py, `lazy_exports`).
"""

from typing import TYPE_CHECKING

from .. import lazy_exports

if TYPE_CHECKING:
    from .adverts import CapacityService
    from .context import MarketContext, MarketSettings
    from .executor import Executor
    from .outputs import JobFailed
    from .router import Market
    from .scheduler import Scheduler
    from .service import JobPath, build_job_path, run_jobs
    from .submitter import Submitter, UnknownJob
    from .transfer import BlobTransfer, FetchError

__all__ = [
    "BlobTransfer",
    "CapacityService",
    "Executor",
    "FetchError",
    "JobFailed",
    "JobPath",
    "Market",
    "MarketContext",
    "MarketSettings",
    "Scheduler",
    "Submitter",
    "UnknownJob",
    "build_job_path",
    "run_jobs",
]
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "BlobTransfer": "transfer",
        "CapacityService": "adverts",
        "Executor": "executor",
        "FetchError": "transfer",
        "JobFailed": "outputs",
        "JobPath": "service",
        "Market": "router",
        "MarketContext": "context",
        "MarketSettings": "context",
        "Scheduler": "scheduler",
        "Submitter": "submitter",
        "UnknownJob": "submitter",
        "build_job_path": "service",
        "run_jobs": "service",
    },
)
