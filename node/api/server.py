"""The local control API: HTTP/1.1 + JSON on 127.0.0.1, for the CLI on the same machine.

h11 parses and produces HTTP (sans-I/O, like our protocol layer); trio moves the bytes. One task per
connection reads one request at a time under a deadline, checks the Host header, the bearer token
(constant-time) and the body size before reading the body, dispatches to the Router, and writes a JSON
response. Keep-alive works; any error the client caused closes the connection after the response.

Any local user can connect to 127.0.0.1, so connections are admitted in two pools. A connection that
has not yet shown the token is "unproven": it must send its first request head within
`auth_timeout`, and when `max_unproven` of them are open, a new one evicts the oldest, so a user who
holds idle connections open cannot lock the owner out (the owner's client sends its request at once).
Once a request shows the token, the connection is served in the owner's pool of `max_connections`.
A JSON body nested deeper than `max_json_depth` is refused with 400, as is any body that is not JSON.
Routes added with `public=True` (the dashboard's static files, which hold no data) are served without
the token. A request a browser makes for another site's page (a foreign Origin, a Sec-Fetch-Site
other than same-origin or none) is refused with 403 before the token is looked at; with the Host check
this keeps web pages, rebound DNS names included, away from the API (docs/security.md, "The dashboard").
Handlers answer with a JSON value, a JsonResponse, or a RawResponse (bytes of any type).
When the response goes out before the body was read (401, 413), the server shuts its sending side and
drains for a moment before closing, so the client reads the response instead of a reset.

The listening port is ephemeral. `serve_control` writes DATA/api.json (mode 0600) with the port and a
random token once it listens, and removes it when it stops; `e31.node.api.client` reads it.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import secrets
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any

import h11
import trio

from .. import metrics
from ..config import NodeConfig
from ..errors import NodeError
from ..store.connection import DiskFull, is_disk_full

API_FILE_VERSION = 1
HOST = "127.0.0.1"

log = logging.getLogger("e31.control")


@dataclass(frozen=True, slots=True)
class ControlLimits:
    max_body: int = 1 << 20
    max_header: int = 16 << 10
    request_timeout: float = 10.0
    """Seconds to receive a whole request (and, on a kept-alive connection, to start the next one)."""
    write_timeout: float = 10.0
    max_connections: int = 32
    """Connections that showed the token, served at once; one more gets 503."""
    max_unproven: int = 16
    """Connections that have not shown the token yet; one more evicts the oldest of them."""
    auth_timeout: float = 2.0
    """Seconds for a new connection to send its first request head."""
    max_json_depth: int = 32


class ControlError(NodeError):
    """The API cannot start (its api.json cannot be written)."""


class HttpError(NodeError):
    """Raised by handlers (and the server) to answer with an error status and a JSON error body."""

    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code or _CODES.get(status, "error")


_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "request_timeout",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    431: "headers_too_large",
    500: "internal_error",
    503: "busy",
    507: "disk_full",
}


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str
    params: dict[str, str]
    """Values of the {name} segments of the matched route."""
    query: dict[str, str]
    body: Any
    """The decoded JSON body, or None when there was none."""


@dataclass(frozen=True, slots=True)
class JsonResponse:
    """A handler's answer with a status other than 200 (a handler may also return a plain JSON value)."""

    body: Any
    status: int = 200


@dataclass(frozen=True, slots=True)
class RawResponse:
    """A handler's answer that is not JSON: bytes of `content_type` (a dashboard file, a job's output,
    the metrics text), with extra headers (say, content-disposition or a content security policy)."""

    body: bytes
    content_type: str
    headers: tuple[tuple[str, str], ...] = ()
    status: int = 200


Handler = Callable[[Request], Awaitable[Any]]


