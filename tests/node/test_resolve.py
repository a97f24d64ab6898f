"""POST /v1/resolve, the one resolver of job ids: full ids, unique prefixes (either role's jobs, odd
digit counts included), batch ids, and the typed errors for bad, unknown and ambiguous ones, on a real
SQLite store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from e31.node.api.resolve import MIN_PREFIX, resolve_handler
from e31.node.api.server import HttpError, JsonResponse, Request
from e31.node.store.async_store import AsyncStore
from e31.node.store.batches import store_batch
from e31.node.store.db import Store
from e31.node.store.lookup import prefix_range

IDS = [
    bytes.fromhex("abc123" + "00" * 29),
    bytes.fromhex("abc123" + "ff" * 29),  # shares its first 6 digits with the one above
    bytes.fromhex("abc124" + "11" * 29),
    bytes.fromhex("0f" * 32),
]


def _job(job_id: bytes, role: str = "submitter") -> dict[str, Any]:
    return {
        "job_id": job_id,
        "role": role,
        "manifest": b"m",
        "state": "queued" if role == "submitter" else "offered",
        "submitter": "e31n" + "a" * 52,
        "created": 1.0,
        "deadline": 2.0,
    }


@pytest.fixture
async def store(tmp_path: Path) -> AsyncStore:
    s = Store(tmp_path / "db.sqlite")
    for j in IDS[:3]:
        s.add_job(**_job(j))
    s.add_job(**_job(IDS[3], "executor"))
    s.add_job(**_job(IDS[0], "executor"))  # both roles: still one job
    return AsyncStore(s)


async def _resolve(store: AsyncStore, ids: list[str]) -> Any:
    return await resolve_handler(store)(Request("POST", "/v1/resolve", {}, {}, {"ids": ids}))


async def test_ids_prefixes_and_batches(store: AsyncStore) -> None:
    full = IDS[2].hex()
    assert await _resolve(store, [full]) == {"job_ids": [full], "batches": []}
    assert (await _resolve(store, ["ee" * 32]))["job_ids"] == ["ee" * 32]  # whole ids pass as they are
    assert (await _resolve(store, ["ABC124 "]))["job_ids"] == [full]  # case and spaces forgiven
    assert (await _resolve(store, ["abc1230"]))["job_ids"] == [IDS[0].hex()]  # odd digit count
    assert (await _resolve(store, ["0f0f0f"]))["job_ids"] == [IDS[3].hex()]  # an executor's job
    bid = store_batch(store.store, [_job(bytes([7]) * 32), _job(bytes([8]) * 32)], 3.0)
    answer = await _resolve(store, [bid, "070707", full])
    assert answer == {"job_ids": [(bytes([7]) * 32).hex(), (bytes([8]) * 32).hex(), full], "batches": [bid]}


async def test_an_ambiguous_prefix_lists_its_candidates(store: AsyncStore) -> None:
    answer = await _resolve(store, ["abc123"])
    assert isinstance(answer, JsonResponse) and answer.status == 409
    error = answer.body["error"]
    assert error["code"] == "ambiguous_id"
    assert error["candidates"] == [IDS[0].hex(), IDS[1].hex()]
    assert "'abc123' is ambiguous" in error["message"] and IDS[1].hex()[:16] in error["message"]


@pytest.mark.parametrize(
    ("given", "status", "code"),
    [
        ("abc12", 400, "bad_id"),  # shorter than MIN_PREFIX
        ("xyz123", 400, "bad_id"),
        ("a" * 65, 400, "bad_id"),
        ("batch-12", 400, "bad_id"),
        ("batch-0123456789abcdef", 404, "unknown_id"),
        ("fedcba", 404, "unknown_id"),
    ],
)
async def test_bad_and_unknown_ids_are_typed(store: AsyncStore, given: str, status: int, code: str) -> None:
    assert MIN_PREFIX == 6
    with pytest.raises(HttpError) as e:
        await _resolve(store, ["abc124", given])
    assert (e.value.status, e.value.code) == (status, code)


async def test_the_body_is_checked(store: AsyncStore) -> None:
    for body in (None, [], {"ids": "abc123"}, {"ids": [1]}, {"ids": [], "more": 1}):
        with pytest.raises(HttpError) as e:
            await resolve_handler(store)(Request("POST", "/v1/resolve", {}, {}, body))
        assert e.value.status == 400


def test_a_prefix_is_a_range_of_ids() -> None:
    low, high = prefix_range("abc")
    assert low == bytes.fromhex("abc0" + "00" * 30) and high == bytes.fromhex("abcf" + "ff" * 30)
    with pytest.raises(ValueError):
        prefix_range("xyz")
