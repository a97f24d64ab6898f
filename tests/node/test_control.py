"""The local control API: a real server on 127.0.0.1, the real client in a worker thread, raw sockets."""

from __future__ import annotations

import json
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
from e31.node.api.client import ApiClient, ApiClientError, ApiError, NodeNotRunning
from e31.node.api.server import (
    ControlEndpoint,
    ControlError,
    ControlLimits,
    HttpError,
    JsonResponse,
    Request,
    Router,
    serve_control,
)
from e31.node.config import API_FILE, NodeConfig, load_config

LIMITS = ControlLimits(
    max_body=1024, request_timeout=1.0, write_timeout=1.0, max_connections=4, max_unproven=4, auth_timeout=1.0
)


def make_router() -> Router:
    router = Router()

    @router.route("GET", "/v1/status")
    async def status(req: Request) -> Any:
        return {"node_id": "e31n-test", "peer_count": 0, "query": req.query}

    @router.route("GET", "/v1/peers")
    async def peers(req: Request) -> Any:
        return [{"node_id": "a", "address": "127.0.0.1:1"}]

    @router.route("POST", "/v1/echo")
    async def echo(req: Request) -> Any:
        return JsonResponse({"got": req.body}, status=201)

    @router.route("GET", "/v1/jobs/{job_id}")
    async def job(req: Request) -> Any:
        if req.params["job_id"] == "missing":
            raise HttpError(404, "no such job")
        return {"job_id": req.params["job_id"]}

    @router.route("GET", "/v1/broken")
    async def broken(req: Request) -> Any:
        raise RuntimeError("handler bug")

    @router.route("GET", "/v1/not-json")
    async def not_json(req: Request) -> Any:
        return {"value": object()}

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


async def call(data_dir: Path, method: str, path: str, body: Any = None) -> Any:
    client = ApiClient(data_dir, timeout=5.0)
    return await trio.to_thread.run_sync(client.request, method, path, body)


