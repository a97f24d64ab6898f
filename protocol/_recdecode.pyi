"""Compiled record decoders (protocol/_recdecode.c), driven by schema.py."""

from collections.abc import Callable
from typing import Any, final

DISABLED: bool
"""True when E31_PURE_PYTHON was set (non-empty) at import: schema.py then keeps to Python."""

@final
class Decoder:
    """A compiled decoder of the wire tuples of one record class (see schema._native_spec)."""

    def __init__(
        self,
        cls: type,
        fields: tuple[tuple[str, tuple[Any, ...]], ...],
        validate: Callable[[Any], object] | None,
        error: type[BaseException],
    ) -> None: ...
    def __call__(self, wire: object, /) -> Any: ...
    @property
    def cls(self) -> type | None: ...
