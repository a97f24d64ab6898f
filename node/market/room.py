"""Jobs waiting to be offered again because every node's queue was full: woken as room frees.

A round whose last decline was for want of room (`busy`: the queue is full; `deadline`: the jobs
promised there leave no time) waits before the job is offered again, the wait doubling per such round
(Submitter._attempts). Waiting out the whole delay would leave a sweep's last jobs idle for seconds
while the queues that declined them empty. Here, each job of this submitter that ends at an
executor (its room there is free again) wakes the job that has waited longest, which is offered again
at once; the others wait on. One woken job per ended job: a sweep is offered again at the rate its jobs
end, not all at once.
"""

from __future__ import annotations

import trio

ROOM_REASONS = ("busy", "deadline")
"""Decline reasons that say the node had no room then (and may have some when a job ends)."""


def for_room(declined: str | None) -> bool:
    """Whether a round's last decline (`reason: text`, or None) was for want of room."""
    return declined is not None and declined.split(":", 1)[0] in ROOM_REASONS


class RoomWaits:
    def __init__(self) -> None:
        self._waiting: dict[trio.Event, None] = {}
        """The jobs waiting, in the order they began to (an event each)."""

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    async def wait(self, seconds: float) -> None:
        """Wait `seconds`, or less if room frees meanwhile (`freed`)."""
        woken = trio.Event()
        self._waiting[woken] = None
        try:
            with trio.move_on_after(seconds):
                await woken.wait()
        finally:
            self._waiting.pop(woken, None)

    def freed(self) -> None:
        """A job ended at an executor: wake the job that has waited longest, if any."""
        if self._waiting:
            woken = next(iter(self._waiting))
            del self._waiting[woken]
            woken.set()
