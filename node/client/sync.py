"""`Client`: the blocking flavour. Each method runs its operation (ops.py) to the end, sending every
request over one kept-alive HTTP connection (the raw API client, node/api/client.py) and sleeping with
time.sleep; it never imports trio, so a script starts fast.

    from e31.client import Client
    node = Client()                              # the local node: --data-dir's default, or E31_DATA_DIR
    batch = node.map("sim.wasm", range(100), fuel="2G", deadline="2h")
    node.wait(batch.batch_id, progress=print)
    node.results(batch.batch_id, out="results/")
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

from e31.node.api.client import ApiClient, ApiClientError

from . import ops
from .errors import from_api
from .generate import generate as generate_op
from .merge import merge as merge_op

P = ParamSpec("P")
T = TypeVar("T")


def drive(op: ops.Op[T], request: Callable[[ops.Call], Any], sleep: Callable[[float], None]) -> T:
    """Run `op` to its end with blocking `request` and `sleep`; an API error is thrown into it."""
    sent: Any = None
    failure: BaseException | None = None
    while True:
        try:
            effect = op.send(sent) if failure is None else op.throw(failure)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        sent, failure = None, None
        if isinstance(effect, ops.Sleep):
            sleep(effect.seconds)
            continue
        try:
            sent = request(effect)
        except ApiClientError as e:
            failure = from_api(e)


def _blocking(op: Callable[P, ops.Op[T]]) -> Callable[Concatenate[Client, P], T]:
    def method(self: Client, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return drive(op(*args, **kwargs), self._request, time.sleep)

    return functools.update_wrapper(method, op)


class Client:
    """The local node's API for a submitter, blocking. `data_dir` is the node's data dir (default: the
    E31_DATA_DIR environment variable, else the platform's default, as for the CLI)."""

    def __init__(self, data_dir: str | os.PathLike[str] | None = None, *, timeout: float = 60.0) -> None:
        where = None if data_dir is None else os.fspath(data_dir)
        self._api = ApiClient(where, timeout=max(timeout, ops.POLL + 10.0))
        self.data_dir = self._api.data_dir

    def _request(self, call: ops.Call) -> Any:
        return self._api.request(call.method, call.path, call.body)

    def close(self) -> None:
        self._api.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    submit = _blocking(ops.submit)
    submit_batch = _blocking(ops.submit_batch)
    map = _blocking(ops.map_jobs)
    job = _blocking(ops.job)
    jobs = _blocking(ops.jobs)
    resolve = _blocking(ops.resolve)
    wait = _blocking(ops.wait)
    results = _blocking(ops.results)
    cancel = _blocking(ops.cancel)
    receipts = _blocking(ops.receipts)
    status = _blocking(ops.status)
    generate = _blocking(generate_op)
    merge = _blocking(merge_op)
