"""The local API under random requests: a real node process, every route, JSON bodies of any shape.

Hypothesis draws bodies (arbitrary JSON, and valid requests with one field replaced by arbitrary JSON) and
ids for the routes' {id} segments; every answer must be a 2xx or a 4xx with a JSON error, never a 5xx,
and the node must keep serving with no traceback in its log. Any string in a drawn body that looks like
an absolute path is moved under the test's own directory, so nothing is written outside it.
"""

from __future__ import annotations

import shutil
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e31.node.api.client import ApiClient, ApiError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_jobs_e2e import ROOT, Node

ECHO = ROOT / "sandbox" / "workloads" / "echo.wasm"
ROUTES = [
    ("POST", "/v1/jobs"),
    ("GET", "/v1/jobs"),
    ("GET", "/v1/jobs/{id}"),
    ("GET", "/v1/jobs/{id}/wait"),
    ("POST", "/v1/jobs/{id}/results"),
    ("POST", "/v1/jobs/{id}/cancel"),
    ("POST", "/v1/batches"),
    ("GET", "/v1/batches/{id}"),
    ("GET", "/v1/batches/{id}/wait"),
    ("POST", "/v1/receipts/export"),
    ("GET", "/v1/status"),
    ("GET", "/v1/peers"),
]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
ids = st.one_of(
    st.text(alphabet="0123456789abcdef", min_size=1, max_size=64),
    st.just("batch-") | st.text(alphabet="0123456789abcdef", min_size=16, max_size=16).map("batch-".__add__),
    st.text(max_size=30).map(lambda t: t.replace("/", "").replace("?", "") or "x"),
)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Node, Path]]:
    base = tmp_path_factory.mktemp("fuzz")
    module = base / "echo.wasm"
    shutil.copy(ECHO, module)
    n = Node(base / "node")
    try:
        yield n, base
    finally:
        n.stop()


def _confine(value: Any, base: Path) -> Any:
    """The body with every absolute-path-like string moved under `base` (the fuzzer must not write
    files outside the test's directory)."""
    if isinstance(value, str) and value.startswith("/"):
        return str(base / "drawn" / value.lstrip("/").replace("..", "_"))
    if isinstance(value, list):
        return [_confine(v, base) for v in value]
    if isinstance(value, dict):
        return {k: _confine(v, base) for k, v in value.items()}
    return value


def _valid_bodies(base: Path) -> dict[str, dict[str, Any]]:
    deadline = int(time.time() * 1000) + 60_000
    job = {"module": str(base / "echo.wasm"), "args": ["hi"], "limits": {}, "deadline": deadline}
    return {
        "/v1/jobs": job,
        "/v1/batches": {"module": job["module"], "jobs": [{"args": ["a"]}, {"args": ["b"]}]},
        "/v1/receipts/export": {"jobs": None, "with_blobs": False, "out": str(base / "bundle.e31")},
        "results": {"out": str(base / "results")},
    }


def _answer(api: ApiClient, method: str, path: str, body: Any) -> int:
    try:
        api.request(method, path, body)
    except ApiError as e:
        assert 400 <= e.status < 500, f"{method} {path} {body!r}: HTTP {e.status}: {e.message}"
        return e.status
    return 200


def test_any_request_gets_a_2xx_or_a_4xx_and_the_node_survives(node: tuple[Node, Path]) -> None:
    n, base = node
    valid = _valid_bodies(base)
    seen: set[int] = set()
    job = n.api.request("POST", "/v1/jobs", valid["/v1/jobs"])["job_id"]
    batch = n.api.request("POST", "/v1/batches", valid["/v1/batches"])["batch_id"]
    known = st.sampled_from([job, batch, job[:8]])
    # done before the fuzz, so that a drawn wait on them never waits out its timeout
    assert n.api.get(f"/v1/jobs/{job}/wait?timeout=60")["state"] == "done"
    assert n.api.get(f"/v1/batches/{batch}/wait?timeout=60")["states"] == {"done": 2}

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        route=st.sampled_from(ROUTES),
        job_id=known | ids,
        body=st.one_of(st.none(), json_values),
        field=st.text(max_size=10),
        mutate=st.booleans(),
        query=st.one_of(
            st.none(), st.text(max_size=12), st.sampled_from(["0", "-1", "1e999", "nan", "0.01"])
        ),
    )
    def one(
        route: tuple[str, str], job_id: str, body: Any, field: str, mutate: bool, query: str | None
    ) -> None:
        method, pattern = route
        path = pattern.replace("{id}", urllib.parse.quote(job_id, safe=""))
        if query is not None:
            path += "?" + urllib.parse.urlencode({"timeout": query, "brief": query, "role": query})
        if mutate and method == "POST":  # a valid body with one field (maybe a new one) replaced by anything
            template = valid.get(pattern, valid["results"])
            keys = [*template, field]
            body = {**template, keys[len(field) % len(keys)]: body}
        seen.add(_answer(n.api, method, path, _confine(body, base)))

    one()
    assert 200 in seen and 400 in seen and 404 in seen, (
        seen
    )  # the fuzz reached past the checks, and into them
    assert n.api.get("/v1/status")["node_id"] == n.node_id
    log = n.log.read_text()
    assert "Traceback" not in log, log[-4000:]
