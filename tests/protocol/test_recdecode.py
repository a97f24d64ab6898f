"""The compiled record decoder (protocol/_recdecode.c) decides exactly as the Python decoders do.

For every registered message kind, on the golden vectors, on Hypothesis-drawn valid messages and on
mutations of them (wrong types, subclasses, huge and negative ints, bools for ints, surrogates, deep
nesting, items removed, added, repeated or swapped), the C decoder and the generated Python decoder
return equal objects of the same types all the way down, or both refuse with the same error (the
reference decoder's). Decoding many messages, valid or not, leaks no memory and no reference.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import subprocess
import sys
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest
import vector_files as vectors
from e31.protocol import errors, receipts, schema
from e31.protocol.codec import pack, unpack, unpack_canonical
from e31.protocol.ids import Digest, NodeId
from e31.protocol.jobs import EnvVar, FileRef, JobManifest
from e31.protocol.messages import REGISTRY, Bid, Cancel, Capacity, Contact, Decline, Offer, Ping
from e31.protocol.receipts import Outcome, UsageReceipt
from e31.protocol.schema import Record
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_roundtrip_property import records

try:
    from e31.protocol import _recdecode
except ImportError:
    _recdecode = None  # type: ignore[assignment]

pytestmark = pytest.mark.skipif(
    _recdecode is None,
    reason="the optional C extension e31.protocol._recdecode was not built (no C compiler at install?)",
)

KINDS = sorted(REGISTRY)
SAMPLES = {name: msg for name, _key, msg in vectors.generator().samples()}


@functools.cache
def _native(cls: type[Record]) -> Callable[[object], Any]:
    return schema._native_from_wire(cls)


@functools.cache
def _python(cls: type[Record]) -> Callable[[object], Any]:
    return schema._generated_from_wire(cls)


def _canon(value: Any) -> Any:
    """The value with every object's exact type spelled out, all the way down."""
    if isinstance(value, (Record, NodeId, Digest)):
        return type(value), tuple(_canon(getattr(value, name)) for name in type(value).__slots__)
    if type(value) is tuple:
        return tuple, tuple(_canon(v) for v in value)
    return type(value), value


def _outcome(decode: Callable[[object], Any], wire: object) -> Any:
    try:
        return "ok", _canon(decode(wire))
    except errors.InvalidMessage as e:
        return "refused", type(e), str(e)


def assert_same(cls: type[Record], wire: object) -> Any:
    """Both decoders agree on `wire`, and agree with the reference; return the outcome."""
    if cls is UsageReceipt:  # its compiled decoders read the version 2 shape (a version 1 one, padded)
        wire = receipts._receipt_v2_shape(wire)
    native = _outcome(_native(cls), wire)
    assert native == _outcome(_python(cls), wire), wire
    assert native == _outcome(cls.from_wire_reference, wire), wire
    return native


def _wire(msg: Record) -> Any:
    return unpack_canonical(pack(msg.to_wire()))


def test_the_compiled_decoder_is_what_from_wire_runs() -> None:
    assert schema.native_decoding() == (not _recdecode.DISABLED)
    from_wire = schema._compiled(Offer)
    native = from_wire.__code__ is _native(Offer).__code__
    assert native == schema.native_decoding()
    if native:
        assert type(schema._DECODERS[Offer]) is _recdecode.Decoder
        assert schema._DECODERS[Offer].cls is Offer


def test_pure_python_is_chosen_by_the_environment() -> None:
    code = (
        "from e31.protocol import schema, _recdecode; from e31.protocol.messages import Ping;"
        "print(_recdecode.DISABLED, schema.native_decoding(),"
        " schema._compiled(Ping).__code__ is schema._native_from_wire(Ping).__code__)"
    )
    for value, expect in (("1", "True False False"), ("", "False True True")):
        env = {**os.environ, "E31_PURE_PYTHON": value}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        assert out.stdout.split() == expect.split()


def test_every_vector_body_decodes_alike() -> None:
    seen = 0
    for vector in vectors.load():
        cls = REGISTRY.get(vector["kind"])
        try:
            env = unpack(bytes.fromhex(vector["envelope"]))
            if cls is None or type(env) is not tuple or len(env) != 5 or type(env[2]) is not bytes:
                continue
            wire = unpack(env[2])
        except errors.ProtocolError:
            continue
        outcome = assert_same(cls, wire)
        if vector["valid"]:
            assert outcome[0] == "ok", vector["name"]
        seen += 1
    assert seen >= len(vectors.valid()) + 8


