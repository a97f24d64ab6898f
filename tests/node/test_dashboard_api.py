"""The local API's parts the dashboard needs, in process on real sockets: public routes that never
count as shown tokens, non-JSON answers, the refusal of other sites' requests (Origin, Sec-Fetch-Site,
Host), and the store's summaries behind GET /v1/overview."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from e31.node.api.dashboard import STATIC_FILES, load_static
from e31.node.api.server import ControlEndpoint, ControlLimits, RawResponse, Request, Router, serve_control
from e31.node.config import load_config
from e31.node.store import batches, overview
from e31.node.store.db import Store

LIMITS = ControlLimits(request_timeout=2.0, write_timeout=2.0, auth_timeout=1.0)


def make_router() -> Router:
    router = Router()

    async def page(req: Request) -> RawResponse:
        return RawResponse(
            b"<!doctype html>shell", "text/html; charset=utf-8", (("x-frame-options", "DENY"),)
        )

    async def status(req: Request) -> Any:
        return {"secret": "data"}

    router.add("GET", "/", page, public=True)
    router.add("GET", "/v1/status", status)
    return router


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[ControlEndpoint]:
    config = load_config(tmp_path, environ={})
    async with trio.open_nursery() as nursery:
        endpoint: ControlEndpoint = await nursery.start(
            lambda task_status: serve_control(make_router(), config, limits=LIMITS, task_status=task_status)
        )
        yield endpoint
        nursery.cancel_scope.cancel()


async def ask(endpoint: ControlEndpoint, path: str, **headers: str) -> tuple[int, dict[str, str], bytes]:
    """One GET over a raw socket; `headers` override Host (default: ours)."""
    lines = {"host": f"127.0.0.1:{endpoint.port}", "connection": "close"}
    lines.update({k.replace("_", "-").lower(): v for k, v in headers.items()})
    head = f"GET {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in lines.items()) + "\r\n"
    stream = await trio.open_tcp_stream("127.0.0.1", endpoint.port)
    async with stream:
        await stream.send_all(head.encode())
        data = b""
        with trio.fail_after(10):
            while chunk := await stream.receive_some(65536):
                data += chunk
    top, _, body = data.partition(b"\r\n\r\n")
    status_line, *rest = top.decode("latin-1").split("\r\n")
    parsed = dict(line.split(": ", 1) for line in rest)
    return int(status_line.split()[1]), {k.lower(): v for k, v in parsed.items()}, body


async def test_a_public_page_loads_without_the_token_and_data_does_not(server: ControlEndpoint) -> None:
    status, headers, body = await ask(server, "/")
    assert status == 200 and body == b"<!doctype html>shell"
    assert headers["content-type"] == "text/html; charset=utf-8" and headers["x-frame-options"] == "DENY"
    assert headers["x-content-type-options"] == "nosniff" and headers["cache-control"] == "no-store"
    status, _, body = await ask(server, "/v1/status")
    assert status == 401 and b"secret" not in body
    status, _, body = await ask(server, "/v1/status", authorization=f"Bearer {server.token}")
    assert status == 200 and b"secret" in body
    # an unknown path without the token is still 401, not a map of what exists
    assert (await ask(server, "/v1/nothing"))[0] == 401


async def test_a_public_page_does_not_admit_a_connection_to_the_owners_pool(server: ControlEndpoint) -> None:
    """A connection that only loaded the shell is still unproven: a second request on it without the
    token for data is refused, and it stays subject to the unproven pool's short first-byte deadline."""
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    host = f"host: 127.0.0.1:{server.port}\r\n"
    async with stream:
        await stream.send_all(f"GET / HTTP/1.1\r\n{host}\r\nGET /v1/status HTTP/1.1\r\n{host}\r\n".encode())
        data = b""
        with trio.fail_after(10):
            while chunk := await stream.receive_some(65536):
                data += chunk
    assert data.count(b"HTTP/1.1 200") == 1 and b"HTTP/1.1 401" in data and b"secret" not in data


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"origin": "http://evil.example"}, 403),
        ({"origin": "null"}, 403),
        ({"sec_fetch_site": "cross-site"}, 403),
        ({"sec_fetch_site": "same-site"}, 403),  # another port on 127.0.0.1 is the same site, not ours
        ({"host": "evil.example:80"}, 400),
        ({"host": "127.0.0.1"}, 400),
        ({"origin": "http://127.0.0.1:{port}", "sec_fetch_site": "same-origin"}, 200),
        ({"origin": "http://localhost:{port}", "host": "localhost:{port}"}, 200),
        ({"sec_fetch_site": "none"}, 200),
    ],
)
async def test_requests_for_other_sites_are_refused_even_with_the_token(
    server: ControlEndpoint, headers: dict[str, str], status: int
) -> None:
    filled = {k: v.format(port=server.port) for k, v in headers.items()}
    got, _, body = await ask(server, "/v1/status", authorization=f"Bearer {server.token}", **filled)
    assert got == status, body
    if status != 200:
        assert b"secret" not in body and b'"error"' in body
    # the public shell is refused to them too: a rebound name or a framing page gets nothing
    assert (await ask(server, "/", **filled))[0] == (200 if status == 200 else status)


