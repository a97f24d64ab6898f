"""The CLI shell: help, version, unknown commands, and start-up that imports only what it needs."""

from __future__ import annotations

import json
import subprocess
import sys

from e31.node.cli import main as cli


def _e31(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "e31.node", *args], capture_output=True, text=True)


def test_help_lists_every_command() -> None:
    proc = _e31("--help")
    assert proc.returncode == 0
    for name in cli.COMMANDS:
        assert name in proc.stdout


def test_version() -> None:
    proc = _e31("--version")
    assert proc.returncode == 0
    assert proc.stdout.startswith("e31 ")


def test_no_command_prints_usage_and_exits_2() -> None:
    proc = _e31()
    assert proc.returncode == 2
    assert "usage: e31" in proc.stderr


def test_unknown_command_is_a_usage_error() -> None:
    proc = _e31("frobnicate")
    assert proc.returncode == 2
    assert "invalid choice" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_help_imports_no_heavy_module() -> None:
    code = (
        "import sys, json\n"
        "from e31.node.cli import main as cli\n"
        "try:\n    cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(json.dumps(sorted(m for m in ('trio', 'wasmtime', 'zeroconf', 'nacl', 'msgpack', 'sqlite3')"
        " if m in sys.modules)))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []


def test_command_modules_have_the_interface() -> None:
    import importlib

    for name, (module_name, help_text) in cli.COMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError:  # pragma: no cover - a registered command must exist
            raise AssertionError(f"command {name} names missing module {module_name}") from None
        assert callable(module.add_arguments) and callable(module.run), name
        assert help_text
