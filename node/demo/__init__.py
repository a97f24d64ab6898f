"""`e31 demo`: a throwaway network of real node processes on 127.0.0.1 renders a Mandelbrot image
as jobs and audits every receipt. It drives the CLI as a user would, so it sits above it.

Its public names are imported lazily from their modules (node/__init__.py, `lazy_exports`).
"""

from typing import TYPE_CHECKING

from .. import lazy_exports

if TYPE_CHECKING:
    from .net import LocalNetwork, NetworkError
    from .run import DemoError, DemoOptions, DemoResult, run_demo
    from .verdict import Verdict, judge

__all__ = [
    "DemoError",
    "DemoOptions",
    "DemoResult",
    "LocalNetwork",
    "NetworkError",
    "Verdict",
    "judge",
    "run_demo",
]
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "DemoError": "run",
        "DemoOptions": "run",
        "DemoResult": "run",
        "LocalNetwork": "net",
        "NetworkError": "net",
        "Verdict": "verdict",
        "judge": "verdict",
        "run_demo": "run",
    },
)
