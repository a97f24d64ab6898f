"""Shared commits: the writes that several tasks make at the same moment go into one transaction.

Each job a submitter ends with a verified receipt takes a few writes that must commit together: the
jobs of a `results` carrier taken in one pass (outcomes.py `_take_together`, through `each`, a group
of writes per job), and those taken each in a task of its own at the same moment (`atomically`).
`SharedCommits` stands for `AsyncStore.atomically`: the first caller leads a batch, lets every other
task that is ready run (a checkpoint, again while more join), then commits all the groups of the batch
in one transaction and hands each its own results. A batch that fails is committed again one group at
a time, so one group's failing write never takes the others' with it (each gets its own error):
`commit_each`, which the executor's deliveries use too (delivery.py). A lone caller costs one
checkpoint more than `AsyncStore.atomically`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import trio

from ..errors import StoreError
from ..store.async_store import AsyncStore
from ..store.db import Call


class _Batch:
    __slots__ = ("done", "members", "results")

    def __init__(self) -> None:
        self.members: list[tuple[Call, ...]] = []
        self.results: list[list[Any] | StoreError] = []
        self.done = trio.Event()


class SharedCommits:
    def __init__(self, store: AsyncStore) -> None:
        self.store = store
        self._open: _Batch | None = None

    async def atomically(self, *calls: Call) -> list[Any]:
        """The results of `calls`, committed durably in one transaction with those of the tasks that
        call this at the same moment (all of a task's calls commit or none do)."""
        (result,) = await self.each([calls])
        if isinstance(result, StoreError):
            raise result
        return result

    async def each(self, groups: Sequence[tuple[Call, ...]]) -> list[list[Any] | StoreError]:
        """Each group's results, or the StoreError of its own commit: the groups of one caller (the
        jobs of a carrier taken in one pass) committed as those of as many tasks calling `atomically`
        at this moment, with theirs (each group all or nothing)."""
        batch = self._open
        leader = batch is None
        if batch is None:
            batch = self._open = _Batch()
        first = len(batch.members)
        batch.members.extend(groups)
        if leader:
            with trio.CancelScope(shield=True):  # the others wait on this batch: it always commits
                await self._lead(batch)
        else:
            await batch.done.wait()
        return batch.results[first : first + len(groups)]

    async def _lead(self, batch: _Batch) -> None:
        try:
            joined = -1
            while joined != len(batch.members):
                joined = len(batch.members)
                await trio.lowlevel.checkpoint()
            self._open = None
            batch.results = await commit_each(self.store, batch.members)
        finally:
            if self._open is batch:
                self._open = None
            missing = StoreError("the shared commit was not made")
            batch.results += [missing] * (len(batch.members) - len(batch.results))
            batch.done.set()


async def commit_each(store: AsyncStore, groups: Sequence[tuple[Call, ...]]) -> list[list[Any] | StoreError]:
    """Commit `groups` (each all or nothing) durably in one transaction; if it fails, each group alone,
    so one group's failing write never takes the others with it. Returns each group's results, or the
    StoreError of its own commit."""
    if len(groups) > 1:
        try:
            merged = await store.atomically(*(c for group in groups for c in group))
        except StoreError:
            pass
        else:
            results: list[list[Any] | StoreError] = []
            start = 0
            for group in groups:
                results.append(merged[start : start + len(group)])
                start += len(group)
            return results
    return [await _alone(store, group) for group in groups]


async def _alone(store: AsyncStore, calls: tuple[Call, ...]) -> list[Any] | StoreError:
    try:
        return await store.atomically(*calls)
    except StoreError as e:
        return e