async def raw(port: int, data: bytes) -> bytes:
    """Send bytes, then read until the server closes the connection."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(data)
        out = b""
        with trio.fail_after(5):
            while chunk := await stream.receive_some(65536):
                out += chunk
    return out


def request_bytes(
    ep: ControlEndpoint,
    method: str = "GET",
    path: str = "/v1/status",
    *,
    token: str | None = None,
    extra: str = "",
    body: bytes = b"",
) -> bytes:
    head = (
        f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{ep.port}\r\n"
        f"Authorization: Bearer {ep.token if token is None else token}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n{extra}\r\n"
    )
    return head.encode() + body


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def json_body(response: bytes) -> Any:
    return json.loads(response.split(b"\r\n\r\n", 1)[1])


async def test_api_file_is_private_and_removed_on_stop(tmp_path: Path) -> None:
    config = load_config(tmp_path, environ={})
    api_file = tmp_path / API_FILE
    async with trio.open_nursery() as nursery:
        ep: ControlEndpoint = await nursery.start(
            lambda task_status: serve_control(Router(), config, task_status=task_status)
        )
        assert ep.host == "127.0.0.1" and ep.api_file == api_file
        assert stat.S_IMODE(api_file.stat().st_mode) == 0o600
        doc = json.loads(api_file.read_text())
        assert (doc["host"], doc["port"], doc["token"]) == ("127.0.0.1", ep.port, ep.token)
        assert len(ep.token) >= 32
        nursery.cancel_scope.cancel()
    assert not api_file.exists()


async def test_client_round_trips(tmp_path: Path, server: ControlEndpoint) -> None:
    status = await call(tmp_path, "GET", "/v1/status?verbose=1")
    assert status == {"node_id": "e31n-test", "peer_count": 0, "query": {"verbose": "1"}}
    assert await call(tmp_path, "GET", "/v1/peers") == [{"node_id": "a", "address": "127.0.0.1:1"}]
    assert await call(tmp_path, "POST", "/v1/echo", {"x": [1, 2]}) == {"got": {"x": [1, 2]}}
    assert await call(tmp_path, "GET", "/v1/jobs/abc%20d") == {"job_id": "abc d"}


async def test_a_client_keeps_its_connection_between_calls(tmp_path: Path, server: ControlEndpoint) -> None:
    client = ApiClient(tmp_path, timeout=5.0)

    def three_calls() -> list[object]:
        socks = []
        for _ in range(3):
            client.get("/v1/peers")
            socks.append(client._kept.conn.sock)
        return socks

    socks = await trio.to_thread.run_sync(three_calls)
    assert socks[0] is not None and socks[0] is socks[1] is socks[2]
    await trio.to_thread.run_sync(client.close)


async def test_a_kept_connection_the_node_closed_is_retried_for_a_get_only(
    tmp_path: Path, server: ControlEndpoint
) -> None:
    client = ApiClient(tmp_path, timeout=5.0)
    assert await trio.to_thread.run_sync(client.get, "/v1/peers")
    await trio.sleep(LIMITS.request_timeout + 0.5)  # the server drops the idle connection
    assert await trio.to_thread.run_sync(client.get, "/v1/peers")  # sent again on a new connection
    await trio.sleep(LIMITS.request_timeout + 0.5)
    with pytest.raises(ApiClientError, match="failed"):  # a POST may have been acted on: not repeated
        await trio.to_thread.run_sync(client.post, "/v1/echo", {"x": 1})
    assert await trio.to_thread.run_sync(client.post, "/v1/echo", {"x": 2}) == {"got": {"x": 2}}


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("GET", "/v1/nowhere", 404, "not_found"),
        ("GET", "/v1/jobs/missing", 404, "not_found"),
        ("POST", "/v1/status", 405, "method_not_allowed"),
        ("GET", "/v1/broken", 500, "internal_error"),
        ("GET", "/v1/not-json", 500, "internal_error"),
    ],
)
async def test_error_answers(
    tmp_path: Path, server: ControlEndpoint, method: str, path: str, status: int, code: str
) -> None:
    with pytest.raises(ApiError) as err:
        await call(tmp_path, method, path, {} if method == "POST" else None)
    assert (err.value.status, err.value.code) == (status, code)
    # The server keeps serving after every one of them.
    assert (await call(tmp_path, "GET", "/v1/status"))["node_id"] == "e31n-test"


async def test_bad_or_missing_token_is_401(server: ControlEndpoint) -> None:
    wrong = await raw(server.port, request_bytes(server, token="x" * len(server.token)))
    assert status_of(wrong) == 401
    assert b"\r\nwww-authenticate: Bearer\r\n" in wrong
    assert json_body(wrong)["error"]["code"] == "unauthorized"
    no_token = f"GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n\r\n".encode()
    missing = await raw(server.port, no_token)
    assert status_of(missing) == 401


async def test_oversize_body_is_413(tmp_path: Path, server: ControlEndpoint) -> None:
    with pytest.raises(ApiError) as err:
        await call(tmp_path, "POST", "/v1/echo", {"blob": "x" * 2000})
    assert err.value.status == 413
    # Chunked and too large as it arrives.
    chunk = b"400\r\n" + b"x" * 1024 + b"\r\n"
    chunked = (
        f"POST /v1/echo HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
        f"Authorization: Bearer {server.token}\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()
    answer = await raw(server.port, chunked + chunk * 2 + b"0\r\n\r\n")
    assert status_of(answer) == 413


async def test_announced_oversize_is_413_before_the_body(server: ControlEndpoint) -> None:
    head = (
        f"POST /v1/echo HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
        f"Authorization: Bearer {server.token}\r\nContent-Length: 99999999\r\n\r\n"
    ).encode()
    answer = await raw(server.port, head)
    assert status_of(answer) == 413
    assert json_body(answer)["error"]["code"] == "payload_too_large"


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x00\x01\x02garbage\r\n\r\n",
        b"GET /v1/status HTTP/9.9\r\n\r\n",
        b"NOT HTTP AT ALL\r\n\r\n",
        b"GET /v1/status HTTP/1.1\r\nBad Header Line\r\n\r\n",
    ],
)
async def test_garbage_is_400(server: ControlEndpoint, garbage: bytes) -> None:
    answer = await raw(server.port, garbage)
    assert status_of(answer) == 400
    assert json_body(answer)["error"]["status"] == 400


async def test_bad_json_and_media_type(server: ControlEndpoint) -> None:
    bad_json = await raw(
        server.port,
        request_bytes(
            server, "POST", "/v1/echo", body=b"{not json", extra="Content-Type: application/json\r\n"
        ),
    )
    assert status_of(bad_json) == 400
    wrong_type = await raw(
        server.port,
        request_bytes(server, "POST", "/v1/echo", body=b"a=1", extra="Content-Type: text/plain\r\n"),
    )
    assert status_of(wrong_type) == 415


async def test_foreign_host_header_is_refused(server: ControlEndpoint) -> None:
    head = (
        f"GET /v1/status HTTP/1.1\r\nHost: evil.example:{server.port}\r\n"
        f"Authorization: Bearer {server.token}\r\n\r\n"
    ).encode()
    assert status_of(await raw(server.port, head)) == 400


async def test_huge_headers_are_refused(server: ControlEndpoint) -> None:
    answer = await raw(server.port, request_bytes(server, extra=f"X-Pad: {'a' * 40000}\r\n"))
    assert status_of(answer) == 431


async def test_keep_alive_serves_several_requests(server: ControlEndpoint) -> None:
    one = request_bytes(server).replace(b"Connection: close\r\n", b"")
    answer = await raw(server.port, one + one + request_bytes(server, path="/v1/peers"))
    assert answer.count(b"HTTP/1.1 200 OK") == 3


async def test_a_silent_client_is_dropped(server: ControlEndpoint) -> None:
    half = f"GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n".encode()
    answer = await raw(server.port, half)
    assert status_of(answer) == 408


async def test_an_idle_connection_is_closed_without_an_answer(server: ControlEndpoint) -> None:
    assert await raw(server.port, b"") == b""


async def test_the_owner_gets_in_past_any_number_of_idle_strangers(
    tmp_path: Path, server: ControlEndpoint
) -> None:
    """Connections that never show the token (half a request head, or nothing) cannot fill the API:
    each new one evicts the oldest, so the owner's request is answered however many are held open."""
    strangers = [await trio.open_tcp_stream("127.0.0.1", server.port) for _ in range(4 * LIMITS.max_unproven)]
    try:
        for i, stream in enumerate(strangers):
            if i % 2:
                await stream.send_all(b"GET /v1/status HTTP/1.1\r\n")
        assert (await call(tmp_path, "GET", "/v1/status"))["node_id"] == "e31n-test"
        with trio.fail_after(5):  # the oldest were evicted: closed without an answer
            assert await strangers[0].receive_some(100) == b""
    finally:
        for stream in strangers:
            await stream.aclose()


