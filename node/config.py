"""The node's configuration: defaults, then DATA/config.toml, then the environment, then flags.

The data directory comes first (flag `--data-dir`, else `E31_DATA_DIR`, else the platform's user data
dir), because the config file lives in it. Every other key may appear in the file or as a flag; a flag
wins. Each key has one parser that accepts the file's TOML value or a flag's text, so both are checked
by the same rules, and every failure is a ConfigError naming the key and where the value came from.
Unknown keys in the file are errors: a typo must not be silently ignored.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from .errors import UsageError
from .units import parse_duration, parse_size

# The data directory's layout (docs/operating.md).
CONFIG_FILE = "config.toml"
API_FILE = "api.json"
IDENTITY_FILE = "identity.key"
STORE_FILE = "node.sqlite"
BLOBS_DIR = "blobs"
DEFAULT_PORT = 7531
DEFAULT_NETWORK = "main"
LOG_LEVELS = ("debug", "info", "warning", "error")


class ConfigError(UsageError):
    """A configuration value that cannot be used; the message names the key and its source."""


@dataclass(frozen=True, slots=True)
class Address:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class BootstrapPeer:
    """A first contact; with `node_id` set, the peer's identity is pinned."""

    address: Address
    node_id: str | None = None

    def __str__(self) -> str:
        return f"{self.node_id}@{self.address}" if self.node_id else str(self.address)


def _default_cores() -> int:
    return os.cpu_count() or 1


def _default_memory() -> int:
    """Half of physical memory where the platform says, else 1 GiB."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return 1 << 30
    return max(total // 2, 64 << 20) if total > 0 else 1 << 30


@dataclass(frozen=True, slots=True)
class NodeConfig:
    data_dir: Path
    listen: Address = Address("0.0.0.0", DEFAULT_PORT)
    bootstrap: tuple[BootstrapPeer, ...] = ()
    cores: int = field(default_factory=_default_cores)
    memory: int = field(default_factory=_default_memory)
    network: str = DEFAULT_NETWORK
    log_level: str = "info"
    max_connections: int = 64
    max_connections_per_address: int = 8
    max_peers: int = 1000
    """Known peers kept at most, in memory and in the store, however they were met."""
    dial_private: bool = False
    """Dial loopback, private and special-purpose addresses peers name (a LAN or one-machine network)."""
    mdns: bool = True
    mdns_interfaces: tuple[str, ...] = ()
    relay: bool = False
    """Offer to relay circuits between peers that cannot be dialled (node/net/relay.py)."""
    only_when_idle: bool = False
    idle_seconds: float = 300.0
    idle_load: float = 0.2
    """Owner CPU use, as a fraction of the machine, above which the owner counts as working."""
    capacity_interval: float = 5.0
    """Seconds between two samples of the machine's load."""
    capacity_raise_after: float = 30.0
    """A higher capacity is offered only once it has held this many seconds (a lower one at once)."""
    disk_ceiling: int = 10 << 30
    gc_interval: float = 600.0
    """Seconds between two garbage collections of expired blobs and finished jobs."""
    config_file: Path | None = None
    """The file the values were read from, or None when there was none."""

    @property
    def config_path(self) -> Path:
        return self.data_dir / CONFIG_FILE

    @property
    def identity_path(self) -> Path:
        return self.data_dir / IDENTITY_FILE

    @property
    def store_path(self) -> Path:
        return self.data_dir / STORE_FILE

    @property
    def blobs_dir(self) -> Path:
        return self.data_dir / BLOBS_DIR

    @property
    def api_file(self) -> Path:
        return self.data_dir / API_FILE


# --- value parsers: each takes (value, from_text) and returns the typed value or raises ValueError ---

_NETWORK_RE = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?$")
_IFACE_RE = re.compile(r"^[A-Za-z0-9_.:@-]{1,64}$")


