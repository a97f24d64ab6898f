"""Zero-configuration discovery of peers on the local network (mDNS / DNS-SD, `_e31._tcp.local.`).

How it works: python-zeroconf runs its own asyncio loop in a thread. We use only its synchronous API,
from trio worker threads (`trio.to_thread.run_sync`): opening the sockets, registering our record (which
blocks about 1.7 s while it probes for name conflicts), resolving others, withdrawing on stop. The browser
calls back on zeroconf's thread; the callback only hands the service name back to trio
(`trio.from_thread.run_sync` with our trio token), where names wait in a small map until one task resolves
them in worker threads. Everything a record says is checked (`parse_record`) before it is reported:
protocol version, network, the node id's canonical text (e31.protocol.ids), usable addresses and port.

A record is only a hint: a killed node's record lingers in caches for about two minutes, and anyone on the
LAN can publish one. Liveness comes from the transport's heartbeats and identity from its handshake.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import trio
from e31.protocol.errors import ProtocolError
from e31.protocol.ids import NodeId

from ..errors import PeerError, Unavailable
from ..logs import logger

if TYPE_CHECKING:  # imported where used: zeroconf is loaded only when discovery starts
    from ifaddr import Adapter
    from zeroconf import ServiceBrowser, ServiceInfo, ServiceStateChange, Zeroconf

SERVICE_TYPE = "_e31._tcp.local."
PROTOCOL_VERSION = "1"
TXT_VERSION, TXT_NETWORK, TXT_NODE_ID = "v", "net", "id"
MAX_ADDRESSES = 16
"""At most this many addresses of one record are reported."""
MAX_NAMES = 512
"""Distinct service names tracked at once; beyond it new names are ignored (a flood on the LAN)."""
RESOLVE_TIMEOUT_MS = 3000
RESOLVE_CONCURRENCY = 4

log = logger("discovery")

HostPort = tuple[str, int]
OnFound = Callable[[str, str, list[HostPort]], object]
OnLost = Callable[[str], object]
BrowseHandler = Callable[["Zeroconf", str, str, "ServiceStateChange"], None]
"""Called by zeroconf's browser (on its thread) with zeroconf, service_type, name and state_change."""


class DiscoveryError(Unavailable):
    """Discovery cannot start: no usable interface, bad arguments, sockets that cannot be opened."""


class BadRecord(PeerError, ValueError):
    """A record from the network that is not a usable e31 record; the message says why."""


@dataclass(frozen=True, slots=True)
class PeerRecord:
    node_id: str
    network: str
    addresses: tuple[HostPort, ...]


# --- the pure parts ---------------------------------------------------------------------------------


def txt_record(node_id: str, network: str) -> dict[str, str]:
    return {TXT_VERSION: PROTOCOL_VERSION, TXT_NETWORK: network, TXT_NODE_ID: node_id}


def parse_record(
    properties: Mapping[bytes, bytes | None], addresses: Iterable[str], port: int | None
) -> PeerRecord:
    """Check a resolved record's TXT values, addresses and port; raise BadRecord saying what is wrong."""
    version = _txt(properties, TXT_VERSION)
    if version != PROTOCOL_VERSION:
        raise BadRecord(f"protocol version {version!r}, we speak {PROTOCOL_VERSION!r}")
    network = _txt(properties, TXT_NETWORK)
    if not network or len(network) > 64:
        raise BadRecord(f"network name {network!r}")
    node_id = _txt(properties, TXT_NODE_ID) or ""
    try:
        NodeId.parse(node_id)
    except ProtocolError as e:
        raise BadRecord(f"node id: {e}") from None
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise BadRecord(f"port {port!r}")
    usable: list[HostPort] = []
    for text in addresses:
        try:
            ip = ipaddress.ip_address(text)
        except ValueError:
            continue
        if ip.is_unspecified or ip.is_multicast or (ip.version == 4 and str(ip) == "255.255.255.255"):
            continue
        if (str(ip), port) not in usable:
            usable.append((str(ip), port))
    if not usable:
        raise BadRecord("no usable address")
    return PeerRecord(node_id, network, tuple(usable[:MAX_ADDRESSES]))


