"""e31.node: the trio program that composes e31.protocol and e31.sandbox into a node.

Its wings and the rules between them are in docs/architecture.md."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("e31-node")
    except PackageNotFoundError:
        return "unknown"


def lazy_exports(
    package: str, names: Mapping[str, str]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for a wing's `__init__`: each public name (a key of `names`, whose value
    is the wing's module that defines it) is imported on first use, so importing one module of a wing
    (the CLI does, for each command) loads none of the others."""

    def __getattr__(name: str) -> object:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(names)

    return __getattr__, __dir__