@pytest.mark.parametrize("kind", KINDS)
@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)
@given(data=st.data())
def test_valid_messages_decode_to_the_same_objects(kind: str, data: st.DataObject) -> None:
    cls = REGISTRY[kind]
    message = data.draw(records(cls))
    outcome = assert_same(cls, _wire(message))
    assert outcome == ("ok", _canon(message))


class Str(str):
    pass


class Bytes(bytes):
    pass


class Tuple(tuple):  # type: ignore[type-arg]
    pass


class Int(int):
    pass


def _deep(depth: int) -> Any:
    value: Any = ()
    for _ in range(depth):
        value = (value,)
    return value


HOSTILE: list[Any] = [
    None,
    True,
    False,
    0,
    1,
    -1,
    2**32,
    2**64 - 1,
    2**64,
    -(2**64),
    2**200,
    1.0,
    float("nan"),
    "",
    "a",
    "\x00",
    "a\x00b",
    "\ud800",
    "é",
    "é" * 300,
    "x" * 5000,
    "../x",
    "a//b",
    "a=b",
    "e31",
    Str("a"),
    Str("net"),
    b"",
    b"\x00" * 16,
    b"\x01" * 32,
    b"\x01" * 33,
    b"\x01" * 31,
    Bytes(b"\x01" * 32),
    bytearray(b"\x01" * 32),
    memoryview(b"\x01" * 32),
    Int(5),
    (),
    (1,),
    [],
    [b"\x01" * 32],
    {},
    {"a": 1},
    Tuple(()),
    _deep(50),
    object(),
    NodeId(b"\x01" * 32),
    Digest(b"\x01" * 32),
]


def _paths(value: Any, path: tuple[int, ...] = ()) -> list[tuple[int, ...]]:
    """The paths to every value inside `value` (as deep as records nest, not into planted deep tuples)."""
    out = [path]
    if type(value) is tuple and len(path) < 8:
        for i, item in enumerate(value):
            out += _paths(item, (*path, i))
    return out


def _get(value: Any, path: tuple[int, ...]) -> Any:
    for i in path:
        value = value[i]
    return value


def _put(value: Any, path: tuple[int, ...], new: Any) -> Any:
    if not path:
        return new
    items = list(value)
    items[path[0]] = _put(items[path[0]], path[1:], new)
    return tuple(items)


def _mutate(wire: Any, path: tuple[int, ...], how: str, other: Any) -> Any:
    here = _get(wire, path)
    if how == "replace":
        return _put(wire, path, other)
    if type(here) is not tuple:
        return _put(wire, path, other)
    items = list(here)
    if how == "drop" and items:
        del items[len(items) // 2]
    elif how == "append":
        items.append(items[-1] if items else other)
    elif how == "repeat" and items:
        items.insert(0, items[0])
    elif how == "swap" and len(items) > 1:
        items[0], items[-1] = items[-1], items[0]
    elif how == "as_list":
        return _put(wire, path, items)
    elif how == "as_subclass":
        return _put(wire, path, Tuple(items))
    return _put(wire, path, tuple(items))


@pytest.mark.parametrize("kind", KINDS)
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]
)
@given(data=st.data())
def test_mutated_messages_are_refused_or_accepted_alike(kind: str, data: st.DataObject) -> None:
    cls = REGISTRY[kind]
    wire = _wire(data.draw(records(cls)))
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(_paths(wire)))
        how = data.draw(
            st.sampled_from(
                ["replace", "replace", "drop", "append", "repeat", "swap", "as_list", "as_subclass"]
            )
        )
        wire = _mutate(wire, path, how, data.draw(st.sampled_from(HOSTILE)))
    assert_same(cls, wire)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_every_leaf_of_every_sample_replaced_by_every_hostile_value(name: str) -> None:
    msg = SAMPLES[name]
    cls = type(msg)
    wire = _wire(msg)
    for path in _paths(wire):
        for value in HOSTILE:
            assert_same(cls, _mutate(wire, path, "replace", value))
        for how in ("drop", "append", "repeat", "swap", "as_list", "as_subclass"):
            assert_same(cls, _mutate(wire, path, how, None))


