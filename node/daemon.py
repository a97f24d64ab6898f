"""The node process: start-up checks, the root nursery, the services, and a clean stop on a signal.

`run(config, settings)` is what `e31 node run` calls. Everything that can fail for a reason the
operator can fix (the data dir, the key file, the store, the blob directory, the listen address,
another node already using the data dir) is checked before or while the services start and ends as
one DaemonError with a one-line message. Then one root nursery holds every service, each started
with `nursery.start`, so the node is announced only once all of them are ready:

    peering (transport listener, dialer, links)  ->  mDNS discovery (unless --no-mdns)
        ->  gossip, job path (market, scheduler, capacity)  ->  garbage collection, heap trimming
        ->  local control API  ->  "node ... listening on ..."

SIGINT or SIGTERM cancels the root nursery: links close, the control API removes api.json, the
peering service drains its store queue, then the store is closed; the process exits 0.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import nacl.signing
import trio

from .api.server import Request, Router, serve_control
from .config import NodeConfig, describe_offer
from .errors import NodeError
from .host import gctune
from .host.memtrim import run_trimmer
from .identity import IdentityError, load_or_create_identity, node_id
from .logs import setup_logging
from .net.addresses import join_address, split_address
from .net.gossip import GossipService
from .net.peering import PeerDoc, PeerService
from .net.peers import PeerSettings
from .net.relay import RelayService
from .net.transport import ListenFailed
from .store.async_store import AsyncStore
from .store.blobs import BlobError, BlobStore
from .store.db import Store

if TYPE_CHECKING:
    from .market.adverts import CapacityService

log = logging.getLogger("e31.node")

LOCK_FILE = "node.lock"


class DaemonError(NodeError):
    """An expected start-up failure; the message is one line for the operator."""


def run(config: NodeConfig, settings: PeerSettings | None = None) -> int:
    """Run a node in the foreground until SIGINT/SIGTERM; returns the exit code (0 after a signal)."""
    setup_logging(config.log_level)
    for line in describe_offer(config):  # the first lines: what this node gives away
        log.info("%s", line)
    settings = settings or PeerSettings()
    os.umask(0o077)  # the database, blobs and logs hold job arguments and outputs: this user's only
    with _data_dir_lock(config.data_dir):
        identity = _identity(config)
        blobs = _blobs(config)
        for name in (
            config.store_path,
            *(config.store_path.with_name(config.store_path.name + s) for s in ("-wal", "-shm")),
        ):
            _private(name, "the database", "600")
        store = Store(config.store_path)  # a StoreError is one line with its own exit code (cli/main.py)
        try:
            node = Node(config, identity, AsyncStore(store), blobs, settings)
            gctune.tune()
            trio.run(_main, node)
        except BaseExceptionGroup as group:
            raise _expected(group) from None
        except ListenFailed as e:
            raise DaemonError(str(e)) from None
        finally:
            store.close()
    log.info("stopped")
    return 0


def _expected(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first error of a group holding only expected failures (NodeErrors: at start-up, or a store
    that failed under the node: a disk error, a full disk), which the CLI prints as one line with its
    exit code; else the group."""
    expected, rest = group.split(NodeError)
    if rest is not None or expected is None:
        return group
    leaf: BaseException = expected
    while isinstance(leaf, BaseExceptionGroup):
        leaf = leaf.exceptions[0]
    return leaf if isinstance(leaf, NodeError) else DaemonError(str(leaf))


@contextlib.contextmanager
def _data_dir_lock(data_dir: Path) -> Iterator[None]:
    """Create the data dir (0700) if needed and hold an exclusive lock on it while the node runs."""
    try:
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError:
        raise DaemonError(f"{data_dir}: not a directory (the data dir must be one)") from None
    except OSError as e:
        raise DaemonError(f"{data_dir}: cannot create the data dir: {e.strerror or e}") from None
    if not data_dir.is_dir():
        raise DaemonError(f"{data_dir}: not a directory (the data dir must be one)")
    if not os.access(data_dir, os.W_OK | os.X_OK):
        raise DaemonError(f"{data_dir}: the data dir is not writable by this user")
    _private(data_dir, "the data dir", "700")
    path = data_dir / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as e:
        raise DaemonError(f"{path}: cannot open the lock file: {e.strerror or e}") from None
    try:
        try:
            import fcntl
        except ImportError:  # no advisory locks on this platform: run unguarded
            fcntl = None  # type: ignore[assignment]
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                raise DaemonError(f"another node is already running with data dir {data_dir}") from None
        yield
    finally:
        os.close(fd)


