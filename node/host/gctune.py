"""The node's settings for Python's cyclic garbage collector.

A node allocates many short-lived container objects per message (trio's tasks, cancel scopes and
outcomes, decoded records): with the default thresholds (700, 10, 10) the young generations were
collected hundreds of times in a 1,000-job sweep, 0.5 s of the submitting node's CPU, and every
collection walks objects that all die by reference counting anyway. Collecting the youngest generation
every THRESHOLDS[0] net allocations instead cut that to 0.06 s; the three nodes' CPU per job fell by
about a tenth in interleaved runs (docs/benchmarks.md, "Jobs at scale"). Objects alive once the node
has started (modules, classes, configuration) are frozen out of collection altogether.

Cyclic garbage (a traceback holding its frames, say) still goes: at the latest after THRESHOLDS[0] *
THRESHOLDS[1] * THRESHOLDS[2] net allocations, and resident memory stays flat over a soak.
"""

from __future__ import annotations

import gc

THRESHOLDS = (20_000, 20, 10)


def tune() -> None:
    """Set the thresholds and freeze what exists now (call once the node is set up)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