def _parse_size(value: object, from_text: bool) -> int:
    """Bytes from a TOML integer or a text with a unit (node/units.py: "4GiB", "512MB", "1.5G")."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"expected a size such as 4GiB, 512MB or a number of bytes, got {_show(value)}")
    return parse_size(value)


def parse_address(text: object, *, allow_port_zero: bool = True) -> Address:
    """HOST:PORT, with an IPv6 host in brackets ([::1]:7531)."""
    if not isinstance(text, str):
        raise ValueError(f"expected HOST:PORT as a string, got {_kind(text)}")
    if text.startswith("["):
        host, sep, port_text = text[1:].partition("]:")
        if not sep or not host or ":" not in host:
            raise ValueError(f"expected [IPV6]:PORT, got {text!r}")
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep or not host:
            raise ValueError(f"expected HOST:PORT, got {text!r}")
        if ":" in host:
            raise ValueError(f"an IPv6 host goes in brackets, as [::1]:{port_text}; got {text!r}")
    if any(c.isspace() or c in "/@[]" for c in host):
        raise ValueError(f"not a host name or address: {host!r}")
    if not port_text.isdigit() or len(port_text) > 5:
        raise ValueError(f"the port must be a number from 0 to 65535, got {port_text!r}")
    port = int(port_text)
    low = 0 if allow_port_zero else 1
    if not low <= port <= 65535:
        raise ValueError(f"the port must be from {low} to 65535, got {port}")
    return Address(host, port)


def check_node_id(text: str) -> str:
    """The seam to the protocol's node id syntax; returns the text unchanged when it is valid."""
    from e31.protocol.errors import ProtocolError
    from e31.protocol.ids import NodeId

    try:
        NodeId.parse(text)
    except ProtocolError as e:
        raise ValueError(str(e)) from e
    return text


def parse_bootstrap(text: object) -> BootstrapPeer:
    """[NODEID@]HOST:PORT."""
    if not isinstance(text, str):
        raise ValueError(f"expected [NODEID@]HOST:PORT as a string, got {_kind(text)}")
    node_id: str | None = None
    if "@" in text:
        node_id, _, text = text.partition("@")
        check_node_id(node_id)
    return BootstrapPeer(parse_address(text, allow_port_zero=False), node_id)


def _parse_int(value: object, from_text: bool, *, low: int) -> int:
    if from_text and isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected a whole number, got {_show(value)}")
    if value < low:
        raise ValueError(f"must be at least {low}, got {value}")
    return value


def _parse_float(value: object, from_text: bool, *, low: float) -> float:
    if from_text and isinstance(value, str):
        with contextlib.suppress(ValueError):
            value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected a number, got {_show(value)}")
    if not low <= float(value) < float("inf"):
        raise ValueError(f"must be a finite number of at least {low}, got {value}")
    return float(value)


def _parse_fraction(value: object, from_text: bool) -> float:
    number = _parse_float(value, from_text, low=0.0)
    if not 0.0 < number <= 1.0:
        raise ValueError(f"expected a fraction in (0, 1], got {_show(value)}")
    return number


def _parse_seconds(value: object, from_text: bool, *, positive: bool = False) -> float:
    """A TOML number of seconds, or a duration as text ("90s", "10m", "1h30m"; node/units.py)."""
    number = parse_duration(value) if isinstance(value, str) else _parse_float(value, from_text, low=0.0)
    if positive and number <= 0.0:
        raise ValueError(f"expected a number of seconds above 0, got {_show(value)}")
    return number


def _parse_bool(value: object, from_text: bool) -> bool:
    if from_text and isinstance(value, str):
        lowered = value.strip().lower()
        if lowered in ("true", "yes", "on", "1"):
            return True
        if lowered in ("false", "no", "off", "0"):
            return False
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {_show(value)}")
    return value


def _parse_network(value: object, from_text: bool) -> str:
    if not isinstance(value, str) or not _NETWORK_RE.match(value):
        raise ValueError(
            "a network name is 1 to 32 characters of a-z, 0-9 and '-', not starting or ending with '-'; "
            f"got {_show(value)}"
        )
    return value


def _parse_log_level(value: object, from_text: bool) -> str:
    if not isinstance(value, str) or value.lower() not in LOG_LEVELS:
        raise ValueError(f"expected one of {', '.join(LOG_LEVELS)}, got {_show(value)}")
    return value.lower()


def _parse_list(item: Callable[[object], Any], value: object, from_text: bool) -> tuple[Any, ...]:
    if from_text and isinstance(value, str):
        value = [v for v in (p.strip() for p in value.split(",")) if v]
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ValueError(f"expected a list, got {_show(value)}")
    return tuple(item(v) for v in value)


def _parse_interface(value: object) -> str:
    if not isinstance(value, str) or not _IFACE_RE.match(value):
        raise ValueError(f"not an interface name: {_show(value)}")
    return value


Parser = Callable[[object, bool], Any]

