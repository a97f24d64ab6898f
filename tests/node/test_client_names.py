"""`e31.client` (a script's name for the Python client) and `e31.node.client` (the CLI's) are one package:
the same module objects, so an error raised on the CLI's path is caught by a script's `except
e31.client.<Error>`. Each check runs in a fresh interpreter, so the order of its imports is the one shown."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_jobs_e2e import Node

CLIENT = Path(__file__).resolve().parents[2] / "node" / "client"


def python(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    n = Node(tmp_path_factory.mktemp("names") / "a")
    try:
        yield n
    finally:
        n.stop()


@pytest.mark.parametrize(
    "first", ["e31.client.errors", "e31.client", "e31.node.client.errors", "e31.node.cli"]
)
def test_both_names_give_the_same_modules_whichever_is_imported_first(first: str) -> None:
    modules = sorted(p.stem for p in CLIENT.glob("*.py") if p.stem != "__init__")
    assert "errors" in modules and "sync" in modules
    out = python(
        "import importlib, sys\n"
        f"importlib.import_module({first!r})\n"
        "import e31.client, e31.node.client\n"
        "assert e31.client is e31.node.client, 'the package'\n"
        f"for name in {modules!r}:\n"
        "    public = importlib.import_module('e31.client.' + name)\n"
        "    private = importlib.import_module('e31.node.client.' + name)\n"
        "    assert public is private, name\n"
        "    assert sys.modules['e31.client.' + name] is private, name\n"
        "    assert private.__spec__.name == private.__name__ == 'e31.node.client.' + name, name\n"
        "from e31.client import NotFound, ClientError\n"
        "from e31.client.errors import NotFound as NotFound2\n"
        "from e31.node.client.errors import NotFound as NotFound3\n"
        "assert NotFound is NotFound2 is NotFound3 and issubclass(NotFound, ClientError)\n"
        "print('loaded once:', sorted({id(m) for n, m in sys.modules.items() if n.endswith('client.errors')"
        " and 'api' not in n}).__len__())\n"
    )
    assert out.strip() == "loaded once: 1"


def test_importing_the_public_name_stays_cheap_and_unknown_modules_fail_as_usual() -> None:
    out = python(
        "import sys\n"
        "import e31.client\n"
        "from e31.client import Client\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('e31.node.client.'))\n"
        "print('trio' in sys.modules, loaded)\n"
        "try:\n"
        "    import e31.client.no_such_module\n"
        "except ModuleNotFoundError as e:\n"
        "    print(e.name)\n"
    )
    first, missing = out.strip().splitlines()
    assert first.startswith("False [")  # the blocking client never loads trio
    assert "e31.node.client.async_client" not in first
    assert missing == "e31.client.no_such_module"


def test_an_error_raised_on_the_cli_path_is_caught_by_the_scripts_name(node: Node) -> None:
    out = python(
        "import e31.client\n"
        "from e31.node.api.client import ApiClient\n"
        "from e31.node.cli.common import expand_ids\n"  # the CLI's way to the client's operations
        "try:\n"
        f"    expand_ids(ApiClient({str(node.data_dir)!r}), ['xyz'])\n"
        "except e31.client.BadId as e:\n"
        "    print('caught', type(e).__module__, e)\n"
    )
    assert out.startswith("caught e31.node.client.errors ") and "not a job id" in out
