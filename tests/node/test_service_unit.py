"""The systemd unit shipped in docs/ (docs/e31.service, shown whole in docs/operating.md): it parses,
systemd accepts it (`systemd-analyze verify`, where installed), its ExecStart is a command line the
real CLI takes, and the config.toml shown beside it loads; `e31 node run`'s first lines and its refusal
of more cores than the machine has."""

from __future__ import annotations

import configparser
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from e31.node.cli.main import build_parser
from e31.node.config import (
    ConfigError,
    NodeConfig,
    check_offer,
    config_from_args,
    describe_offer,
    machine_cores,
)

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "docs" / "e31.service"
OPERATING = (ROOT / "docs" / "operating.md").read_text()


def _unit() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=True, delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(UNIT.read_text())
    return parser


def test_the_unit_parses_and_is_the_one_the_guide_shows() -> None:
    unit = _unit()
    assert unit.sections() == ["Unit", "Service", "Install"]
    assert unit["Service"]["KillSignal"] == "SIGTERM" and unit["Service"]["User"] == "e31"
    assert unit["Install"]["WantedBy"] == "multi-user.target"
    assert f"```ini\n{UNIT.read_text()}```" in OPERATING


def test_exec_start_is_a_command_line_of_the_real_cli(tmp_path: Path) -> None:
    argv = shlex.split(_unit()["Service"]["ExecStart"])
    assert Path(argv[0]).is_absolute() and Path(argv[0]).name == "e31"
    args = build_parser(argv[1:]).parse_args(argv[1:])
    assert args.command == "node" and args.node_command == "run"
    (env,) = [v for k, v in _unit()["Service"].items() if k == "Environment"]
    name, _, value = env.partition("=")
    assert name == "E31_DATA_DIR" and Path(value).is_absolute()
    config = config_from_args(args, environ={"E31_DATA_DIR": str(tmp_path)})
    assert config.data_dir == tmp_path


def test_the_config_shown_with_the_unit_loads(tmp_path: Path) -> None:
    section = OPERATING[OPERATING.index("## Installing and running as a service") :]
    (toml,) = re.findall(r"```toml\n(.*?)```", section[: section.index("```ini")], re.S)
    (tmp_path / "config.toml").write_text(toml)
    args = build_parser(["node", "run"]).parse_args(["node", "run", "--data-dir", str(tmp_path)])
    config = config_from_args(args, environ={})
    assert config.only_when_idle and config.cores == 2 and config.config_file == tmp_path / "config.toml"
    check_offer(config, cores=2)  # a two-core machine can keep it


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_accepts_the_unit(tmp_path: Path) -> None:
    e31 = Path(sys.executable).with_name("e31")
    if not e31.exists():
        pytest.skip("no e31 script beside this Python (not an installed environment)")
    text = UNIT.read_text()
    argv0 = shlex.split(_unit()["Service"]["ExecStart"])[0]
    unit = tmp_path / "e31.service"
    unit.write_text(text.replace(argv0, str(e31)))  # the shipped path does not exist here
    done = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=120
    )
    mine = [ln for ln in done.stderr.splitlines() if str(unit) in ln]
    assert done.returncode == 0 and mine == [], done.stderr
    unit.write_text(text.replace(argv0, str(e31)).replace("Nice=19", "Nicee=19"))  # the check can fail
    bad = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=120
    )
    assert "Nicee" in bad.stderr


def test_more_cores_than_the_machine_has_are_refused(tmp_path: Path) -> None:
    have = machine_cores()
    with pytest.raises(ConfigError, match=f"cores {have + 1} is more than this machine's {have}") as e:
        check_offer(NodeConfig(data_dir=tmp_path, cores=have + 1))
    assert e.value.exit_code == 2
    check_offer(NodeConfig(data_dir=tmp_path, cores=have))
    env = {**os.environ, "E31_DATA_DIR": str(tmp_path / "d")}
    done = subprocess.run(
        [sys.executable, "-m", "e31.node", "node", "run", "--cores", str(have + 1), "--no-mdns"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"e31: error: cores {have + 1} is more than this machine's {have} (--cores): offer at most {have}"
    ]
    assert not (tmp_path / "d").exists()  # refused before anything was made


def test_the_first_lines_say_what_the_node_offers(tmp_path: Path) -> None:
    idle = NodeConfig(data_dir=tmp_path, cores=1, memory=3 << 29, only_when_idle=True, mdns=False)
    assert describe_offer(idle) == [
        f"offering 1 of {machine_cores()} cores, 1.5 GiB of memory, 10.0 GiB of disk for blobs",
        "idle policy: jobs run only while the owner is away "
        "(idle for 5m 0s, owner CPU under 20% of the machine)",
        f"network main; listen 0.0.0.0:7531; mDNS off; data dir {tmp_path}",
    ]
    assert "submit only" in describe_offer(NodeConfig(data_dir=tmp_path, cores=0))[0]
    assert "mDNS on (eth0)" in describe_offer(NodeConfig(data_dir=tmp_path, mdns_interfaces=("eth0",)))[2]