_PARSERS: dict[str, Parser] = {
    "listen": lambda v, t: parse_address(v),
    "bootstrap": lambda v, t: _parse_list(parse_bootstrap, v, t),
    "cores": lambda v, t: _parse_int(v, t, low=0),  # 0: a submit-only node (never executes)
    "memory": _parse_size,
    "network": _parse_network,
    "log_level": _parse_log_level,
    "max_connections": lambda v, t: _parse_int(v, t, low=1),
    "max_connections_per_address": lambda v, t: _parse_int(v, t, low=1),
    "max_peers": lambda v, t: _parse_int(v, t, low=1),
    "dial_private": _parse_bool,
    "mdns": _parse_bool,
    "mdns_interfaces": lambda v, t: _parse_list(_parse_interface, v, t),
    "relay": _parse_bool,
    "only_when_idle": _parse_bool,
    "idle_seconds": _parse_seconds,
    "idle_load": lambda v, t: _parse_fraction(v, t),
    "capacity_interval": lambda v, t: _parse_seconds(v, t, positive=True),
    "capacity_raise_after": _parse_seconds,
    "disk_ceiling": _parse_size,
    "gc_interval": lambda v, t: _parse_seconds(v, t, positive=True),
}
FILE_KEYS = tuple(_PARSERS)
"""The keys config.toml may hold (the NodeConfig field names, minus data_dir and config_file)."""

assert set(FILE_KEYS) == {f.name for f in fields(NodeConfig)} - {"data_dir", "config_file"}


def default_data_dir(environ: Mapping[str, str] | None = None, platform: str | None = None) -> Path:
    """`$XDG_DATA_HOME/e31` or `~/.local/share/e31`; `~/Library/Application Support/e31` on macOS."""
    env = os.environ if environ is None else environ
    plat = sys.platform if platform is None else platform
    home = Path(env.get("HOME") or Path.home())
    if plat == "darwin":
        return home / "Library" / "Application Support" / "e31"
    if plat.startswith("win"):
        base = env.get("LOCALAPPDATA")
        return Path(base) / "e31" if base else home / "AppData" / "Local" / "e31"
    xdg = env.get("XDG_DATA_HOME")
    # The XDG spec says a relative XDG_DATA_HOME is invalid and must be ignored.
    if xdg and Path(xdg).is_absolute():
        return Path(xdg) / "e31"
    return home / ".local" / "share" / "e31"