def test_types_are_exact_as_in_python() -> None:
    ping = _wire(SAMPLES["ping"])
    net, sender, nonce, expires = ping
    refused = [
        (Str(net), sender, nonce, expires),
        (net, Bytes(sender), nonce, expires),
        (net, sender, Bytes(nonce), expires),
        (net, sender, nonce, True),
        (net, sender, nonce, Int(expires)),
        (net, sender, nonce, float(expires)),
        Tuple(ping),
        list(ping),
        (net, sender, nonce, -1),
        (net, sender, nonce, 2**64),
        (net, sender, nonce),
    ]
    for wire in refused:
        assert assert_same(Ping, wire)[0] == "refused", wire
    assert assert_same(Ping, (net, sender, nonce, 2**64 - 1))[0] == "ok"
    outcome = ("exited", 0, None)
    assert assert_same(Outcome, outcome)[0] == "ok"
    assert assert_same(Outcome, ("exited", False, None))[0] == "refused"
    assert assert_same(Outcome, (Str("exited"), 0, None))[0] == "refused"


def test_text_counts_utf8_bytes_refuses_surrogates_and_nul() -> None:
    for value in ("é" * 2048, "é" * 2049, "a" * 4096, "a" * 4097, "\ud800", "ok\udfffok", "a\x00", "ünï", ""):
        assert_same(EnvVar, ("NAME", value))
    for name in ("A=B", "Ä", "Ä=", "", "\x00", "x" * 255, "x" * 256, "é" * 128):
        assert_same(EnvVar, (name, "v"))
    for name in (
        "a",
        "a/b",
        "a/./b",
        "a/../b",
        "/a",
        "a/",
        ".a",
        "a/.b",
        "a\\b",
        "a\x7fb",
        "ü/ö",
        "a" * 256,
        "\ud800",
        "a\x01",
    ):
        assert_same(FileRef, (name, (b"\x01" * 32, 1)))


def test_arrays_must_be_sorted_and_unique() -> None:
    blob = (b"\x11" * 32, 5)
    manifest = list(_wire(SAMPLES["offer"].manifests[0]))
    orders = ((), ("a",), ("a", "b"), ("b", "a"), ("a", "a"), ("a", "b", "b"), ("a", "c", "b"), ("a", "a/b"))
    for names in orders:
        manifest[1] = tuple((n, blob) for n in names)
        expect = "ok" if names in ((), ("a",), ("a", "b")) else "refused"
        assert assert_same(JobManifest, tuple(manifest))[0] == expect, names
    low, high = b"\x01" * 32, b"\x02" * 32
    capacity = list(_wire(SAMPLES["capacity"]))
    for profiles in ((low,), (low, high), (high, low), (low, low), ()):
        capacity[5] = profiles
        expect = "ok" if profiles in ((low,), (low, high)) else "refused"
        assert assert_same(Capacity, tuple(capacity))[0] == expect, profiles


def test_sets_must_be_sorted_by_job_id_and_unique() -> None:
    """Offers order their manifests and bids their items by job id, a key read through a nested field
    (the C decoder calls it back); declines order their job ids by bytes."""
    offer = list(_wire(SAMPLES["offer"]))
    one, two = offer[3]
    bid = list(_wire(SAMPLES["bid"]))
    first, second = bid[4]
    decline = list(_wire(SAMPLES["decline"]))
    low, high = decline[1]
    cases = [(Offer, offer, 3, one, two), (Bid, bid, 4, first, second), (Decline, decline, 1, low, high)]
    for cls, wire, index, a, b in cases:
        for items in ((a,), (a, b), (b, a), (a, a), (a, b, b), ()):
            wire[index] = items
            expect = "ok" if items in ((a,), (a, b)) else "refused"
            assert assert_same(cls, tuple(wire))[0] == expect, (cls, items)


def test_deep_nesting_is_refused_without_crashing() -> None:
    offer = _wire(SAMPLES["offer"])
    for depth in (1, 100, 1100, 100_000):
        assert assert_same(Offer, (*offer[:3], _deep(depth)))[0] == "refused"
        assert assert_same(Offer, (*offer[:3], (_deep(depth),)))[0] == "refused"
        assert assert_same(Contact, ("net", b"\x01" * 32, (_deep(depth),), 1))[0] == "refused"
        cancel = _wire(SAMPLES["cancel"])  # the reason, one of a closed set, is shown in the error
        assert assert_same(Cancel, (*cancel[:4], _deep(depth), cancel[5]))[0] == "refused"


