"""Static checks as tests: ruff (lint and format) over the tree, mypy --strict over every package.

mypy cannot follow setuptools' editable-install hook, so the check lays the three packages out under an
`e31/` namespace of symlinks in a temporary directory and type-checks them there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _tool(name: str) -> str:
    exe = Path(sys.executable).with_name(name)
    found = str(exe) if exe.exists() else shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed (it comes with the test extra)")
    return found


def test_ruff_clean() -> None:
    proc = subprocess.run([_tool("ruff"), "check", "--no-cache", str(ROOT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_format_clean() -> None:
    proc = subprocess.run(
        [_tool("ruff"), "format", "--check", "--no-cache", str(ROOT)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_strict_on_every_package(tmp_path: Path) -> None:
    ns = tmp_path / "e31"
    ns.mkdir()
    for pkg in ("protocol", "sandbox", "node"):
        os.symlink(ROOT / pkg, ns / pkg)
    os.symlink(ROOT / "node" / "client", ns / "client")  # e31.client (pyproject's package-dir)
    proc = subprocess.run(
        [
            _tool("mypy"),
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(tmp_path / "cache"),
            "-p",
            "e31.protocol",
            "-p",
            "e31.sandbox",
            "-p",
            "e31.node",
            "-p",
            "e31.client",
            "--exclude",
            "e31/node/client/",  # checked once, as e31.client
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
