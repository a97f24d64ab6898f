"""The local HTTP API: the server (h11 on 127.0.0.1, the bearer token, size and time limits, the
two connection pools), the jobs and export endpoints, the dashboard (its static files and endpoints),
GET /metrics, and the client the CLI uses.

Its public names are imported lazily from their modules (node/__init__.py, `lazy_exports`).
"""

from typing import TYPE_CHECKING

from .. import lazy_exports

if TYPE_CHECKING:
    from .client import ApiClient, ApiClientError, ApiError, NodeNotRunning
    from .dashboard import DashboardApi
    from .export import export_handler
    from .jobs import JobsApi, compile_check
    from .prometheus import metrics_handler
    from .server import (
        ControlEndpoint,
        ControlError,
        ControlLimits,
        HttpError,
        JsonResponse,
        RawResponse,
        Request,
        Router,
        serve_control,
    )

__all__ = [
    "ApiClient",
    "ApiClientError",
    "ApiError",
    "ControlEndpoint",
    "ControlError",
    "ControlLimits",
    "DashboardApi",
    "HttpError",
    "JobsApi",
    "JsonResponse",
    "NodeNotRunning",
    "RawResponse",
    "Request",
    "Router",
    "compile_check",
    "export_handler",
    "metrics_handler",
    "serve_control",
]
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "ApiClient": "client",
        "ApiClientError": "client",
        "ApiError": "client",
        "ControlEndpoint": "server",
        "ControlError": "server",
        "ControlLimits": "server",
        "DashboardApi": "dashboard",
        "HttpError": "server",
        "JobsApi": "jobs",
        "JsonResponse": "server",
        "NodeNotRunning": "client",
        "RawResponse": "server",
        "Request": "server",
        "Router": "server",
        "compile_check": "jobs",
        "export_handler": "export",
        "metrics_handler": "prometheus",
        "serve_control": "server",
    },
)