@dataclass
class Router:
    """Routes "METHOD /path/{param}" to async handlers. The daemon registers its handlers here."""

    _routes: list[tuple[str, tuple[str, ...], Handler]] = field(default_factory=list)
    _public: set[Handler] = field(default_factory=set)
    """Handlers served without the token (the dashboard's static shell; never one that shows data)."""

    def add(self, method: str, pattern: str, handler: Handler, *, public: bool = False) -> None:
        if not pattern.startswith("/"):
            raise ValueError(f"a route pattern starts with '/': {pattern!r}")
        segments = tuple(pattern.strip("/").split("/")) if pattern != "/" else ()
        for m, s, _ in self._routes:
            if m == method.upper() and s == segments:
                raise ValueError(f"route {method} {pattern} is already registered")
        self._routes.append((method.upper(), segments, handler))
        if public:
            self._public.add(handler)

    def route(self, method: str, pattern: str) -> Callable[[Handler], Handler]:
        def register(handler: Handler) -> Handler:
            self.add(method, pattern, handler)
            return handler

        return register

    def resolve(self, method: str, path: str) -> tuple[Handler, dict[str, str]]:
        parts = tuple(urllib.parse.unquote(p) for p in path.strip("/").split("/")) if path != "/" else ()
        allowed: list[str] = []
        for m, segments, handler in self._routes:
            params = _match(segments, parts)
            if params is None:
                continue
            if m == method:
                return handler, params
            allowed.append(m)
        if allowed:
            raise HttpError(405, f"{method} is not allowed on {path} (allowed: {', '.join(sorted(allowed))})")
        raise HttpError(404, f"no such endpoint: {path}")

    def public(self, method: str, path: str) -> Handler | None:
        """The handler of a public route matching `method` and `path`, or None."""
        try:
            handler, _ = self.resolve(method, path)
        except HttpError:
            return None
        return handler if handler in self._public else None


def _match(segments: tuple[str, ...], parts: tuple[str, ...]) -> dict[str, str] | None:
    if len(segments) != len(parts):
        return None
    params: dict[str, str] = {}
    for seg, part in zip(segments, parts, strict=True):
        if seg.startswith("{") and seg.endswith("}"):
            if not part:
                return None
            params[seg[1:-1]] = part
        elif seg != part:
            return None
    return params


@dataclass(frozen=True, slots=True)
class ControlEndpoint:
    """Where the API listens, as written to api.json."""

    host: str
    port: int
    token: str
    api_file: Path


