"""Receipts checked offline: the bundle format (every envelope an auditor needs, and the blobs to
re-run), the checks of what a bundle's envelopes claim, and re-execution of its jobs.

Its public names are imported lazily from their modules (node/__init__.py, `lazy_exports`).
"""

from typing import TYPE_CHECKING

from .. import lazy_exports

if TYPE_CHECKING:
    from .bundle import Bundle, BundleError, Export, export_bundle, read_bundle, write_bundle
    from .checks import AuditReport, Finding, audit, render
    from .rerun import Rerun, rerun_job

__all__ = [
    "AuditReport",
    "Bundle",
    "BundleError",
    "Export",
    "Finding",
    "Rerun",
    "audit",
    "export_bundle",
    "read_bundle",
    "render",
    "rerun_job",
    "write_bundle",
]
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "AuditReport": "checks",
        "Bundle": "bundle",
        "BundleError": "bundle",
        "Export": "bundle",
        "Finding": "checks",
        "Rerun": "rerun",
        "audit": "checks",
        "export_bundle": "bundle",
        "read_bundle": "bundle",
        "render": "checks",
        "rerun_job": "rerun",
        "write_bundle": "bundle",
    },
)
