"""The CLI's side of the local control API: a small synchronous HTTP client (stdlib http.client).

It finds the running node through DATA/api.json (address and bearer token), sends one JSON request per
call and returns the decoded JSON answer. No node there (no api.json, or nothing listening at its port
after a crash) is NodeNotRunning; an error answer is ApiError with the node's status and message.

A client keeps its connection open between calls (HTTP keep-alive: a busy client such as a sweep
pays the connection set-up once), but reuses it only while it is fresh (REUSE_WITHIN, well under the
node's 10 s idle timeout), so the node never closes it under a request in practice. Should a reused
connection fail anyway (the node restarted), a GET is sent again on a new connection; a POST is not
(the node may have acted on it): its error is raised as before. Each thread has its own connection.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from pathlib import Path
from typing import Any

from ..config import API_FILE, resolve_data_dir
from ..errors import NodeError, Unavailable


class ApiClientError(NodeError):
    """Base of the client's errors; each message is one line fit for the CLI."""


class NodeNotRunning(ApiClientError, Unavailable):
    def __init__(self, data_dir: Path, detail: str = "") -> None:
        super().__init__(f"no node is running with data dir {data_dir}{f' ({detail})' if detail else ''}")
        self.data_dir = data_dir


class ApiError(ApiClientError):
    """The node answered with an error status."""

    def __init__(self, status: int, code: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(f"the node refused the request: {message} (HTTP {status})")
        self.status = status
        self.code = code
        self.message = message
        self.details = details or {}
        """The whole error object the node answered (an ambiguous id's "candidates", ...)."""


REUSE_WITHIN = 4.0
"""Seconds after its last answer during which a connection is used again."""


class ApiClient:
    def __init__(self, data_dir: Path | str | None = None, *, timeout: float = 30.0) -> None:
        self.data_dir = resolve_data_dir(data_dir)
        self.timeout = timeout
        self._kept = threading.local()  # per thread: conn, to (host, port), last (monotonic)

    def close(self) -> None:
        """Close this thread's kept connection (others close when their thread's client is dropped)."""
        conn = getattr(self._kept, "conn", None)
        if conn is not None:
            conn.close()
            self._kept.conn = None

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _connection(self, host: str, port: int) -> tuple[http.client.HTTPConnection, bool]:
        """The kept connection when it is to this address and fresh, else a new one; and whether reused."""
        kept = self._kept
        conn: http.client.HTTPConnection | None = getattr(kept, "conn", None)
        if conn is not None and (kept.to != (host, port) or time.monotonic() - kept.last > REUSE_WITHIN):
            self.close()
            conn = None
        if conn is not None:
            return conn, True
        kept.conn, kept.to = http.client.HTTPConnection(host, port, timeout=self.timeout), (host, port)
        kept.last = time.monotonic()
        return kept.conn, False

    def _endpoint(self) -> tuple[str, int, str]:
        path = self.data_dir / API_FILE
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError:
            raise NodeNotRunning(self.data_dir) from None
        except PermissionError:
            raise ApiClientError(f"cannot read {path}: permission denied (another user's node?)") from None
        except (OSError, ValueError) as e:
            raise NodeNotRunning(self.data_dir, f"unreadable {API_FILE}: {e}") from None
        try:
            host, port, token = doc["host"], doc["port"], doc["token"]
            if not (isinstance(host, str) and isinstance(port, int) and isinstance(token, str)):
                raise TypeError
        except (KeyError, TypeError):
            raise NodeNotRunning(self.data_dir, f"malformed {API_FILE}") from None
        return host, port, token

    def request(self, method: str, path: str, body: Any = None) -> Any:
        host, port, token = self._endpoint()
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        while True:
            conn, reused = self._connection(host, port)
            try:
                conn.request(method, path, body=payload, headers=headers)
                response = conn.getresponse()
                raw = response.read()
            except ConnectionRefusedError:
                self.close()
                detail = f"nothing listens at {host}:{port}; stale {API_FILE}"
                raise NodeNotRunning(self.data_dir, detail) from None
            except TimeoutError:
                self.close()
                raise ApiClientError(
                    f"the node at {host}:{port} gave no answer in {self.timeout:g} s"
                ) from None
            except (OSError, http.client.HTTPException) as e:
                self.close()
                if reused and method == "GET":
                    continue  # the node closed a kept connection (it restarted): once more, on a new one
                raise ApiClientError(f"talking to the node at {host}:{port} failed: {e}") from None
            except BaseException:  # anything else (an interrupt...) leaves the connection mid-request
                self.close()
                raise
            break
        self._kept.last = time.monotonic()
        if response.will_close:
            self.close()
        try:
            answer = json.loads(raw) if raw else None
        except ValueError:
            raise ApiClientError(
                f"the node answered HTTP {response.status} with a body that is not JSON"
            ) from None
        if response.status >= 400:
            err = answer.get("error") if isinstance(answer, dict) else None
            if isinstance(err, dict):
                code, message = str(err.get("code", "error")), str(err.get("message", ""))
                raise ApiError(response.status, code, message, err)
            raise ApiError(response.status, "error", response.reason or "error")
        return answer

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, {} if body is None else body)
