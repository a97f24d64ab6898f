"""Configuration: defaults, the file, the environment and flags, and every kind of bad value."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from e31.node.config import (
    CONFIG_FILE,
    FILE_KEYS,
    Address,
    BootstrapPeer,
    ConfigError,
    add_arguments,
    config_from_args,
    default_data_dir,
    load_config,
    parse_address,
    resolve_data_dir,
)

NODE_ID = "e31n" + "a" * 52


def write(data_dir: Path, text: str) -> Path:
    path = data_dir / CONFIG_FILE
    path.write_text(text)
    return path


def parse_flags(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_defaults_without_a_file(tmp_path: Path) -> None:
    cfg = load_config(tmp_path, environ={})
    assert cfg.data_dir == tmp_path
    assert cfg.config_file is None
    assert cfg.network == "main"
    assert cfg.listen == Address("0.0.0.0", 7531)
    assert cfg.bootstrap == ()
    assert cfg.cores >= 1 and cfg.memory > 0
    assert cfg.mdns is True and cfg.only_when_idle is False


def test_file_values_are_parsed(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        f"""
listen = "127.0.0.1:0"
bootstrap = ["10.0.0.1:7531", "{NODE_ID}@[::1]:9000"]
cores = 3
memory = "4GiB"
network = "test-net-2"
log_level = "DEBUG"
max_connections = 10
max_connections_per_address = 2
mdns = false
mdns_interfaces = ["eth0", "wlan0"]
only_when_idle = true
idle_seconds = 60
disk_ceiling = "512MB"
""",
    )
    cfg = load_config(tmp_path, environ={})
    assert cfg.config_file == path
    assert cfg.listen == Address("127.0.0.1", 0)
    assert cfg.bootstrap == (
        BootstrapPeer(Address("10.0.0.1", 7531)),
        BootstrapPeer(Address("::1", 9000), NODE_ID),
    )
    assert str(cfg.bootstrap[1]) == f"{NODE_ID}@[::1]:9000"
    assert (cfg.cores, cfg.memory, cfg.network, cfg.log_level) == (3, 4 << 30, "test-net-2", "debug")
    assert (cfg.max_connections, cfg.max_connections_per_address) == (10, 2)
    assert (cfg.mdns, cfg.mdns_interfaces) == (False, ("eth0", "wlan0"))
    assert (cfg.only_when_idle, cfg.idle_seconds, cfg.disk_ceiling) == (True, 60.0, 512_000_000)


def test_flags_override_the_file(tmp_path: Path) -> None:
    write(tmp_path, 'cores = 3\nnetwork = "filenet"\nmdns = true\nbootstrap = ["10.0.0.1:1"]\n')
    args = parse_flags(
        "--data-dir",
        str(tmp_path),
        "--cores",
        "5",
        "--no-mdns",
        "--bootstrap",
        "127.0.0.1:2",
        "--bootstrap",
        "127.0.0.1:3",
        "--memory",
        "512MiB",
    )
    cfg = config_from_args(args, environ={})
    assert cfg.cores == 5
    assert cfg.network == "filenet"
    assert cfg.mdns is False
    assert [str(b) for b in cfg.bootstrap] == ["127.0.0.1:2", "127.0.0.1:3"]
    assert cfg.memory == 512 << 20


def test_cores_0_makes_a_submit_only_node_in_the_file_or_by_flag(tmp_path: Path) -> None:
    write(tmp_path, "cores = 0\n")
    assert load_config(tmp_path, environ={}).cores == 0
    write(tmp_path, "cores = 2\n")
    assert config_from_args(parse_flags("--data-dir", str(tmp_path), "--cores", "0"), environ={}).cores == 0


def test_data_dir_from_flag_env_or_platform(tmp_path: Path) -> None:
    env = {"E31_DATA_DIR": str(tmp_path / "env"), "HOME": "/home/u"}
    assert resolve_data_dir(str(tmp_path / "flag"), env) == tmp_path / "flag"
    assert resolve_data_dir(None, env) == tmp_path / "env"
    assert default_data_dir({"HOME": "/home/u"}, "linux") == Path("/home/u/.local/share/e31")
    assert default_data_dir({"HOME": "/home/u", "XDG_DATA_HOME": "/xdg"}, "linux") == Path("/xdg/e31")
    assert default_data_dir({"HOME": "/home/u", "XDG_DATA_HOME": "rel"}, "linux") == Path(
        "/home/u/.local/share/e31"
    )
    mac = Path("/Users/u/Library/Application Support/e31")
    assert default_data_dir({"HOME": "/Users/u"}, "darwin") == mac


def test_config_file_is_read_from_the_env_data_dir(tmp_path: Path) -> None:
    write(tmp_path, "cores = 7\n")
    assert load_config(None, environ={"E31_DATA_DIR": str(tmp_path)}).cores == 7


@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        ("0", 0),
        ("1234", 1234),
        ('"1234"', 1234),
        ('"4GiB"', 4 << 30),
        ('"4G"', 4 << 30),
        ('"64M"', 64 << 20),
        ('"64Mi"', 64 << 20),
        ('"512MB"', 512_000_000),
        ('"1.5 KiB"', 1536),
        ('"1.5G"', 3 << 29),
        ('"2g"', 2 << 30),
        ('"3TiB"', 3 << 40),
        ('"10b"', 10),
        ('"1_000_000"', 1_000_000),
    ],
)
def test_sizes_in_the_file_are_integers_or_texts_with_a_unit(
    tmp_path: Path, toml: str, expected: int
) -> None:
    """K, M, G, T are powers of 1024 here as on every command line; KB, MB, GB, TB powers of 1000."""
    write(tmp_path, f"memory = {toml}\ndisk_ceiling = {toml}\n")
    cfg = load_config(tmp_path, environ={})
    assert (cfg.memory, cfg.disk_ceiling) == (expected, expected)


@pytest.mark.parametrize(
    "toml",
    ['""', '"GiB"', '"4 parsecs"', '"-1"', "-5", "true", "1.5", '"1e9"', '"4GiB extra"', '"0.1K"', "[1]"],
)
def test_bad_sizes_in_the_file(tmp_path: Path, toml: str) -> None:
    write(tmp_path, f"memory = {toml}\n")
    with pytest.raises(ConfigError, match="'memory': expected a size"):
        load_config(tmp_path, environ={})


@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        ("45", 45.0),
        ("2.5", 2.5),
        ('"45"', 45.0),
        ('"500ms"', 0.5),
        ('"90s"', 90.0),
        ('"10m"', 600.0),
        ('"1h30m"', 5400.0),
        ('"1d"', 86400.0),
    ],
)
def test_durations_in_the_file_are_seconds_or_texts_with_units(
    tmp_path: Path, toml: str, expected: float
) -> None:
    keys = ("idle_seconds", "capacity_interval", "capacity_raise_after", "gc_interval")
    write(tmp_path, "".join(f"{key} = {toml}\n" for key in keys))
    cfg = load_config(tmp_path, environ={})
    assert [getattr(cfg, key) for key in keys] == [expected] * 4


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('idle_seconds = "soon"', "'idle_seconds': expected a number of seconds or a duration, got 'soon'"),
        (
            'idle_seconds = "-5m"',
            "'idle_seconds': expected a number of seconds or a duration, got '-5m' (negative)",
        ),
        ('gc_interval = "30m1h"', "'gc_interval': expected a number of seconds or a duration"),
        ('gc_interval = "0s"', "'gc_interval': expected a number of seconds above 0"),
        ("capacity_interval = 0", "'capacity_interval': expected a number of seconds above 0"),
        ("capacity_raise_after = true", "'capacity_raise_after': expected a number"),
    ],
)
def test_bad_durations_in_the_file(tmp_path: Path, text: str, fragment: str) -> None:
    write(tmp_path, text + "\n")
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path, environ={})
    assert fragment in str(err.value)


def test_flags_take_the_same_units_as_the_file(tmp_path: Path) -> None:
    args = parse_flags(
        "--data-dir", str(tmp_path), "--memory", "2G", "--disk-ceiling", "20GB", "--gc-interval", "10m"
    )
    cfg = config_from_args(args, environ={})
    assert (cfg.memory, cfg.disk_ceiling, cfg.gc_interval) == (2 << 30, 20_000_000_000, 600.0)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.0.0.0:0", Address("0.0.0.0", 0)),
        ("localhost:80", Address("localhost", 80)),
        ("[::1]:65535", Address("::1", 65535)),
        ("[fe80::1%eth0]:1", Address("fe80::1%eth0", 1)),
    ],
)
def test_addresses(text: str, expected: Address) -> None:
    assert parse_address(text) == expected
    assert str(expected) == text


@pytest.mark.parametrize(
    "bad",
    ["host", ":80", "host:", "host:65536", "host:-1", "::1:80", "[::1]80", "[]:80", "a b:80", "host:8o", 80],
)
def test_bad_addresses(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_address(bad)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("cores = -1", "'cores': must be at least 0"),
        ('cores = "4"', "'cores': expected a whole number"),
        ("cores = true", "'cores': expected a whole number"),
        ('network = "Main"', "'network': a network name"),
        ('network = "-x"', "'network'"),
        ('network = "' + "a" * 33 + '"', "'network'"),
        ('listen = "nowhere"', "'listen': expected HOST:PORT"),
        ('bootstrap = "10.0.0.1:1"', "'bootstrap': expected a list"),
        ('bootstrap = ["10.0.0.1:0"]', "'bootstrap': the port must be from 1"),
        ('bootstrap = ["nodeid@10.0.0.1:5"]', "'bootstrap': a node id starts with 'e31n'"),
        ('memory = "lots"', "'memory': expected a size"),
        ('log_level = "chatty"', "'log_level': expected one of"),
        ('mdns = "yes"', "'mdns': expected true or false"),
        ('mdns_interfaces = ["eth 0"]', "'mdns_interfaces': not an interface name"),
        ("idle_seconds = -1", "'idle_seconds': must be a finite number"),
        ("idle_seconds = inf", "'idle_seconds': must be a finite number"),
        ("disk_ceiling = 1.5", "'disk_ceiling': expected a size"),
        ("cores = 2\ncoers = 3", "unknown key 'coers' (did you mean 'cores'?)"),
        ("[mdns]\non = true", "'mdns': expected true or false"),
        ("[limits]\ncores = 2", "unknown key 'limits'"),
        ("cores = ", "not valid TOML"),
    ],
)
def test_bad_file_values_name_the_key_and_file(tmp_path: Path, text: str, fragment: str) -> None:
    write(tmp_path, text + "\n")
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path, environ={})
    assert fragment in str(err.value)
    assert str(tmp_path / CONFIG_FILE) in str(err.value)


def test_unknown_key_lists_the_known_ones(tmp_path: Path) -> None:
    write(tmp_path, "colour = 1\n")
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path, environ={})
    assert all(key in str(err.value) for key in FILE_KEYS)


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--cores", "many"], "--cores: expected a whole number"),
        (["--memory", "4 parsecs"], "--memory: expected a size"),
        (["--network", "UPPER"], "--network: a network name"),
        (["--listen", "1.2.3.4"], "--listen: expected HOST:PORT"),
        (["--bootstrap", "e31nshort@1.2.3.4:5"], "--bootstrap: a node id is 56 characters"),
        (["--idle-seconds", "soon"], "--idle-seconds: expected a number"),
        (["--memory=-1G"], "--memory: expected a size, got '-1G' (negative)"),
        (["--gc-interval", "0"], "--gc-interval: expected a number of seconds above 0"),
    ],
)
def test_bad_flags_name_the_flag(tmp_path: Path, argv: list[str], fragment: str) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_args(parse_flags("--data-dir", str(tmp_path), *argv), environ={})
    assert fragment in str(err.value)


def test_unreadable_and_non_text_files(tmp_path: Path) -> None:
    (tmp_path / CONFIG_FILE).write_bytes(b"\xff\xfe cores = 1")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(tmp_path, environ={})
    (tmp_path / CONFIG_FILE).unlink()
    (tmp_path / CONFIG_FILE).mkdir()
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path, environ={})


def test_config_is_frozen(tmp_path: Path) -> None:
    cfg = load_config(tmp_path, environ={})
    with pytest.raises(AttributeError):
        cfg.cores = 9  # type: ignore[misc]