def resolve_data_dir(flag: str | os.PathLike[str] | None, environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    if flag is not None and str(flag) != "":
        return Path(flag).expanduser()
    if env.get("E31_DATA_DIR"):
        return Path(env["E31_DATA_DIR"]).expanduser()
    return default_data_dir(env)


def read_config_file(path: Path) -> dict[str, Any]:
    """The parsed file's raw table, or {} when the file does not exist."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, expected a TOML file") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror or e}") from None
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None


def load_config(
    data_dir: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, object] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
) -> NodeConfig:
    """Merge defaults, DATA/config.toml, the environment and `overrides` (flag values, by key).

    An override whose value is None is treated as not given. Flag values may be text (as typed on the
    command line); they pass through the same parsers as the file's values.
    """
    root = resolve_data_dir(data_dir, environ)
    path = root / CONFIG_FILE
    table = read_config_file(path)
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key not in _PARSERS:
            hint = _suggest(key)
            raise ConfigError(f"{path}: unknown key {key!r}{hint}; known keys: {', '.join(FILE_KEYS)}")
        try:
            values[key] = _PARSERS[key](value, False)
        except ValueError as e:
            raise ConfigError(f"{path}: key {key!r}: {e}") from None
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        if key not in _PARSERS:
            raise ConfigError(f"unknown configuration key {key!r}")
        try:
            values[key] = _PARSERS[key](value, True)
        except ValueError as e:
            raise ConfigError(f"--{key.replace('_', '-')}: {e}") from None
    return NodeConfig(data_dir=root, config_file=path if table or path.exists() else None, **values)


_FLAG_HELP = {
    "listen": ("HOST:PORT", f"address to listen on (default 0.0.0.0:{DEFAULT_PORT}; port 0 picks one)"),
    "bootstrap": ("[NODEID@]HOST:PORT", "a peer to contact first; NODEID@ pins its identity (repeatable)"),
    "cores": ("N", "cores to offer to jobs (default: all; 0: submit only, never run jobs)"),
    "memory": ("SIZE", "memory to offer to jobs, e.g. 4G or 4GiB (default: half of it)"),
    "network": ("NAME", f"network name; networks never mix (default {DEFAULT_NETWORK})"),
    "max_connections": ("N", "cap on peer connections in total"),
    "max_connections_per_address": ("N", "cap on peer connections per remote address"),
    "max_peers": ("N", "cap on known peers kept, in memory and on disk (default 1000)"),
    "mdns_interfaces": ("IF[,IF...]", "interfaces for mDNS (default: all)"),
    "idle_seconds": ("DURATION", "owner inactivity before jobs run, e.g. 5m (with --only-when-idle)"),
    "idle_load": ("FRACTION", "owner CPU use (0-1 of the machine) that counts as working (default 0.2)"),
    "capacity_interval": ("DURATION", "time between load samples (default 5s)"),
    "capacity_raise_after": (
        "DURATION",
        "how long a higher capacity must hold before it is offered (default 30s)",
    ),
    "disk_ceiling": ("SIZE", "most disk the blob store may use, e.g. 20G (default 10GiB)"),
    "gc_interval": ("DURATION", "time between garbage collections (default 10m)"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `e31 node run`: one per config key, plus `--data-dir`."""
    add_data_dir_argument(parser)
    for key, (metavar, text) in _FLAG_HELP.items():
        flag = "--" + key.replace("_", "-")
        action = "append" if key == "bootstrap" else "store"
        parser.add_argument(flag, dest=key, metavar=metavar, action=action, help=text)
    parser.add_argument("--log-level", choices=LOG_LEVELS, help="log detail (default info)")
    parser.add_argument(
        "--mdns",
        dest="mdns",
        action="store_const",
        const="true",
        help="find peers on the local network (default)",
    )
    parser.add_argument("--no-mdns", dest="mdns", action="store_const", const="false", help="do not use mDNS")
    parser.add_argument(
        "--dial-private",
        dest="dial_private",
        action="store_const",
        const="true",
        help="dial loopback, private and special-purpose addresses peers name (default: only public ones)",
    )
    parser.add_argument(
        "--relay",
        dest="relay",
        action="store_const",
        const="true",
        help="offer to relay between peers that cannot be dialled, within limits (default: off)",
    )
    parser.add_argument(
        "--only-when-idle",
        dest="only_when_idle",
        action="store_const",
        const="true",
        help="run jobs only while the machine's owner is away",
    )


def machine_cores() -> int:
    """The cores of this machine (all of them, as os.cpu_count counts)."""
    return os.cpu_count() or 1


def check_offer(config: NodeConfig, cores: int | None = None) -> None:
    """Refuse an offer the machine cannot keep: more cores than it has (ConfigError, exit 2)."""
    have = machine_cores() if cores is None else cores
    if config.cores > have:
        where = f"{config.config_file} or --cores" if config.config_file else "--cores"
        raise ConfigError(
            f"cores {config.cores} is more than this machine's {have} ({where}): offer at most {have}"
        )


def describe_offer(config: NodeConfig) -> list[str]:
    """What the node offers, in the lines `e31 node run` starts with (docs/operating.md)."""
    from .units import format_duration

    def size(n: int) -> str:
        return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"

    if config.cores == 0:
        cores = "no cores (submit only: this node never runs jobs)"
    else:
        cores = f"{config.cores} of {machine_cores()} cores"
    if config.only_when_idle:
        idle = (
            f"jobs run only while the owner is away (idle for {format_duration(config.idle_seconds)}, "
            f"owner CPU under {config.idle_load:.0%} of the machine)"
        )
    else:
        idle = "jobs run whenever cores are free; the offer shrinks while the owner uses the machine"
    mdns = "on" + (f" ({', '.join(config.mdns_interfaces)})" if config.mdns_interfaces else "")
    return [
        f"offering {cores}, {size(config.memory)} of memory, {size(config.disk_ceiling)} of disk for blobs",
        f"idle policy: {idle}",
        f"network {config.network}; listen {config.listen}; mDNS {mdns if config.mdns else 'off'}; "
        f"data dir {config.data_dir}",
    ]


def add_data_dir_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir",
        metavar="DIR",
        help="the node's data directory (default: $E31_DATA_DIR, else the user data dir)",
    )


def config_from_args(args: argparse.Namespace, *, environ: Mapping[str, str] | None = None) -> NodeConfig:
    """Build the configuration from parsed flags (as added by `add_arguments`)."""
    given = {key: getattr(args, key, None) for key in FILE_KEYS}
    if given["bootstrap"] is not None:
        given["bootstrap"] = list(given["bootstrap"])
    return load_config(getattr(args, "data_dir", None), given, environ=environ)


def _suggest(key: str) -> str:
    import difflib

    close = difflib.get_close_matches(key, FILE_KEYS, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _kind(value: object) -> str:
    return type(value).__name__


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
