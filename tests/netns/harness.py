"""Many hosts on one machine: Linux network namespaces joined by veth pairs and bridges (iproute2),
home networks behind NAT routers (nftables), and links that drop, lose or delay packets (tc netem).

How it is built: a topology (`Topology`, a context manager) owns a *switch* namespace that holds one
bridge per segment, and one namespace per host or router. Each host's interface `e0` is one end of a
veth pair whose other end is a port of its segment's bridge in the switch namespace, so nothing at all
is created in the namespace the tests run in: every address, route, firewall rule and qdisc exists
only inside namespaces this topology made, and goes with them. A NAT router has `wan` on one segment
and `lan` on another; nftables masquerades what leaves by `wan` and lets in only replies (no inbound
to the hosts behind it), as a home router does.

Names: every namespace is called `e31nt<pid>x<n>-<name>` (the pid of the process that made it, and a
counter), so parallel test runs and other people's namespaces never collide, and `sweep_stale()`
deletes what a killed run left behind (namespaces whose pid is no longer alive, and the processes in
them). `close()` (the context manager's exit, and a finalizer at interpreter exit) kills every process
in the topology's namespaces and deletes them: veths, bridges, rules and qdiscs go with their namespace.

Faults: `Host.link_down()`/`link_up()` take the host's bridge port down and up (the host keeps its
address: a cable pulled), `Host.shape(...)` puts netem delay, loss or a rate on both directions of the
host's link, `Host.readdress(ip)` gives it a new address on its segment, and `Topology.partition(...)`
cuts a segment into groups that reach only each other (nftables in the bridge family on the switch),
`heal()` joins them again.

Code in the test process reaches a namespace's sockets (a node's control API on its 127.0.0.1) through
`Host.call(fn)`, which runs `fn` in a thread that has entered the namespace (setns(2)): sockets made
there belong to it.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import itertools
import os
import shutil
import signal
import subprocess
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

PREFIX = "e31nt"
NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000
T = TypeVar("T")
_counter = itertools.count()


class Unsupported(RuntimeError):
    """Namespaces cannot be made here; the message says why (tests skip with it)."""


class HarnessError(RuntimeError):
    """A command that builds or changes the topology failed."""


def unsupported_reason(*, nat: bool = False) -> str | None:
    """Why a topology cannot be built on this machine, or None when it can (root, iproute2, a kernel
    that makes network namespaces, and for NAT nftables)."""
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs these tests as root)"
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed"
    if nat and shutil.which("nft") is None:
        return "nftables' `nft` is not installed"
    probe = f"{PREFIX}{os.getpid()}x{next(_counter)}-probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip() or made.returncode}"
    try:
        if nat:  # the kernel must take what NAT routers and partitions load (nf_tables, ip and bridge)
            rules = (
                NAT_RULES
                + "table bridge e31probe {\n  chain cut {\n    type filter hook forward priority 0;\n  }\n}\n"
            )
            loaded = subprocess.run(
                ["ip", "netns", "exec", probe, "nft", "-f", "-"], input=rules, capture_output=True, text=True
            )
            if loaded.returncode != 0:
                return f"nftables cannot load NAT or bridge rules here: {loaded.stderr.strip()[:200]}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def sh(*argv: str, ns: str | None = None, stdin: str | None = None, check: bool = True) -> str:
    """Run one command (in namespace `ns` if given); its stdout. A failure raises HarnessError."""
    cmd = list(argv) if ns is None else ["ip", "netns", "exec", ns, *argv]
    proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=60)
    if check and proc.returncode != 0:
        raise HarnessError(f"{' '.join(cmd)}: {proc.stderr.strip() or proc.returncode}")
    return proc.stdout


_netem: list[bool] = []


def netem_available() -> bool:
    """Whether the kernel has tc netem (a probe on a veth pair in a namespace of its own, once)."""
    if not _netem:
        ns = f"{PREFIX}{os.getpid()}x{next(_counter)}-netem"
        sh("ip", "netns", "add", ns)
        try:
            sh("ip", "link", "add", "t0", "type", "veth", "peer", "name", "t1", ns=ns)
            probe = sh("tc", "qdisc", "add", "dev", "t0", "root", "netem", "delay", "1ms", ns=ns, check=False)
            shown = sh("tc", "qdisc", "show", "dev", "t0", ns=ns)
            _netem.append("netem" in shown and probe is not None)
        finally:
            sh("ip", "netns", "del", ns, check=False)
    return _netem[0]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _kill_processes_in(ns: str) -> None:
    """SIGKILL every process in namespace `ns` and wait (briefly) for them to go."""
    for _ in range(50):
        pids = [int(p) for p in sh("ip", "netns", "pids", ns, check=False).split()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def _delete_namespace(ns: str) -> None:
    _kill_processes_in(ns)
    sh("ip", "netns", "del", ns, check=False)


def sweep_stale() -> list[str]:
    """Delete the namespaces (and kill the processes in them) that runs no longer alive left behind;
    returns their names. Namespaces of live processes, this one's included, are left alone."""
    gone = []
    if not NETNS_DIR.is_dir():
        return gone
    for entry in NETNS_DIR.iterdir():
        name = entry.name
        if not name.startswith(PREFIX):
            continue
        pid_text = name[len(PREFIX) :].split("x", 1)[0]
        if not pid_text.isdigit() or _pid_alive(int(pid_text)):
            continue
        _delete_namespace(name)
        gone.append(name)
    return gone


