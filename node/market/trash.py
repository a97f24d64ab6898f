"""Finished runs' directories, moved aside at once and deleted together later.

A run's directory is moved aside when its job ends (one rename, in the job's task); the executor's
delivery loop deletes what was moved aside at its next turn, in one thread hop for all (GC removes any
left after a stop: the names never look like a job id).
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
from collections import deque
from pathlib import Path

import trio

log = logging.getLogger("e31.executor")

TRASH_PREFIX = ".trash-"
"""Run directories moved aside to be deleted are named so (never a job id: GC removes them too)."""


class Trash:
    def __init__(self) -> None:
        self._moved: deque[Path] = deque()

    def discard(self, work: Path) -> None:
        """Move a finished run's directory aside (one rename, here), to be deleted at the next `tidy`.
        A run that made none (a tiny job's) costs one stat."""
        if not os.path.lexists(work):
            return
        trash = work.with_name(f"{TRASH_PREFIX}{work.name}-{secrets.token_hex(4)}")
        try:
            os.rename(work, trash)
        except FileNotFoundError:
            return
        except OSError as e:  # left for GC, which removes run directories of jobs not running
            log.warning("cannot move the run directory %s aside: %s", work, e)
            return
        self._moved.append(trash)

    def _empty(self) -> None:
        while self._moved:
            shutil.rmtree(self._moved.popleft(), ignore_errors=True)

    async def tidy(self) -> None:
        """Delete what was moved aside, in one thread hop."""
        if self._moved:
            await trio.to_thread.run_sync(self._empty)
