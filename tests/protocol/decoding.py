"""A check the decoder tests share: the fast decoder and the reference decoder agree on wire data."""

from __future__ import annotations

from typing import Any

from e31.protocol import errors
from e31.protocol.schema import Record


def same_outcome(cls: type[Record], wire: Any) -> None:
    """`cls.from_wire` and `cls.from_wire_reference` build equal objects from `wire`, or both refuse it
    with InvalidMessage (and raise nothing else)."""
    outcomes = []
    for decode in (cls.from_wire, cls.from_wire_reference):
        try:
            outcomes.append(decode(wire))
        except errors.InvalidMessage:
            outcomes.append(errors.InvalidMessage)
    assert outcomes[0] == outcomes[1], wire
