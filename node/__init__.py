"""e31.node: the trio program that composes e31.protocol and e31.sandbox into a node.

Its wings and the rules between them are in docs/architecture.md."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from importlib.abc import Loader
    from importlib.machinery import ModuleSpec
    from types import ModuleType


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


def same_package(alias: str, real: str) -> None:
    """Make `alias` another name for the package `real`: `import alias` and `import alias.sub` give the
    very module objects of `real` and `real.sub`, each loaded once, so a class (an exception a script
    catches) is the same under both names. Called from the package's `__init__` when it runs under
    `alias` (pyproject's package-dir maps both names to one directory); the module object that `__init__`
    was filling is dropped, and the import system returns `real` in its place."""
    sys.modules[alias] = importlib.import_module(real)
    if not any(isinstance(f, _SamePackage) and f.alias == alias for f in sys.meta_path):
        sys.meta_path.insert(0, _SamePackage(alias, real))


class _SamePackage:
    """Finds `alias.sub` (before the path finders would load the file again under that name) and loads
    it as `real.sub`, imported the usual way: a meta path finder and loader (importlib.abc's protocols,
    not its classes: importlib.abc would cost every `import e31.node` milliseconds)."""

    def __init__(self, alias: str, real: str) -> None:
        self.alias, self.real = alias, real
        self._specs: dict[str, ModuleSpec | None] = {}

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None, /
    ) -> ModuleSpec | None:
        if not fullname.startswith(self.alias + "."):
            return None
        import importlib.util
        from importlib.machinery import ModuleSpec

        if importlib.util.find_spec(self.real + fullname[len(self.alias) :]) is None:
            return None  # no such module: the import fails as usual, naming the alias
        return ModuleSpec(fullname, cast("Loader", self))  # a Loader in all but the base class

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.real + spec.name[len(self.alias) :])
        self._specs[module.__name__] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The module ran when create_module imported it; the import system has since set its __spec__ to
        # the alias's: give it back its own.
        module.__spec__ = self._specs.pop(module.__name__, module.__spec__)
