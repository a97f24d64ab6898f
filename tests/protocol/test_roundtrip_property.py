"""Every valid value of every message kind survives encode -> decode, by both decoders, and JSON.

Values are drawn from the codecs themselves, so a new field or kind is covered without new code here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from e31.protocol import receipts, schema
from e31.protocol.codec import pack, unpack_canonical
from e31.protocol.errors import InvalidMessage
from e31.protocol.ids import Digest, NodeId
from e31.protocol.jobs import FILE_NAME, JobManifest
from e31.protocol.messages import ADDRESS, BY_JOB, REGISTRY, BidItem, Offer, UsageReceipt
from e31.protocol.receipts import Outcome
from e31.protocol.relay import OBSERVED
from e31.protocol.schema import NETWORK, Record
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

_NAME_PART = st.from_regex(r"[a-zA-Z0-9_.ü-]{1,12}", fullmatch=True).filter(lambda p: p not in (".", ".."))
_SPECIAL: dict[int, st.SearchStrategy[Any]] = {
    id(NETWORK): st.from_regex(r"[a-z0-9._-]{1,32}", fullmatch=True),
    id(FILE_NAME): st.lists(_NAME_PART, min_size=1, max_size=3).map("/".join),
    id(ADDRESS): st.one_of(
        st.tuples(
            st.from_regex(r"[a-z0-9-]{1,20}(\.[a-z0-9-]{1,10}){0,2}", fullmatch=True), st.integers(1, 65535)
        ).map(lambda hp: f"{hp[0]}:{hp[1]}"),
        st.integers(1, 65535).map(lambda p: f"[2001:db8::1]:{p}"),
    ),
    id(OBSERVED): st.one_of(
        st.tuples(st.ip_addresses(v=4), st.integers(1, 65535)).map(lambda hp: f"{hp[0]}:{hp[1]}"),
        st.tuples(st.ip_addresses(v=6), st.integers(1, 65535)).map(lambda hp: f"[{hp[0]}]:{hp[1]}"),
    ),
}


def values(codec: schema.Codec[Any]) -> st.SearchStrategy[Any]:
    if id(codec) in _SPECIAL:
        return _SPECIAL[id(codec)]
    if isinstance(codec, schema.UInt):
        return st.integers(codec.min, codec.max)
    if isinstance(codec, schema.Bool):
        return st.booleans()
    if isinstance(codec, schema.Text):
        return st.text(
            st.characters(exclude_categories=("Cs",), exclude_characters="\x00"),
            min_size=codec.min,
            max_size=min(codec.max // 4, 20),
        )
    if isinstance(codec, schema.OneOf):
        return st.sampled_from(codec.order)
    if isinstance(codec, schema.Bin):
        return st.binary(min_size=codec.min, max_size=min(codec.max, max(codec.min, 48)))
    if isinstance(codec, schema.Key):
        return st.binary(min_size=32, max_size=32).map(NodeId)
    if isinstance(codec, schema.Hash):
        return st.binary(min_size=32, max_size=32).map(Digest)
    if isinstance(codec, (schema.Opt, receipts.Added)):  # Added: None is a field absent from the array
        return st.none() | values(codec.inner)
    if isinstance(codec, schema.Seq):
        items = st.lists(values(codec.inner), min_size=codec.min, max_size=min(codec.max, 3))
        if codec.order_key is None:
            return items.map(tuple)
        key = codec.order_key
        return items.map(lambda xs: tuple(sorted({key(x): x for x in xs}.values(), key=key))).filter(
            lambda xs: len(xs) >= codec.min
        )
    if isinstance(codec, schema.Sub):
        return records(codec.cls)
    raise AssertionError(f"no strategy for {codec!r}")


def _repair(cls: type[Record], fields: dict[str, Any]) -> None:
    """Bend a draw towards the rules between fields, so few draws are thrown away."""
    if cls is Outcome:
        fields["exit_code"] = (fields["exit_code"] or 0) if fields["status"] == "exited" else None
        fields["trap"] = (fields["trap"] or "unreachable") if fields["status"] == "trap" else None
    elif cls is UsageReceipt:
        times = sorted((fields["queued_at"], fields["started_at"], fields["finished_at"]))
        fields["queued_at"], fields["started_at"], fields["finished_at"] = times
        fields["fuel_used"] = min(fields["fuel_used"], fields["limits"].fuel)
        fields["peak_memory"] = min(fields["peak_memory"], fields["limits"].memory_bytes)
        if fields["meter"] is not None:
            paused = min(fields["meter"].paused_ms, fields["finished_at"] - fields["started_at"])
            fields["meter"] = dataclasses.replace(fields["meter"], paused_ms=paused)
    elif cls is JobManifest and fields["deadline"] <= fields["created_at"]:
        fields["created_at"], fields["deadline"] = fields["deadline"], fields["created_at"]
    elif cls is BidItem and fields["expected_finish"] < fields["expected_start"]:
        times = sorted((fields["expected_start"], fields["expected_finish"]))
        fields["expected_start"], fields["expected_finish"] = times
    elif cls is Offer:  # every job is the issuer's: re-own them (new ids, so sort again)
        owned = [dataclasses.replace(m, submitter=fields["submitter"]) for m in fields["manifests"]]
        fields["manifests"] = tuple(sorted({m.job_id: m for m in owned}.values(), key=BY_JOB))


def records(cls: type[Record]) -> st.SearchStrategy[Any]:
    names = [name for name, _ in cls._FIELDS]
    fields = [values(codec) for _, codec in cls._FIELDS]

    def build(args: tuple[Any, ...]) -> Any:
        drawn = dict(zip(names, args, strict=True))
        _repair(cls, drawn)
        try:
            return cls(**drawn)
        except InvalidMessage:
            return None  # a rule between fields the draw still breaks (equal deadline, nested inputs)

    return st.tuples(*fields).map(build).filter(lambda r: r is not None)


@pytest.mark.parametrize("kind", sorted(REGISTRY))
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)
@given(data=st.data())
def test_any_valid_message_round_trips(kind: str, data: st.DataObject) -> None:
    cls = REGISTRY[kind]
    message = data.draw(records(cls))
    assume(message is not None)
    body = pack(message.to_wire())
    wire = unpack_canonical(body)
    assert cls.from_wire(wire) == message
    assert cls.from_wire_reference(wire) == message
    assert cls.from_json(message.to_json()) == message
    assert dataclasses.replace(message) == message


@pytest.mark.parametrize("kind", sorted(REGISTRY))
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)
@given(data=st.data())
def test_the_generated_encoder_writes_what_the_reference_does(kind: str, data: st.DataObject) -> None:
    """Record.to_wire (an encoder generated per class) against to_wire_reference (each codec's `enc`),
    the message and every record nested in it: the same array, so the same bytes and ids."""
    message = data.draw(records(REGISTRY[kind]))
    assume(message is not None)
    wire = Record.to_wire(message)  # (a receipt's own to_wire then drops an absent version-2 field)
    assert wire == message.to_wire_reference() and type(wire) is tuple
    assert pack(wire) == pack(message.to_wire_reference())