def _private(path: Path, what: str, mode: str) -> None:
    """Refuse to run on `path` when other users may read it (its group or others have any bit)."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    except OSError as e:
        raise DaemonError(f"{path}: cannot check {what}: {e.strerror or e}") from None
    if st.st_mode & 0o077:
        raise DaemonError(
            f"{path}: {what} is open to other users (mode {stat.S_IMODE(st.st_mode):04o}) and holds job "
            f"arguments and outputs; run: chmod {mode} {path}"
        )


def _identity(config: NodeConfig) -> nacl.signing.SigningKey:
    path = config.identity_path
    existed = os.path.lexists(path)
    if not existed and os.path.lexists(config.store_path):
        # A new key would sign a new receipt log under the old one's history: refuse, keep the data.
        raise DaemonError(
            f"{path} is missing but {config.store_path} holds this node's jobs and receipt log, signed by "
            "that key: restore the key from its backup, or move the data dir away to start a new node"
        )
    try:
        key = load_or_create_identity(path)
    except IdentityError as e:
        raise DaemonError(str(e)) from None
    if existed:
        log.info("identity %s from %s", node_id(key), path)
    else:
        log.info("created a new identity %s; its key is in %s (mode 0600): back it up", node_id(key), path)
    return key


def _blobs(config: NodeConfig) -> BlobStore:
    """Open the blob store and remove what a crash left half-written (before any writer runs)."""
    try:
        blobs = BlobStore(config.blobs_dir, ceiling=config.disk_ceiling)
        swept = blobs.sweep()
    except (BlobError, OSError) as e:
        raise DaemonError(f"{config.blobs_dir}: {e}") from None
    if swept:
        log.info("removed %d unfinished blob write(s) left by an earlier stop", swept)
    return blobs


async def _main(node: Node) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:
            await nursery.start(node.serve)
            async for signum in signals:
                log.info("%s received: stopping", signal.Signals(signum).name)
                break
            nursery.cancel_scope.cancel()


@dataclass
class Node:
    """The running node's services and the local API's view of them."""

    config: NodeConfig
    identity: nacl.signing.SigningKey
    store: AsyncStore
    blobs: BlobStore
    settings: PeerSettings
    peering: PeerService = field(init=False)
    started_at: float = 0.0
    started_wall: float = 0.0
    capacity: CapacityService | None = None
    """The CapacityService once the job path runs (market/adverts.py)."""
    gossip: GossipService[bytes] | None = None
    """The GossipService once started (net/gossip.py); its counters show in the status."""
    relay: RelayService | None = None
    """Reachability and relaying (net/relay.py), once started."""

    def __post_init__(self) -> None:
        self.peering = PeerService(
            identity=self.identity, config=self.config, store=self.store, settings=self.settings
        )

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start every service, report ready, run until cancelled, then close the store."""
        try:
            async with trio.open_nursery() as nursery:
                self.started_at, self.started_wall = trio.current_time(), time.time()
                listen = await nursery.start(self.peering.run)
                if self.config.mdns:
                    await self._start_discovery(nursery, listen)
                router = self.router()
                await self._start_jobs(nursery, router)
                await self._start_gc(nursery)
                await nursery.start(run_trimmer)
                await nursery.start(serve_control, router, self.config)
                log.info(
                    "node %s on network %s listening on %s", self.peering.node_id, self.config.network, listen
                )
                task_status.started()
        finally:
            with trio.CancelScope(shield=True):
                await self.store.aclose()

    async def _start_discovery(self, nursery: trio.Nursery, listen: str) -> None:
        """Find peers on the local network; a LAN without multicast only loses this, not the node."""
        from e31.protocol.errors import ProtocolError
        from e31.protocol.ids import NodeId

        from .net.discovery import DiscoveryError, run_discovery

        def found(node: str, network: str, addresses: list[tuple[str, int]]) -> None:
            try:
                key = NodeId.parse(node).raw
            except ProtocolError:
                return
            if network == self.config.network:
                self.peering.discovered(key, [join_address(h, p) for h, p in addresses], "mdns")

        interfaces = list(self.config.mdns_interfaces) or None
        try:
            await nursery.start(
                partial(
                    run_discovery,
                    node_id=self.peering.node_id,
                    network=self.config.network,
                    addresses=[split_address(listen)],
                    interfaces=interfaces,
                    on_found=found,
                )
            )
        except DiscoveryError as e:
            log.warning("mDNS discovery is off: %s", e)

    async def _start_jobs(self, nursery: trio.Nursery, router: Router) -> None:
        """Gossip (offers), the receipt log with its export endpoint, and the job path (market_service)."""
        from e31.protocol.gossip import DEFAULT_KINDS, GossipConfig, GossipEngine
        from e31.sandbox.profile import PROFILE

        from .api.export import export_handler
        from .api.jobs import JobsApi, compile_check
        from .market.service import run_jobs
        from .net.relay import GOSSIP_KINDS
        from .store.receiptlog import ReceiptLog

        kinds = {**DEFAULT_KINDS, **GOSSIP_KINDS}
        gossip = GossipService(
            GossipEngine[bytes](GossipConfig(self.config.network, kinds=kinds)),
            on_disconnect=self.peering.disconnect,
            on_refuse=self.peering.refuse,
        )
        adverts = gossip.subscribe("capacity")  # before any link can bring one
        await nursery.start(gossip.run)
        self.peering.add_listener(gossip)
        self.gossip = gossip
        self.relay = RelayService(
            self.peering, offer=self.config.relay, publish=gossip.publish, via=gossip.subscribe("via")
        )
        await nursery.start(self.relay.run)
        # in a thread, like every other synchronous use of the store (it may write; the event loop
        # must never touch the connection directly: its short writes share an open transaction)
        receipt_log = await trio.to_thread.run_sync(
            ReceiptLog, self.store.store, self.identity, self.config.network
        )
        router.add("POST", "/v1/receipts/export", export_handler(self.store, self.blobs, receipt_log))
        market = await nursery.start(
            partial(
                run_jobs,
                identity=self.identity,
                config=self.config,
                store=self.store,
                blobs=self.blobs,
                peering=self.peering,
                gossip=gossip,
                receipt_log=receipt_log,
                on_capacity=self._set_capacity,
                adverts=adverts,
            )
        )
        JobsApi(market.submitter, self.blobs, PROFILE.digest, compile_check).register(router)
        self._add_dashboard(router, market.submitter, receipt_log)

    def _add_dashboard(self, router: Router, submitter: Any, receipt_log: Any) -> None:
        """The dashboard's page and endpoints, and GET /metrics (node/api/dashboard.py, prometheus.py)."""
        from .api.dashboard import DashboardApi
        from .api.prometheus import metrics_handler

        DashboardApi(
            self.store, self.blobs, submitter, receipt_log, self.status, self.peering.peer_docs
        ).register(router)
        router.add(
            "GET", "/metrics", metrics_handler(self.store, self.status, self._queue, lambda: receipt_log)
        )

    def _queue(self) -> tuple[int, float] | None:
        if self.capacity is None:
            return None
        scheduler = self.capacity.scheduler
        return scheduler.queue_length, scheduler.backlog_ms / 1000

    async def _start_gc(self, nursery: trio.Nursery) -> None:
        """Collect expired blobs and the leftovers of finished jobs every `gc_interval` seconds."""
        from .market.context import MarketSettings
        from .market.service import RUNS_DIR
        from .store.gc import run_gc

        await nursery.start(
            partial(
                run_gc,
                self.store,
                self.blobs,
                interval=self.config.gc_interval,
                retention_s=MarketSettings().retention_ms / 1000,
                runs_dir=self.config.data_dir / RUNS_DIR,
            )
        )

    def _set_capacity(self, capacity: CapacityService) -> None:
        self.capacity = capacity

    def router(self) -> Router:
        router = Router()
        router.add("GET", "/v1/status", self._status)
        router.add("GET", "/v1/peers", self._peers)
        return router

    def status(self) -> dict[str, Any]:
        from . import version

        counts = self.peering.counts()
        return {
            "node_id": self.peering.node_id,
            "network": self.config.network,
            "listen": self.peering.listen,
            "addresses": self.peering.addresses,
            "uptime_seconds": round(trio.current_time() - self.started_at, 3),
            "started_at": self.started_wall,
            "version": version(),
            "pid": os.getpid(),
            "data_dir": str(self.config.data_dir),
            "peer_count": counts["connected"] + counts["suspect"],
            "peers": counts,
            "capacity": {"cores": self.config.cores, "memory_bytes": self.config.memory},
            "offered": None if self.capacity is None else self.capacity.to_json(),
            "peer_capacity": {} if self.capacity is None else self.capacity.peer_table(),
            "gossip": {} if self.gossip is None else self.gossip.counters,
            "reachability": {} if self.relay is None else self.relay.to_json(),
        }

    async def _status(self, request: Request) -> dict[str, Any]:
        return self.status()

    async def _peers(self, request: Request) -> list[PeerDoc]:
        return self.peering.peer_docs()
