"""The node's garbage collector settings: young generations collected far less often than Python's
default, and what exists at start-up frozen out of collection; cyclic garbage is still collected."""

from __future__ import annotations

import gc
import weakref

from e31.node.host import gctune


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_tune_sets_the_thresholds_and_freezes_what_exists() -> None:
    before = gc.get_threshold()
    try:
        gctune.tune()
        assert gc.get_threshold() == gctune.THRESHOLDS
        assert gc.get_freeze_count() > 0
        # a cycle made afterwards is still garbage the collector finds
        cycle = _Cycle()
        ref = weakref.ref(cycle)
        del cycle
        gc.collect()
        assert ref() is None
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