async def serve_control(
    router: Router,
    config: NodeConfig,
    *,
    limits: ControlLimits | None = None,
    task_status: trio.TaskStatus[ControlEndpoint] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the API until cancelled; `nursery.start` returns the ControlEndpoint once it listens."""
    lim = limits or ControlLimits()
    listeners = await trio.open_tcp_listeners(0, host=HOST)
    port: int = listeners[0].socket.getsockname()[1]
    token = secrets.token_urlsafe(32)
    api_file = config.api_file
    hosts = {f"{HOST}:{port}", f"localhost:{port}"}
    server = _Server(router, lim, token, hosts, {f"http://{h}" for h in hosts})
    try:
        try:
            _write_api_file(api_file, port, token)
        except OSError as e:
            if is_disk_full(e):
                raise DiskFull(
                    f"{api_file}: cannot write: the disk is full ({e.strerror}); free space on it"
                ) from None
            raise ControlError(f"cannot write {api_file}: {e.strerror or e}") from None
        log.info("local API on http://%s:%d (address and token in %s)", HOST, port, api_file)
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, server.handle, listeners)
            task_status.started(ControlEndpoint(HOST, port, token, api_file))
    finally:
        for listener in listeners:
            with trio.CancelScope(shield=True):
                await listener.aclose()
        _remove_api_file(api_file, token)


def _write_api_file(path: Path, port: int, token: str) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    doc = {"version": API_FILE_VERSION, "host": HOST, "port": port, "token": token, "pid": os.getpid()}
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _remove_api_file(path: Path, token: str) -> None:
    """Remove api.json if it is still ours (another node may have taken the data dir since)."""
    try:
        if json.loads(path.read_text()).get("token") == token:
            path.unlink()
    except (OSError, ValueError, AttributeError):
        pass


class _Server:
    def __init__(
        self, router: Router, limits: ControlLimits, token: str, hosts: set[str], origins: set[str]
    ) -> None:
        self.router = router
        self.limits = limits
        self.expected_auth = f"Bearer {token}".encode()
        self.hosts = hosts
        self.origins = origins
        """The dashboard's own origins: a browser's request from any other page is refused."""
        self.unproven: dict[_Connection, trio.CancelScope] = {}
        """Connections that have not shown the token, oldest first (dicts keep insertion order)."""
        self.proven = 0

    async def handle(self, stream: trio.SocketStream) -> None:
        conn = _Connection(stream, self.limits)
        try:
            async with stream:
                with trio.CancelScope() as scope:
                    self.unproven[conn] = scope
                    if len(self.unproven) > self.limits.max_unproven:
                        oldest = next(iter(self.unproven))
                        self.unproven.pop(oldest).cancel()
                    await self._serve(conn)
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError):
            pass
        except Exception:  # one bad connection must never stop the server
            log.exception("local API connection failed")
        finally:
            if self.unproven.pop(conn, None) is None and conn.proven:
                self.proven -= 1

    def _prove(self, conn: _Connection) -> None:
        """`conn` showed the token: move it to the owner's pool, or refuse it when that pool is full."""
        if conn.proven:
            return
        self.unproven.pop(conn, None)
        if self.proven >= self.limits.max_connections:
            raise HttpError(503, "too many connections to the local API")
        conn.proven = True
        self.proven += 1

    async def _serve(self, conn: _Connection) -> None:
        while True:
            timeout = self.limits.request_timeout if conn.proven else self.limits.auth_timeout
            try:
                with trio.fail_after(timeout):
                    event = await conn.next_event()
                    if not isinstance(event, h11.Request):  # closed, or idle between requests
                        return
                    request, handler = await self._read_request(conn, event)
            except trio.TooSlowError:
                if conn.h11.their_state is h11.IDLE and not conn.h11.trailing_data[0]:
                    return  # an idle connection: nothing to answer
                await conn.send_error(HttpError(408, "the request took too long to arrive"))
                return
            except h11.RemoteProtocolError as e:
                await conn.send_error(HttpError(e.error_status_hint, f"malformed HTTP request: {e}"))
                return
            except HttpError as e:
                await conn.send_error(e)
                return
            status, body = await self._call(handler, request)
            log.debug("%s %s -> %d", request.method, request.path, status)
            metrics.API_REQUESTS.inc(1, f"{status // 100}xx")
            if isinstance(body, RawResponse):
                await conn.send_raw(body)
            else:
                await conn.send_json(status, body)
            if conn.h11.our_state is not h11.DONE or conn.h11.their_state is not h11.DONE:
                return
            conn.h11.start_next_cycle()

    async def _read_request(self, conn: _Connection, event: h11.Request) -> tuple[Request, Handler]:
        # h11 caps a head that arrives in pieces; one that arrives whole is measured here.
        if len(event.target) + sum(len(k) + len(v) + 4 for k, v in event.headers) > self.limits.max_header:
            raise HttpError(431, f"request head over {self.limits.max_header} bytes")
        headers = {k.decode("latin-1").lower(): v for k, v in event.headers}
        host = headers.get("host", b"").decode("latin-1")
        if host not in self.hosts:
            raise HttpError(400, f"unexpected Host header {host!r}")
        _check_same_origin(headers, self.origins)
        method = event.method.decode("ascii")
        target = event.target.decode("ascii", errors="replace")
        path, _, query_text = target.partition("?")
        if hmac.compare_digest(headers.get("authorization", b""), self.expected_auth):
            self._prove(conn)
        elif self.router.public(method, path) is None:
            raise HttpError(401, "missing or wrong bearer token (see api.json in the data dir)")
        length = headers.get("content-length")
        if length is not None and int(length) > self.limits.max_body:
            raise HttpError(413, f"request body over {self.limits.max_body} bytes")
        handler, params = self.router.resolve(method, path)
        raw = bytearray()
        while True:
            ev = await conn.next_event()
            if isinstance(ev, h11.Data):
                raw += ev.data
                if len(raw) > self.limits.max_body:
                    raise HttpError(413, f"request body over {self.limits.max_body} bytes")
            elif isinstance(ev, h11.EndOfMessage):
                break
            else:
                raise HttpError(400, "the connection closed in the middle of the request")
        body: Any = None
        if raw:
            ctype = headers.get("content-type", b"application/json").split(b";")[0].strip().lower()
            if ctype != b"application/json":
                raise HttpError(415, "the request body must be application/json")
            body = _parse_json(raw, self.limits.max_json_depth)
        try:
            query = dict(urllib.parse.parse_qsl(query_text, keep_blank_values=True, strict_parsing=False))
        except ValueError as e:
            raise HttpError(400, f"bad query string: {e}") from None
        return Request(method, path, params, query, body), handler

    async def _call(self, handler: Handler, request: Request) -> tuple[int, Any]:
        try:
            result = await handler(request)
        except HttpError as e:
            return e.status, _error_body(e)
        except DiskFull as e:  # one warning line, not a traceback per request; reads still work
            log.warning("%s %s: %s", request.method, request.path, e)
            return 507, _error_body(HttpError(507, f"{e}, then try again", "disk_full"))
        except Exception as e:
            if is_disk_full(e):  # a write outside the stores (they raise DiskFull): the same answer
                log.warning("%s %s: the disk is full: %s", request.method, request.path, e)
                return 507, _error_body(HttpError(507, f"the disk is full: {e}", "disk_full"))
            log.exception("the handler of %s %s failed", request.method, request.path)
            return 500, _error_body(HttpError(500, "internal error in the node (see its log)"))
        if isinstance(result, JsonResponse):
            return result.status, result.body
        if isinstance(result, RawResponse):
            return result.status, result
        return 200, result


def _check_same_origin(headers: dict[str, bytes], origins: set[str]) -> None:
    """Refuse (403) a request a browser sent on behalf of another site's page: an Origin header that is
    not one of ours, or a Sec-Fetch-Site other than same-origin or none (typed or bookmarked). Clients
    that are not browsers (the CLI, curl) send neither header. docs/security.md, "The dashboard"."""
    origin = headers.get("origin")
    if origin is not None and origin.decode("latin-1") not in origins:
        raise HttpError(403, f"requests from another origin ({origin.decode('latin-1')[:80]!r}) are refused")
    site = headers.get("sec-fetch-site")
    if site is not None and site not in (b"same-origin", b"none"):
        raise HttpError(
            403, f"a {site.decode('latin-1')[:20]} request is refused (only this dashboard's own)"
        )


def _parse_json(raw: bytes | bytearray, max_depth: int) -> Any:
    """The JSON value of a request body, or HttpError 400: not JSON, or nested deeper than `max_depth`
    (the count of brackets bounds the depth, so only a body that could be too deep is walked)."""
    try:
        body = json.loads(raw)
    except RecursionError:
        raise HttpError(400, f"the request body is nested deeper than {max_depth} levels") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise HttpError(400, f"the request body is not valid JSON: {e}") from None
    if raw.count(b"[") + raw.count(b"{") > max_depth:
        level: list[tuple[Any, int]] = [(body, 1)]
        while level:
            value, depth = level.pop()
            if depth > max_depth:
                raise HttpError(400, f"the request body is nested deeper than {max_depth} levels")
            if isinstance(value, dict):
                level += [(v, depth + 1) for v in value.values() if isinstance(v, dict | list)]
            elif isinstance(value, list):
                level += [(v, depth + 1) for v in value if isinstance(v, dict | list)]
    return body


def _reason(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode("ascii")
    except ValueError:
        return b""


def _error_body(e: HttpError) -> dict[str, Any]:
    return {"error": {"code": e.code, "message": e.message, "status": e.status}}


class _Connection:
    """One socket and its h11 state machine."""

    def __init__(self, stream: trio.SocketStream, limits: ControlLimits) -> None:
        self.stream = stream
        self.limits = limits
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=limits.max_header)
        self.proven = False
        """It showed the token (in the owner's pool)."""

    async def next_event(self) -> Any:
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                self.h11.receive_data(await self.stream.receive_some(64 << 10))
                continue
            return event

    async def _send(self, *events: Any) -> None:
        data = b"".join(self.h11.send(e) or b"" for e in events)
        with trio.fail_after(self.limits.write_timeout):
            await self.stream.send_all(data)

    async def send_json(self, status: int, body: Any, *, close: bool = False) -> None:
        try:
            payload = json.dumps(body, separators=(",", ":"), allow_nan=False).encode() + b"\n"
        except (TypeError, ValueError) as e:
            log.error("a handler returned a value that is not JSON: %s", e)
            status, payload = 500, json.dumps(_error_body(HttpError(500, "internal error"))).encode() + b"\n"
        headers = [
            ("content-type", "application/json"),
            ("content-length", str(len(payload))),
            ("cache-control", "no-store"),
            ("x-content-type-options", "nosniff"),
        ]
        if close:
            headers.append(("connection", "close"))
        if status == 401:
            headers.append(("www-authenticate", "Bearer"))
        response = h11.Response(status_code=status, headers=headers, reason=_reason(status))
        await self._send(response, h11.Data(data=payload), h11.EndOfMessage())

    async def send_raw(self, response: RawResponse) -> None:
        headers = [
            ("content-type", response.content_type),
            ("content-length", str(len(response.body))),
            ("cache-control", "no-store"),
            ("x-content-type-options", "nosniff"),
            *response.headers,
        ]
        head = h11.Response(status_code=response.status, headers=headers, reason=_reason(response.status))
        await self._send(head, h11.Data(data=response.body), h11.EndOfMessage())

    async def send_error(self, error: HttpError) -> None:
        """Answer with an error and end the connection (lingering so the client can read the answer)."""
        if self.h11.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        metrics.API_REQUESTS.inc(1, f"{error.status // 100}xx")
        try:
            await self.send_json(error.status, _error_body(error), close=True)
            await self.stream.send_eof()
            with trio.move_on_after(1.0):
                drained = 0
                while drained < 8 * self.limits.max_body + (1 << 20):
                    chunk = await self.stream.receive_some(64 << 10)
                    if not chunk:
                        break
                    drained += len(chunk)
        except (trio.TooSlowError, h11.LocalProtocolError):
            pass