def _txt(properties: Mapping[bytes, bytes | None], key: str) -> str | None:
    value = properties.get(key.encode("ascii"))
    if value is None:
        return None
    try:
        return value.decode("utf-8", errors="strict")
    except (UnicodeDecodeError, AttributeError):
        raise BadRecord(f"TXT value {key!r} is not UTF-8 text") from None


def advertised_addresses(listen: Sequence[HostPort], host_addresses: Sequence[str]) -> list[HostPort]:
    """The (address, port) pairs to publish for the addresses we listen on.

    A specific address is published as it is (127.0.0.1 stays 127.0.0.1); a wildcard (0.0.0.0, ::) stands
    for `host_addresses` of its family: the addresses of the interfaces discovery runs on.
    """
    out: list[HostPort] = []
    for host, port in listen:
        ip = ipaddress.ip_address(host)
        if ip.is_unspecified:
            chosen = [a for a in host_addresses if ipaddress.ip_address(a).version == ip.version]
        else:
            chosen = [str(ip)]
        for address in chosen:
            if (address, port) not in out:
                out.append((address, port))
    return out


# --- talking to the operating system (called in worker threads) -------------------------------------


def _host_addresses(interfaces: Sequence[str] | None) -> tuple[list[str], list[str]]:
    """(addresses to give zeroconf, addresses a wildcard listener stands for).

    None: zeroconf's default (all IPv4 interfaces) and every address of the host that a peer elsewhere
    could use (not loopback, not IPv6 link-local). A list: each entry is an IP address, or an interface
    name standing for its IPv4 addresses.
    """
    import ifaddr

    adapters = ifaddr.get_adapters()

    def ips(adapter: Adapter) -> list[str]:
        return [ip.ip if isinstance(ip.ip, str) else ip.ip[0] for ip in adapter.ips]

    if interfaces is None:
        every = [a for adapter in adapters for a in ips(adapter)]
        usable = [
            a
            for a in every
            if not ipaddress.ip_address(a).is_loopback and not ipaddress.ip_address(a).is_link_local
        ]
        return [], list(dict.fromkeys(usable))
    chosen: list[str] = []
    by_name = {a.nice_name: a for a in adapters} | {a.name: a for a in adapters}
    here = {ipaddress.ip_address(a) for adapter in adapters for a in ips(adapter)}
    for entry in interfaces:
        try:
            ip = ipaddress.ip_address(entry)
        except ValueError:
            pass
        else:
            # Checked here: zeroconf leaks a socket when asked for an address it cannot join on.
            if ip not in here:
                raise DiscoveryError(f"{entry} is not an address of any network interface here")
            chosen.append(str(ip))
            continue
        adapter = by_name.get(entry)
        if adapter is None:
            known = ", ".join(sorted({a.nice_name for a in adapters})) or "none"
            raise DiscoveryError(
                f"no network interface or address {entry!r} (interfaces with an address here: {known})"
            )
        v4 = [a for a in ips(adapter) if ipaddress.ip_address(a).version == 4]
        if not v4:
            raise DiscoveryError(f"interface {entry!r} has no IPv4 address")
        chosen += v4
    chosen = list(dict.fromkeys(chosen))
    if not chosen:
        raise DiscoveryError("no network interface selected for mDNS")
    return chosen, chosen


def _resolve_listen(addresses: Sequence[HostPort]) -> list[HostPort]:
    """Host names in the listen addresses turned into IP addresses (getaddrinfo)."""
    out: list[HostPort] = []
    for host, port in addresses:
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise DiscoveryError(f"cannot advertise port {port!r}: a bound port is 1 to 65535")
        try:
            out.append((str(ipaddress.ip_address(host)), port))
            continue
        except ValueError:
            pass
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as e:
            raise DiscoveryError(f"cannot resolve listen host {host!r}: {e}") from None
        out += [(str(info[4][0]), port) for info in infos]
    return out