def test_rules_and_validate_hooks_run() -> None:
    receipt = list(_wire(SAMPLES["receipt"]))
    assert assert_same(UsageReceipt, tuple(receipt))[0] == "ok"
    limits = receipt[12]
    receipt[14] = limits[0] + 1  # fuel_used above limits.fuel: UsageReceipt._validate
    assert "fuel_used exceeds" in assert_same(UsageReceipt, tuple(receipt))[2]
    assert assert_same(Outcome, ("exited", None, None))[0] == "refused"
    assert assert_same(Contact, ("net", b"\x01" * 32, ("host:0",), 1))[0] == "refused"
    assert assert_same(Contact, ("Net", b"\x01" * 32, ("host:1",), 1))[0] == "refused"


def test_the_error_is_the_reference_decoders() -> None:
    wire = list(_wire(SAMPLES["offer"]))
    wire[0] = "NET"
    with pytest.raises(errors.InvalidMessage) as native:
        _native(Offer)(tuple(wire))
    with pytest.raises(errors.InvalidMessage) as reference:
        Offer.from_wire_reference(tuple(wire))
    assert str(native.value) == str(reference.value) and "network" in str(native.value)


def test_bad_specs_are_refused_at_construction() -> None:
    error = errors.InvalidMessage
    bad: list[tuple[Any, ...]] = [
        (Ping, (("network", ("nope",)),), None, error),
        (Ping, (("network", ("uint", 0)),), None, error),
        (Ping, (("network", ("uint", -1, 5)),), None, error),
        (Ping, (("network", ("uint", 5, 1)),), None, error),
        (Ping, (("network", ("uint", 0, 2**64)),), None, error),
        (Ping, (("missing", ("bool",)),), None, error),
        (Ping, (("network", ("bool",)), ("network", ("bool",))), None, error),
        (Ping, (("network", ("sub", "not a decoder")),), None, error),
        (Ping, (("network", ("oneof", {"a"})),), None, error),
        (Ping, (("network", ("text", 0, 5, 3, print)),), None, error),
        (Ping, (("network", ("id", Ping, 32)),), None, error),
        (Ping, (("network", ("seq", ("bool",), 0, 5, "raw")),), None, error),
        (Ping, (("network", ("call", 5)),), None, error),
        (Ping, (("network", "uint"),), None, error),
        (Ping, (("network", ("bool",)),), 5, error),
        (Ping, (("network", ("bool",)),), None, 5),
        (5, (), None, error),
        (Ping, [("network", ("bool",))], None, error),
    ]
    blob_only = _recdecode.Decoder(FileRef, (("blob", ("call", print)),), None, error)
    bad.append((EnvVar, (("name", ("seq", ("sub", blob_only), 0, 5, "name")),), None, error))
    for args in bad:
        with pytest.raises((TypeError, ValueError)):
            _recdecode.Decoder(*args)
    with pytest.raises(RuntimeError):
        _recdecode.Decoder.__new__(_recdecode.Decoder)(())
    decoder = _recdecode.Decoder(Ping, (("network", ("bool",)),), None, error)
    for call in ((), (1, 2)):
        with pytest.raises(TypeError):
            decoder(*call)
    with pytest.raises(TypeError):
        decoder(wire=(True,))
    with pytest.raises(TypeError):
        decoder.__init__(Ping, (), None, error)
    assert "Ping" in repr(decoder)


def _leaky(value: Any) -> bool:
    """Whether the reference count of `value` is ours to watch (None, bools and small ints are everyone's)."""
    return type(value) in (tuple, str, bytes) or (type(value) is int and not -5 <= value <= 256)


def _rss() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None  # not Linux: the tracemalloc check stands alone