def test_the_dashboard_files_ship_in_the_package() -> None:
    files = load_static()
    assert set(files) == set(STATIC_FILES)
    assert b'<script type="module" src="/ui/app.js">' in files["index.html"]
    assert b"sessionStorage" in files["app.js"] and b"innerHTML" not in files["app.js"]
    for name, data in files.items():  # nothing from another origin: no CDN, no inline script
        assert b"http://" not in data and b"https://" not in data, name
    assert b"<script>" not in files["index.html"] and b"style=" not in files["index.html"]


def test_the_store_summaries_count_jobs_served_and_batches(tmp_path: Path) -> None:
    store = Store(tmp_path / "node.sqlite")
    try:
        sub = "e31n" + "a" * 52
        common = {"manifest": b"m", "deadline": 9e9, "created": 100.0}
        jobs = [
            {"job_id": bytes([i]) * 32, "role": "submitter", "state": "queued", "submitter": sub, **common}
            for i in range(4)
        ]
        bid = batches.store_batch(store, jobs, 100.0)
        for i, states in enumerate([["offered"], ["offered", "assigned"], ["offered", "assigned", "done"]]):
            for state in states:
                store.update_job(bytes([i]) * 32, "submitter", 101.0 + i, state=state)
        for i, (who, fuel) in enumerate([(sub, 10), (sub, 20), ("e31n" + "b" * 52, 5)]):
            job_id = bytes([50 + i]) * 32
            store.add_job(job_id=job_id, role="executor", state="queued", submitter=who, **common)
            store.update_job(job_id, "executor", 100.0, state="running", started=100.0)
            store.update_job(job_id, "executor", 102.5, state="done", finished=102.5, fuel_used=fuel)
        counts = overview.job_counts(store)
        assert counts[("executor", "done")] == 3 and counts[("submitter", "queued")] == 1
        assert counts[("submitter", "done")] == 1
        served = overview.served_by_submitter(store)
        assert [(s.submitter, s.jobs, s.done, s.fuel) for s in served] == [
            (sub, 2, 2, 30),
            ("e31n" + "b" * 52, 1, 1, 5),
        ]
        assert served[0].run_seconds == pytest.approx(5.0)
        [progress] = overview.latest_batches(store, 10)
        assert (progress.batch_id, progress.total, progress.ended) == (bid, 4, 1)
        assert progress.states == {"queued": 1, "offered": 1, "assigned": 1, "done": 1}
        assert progress.last_ended == 103.0
        latest = overview.latest_jobs(store, "submitter", 2, unfinished=True)
        assert [r.state for r in latest] == ["assigned", "offered"]
    finally:
        store.close()