class _Zeroconf:
    """The blocking side: one Zeroconf instance, our record, the browser. Every method runs in a thread."""

    def __init__(
        self, interfaces: Sequence[str] | None, listen: Sequence[HostPort], node_id: str, network: str
    ) -> None:
        from zeroconf import ServiceInfo, Zeroconf

        zc_interfaces, host_addresses = _host_addresses(interfaces)
        published = advertised_addresses(_resolve_listen(listen), host_addresses)
        # DNS-SD carries one port per record: addresses listening on other ports are not published.
        self.published = [(a, p) for a, p in published if p == published[0][1]] if published else []
        self.info: ServiceInfo | None = None
        if self.published:
            self.info = ServiceInfo(
                SERVICE_TYPE,
                f"{node_id}.{SERVICE_TYPE}",
                port=self.published[0][1],
                properties=txt_record(node_id, network),
                server=f"{node_id}.local.",
                parsed_addresses=[a for a, _ in self.published],
            )
        self.browser: ServiceBrowser | None = None
        self.registered = False
        try:
            self.zc = Zeroconf() if interfaces is None else Zeroconf(interfaces=zc_interfaces)
        except Exception as e:  # OSError, ValueError, RuntimeError and zeroconf's own: all mean "cannot"
            where = "the default interfaces" if interfaces is None else ", ".join(zc_interfaces)
            raise DiscoveryError(f"cannot open mDNS sockets on {where}: {e}") from None

    def browse(self, handler: BrowseHandler) -> None:
        from zeroconf import ServiceBrowser

        try:
            self.browser = ServiceBrowser(self.zc, SERVICE_TYPE, handlers=[handler])
        except Exception as e:
            raise DiscoveryError(f"cannot browse for {SERVICE_TYPE}: {e or type(e).__name__}") from None

    def register(self) -> None:
        if self.info is None:
            raise DiscoveryError("no address to publish")
        self.zc.register_service(self.info, allow_name_change=True)
        self.registered = True

    def resolve(self, name: str) -> PeerRecord | None:
        info = self.zc.get_service_info(SERVICE_TYPE, name, timeout=RESOLVE_TIMEOUT_MS)
        if info is None:
            return None
        return parse_record(info.properties or {}, info.parsed_addresses(), info.port)

    def close(self) -> None:
        """Stop browsing, withdraw our record (goodbye packets), close the sockets; log, never raise."""
        steps: list[tuple[str, Callable[[], object]]] = []
        if self.browser is not None:
            steps.append(("stop browsing", self.browser.cancel))
        if self.registered and self.info is not None:
            steps.append(("withdraw the record", partial(self.zc.unregister_service, self.info)))
        steps.append(("close", self.zc.close))
        for what, step in steps:
            try:
                step()
            except Exception as e:  # zeroconf raises assorted errors at shutdown; none may escape
                log.warning("mDNS: cannot %s: %s", what, e or type(e).__name__)


# --- the trio service -------------------------------------------------------------------------------


class _Browser:
    """The trio side: pending names from the browser thread, resolution, deduplicated reports."""

    def __init__(
        self, zc: _Zeroconf, node_id: str, network: str, on_found: OnFound, on_lost: OnLost | None
    ) -> None:
        self.zc = zc
        self.node_id = node_id
        self.network = network
        self.on_found = on_found
        self.on_lost = on_lost
        self.pending: dict[str, bool] = {}
        """name -> removed? (the latest news wins)"""
        self.wake = trio.Event()
        self.resolving: set[str] = set()
        self.records: dict[str, PeerRecord] = {}
        self.reported: dict[str, tuple[HostPort, ...]] = {}
        self.limiter = trio.CapacityLimiter(RESOLVE_CONCURRENCY)
        self.flood_warned = False

    def note(self, name: str, removed: bool) -> None:
        """Called on the trio thread for each browser event."""
        known = name in self.pending or name in self.records or name in self.resolving
        if not known and len(self.pending) + len(self.records) >= MAX_NAMES:
            if not self.flood_warned:
                log.warning("mDNS: more than %d e31 records on the network; ignoring new ones", MAX_NAMES)
                self.flood_warned = True
            return
        self.pending[name] = removed
        self.wake.set()

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            while True:
                await self.wake.wait()
                self.wake = trio.Event()
                for name in [n for n in self.pending if n not in self.resolving]:
                    if self.pending.pop(name):
                        self.forget(name)
                    else:
                        self.resolving.add(name)
                        nursery.start_soon(self.resolve, name)

    async def resolve(self, name: str) -> None:
        try:
            async with self.limiter:
                record = await trio.to_thread.run_sync(self.zc.resolve, name, abandon_on_cancel=True)
        except BadRecord as e:
            log.debug("mDNS: ignoring record %r: %s", name, e)
            self.forget(name)
            return
        except Exception as e:  # zeroconf and socket errors: this record is skipped, discovery goes on
            log.warning("mDNS: cannot resolve %r: %s", name, e or type(e).__name__)
            return
        finally:
            self.resolving.discard(name)
            if name in self.pending:
                self.wake.set()
        if self.pending.get(name):
            return  # withdrawn while we asked: the answer is stale, the removal comes next
        if record is None:
            log.debug("mDNS: %r did not answer", name)
        elif record.node_id == self.node_id:
            pass
        elif record.network != self.network:
            log.debug("mDNS: ignoring %s of network %r", record.node_id, record.network)
            self.forget(name)
        else:
            old = self.records.pop(name, None)
            self.records[name] = record
            self.publish({record.node_id} | ({old.node_id} if old else set()))

    def forget(self, name: str) -> None:
        old = self.records.pop(name, None)
        if old is not None:
            self.publish({old.node_id})

    def publish(self, node_ids: set[str]) -> None:
        for node_id in sorted(node_ids):
            latest = [r for r in self.records.values() if r.node_id == node_id]
            if not latest:
                if self.reported.pop(node_id, None) is not None:
                    log.info("mDNS: %s withdrew its record", node_id)
                    if self.on_lost is not None:
                        self.on_lost(node_id)
                continue
            addresses = latest[-1].addresses
            if self.reported.get(node_id) != addresses:
                self.reported[node_id] = addresses
                log.info("mDNS: found %s at %s", node_id, ", ".join(_show(a) for a in addresses))
                self.on_found(node_id, self.network, list(addresses))