def _leak_check(pairs: list[tuple[Callable[[object], Any], Any]], rounds: int) -> None:
    """Decoding each wire `rounds` times leaves every reference count, and the heap, as they were."""
    shared: list[Any] = [obj for _, wire in pairs for path in _paths(wire) if _leaky(obj := _get(wire, path))]
    shared += [Digest, NodeId, errors.InvalidMessage, *{type(SAMPLES[name]) for name in SAMPLES}]

    def run(times: int) -> None:
        for _ in range(times):
            for decode, wire in pairs:
                with contextlib.suppress(errors.InvalidMessage):
                    decode(wire)

    run(1000)
    gc.collect()
    counts = [sys.getrefcount(obj) for obj in shared]
    rss = _rss()
    run(rounds)
    gc.collect()
    assert [sys.getrefcount(obj) for obj in shared] == counts
    after = _rss()
    if rss is not None and after is not None:
        assert after - rss < 4 << 20, f"RSS grew {after - rss} bytes over {rounds * len(pairs)} decodes"
    tracemalloc.start()  # slows every allocation: a tenth of the rounds
    try:
        before = tracemalloc.get_traced_memory()[0]
        run(rounds // 10)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 16 * 1024, f"{grown} bytes more after {rounds // 10 * len(pairs)} decodes"


def test_no_leak_decoding_valid_messages() -> None:
    names = ("offer", "receipt", "capacity", "contact", "proof")
    # (the sample receipt is a version 1 one: its fields' decoder reads it padded, as from_wire does)
    pairs = [
        (schema._native_decoder(type(SAMPLES[name])), receipts._receipt_v2_shape(_wire(SAMPLES[name])))
        for name in names
    ]
    for decode, wire in pairs:
        assert _canon(decode(wire)) == _canon(_python(decode.cls)(wire))
    _leak_check(pairs, 40_000)  # 200k messages


def test_no_leak_refusing_messages() -> None:
    offer, receipt = _wire(SAMPLES["offer"]), _wire(SAMPLES["receipt"])
    broken = [
        (Offer, _mutate(offer, (3, 0, 1, 1, 0), "replace", "../x")),  # a rule refuses the second input's name
        (Offer, _mutate(offer, (3, 0, 1), "swap", None)),  # unsorted, found after the items are built
        (Offer, _mutate(offer, (3, 0, 6), "replace", 0)),  # JobManifest._validate: deadline before creation
        (Offer, _mutate(offer, (3,), "swap", None)),  # manifests out of job-id order: a key called back
        (Offer, _mutate(offer, (2,), "replace", b"\x01" * 32)),  # Offer._validate: another submitter
        (UsageReceipt, _mutate(receipt, (13,), "replace", ("exited", None, None))),  # Outcome._validate
        (UsageReceipt, _mutate(receipt, (19,), "replace", -1)),  # the last field
        (UsageReceipt, _mutate(receipt, (6, 0, 0), "replace", "é\ud800")),  # non-ASCII: the Python check
    ]
    pairs = [(schema._native_decoder(cls), receipts._receipt_v2_shape(wire)) for cls, wire in broken]
    for decode, wire in pairs:
        with pytest.raises(errors.InvalidMessage):
            decode(wire)
        assert_same(decode.cls, wire)
    _leak_check(pairs, 20_000)


def test_the_quick_text_tests_in_c_decide_exactly_as_the_rules() -> None:
    """Network names (a character set), variable names (no '=') and file names (their plain shape)
    are passed in C without calling the rule; every other text goes to the rule: same verdicts."""
    sender, nonce, blob = b"\x01" * 32, b"\x02" * 16, (b"\x01" * 32, 1)
    for net in ("main", "net-1.test_x", "a", "Net", "net 1", "net\x00", "n\u00e9t", "-", "a/b", "z" * 33):
        assert_same(Ping, (net, sender, nonce, 1))
    for name in ("PATH", "A_B", "A=B", "=", "A\x00", "\u00c9", "a b"):
        assert_same(EnvVar, (name, "v"))
    names = (
        "a",
        "a/b",
        "a.b/c.d",
        "a/../b",
        "a//b",
        "a/b/",
        "/a",
        ".a",
        "a/.b",
        "..",
        ".",
        "a/.",
        "a/..",
        "a/./b",
        "a\\b",
        "a\x7fb",
        "a\x1fb",
        "a\tb",
        "~/x",
        "a/b c/d",
        "\u00e9/x",
        "a" * 255,
        "a/" * 127 + "a",
    )
    for name in names:
        assert_same(FileRef, (name, blob))
