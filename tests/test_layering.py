"""The import rules between the layers (docs/architecture.md), enforced by walking the source."""

from __future__ import annotations

import ast
import re
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


# --- node/'s wings -----------------------------------------------------------------------------------
# A wing may import the wings ranked below it and the foundation modules, never one ranked the same or
# above (docs/architecture.md, "node/'s wings"). The foundation (node/'s own small top-level modules)
# imports only itself; `daemon` composes the wings below the CLI; `__main__` is the entry point.
WING_RANK = {
    "host": 1,
    "store": 2,
    "net": 3,
    "market": 4,
    "audit": 4,
    "api": 5,
    "client": 6,  # the Python client (e31.client): above the API it calls, below the CLI that uses it
    "daemon": 6,
    "cli": 7,
    "demo": 8,
    "__main__": 9,
}
FOUNDATION = {"config", "errors", "identity", "lifecycle", "logs", "metrics", "nursery", "units", "__init__"}
NODE = ROOT / "node"


def _node_unit(parts: tuple[str, ...]) -> str:
    """The wing (or top-level module) that a module path under e31.node belongs to."""
    return parts[0] if parts else "__init__"


def _is_module(parts: tuple[str, ...]) -> bool:
    path = NODE.joinpath(*parts)
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _node_imports(path: Path) -> list[tuple[int, tuple[str, ...]]]:
    """Every import of an e31.node module from `path`, as the path of names under e31.node."""
    here = path.relative_to(NODE).with_suffix("").parts
    package = here[:-1]
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[int, tuple[str, ...]]] = []
    for node in ast.walk(tree):
        names: list[tuple[str, ...]] = []
        if isinstance(node, ast.Import):
            names = [tuple(a.name.split("."))[2:] for a in node.names if a.name.startswith("e31.node")]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                target = base + tuple(node.module.split(".") if node.module else ())
            elif node.module and (node.module == "e31.node" or node.module.startswith("e31.node.")):
                target = tuple(node.module.split("."))[2:]
            else:
                continue
            # `from PACKAGE import NAME` imports a module when NAME is one, else a name of PACKAGE
            names = [(*target, a.name) if _is_module((*target, a.name)) else target for a in node.names]
        found += [(node.lineno, n) for n in names]
    return found


def _wing_violations() -> list[str]:
    bad = []
    for path in sorted(NODE.rglob("*.py")):
        unit = _node_unit(path.relative_to(NODE).with_suffix("").parts)
        for lineno, target in _node_imports(path):
            dest = _node_unit(target)
            if dest == unit:
                continue
            where = f"{path.relative_to(ROOT)}:{lineno} imports e31.node.{'.'.join(target)}"
            if unit in FOUNDATION:
                if dest not in FOUNDATION:
                    bad.append(f"{where}: a foundation module imports only the foundation")
            elif dest in FOUNDATION:
                continue
            elif dest not in WING_RANK:
                bad.append(f"{where}: {dest} is neither a wing nor a foundation module")
            elif WING_RANK[dest] >= WING_RANK[unit]:
                bad.append(f"{where}: {unit} may not import {dest} (imports run down the wings)")
    return bad


def test_node_wings_import_one_way() -> None:
    assert _wing_violations() == []


def test_node_top_level_is_small() -> None:
    top = sorted(p.name for p in NODE.glob("*.py"))
    assert len(top) <= 12, top
    units = {p.stem for p in NODE.glob("*.py")} | {
        p.name for p in NODE.iterdir() if p.is_dir() and (p / "__init__.py").exists()
    }
    assert units <= set(WING_RANK) | FOUNDATION, units - set(WING_RANK) - FOUNDATION


# --- SQL stays in node/store/ -----------------------------------------------------------------------
# The store wing is the only place with SQL (docs/architecture.md): no other module of node/ holds an
# SQL statement, imports sqlite3, runs one (`.execute(SQL)`, `.executemany`, `.executescript`) or opens
# the store's connection (`store.reading()`, `store.transaction()`); it calls a store method instead.
SQL_STATEMENT = re.compile(
    r"\b(SELECT|INSERT|UPDATE|DELETE|CREATE|DROP|ALTER|REPLACE)\b[\s\S]*?\b(FROM|INTO|SET|TABLE|INDEX)\b"
    r"|\bPRAGMA\s+\w+"
)
RUNS_SQL = {"execute", "executemany", "executescript"}
OPENS_THE_CONNECTION = {"reading", "transaction"}


def _text(node: ast.expr) -> str | None:
    """The text of a string literal, an f-string's (each placeholder as {}) or a sum of them; else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    if isinstance(node, ast.BinOp):
        left, right = _text(node.left), _text(node.right)
        return None if left is None and right is None else (left or "{}") + (right or "{}")
    return None


def _sql_use(node: ast.AST) -> str | None:
    """What SQL `node` holds or runs, if any."""
    if isinstance(node, ast.expr) and (text := _text(node)) is not None:
        return "an SQL statement" if SQL_STATEMENT.search(text) else None
    if isinstance(node, ast.Import | ast.ImportFrom):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
        return "imports sqlite3" if "sqlite3" in names and not getattr(node, "level", 0) else None
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return None
    name = node.func.attr
    # `.execute` of a string only: other things execute too (market/scheduler.py)
    if name in RUNS_SQL and (name != "execute" or (node.args and _text(node.args[0]) is not None)):
        return f"runs SQL (.{name})"
    return f"opens the store's connection (.{name}())" if name in OPENS_THE_CONNECTION else None


def _sql_outside_store(root: Path) -> list[str]:
    """Every place in the package at `root` (a node/ tree), outside its store/, that holds or runs SQL."""
    bad = set()
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).parts[0] == "store":
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if (use := _sql_use(node)) is not None:
                bad.add(f"{path.relative_to(root.parent)}:{getattr(node, 'lineno', 0)}: {use}")
    return sorted(bad)


def test_no_sql_outside_the_store() -> None:
    assert _sql_outside_store(NODE) == []


def test_the_sql_checker_catches_a_violation(tmp_path: Path) -> None:
    node = tmp_path / "node"
    (node / "api").mkdir(parents=True)
    (node / "store").mkdir()
    (node / "store" / "ok.py").write_text('import sqlite3\nQ = "SELECT job_id FROM jobs"\n')
    (node / "api" / "bad.py").write_text(
        "import sqlite3\n"
        "def f(store, c, rows, cols, scheduler, work):\n"
        "    with store.reading() as c:\n"
        '        c.execute(f"SELECT {cols} FROM jobs")\n'
        '    c.executemany("INSERT INTO blob_refs VALUES (?)", rows)\n'
        '    sql = "DELETE FROM jobs "\n'
        "    with store.store.transaction(durable=False):\n"
        "        pass\n"
        '    scheduler.execute(work, "not SQL")\n'
        '    return "Delete the job: select it from the list"\n'
    )
    assert _sql_outside_store(node) == [
        "node/api/bad.py:1: imports sqlite3",
        "node/api/bad.py:3: opens the store's connection (.reading())",
        "node/api/bad.py:4: an SQL statement",
        "node/api/bad.py:4: runs SQL (.execute)",
        "node/api/bad.py:5: an SQL statement",
        "node/api/bad.py:5: runs SQL (.executemany)",
        "node/api/bad.py:6: an SQL statement",
        "node/api/bad.py:7: opens the store's connection (.transaction())",
    ]