async def run_discovery(
    *,
    node_id: str,
    network: str,
    addresses: Sequence[HostPort],
    interfaces: Sequence[str] | None,
    on_found: OnFound,
    on_lost: OnLost | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Publish this node on mDNS and report the other nodes of `network` until cancelled.

    `addresses`: the (host, port) pairs the node listens on (bound ports); wildcards stand for the
    addresses of the interfaces in use. `interfaces`: None for all, else IP addresses or interface names.
    `on_found(node_id, network, [(host, port), ...])` is called on the trio thread for a new peer and
    again when its addresses change; `on_lost(node_id)` when its record is withdrawn or expires.
    Ready once browsing; our record is registered right after (that takes about 1.7 s). Raises
    DiscoveryError when it cannot start; later zeroconf failures are logged. On exit, even by
    cancellation, the record is withdrawn and the sockets closed (a stop while the record is still being
    registered first lets the registration finish, so that nothing is left announced).
    """
    try:
        NodeId.parse(node_id)
    except ProtocolError as e:
        raise DiscoveryError(f"not a node id: {e}") from None
    if not network or len(network) > 64:
        raise DiscoveryError(f"not a network name: {network!r}")
    if interfaces is not None and isinstance(interfaces, str):
        raise DiscoveryError("interfaces is a list of addresses or interface names, not one string")
    token = trio.lowlevel.current_trio_token()
    zc = await trio.to_thread.run_sync(_Zeroconf, interfaces, list(addresses), node_id, network)
    browser = _Browser(zc, node_id, network, on_found, on_lost)

    def handler(zeroconf: Zeroconf, service_type: str, name: str, state_change: ServiceStateChange) -> None:
        removed = state_change.name == "Removed"
        with contextlib.suppress(trio.RunFinishedError):
            trio.from_thread.run_sync(browser.note, name, removed, trio_token=token)

    try:
        await trio.to_thread.run_sync(zc.browse, handler)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(browser.run)
            task_status.started()
            if zc.info is None:
                log.warning(
                    "mDNS: no address to publish for %s; looking for peers only",
                    ", ".join(_show(a) for a in addresses) or "no listen address",
                )
                return
            try:
                # Not abandoned on cancel: a registration cut short could announce after our goodbye
                # and leave a record nobody withdraws. Stopping during start-up waits for it (<2 s).
                await trio.to_thread.run_sync(zc.register)
            except Exception as e:  # a conflict or a socket error: we can still find others
                log.warning("mDNS: cannot publish our record: %s", e or type(e).__name__)
            else:
                log.info("mDNS: published %s at %s", zc.info.name, ", ".join(_show(a) for a in zc.published))
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(zc.close)


def _show(address: HostPort) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
