"""The machine the node runs on: the capacity it can spare beside its owner (idle detection from
/proc), the Python collector's settings, and returning free heap pages to the OS.

Its public names are imported lazily from their modules (node/__init__.py, `lazy_exports`).
"""

from typing import TYPE_CHECKING

from .. import lazy_exports

if TYPE_CHECKING:
    from .capacity import Capacity, CapacityError, CapacityPolicy, sampler_from_env
    from .gctune import tune
    from .memtrim import run_trimmer

__all__ = [
    "Capacity",
    "CapacityError",
    "CapacityPolicy",
    "run_trimmer",
    "sampler_from_env",
    "tune",
]
__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "Capacity": "capacity",
        "CapacityError": "capacity",
        "CapacityPolicy": "capacity",
        "run_trimmer": "memtrim",
        "sampler_from_env": "capacity",
        "tune": "gctune",
    },
)
