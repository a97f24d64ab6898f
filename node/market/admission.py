"""Admission of a submitter's jobs to be offered: at most `slots` at once, and, once jobs wait, in groups.

A sweep of thousands of jobs keeps `slots` of them offered or assigned and the rest waiting. Freed
one by one as jobs end, slots would admit the waiting jobs one by one, and each would be offered
alone; held until `step` are free (or every waiting job fits), they admit a group that goes out
together in one offer (docs/protocol.md section 6: an offer carries up to 64 jobs). A job that finds
a free slot and nobody waiting goes at once.
"""

from __future__ import annotations

from collections import deque
from types import TracebackType

import trio


class Admission:
    """An async context manager: `async with admission:` holds one slot while the block runs."""

    def __init__(self, slots: int, step: int) -> None:
        if slots < 1 or not 1 <= step <= slots:
            raise ValueError("need slots >= 1 and 1 <= step <= slots")
        self.free = slots
        self.step = step
        self._waiting: deque[trio.Event] = deque()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    async def __aenter__(self) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()  # cancelled: no slot taken
        if self.free > 0 and not self._waiting:
            self.free -= 1
            await trio.lowlevel.cancel_shielded_checkpoint()  # taken: the block runs and gives it back
            return
        admitted = trio.Event()
        self._waiting.append(admitted)
        try:
            await admitted.wait()
        except BaseException:
            if admitted.is_set():  # admitted as it was cancelled: the slot goes back
                self._release()
            else:
                self._waiting.remove(admitted)
                self._admit()  # the others may fit now
            raise

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._release()

    def _release(self) -> None:
        self.free += 1
        self._admit()

    def _admit(self) -> None:
        if self._waiting and self.free >= min(self.step, len(self._waiting)):
            while self._waiting and self.free > 0:
                self.free -= 1
                self._waiting.popleft().set()