def _setns(ns: str) -> None:
    """Move the calling thread into network namespace `ns` (setns(2): per thread)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(NETNS_DIR / ns, os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into {ns}: {os.strerror(err)}")
    finally:
        os.close(fd)


@dataclass(eq=False)
class Segment:
    """A layer-2 segment: a bridge in the switch namespace and an IPv4 subnet on it."""

    topology: Topology
    name: str
    bridge: str
    network: ipaddress.IPv4Network
    _next_host: Iterator[ipaddress.IPv4Address] = field(init=False)

    def __post_init__(self) -> None:
        self._next_host = iter(list(self.network.hosts())[10:])

    def allocate(self) -> str:
        return str(next(self._next_host))

    @property
    def prefixlen(self) -> int:
        return self.network.prefixlen


@dataclass(eq=False)
class Host:
    """A namespace with one interface `e0` on a segment (a port of its bridge)."""

    topology: Topology
    name: str
    ns: str
    segment: Segment
    ip: str
    port: str
    """The bridge port (in the switch namespace) its veth ends in."""
    gateway: str | None = None
    _pool: ThreadPoolExecutor | None = None
    _pool_lock: threading.Lock = field(default_factory=threading.Lock)

    def exec(self, argv: Sequence[str], **popen: object) -> subprocess.Popen[bytes]:
        """Start a process in this host's namespace (`ip netns exec` execs it: its pid is the process's)."""
        return subprocess.Popen(["ip", "netns", "exec", self.ns, *argv], **popen)  # type: ignore[call-overload,no-any-return]

    def sh(self, *argv: str, check: bool = True) -> str:
        return sh(*argv, ns=self.ns, check=check)

    def call(self, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)` in a thread inside this namespace (its sockets are this host's)."""
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    1, f"netns-{self.name}", initializer=_setns, initargs=(self.ns,)
                )
            pool = self._pool
        return pool.submit(fn, *args).result()

    # --- faults ---

    def link_down(self) -> None:
        """Pull the cable: the host's bridge port goes down (its address and routes stay)."""
        self.topology.switch_sh("ip", "link", "set", self.port, "down")

    def link_up(self) -> None:
        self.topology.switch_sh("ip", "link", "set", self.port, "up")

    def shape(
        self, *, delay_ms: float = 0, jitter_ms: float = 0, loss_pct: float = 0, rate: str = ""
    ) -> None:
        """Both directions of this host's link: a delay (with jitter), random loss, a rate cap. With
        `tc netem` (sch_netem) in the kernel, netem does it all; without it, loss is dropped at random by
        nftables in the host's namespace and the rate is a tbf qdisc, and a delay is Unsupported."""
        if not (delay_ms or loss_pct or rate):
            raise ValueError("shape needs a delay, a loss or a rate")
        self.unshape()
        if netem_available():
            spec: list[str] = []
            if delay_ms:
                spec += ["delay", f"{delay_ms}ms"] + ([f"{jitter_ms}ms"] if jitter_ms else [])
            if loss_pct:
                spec += ["loss", f"{loss_pct}%"]
            if rate:
                spec += ["rate", rate]
            self.sh("tc", "qdisc", "replace", "dev", "e0", "root", "netem", *spec)
            self.topology.switch_sh("tc", "qdisc", "replace", "dev", self.port, "root", "netem", *spec)
            return
        if delay_ms:
            raise Unsupported("this kernel has no tc netem (sch_netem): links cannot be delayed")
        if loss_pct:
            per_10k = round(loss_pct * 100)
            drop = "drop" if per_10k >= 10000 else f"numgen random mod 10000 < {per_10k} drop"
            chains = "".join(
                f"  chain {hook} {{\n    type filter hook {hook} priority 0;\n    {drop}\n  }}\n"
                for hook in ("input", "output")
            )
            sh("nft", "-f", "-", ns=self.ns, stdin=f"table inet e31loss {{\n{chains}}}\n")
        if rate:
            tbf = ["tbf", "rate", rate, "burst", "32kbit", "latency", "400ms"]
            self.sh("tc", "qdisc", "replace", "dev", "e0", "root", *tbf)
            self.topology.switch_sh("tc", "qdisc", "replace", "dev", self.port, "root", *tbf)

    def unshape(self) -> None:
        self.sh("tc", "qdisc", "del", "dev", "e0", "root", check=False)
        self.topology.switch_sh("tc", "qdisc", "del", "dev", self.port, "root", check=False)
        if shutil.which("nft") is not None:
            self.sh("nft", "delete", "table", "inet", "e31loss", check=False)

    def readdress(self, ip: str | None = None) -> str:
        """Give the host a new address on its segment (the old one is removed); returns it."""
        new = ip or self.segment.allocate()
        # (the old one first: deleting a primary address deletes the secondaries of its subnet too)
        self.sh("ip", "addr", "del", f"{self.ip}/{self.segment.prefixlen}", "dev", "e0")
        self.sh("ip", "addr", "add", f"{new}/{self.segment.prefixlen}", "dev", "e0")
        if self.gateway is not None:
            self.sh("ip", "route", "replace", "default", "via", self.gateway, "dev", "e0")
        self.ip = new
        return new

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