async def test_a_stranger_that_never_sends_a_head_is_dropped_after_the_auth_timeout(
    server: ControlEndpoint,
) -> None:
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    async with stream:
        with trio.fail_after(LIMITS.auth_timeout + 5):
            assert await stream.receive_some(100) == b""


async def test_connections_over_the_owners_cap_get_503(server: ControlEndpoint) -> None:
    kept = [await trio.open_tcp_stream("127.0.0.1", server.port) for _ in range(LIMITS.max_connections)]
    try:
        for stream in kept:  # each shows the token and stays open (keep-alive)
            await stream.send_all(request_bytes(server).replace(b"Connection: close\r\n", b""))
            with trio.fail_after(5):
                assert b"HTTP/1.1 200" in await stream.receive_some(65536)
        answer = await raw(server.port, request_bytes(server))
        assert status_of(answer) == 503
    finally:
        for stream in kept:
            await stream.aclose()
    assert status_of(await raw(server.port, request_bytes(server))) == 200  # their places are free again


@pytest.mark.parametrize("depth", [LIMITS.max_json_depth + 1, 400, 100_000])
async def test_a_body_nested_too_deep_is_400(depth: int) -> None:
    from e31.node.api.server import _parse_json

    with pytest.raises(HttpError, match="nested deeper than") as e:
        _parse_json(b"[" * depth + b"]" * depth, LIMITS.max_json_depth)
    assert e.value.status == 400
    nested = b'{"a":' * (depth - 1) + b"[]" + b"}" * (depth - 1)
    with pytest.raises(HttpError, match="nested deeper than"):
        _parse_json(nested, LIMITS.max_json_depth)


async def test_a_body_nested_to_the_limit_is_served(server: ControlEndpoint) -> None:
    depth = LIMITS.max_json_depth
    ok = b"[" * depth + b"]" * depth
    deep = b"[" * (depth + 1) + b"]" * (depth + 1)
    for body, status in ((ok, 201), (deep, 400)):
        answer = await raw(
            server.port,
            request_bytes(server, "POST", "/v1/echo", body=body, extra="Content-Type: application/json\r\n"),
        )
        assert status_of(answer) == status, answer


async def test_no_server_is_node_not_running(tmp_path: Path) -> None:
    client = ApiClient(tmp_path / "empty")
    with pytest.raises(NodeNotRunning, match="no node is running with data dir"):
        await trio.to_thread.run_sync(client.get, "/v1/status")


async def test_stale_or_broken_api_file(tmp_path: Path) -> None:
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    port = listener.socket.getsockname()[1]
    await listener.aclose()  # nothing listens on that port any more
    (tmp_path / API_FILE).write_text(json.dumps({"host": "127.0.0.1", "port": port, "token": "t"}))
    client = ApiClient(tmp_path)
    with pytest.raises(NodeNotRunning, match="stale"):
        await trio.to_thread.run_sync(client.get, "/v1/status")
    (tmp_path / API_FILE).write_text("{half a document")
    with pytest.raises(NodeNotRunning, match="unreadable"):
        await trio.to_thread.run_sync(client.get, "/v1/status")
    (tmp_path / API_FILE).write_text(json.dumps({"host": "127.0.0.1", "port": "80"}))
    with pytest.raises(NodeNotRunning, match="malformed"):
        await trio.to_thread.run_sync(client.get, "/v1/status")
    assert issubclass(NodeNotRunning, ApiClientError)


def test_router_rules() -> None:
    router = make_router()
    with pytest.raises(ValueError, match="already registered"):
        router.add("GET", "/v1/status", lambda req: None)  # type: ignore[arg-type,return-value]
    with pytest.raises(ValueError, match="starts with"):
        router.add("GET", "v1/x", lambda req: None)  # type: ignore[arg-type,return-value]
    _, params = router.resolve("GET", "/v1/jobs/42")
    assert params == {"job_id": "42"}
    with pytest.raises(HttpError) as err:
        router.resolve("GET", "/v1/jobs/")
    assert err.value.status == 404


async def test_unwritable_data_dir_is_a_control_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    config = NodeConfig(data_dir=blocker / "data")
    with pytest.raises(ControlError, match="cannot write"):
        await serve_control(Router(), config)
