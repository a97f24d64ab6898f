"""Shared commits (node/market/commits.py): the writes of tasks that commit at the same moment go
into one transaction, and one task's failing write does not take the others' with it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from e31.node.errors import StoreError
from e31.node.market.commits import SharedCommits
from e31.node.store.async_store import AsyncStore
from e31.node.store.db import Store, call


def refuse(store: Store) -> None:
    raise StoreError("this write cannot be stored")


@pytest.fixture
async def store(tmp_path: Path) -> Any:
    s = await AsyncStore.open(tmp_path / "node.sqlite")
    try:
        yield s
    finally:
        await s.aclose()


def counting(store: AsyncStore) -> list[int]:
    """Record the number of calls of each transaction `store.atomically` makes."""
    made: list[int] = []
    atomically = store.atomically

    async def counted(*calls: Any, durable: bool = True) -> Any:
        made.append(len(calls))
        return await atomically(*calls, durable=durable)

    store.atomically = counted  # type: ignore[method-assign]
    return made


async def test_tasks_committing_at_once_share_one_transaction_and_get_their_own_results(
    store: AsyncStore,
) -> None:
    made = counting(store)
    shared = SharedCommits(store)
    got: dict[int, list[Any]] = {}

    async def write(i: int) -> None:
        got[i] = await shared.atomically(call(Store.kv_set, f"k{i}", b"%d" % i), call(Store.kv_get, f"k{i}"))

    async with trio.open_nursery() as nursery:
        for i in range(5):
            nursery.start_soon(write, i)
    assert made == [10]
    assert got == {i: [None, b"%d" % i] for i in range(5)}


async def test_a_lone_task_commits_alone(store: AsyncStore) -> None:
    made = counting(store)
    shared = SharedCommits(store)
    assert await shared.atomically(call(Store.kv_set, "a", b"1")) == [None]
    assert await shared.atomically(call(Store.kv_set, "b", b"2")) == [None]
    assert made == [1, 1]


async def test_a_failing_write_fails_its_own_task_only(store: AsyncStore) -> None:
    made = counting(store)
    shared = SharedCommits(store)
    outcomes: dict[int, object] = {}

    async def write(i: int) -> None:
        calls = [call(Store.kv_set, f"k{i}", b"x")] + ([call(refuse)] if i == 1 else [])
        try:
            outcomes[i] = await shared.atomically(*calls)
        except StoreError as e:
            outcomes[i] = e

    async with trio.open_nursery() as nursery:
        for i in range(3):
            nursery.start_soon(write, i)
    assert made[0] == 4 and sorted(made[1:]) == [1, 1, 2], "the whole batch, then each task alone"
    assert outcomes[0] == [None] and outcomes[2] == [None]
    assert isinstance(outcomes[1], StoreError)
    assert [await store.run(Store.kv_get, f"k{i}") for i in range(3)] == [b"x", None, b"x"]
