"""Each wing of node/ says what it owns and exports its public names, lazily, with one list of them."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

NODE = Path(__file__).resolve().parent.parent / "node"
WINGS = sorted(p.name for p in NODE.iterdir() if (p / "__init__.py").exists())


def _declared(wing: str) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """`__all__`, the lazy_exports mapping, and the names the TYPE_CHECKING block imports (-> module)."""
    tree = ast.parse((NODE / wing / "__init__.py").read_text())
    all_names: list[str] = []
    mapping: dict[str, str] = {}
    typed: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            all_names = list(ast.literal_eval(node.value))
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "lazy_exports":
            mapping = ast.literal_eval(node.args[1])
        elif isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom) and imp.level == 1 and imp.module
                typed.update({a.name: imp.module for a in imp.names})
    return all_names, mapping, typed


@pytest.mark.parametrize("wing", WINGS)
def test_a_wing_exports_each_public_name_from_the_module_that_defines_it(wing: str) -> None:
    module = importlib.import_module(f"e31.node.{wing}")
    assert module.__doc__ and len(module.__doc__.split()) > 10, "the wing's docstring says what it owns"
    all_names, mapping, typed = _declared(wing)
    assert all_names == sorted(all_names) and set(all_names) == set(mapping), "one list of names"
    assert typed == mapping, "the type checker sees the names where they are loaded from"
    for name, where in mapping.items():
        value = getattr(module, name)
        defined = importlib.import_module(f"e31.node.{wing}.{where}")
        assert getattr(defined, name) is value
        assert getattr(value, "__module__", defined.__name__) == defined.__name__, f"{name} is defined there"
    with pytest.raises(AttributeError):
        module.no_such_name  # noqa: B018


def test_importing_a_wing_loads_none_of_its_modules() -> None:
    code = (
        "import sys\n"
        f"wings = {WINGS!r}\n"
        "for w in wings: __import__('e31.node.' + w)\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('e31.node.') and m.count('.') == 3)\n"
        "print(loaded)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_no_node_module_is_over_700_lines() -> None:
    long = {
        str(p.relative_to(NODE.parent)): n
        for p in sorted(NODE.rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > 700
    }
    assert long == {}