@dataclass(eq=False)
class Router:
    """A NAT router: `wan` on a public segment, `lan` the gateway of a home segment."""

    topology: Topology
    name: str
    ns: str
    wan_ip: str
    lan_ip: str
    home: Segment
    port: str
    """Its `wan`'s bridge port (a router in a partition's group takes its home with it)."""


class Topology:
    """Namespaces, bridges and veths made for one test; a context manager that removes them all."""

    def __init__(self) -> None:
        self.id = f"{PREFIX}{os.getpid()}x{next(_counter)}"
        self.namespaces: list[str] = []
        self.segments: dict[str, Segment] = {}
        self.hosts: dict[str, Host] = {}
        self.routers: dict[str, Router] = {}
        self._ports = itertools.count()
        self._closed = False
        self._partition: list[list[Host | Router]] | None = None
        self.switch = self._namespace("sw")
        self._finalizer = weakref.finalize(self, _remove_all, self.namespaces)

    def __enter__(self) -> Topology:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Kill every process in this topology's namespaces and delete them (and so everything in them)."""
        if self._closed:
            return
        self._closed = True
        for host in self.hosts.values():
            host.close()
        self._finalizer()

    # --- building ---

    def _namespace(self, name: str) -> str:
        ns = f"{self.id}-{name}"
        if len(ns) > 200 or "/" in name:
            raise ValueError(f"bad namespace name {name!r}")
        sh("ip", "netns", "add", ns)
        self.namespaces.append(ns)
        sh("ip", "link", "set", "lo", "up", ns=ns)
        return ns

    def switch_sh(self, *argv: str, check: bool = True, stdin: str | None = None) -> str:
        return sh(*argv, ns=self.switch, check=check, stdin=stdin)

    def segment(self, name: str, subnet: str) -> Segment:
        """A new bridge for `subnet` (private: 10/8 or 172.16/12 only)."""
        network = ipaddress.IPv4Network(subnet)
        if not network.is_private or network.subnet_of(ipaddress.IPv4Network("192.168.0.0/16")):
            raise ValueError(f"use a 10.x or 172.16-31.x subnet, not {subnet}")
        bridge = f"br{len(self.segments)}"
        self.switch_sh("ip", "link", "add", bridge, "type", "bridge")
        self.switch_sh("ip", "link", "set", bridge, "up")
        seg = self.segments[name] = Segment(self, name, bridge, network)
        return seg

    def _veth(self, ns: str, inner: str, segment: Segment) -> str:
        """A veth pair: `inner` in `ns`, its peer a port of `segment`'s bridge. Returns the port's name."""
        port = f"p{next(self._ports)}"
        self.switch_sh("ip", "link", "add", port, "type", "veth", "peer", "name", inner, "netns", ns)
        self.switch_sh("ip", "link", "set", port, "master", segment.bridge, "up")
        sh("ip", "link", "set", inner, "up", ns=ns)
        return port

    def host(self, name: str, segment: Segment, *, gateway: str | None = None) -> Host:
        """A host on `segment`; `gateway` is its default route (a home host's router)."""
        if name in self.hosts or name in self.routers:
            raise ValueError(f"{name} exists")
        ns = self._namespace(name)
        port = self._veth(ns, "e0", segment)
        ip = segment.allocate()
        sh("ip", "addr", "add", f"{ip}/{segment.prefixlen}", "dev", "e0", ns=ns)
        if gateway is not None:
            sh("ip", "route", "add", "default", "via", gateway, "dev", "e0", ns=ns)
        host = self.hosts[name] = Host(self, name, ns, segment, ip, port, gateway)
        return host

    def nat_router(self, name: str, public: Segment, home: Segment) -> Router:
        """A home router between `public` (its `wan`) and `home` (its `lan`, the home's gateway): it
        masquerades outbound traffic and lets in only replies to it."""
        ns = self._namespace(name)
        port = self._veth(ns, "wan", public)
        self._veth(ns, "lan", home)
        wan, lan = public.allocate(), str(next(iter(home.network.hosts())))
        sh("ip", "addr", "add", f"{wan}/{public.prefixlen}", "dev", "wan", ns=ns)
        sh("ip", "addr", "add", f"{lan}/{home.prefixlen}", "dev", "lan", ns=ns)
        sh("sysctl", "-qw", "net.ipv4.ip_forward=1", ns=ns)  # this namespace's own forwarding only
        sh("nft", "-f", "-", ns=ns, stdin=NAT_RULES)
        router = self.routers[name] = Router(self, name, ns, wan, lan, home, port)
        return router

    # --- faults over many hosts ---

    def partition(self, *groups: Sequence[Host | Router]) -> None:
        """Cut the network so that each group reaches only itself (a host in no group reaches everyone;
        a router stands for its whole home). Replaces any earlier partition."""
        ports = [[h.port for h in g] for g in groups]
        rules = []
        for i, a in enumerate(ports):
            for j, b in enumerate(ports):
                if i != j and a and b:
                    rules.append(f"iifname {{ {', '.join(a)} }} oifname {{ {', '.join(b)} }} drop")
        self.heal()
        script = "table bridge e31cut {\n  chain cut {\n    type filter hook forward priority 0;\n"
        script += "".join(f"    {r}\n" for r in rules) + "  }\n}\n"
        self.switch_sh("nft", "-f", "-", stdin=script)
        self._partition = [list(g) for g in groups]

    def heal(self) -> None:
        """Undo `partition`."""
        if self._partition is not None:
            self.switch_sh("nft", "delete", "table", "bridge", "e31cut", check=False)
            self._partition = None


NAT_RULES = """
table ip e31nat {
  chain post {
    type nat hook postrouting priority srcnat;
    oifname "wan" masquerade
  }
  chain forward {
    type filter hook forward priority filter; policy drop;
    ct state established,related accept
    iifname "lan" oifname "wan" accept
  }
  chain input {
    type filter hook input priority filter; policy drop;
    iifname "lo" accept
    ct state established,related accept
    iifname "lan" accept
  }
}
"""
"""A home router: outbound from the home masqueraded, inbound only as replies (no port forwarding)."""


def _remove_all(namespaces: list[str]) -> None:
    """Delete namespaces, the switch (holding the bridges) last."""
    for ns in reversed(namespaces):
        _delete_namespace(ns)
    namespaces.clear()
