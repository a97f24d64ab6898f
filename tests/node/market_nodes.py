"""In-memory nodes for the market's tests: each a real job path (market/service.build_job_path: real
stores, blob stores and sandbox workers) over `Net`, an in-memory stand-in for the net wing (links and
gossip), which these tests are not about. Fixtures for them are in conftest.py.
"""

from __future__ import annotations

import inspect
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import nacl.signing
import trio
from e31.node.config import NodeConfig
from e31.node.market.context import MarketSettings
from e31.node.market.delivery import OnAcked
from e31.node.market.rules import WindowSettings
from e31.node.market.service import JobPath, build_job_path
from e31.node.market.transfer import TransferSettings
from e31.node.net.peering import LinkListener
from e31.node.store.async_store import AsyncStore
from e31.node.store.blobs import BlobStore
from e31.node.store.db import Store
from e31.protocol.blobs import blob_ref
from e31.protocol.envelope import VerifiedEnvelope, verify
from e31.protocol.ids import Digest, NodeId
from e31.protocol.jobs import JobManifest, Limits
from e31.protocol.messages import Offer
from e31.protocol.receipts import UsageReceipt
from e31.sandbox.profile import PROFILE

NETWORK = "test"
WORKLOADS = Path(__file__).resolve().parents[2] / "sandbox" / "workloads"
SETTINGS = MarketSettings(
    window=WindowSettings(window=0.3, max_wait=2.0),
    lease_slack_ms=1500,
    reoffer_delay=0.1,
    delivery_interval=0.2,
    execute_own_jobs=False,
    transfer=TransferSettings(request_timeout=2.0),
)


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


class Net:
    def __init__(self) -> None:
        self.handlers: dict[bytes, Callable[[bytes, bytes], Any]] = {}
        self.offer_sinks: dict[bytes, Callable[[VerifiedEnvelope[Any]], None]] = {}
        self.nursery: trio.Nursery | None = None

    def sender(self, me: bytes) -> Callable[[bytes, bytes], Any]:
        async def send(peer: bytes, raw: bytes) -> bool:
            handler = self.handlers.get(peer)
            if handler is None or self.nursery is None:
                return False
            self.nursery.start_soon(handler, me, raw)
            return True

        return send

    def publisher(self, me: bytes) -> Callable[[bytes | VerifiedEnvelope[Any]], int]:
        def publish(message: bytes | VerifiedEnvelope[Any]) -> int:
            raw = message.raw if isinstance(message, VerifiedEnvelope) else message
            env = verify(raw, Offer)  # the others get it off the "wire", checked
            for key, sink in self.offer_sinks.items():
                if key != me:
                    sink(env)
            return len(self.offer_sinks) - 1

        return publish


class NetPeers:
    """One node's view of `Net`, as the job path sees its links (market/service.Peers)."""

    def __init__(self, net: Net, me: bytes) -> None:
        self.net = net
        self.me = me
        self._send = net.sender(me)

    async def send(self, peer: bytes, envelope: bytes) -> bool:
        sent: bool = await self._send(peer, envelope)
        return sent

    def connected(self) -> list[bytes]:
        return [k for k in self.net.handlers if k != self.me]

    def add_listener(self, listener: LinkListener) -> None:
        pass


class RealNode:
    """A node's job path on `Net`: its messages come in through `Net.handlers`, offers through
    `Net.offer_sinks`; `acked` records the receipts its executor has had acknowledged."""

    def __init__(self, net: Net, tmp: Path, name: str, seed: int) -> None:
        self.net = net
        self.key = nacl.signing.SigningKey(bytes([seed]) * 32)
        self.id = bytes(self.key.verify_key)
        self.store = AsyncStore(Store(tmp / f"{name}.sqlite"))
        self.blobs = BlobStore(tmp / f"{name}-blobs")
        self.config = NodeConfig(data_dir=tmp / name, cores=1, memory=1 << 30, network=NETWORK)
        self.acked: list[bytes] = []
        self.path = self.build(SETTINGS)
        self.ctx = self.path.ctx
        self.transfer = self.path.transfer
        self.executor = self.path.executor
        self.submitter = self.path.submitter
        self.market = self.path.market
        net.handlers[self.id] = self.market.message
        net.offer_sinks[self.id] = self.executor.on_offer

    def build(self, settings: MarketSettings, on_acked: OnAcked | None = None) -> JobPath:
        """A job path of this node (the same keys and stores): a second one stands for the node
        restarted."""

        async def acked(receipts: list[VerifiedEnvelope[UsageReceipt]]) -> None:
            self.acked.extend(r.message_id.raw for r in receipts)

        return build_job_path(
            identity=self.key,
            config=self.config,
            store=self.store,
            blobs=self.blobs,
            peers=NetPeers(self.net, self.id),
            publish=self.net.publisher(self.id),
            settings=settings,
            on_acked=on_acked or acked,
        )

    def manifest(
        self,
        args: tuple[str, ...],
        deadline_s: float = 60.0,
        workload: str = "montecarlo",
        fuel: int = 10**10,
    ) -> JobManifest:
        module = (WORKLOADS / f"{workload}.wasm").read_bytes()
        self.blobs.put(module)
        now = wall_ms()
        return JobManifest(
            module=blob_ref(module),
            inputs=(),
            args=args,
            env=(),
            stdin=None,
            limits=Limits(fuel, 64 << 20, 30_000, 1 << 20),
            deadline=now + int(deadline_s * 1000),
            retention_ms=60_000,
            replicas=1,
            profile=Digest(PROFILE.digest),
            submitter=NodeId(self.id),
            nonce=secrets.token_bytes(16),
            created_at=now,
        )

    async def job(self, job_id: bytes) -> Any:
        return await self.store.run(Store.job, job_id, "submitter")


async def start(nursery: trio.Nursery, *nodes: RealNode) -> None:
    for node in nodes:
        await nursery.start(node.market.run)


async def wait_state(
    node: RealNode, job_id: bytes, state: str, seconds: float = 30.0, role: str = "submitter"
) -> Any:
    for _ in range(int(seconds / 0.05)):
        row = await node.store.run(Store.job, job_id, role)
        if row is not None and row.state == state:
            return row
        await trio.sleep(0.05)
    raise AssertionError(f"job never reached {state}")


async def until(check: Callable[[], object], seconds: float = 5.0) -> None:
    """Poll `check` (a function, or one returning an awaitable) every 50 ms until it is true; fail the
    test (AssertionError) if it is not within `seconds`, so a check written only as a wait still fails."""
    for _ in range(int(seconds / 0.05)):
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return
        await trio.sleep(0.05)
    value = check()
    if inspect.isawaitable(value):
        value = await value
    assert value, f"still not true after {seconds:g} s: {getattr(check, '__qualname__', check)}"
