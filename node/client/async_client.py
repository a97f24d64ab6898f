"""`AsyncClient`: the trio flavour. The same operations as Client (ops.py), driven in a trio task:
each request runs in a worker thread over the raw API client (node/api/client.py), so a cancelled
wait returns at once (the thread's request is abandoned and ends by its own timeout), and sleeps are
trio.sleep. Only this module imports trio.

    async with AsyncClient() as node:
        batch = await node.map("sim.wasm", range(100))
        jobs = await node.wait(batch.batch_id)
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, TypeVar

import trio
from e31.node.api.client import ApiClient, ApiClientError

from . import ops
from .errors import from_api
from .generate import generate as generate_op
from .merge import merge as merge_op

P = ParamSpec("P")
T = TypeVar("T")


async def drive(op: ops.Op[T], request: Callable[[ops.Call], Any]) -> T:
    """Run `op` to its end in this task; `request` (blocking) runs in a worker thread."""
    sent: Any = None
    failure: BaseException | None = None
    while True:
        try:
            effect = op.send(sent) if failure is None else op.throw(failure)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        sent, failure = None, None
        if isinstance(effect, ops.Sleep):
            await trio.sleep(effect.seconds)
            continue
        try:
            sent = await trio.to_thread.run_sync(request, effect, abandon_on_cancel=True)
        except ApiClientError as e:
            failure = from_api(e)


def _awaitable(op: Callable[P, ops.Op[T]]) -> Callable[Concatenate[AsyncClient, P], Coroutine[Any, Any, T]]:
    async def method(self: AsyncClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await drive(op(*args, **kwargs), self._request)

    return functools.update_wrapper(method, op)


class AsyncClient:
    """The local node's API for a submitter, for trio programs: the methods of Client, awaited."""

    def __init__(self, data_dir: str | os.PathLike[str] | None = None, *, timeout: float = 60.0) -> None:
        where = None if data_dir is None else os.fspath(data_dir)
        self._api = ApiClient(where, timeout=max(timeout, ops.POLL + 10.0))
        self.data_dir = self._api.data_dir

    def _request(self, call: ops.Call) -> Any:
        return self._api.request(call.method, call.path, call.body)  # each worker thread keeps its own

    async def aclose(self) -> None:
        self._api.close()  # this thread's; the worker threads' close as their threads end

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    submit = _awaitable(ops.submit)
    submit_batch = _awaitable(ops.submit_batch)
    map = _awaitable(ops.map_jobs)
    job = _awaitable(ops.job)
    jobs = _awaitable(ops.jobs)
    resolve = _awaitable(ops.resolve)
    wait = _awaitable(ops.wait)
    results = _awaitable(ops.results)
    cancel = _awaitable(ops.cancel)
    receipts = _awaitable(ops.receipts)
    status = _awaitable(ops.status)
    generate = _awaitable(generate_op)
    merge = _awaitable(merge_op)
