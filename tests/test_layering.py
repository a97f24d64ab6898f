"""The import rules between the layers (docs/architecture.md), enforced by walking the source."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

FORBIDDEN = {
    "protocol": {
        "trio",
        "socket",
        "zeroconf",
        "time",
        "random",
        "wasmtime",
        "asyncio",
        "threading",
        "os",
        "e31.sandbox",
        "e31.node",
        "sqlite3",
        "secrets",
    },
    "sandbox": {"trio", "e31.node", "e31.protocol", "zeroconf", "asyncio"},
}


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def _violations(package: str) -> list[str]:
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for lineno, name in _imports(path):
            for banned in FORBIDDEN[package]:
                if name == banned or name.startswith(banned + "."):
                    bad.append(f"{path.relative_to(ROOT)}:{lineno} imports {name}")
    return bad


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_layer_imports(package: str) -> None:
    assert _violations(package) == []


def test_only_sandbox_imports_wasmtime() -> None:
    offenders = [
        f"{p.relative_to(ROOT)}:{ln}"
        for pkg in ("protocol", "node")
        for p in sorted((ROOT / pkg).rglob("*.py"))
        for ln, name in _imports(p)
        if name == "wasmtime" or name.startswith("wasmtime.")
    ]
    assert offenders == []


def test_the_checker_catches_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "x.py"
    bad.write_text("import trio\nfrom time import monotonic\nfrom e31.node import cli\n")
    assert [n for _, n in _imports(bad)] == ["trio", "time", "e31.node"]
