"""Field codecs and the record machinery behind every message class.

A record is a frozen dataclass whose fields each carry a codec (in the field's metadata). The
codec says how the field's Python value is checked, how it is written to the wire (inside a
msgpack array, in field order) and read back, and how it looks in JSON (inspect, vectors).

Construction validates every field (`check`), then the rules between fields (`_validate`).
Decoding must accept exactly what construction accepts, and it is the hot path of verification,
so each record class gets a generated decoder (`_compile_from_wire`): one straight-line function
in which every codec's checks, every nested record and every array of records are written out
(`Codec.inline`), and objects are built without their checking __init__. `from_wire_reference`
is the plain equivalent (convert each field with `dec`, then construct) that the tests hold the
generated one to; any wire value the generated decoder refuses is re-decoded by the reference,
so both raise the same error. Every failure is InvalidMessage.

Encoding is generated too (`_compile_to_wire`): one expression per field, with the codecs' `enc`
written out, held by the tests to `to_wire_reference` (each codec's `enc` in turn). Every signature,
message id and job id is made over its output.

When the optional C extension `_recdecode` is built (and E31_PURE_PYTHON is not set), the same
checks run in C instead: `_native_spec` turns each codec into a spec the extension interprets
(calling back into Python for what only Python can decide: text rules, non-ASCII text, `_validate`),
and a refusal is explained by the reference decoder just the same.
"""

from __future__ import annotations

import bisect
import dataclasses
import operator
import re
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar, Generic, TypeVar

from .errors import InvalidMessage
from .ids import DIGEST_SIZE, KEY_SIZE, Digest, InvalidId, NodeId

try:
    from . import _recdecode
except ImportError:  # not built (no C compiler at install time): the generated Python decoders run
    _recdecode = None  # type: ignore[assignment]

T = TypeVar("T")
R = TypeVar("R", bound="Record")

U16 = (1 << 16) - 1
U32 = (1 << 32) - 1
U64 = (1 << 64) - 1


class Codec(Generic[T]):
    """How one field is checked, encoded, decoded and shown as JSON."""

    def check(self, v: object) -> None:
        raise NotImplementedError

    def enc(self, v: T) -> Any:
        return v

    def dec(self, w: object) -> Any:
        """Turn a wire value into the Python value (not yet checked)."""
        return w

    def decode(self, w: object) -> Any:
        """Turn a wire value into a checked Python value. Codecs on the hot path override this."""
        v = self.dec(w)
        self.check(v)
        return v

    def inline(self, x: str, src: Source) -> str:
        """Write into `src` the lines of a generated decoder that check the wire value held in
        variable `x`, and return an expression for the checked Python value.

        A generated check must accept exactly what `decode` accepts. A cheap test that may refuse a
        valid value (non-ASCII text, say) must fall back to `check`, which raises or lets it pass;
        a refusal is re-explained by the reference decoder, so the error text need not be precise."""
        return src.let(f"{src.bind(self)}.decode({x})")

    def to_json(self, v: T) -> Any:
        return v

    def from_json(self, j: object) -> Any:
        return j

    def describe(self) -> str:
        raise NotImplementedError


class UInt(Codec[int]):
    def __init__(self, maximum: int = U64, minimum: int = 0, label: str = "") -> None:
        self.min, self.max, self.label = minimum, maximum, label

    def check(self, v: object) -> None:
        if type(v) is not int:
            raise InvalidMessage(f"expected an integer, got {type(v).__name__}")
        if not self.min <= v <= self.max:
            raise InvalidMessage(f"{v} is outside {self.min}..{self.max}")

    def decode(self, w: object) -> Any:
        if type(w) is not int or not self.min <= w <= self.max:
            self.check(w)
        return w

    def inline(self, x: str, src: Source) -> str:
        c = src.bind(self)
        src.emit(f"if type({x}) is not int or not {self.min} <= {x} <= {self.max}: {c}.check({x})")
        return x

    def describe(self) -> str:
        if self.label:
            return self.label
        names = {U16: "uint16", U32: "uint32", U64: "uint64"}
        if self.max in names:
            return names[self.max] if self.min == 0 else f"{names[self.max]}, at least {self.min}"
        return f"uint {self.min}..{self.max}"


class Bool(Codec[bool]):
    def check(self, v: object) -> None:
        if type(v) is not bool:
            raise InvalidMessage(f"expected a boolean, got {type(v).__name__}")

    def inline(self, x: str, src: Source) -> str:
        src.emit(f"if type({x}) is not bool: {src.bind(self)}.check({x})")
        return x

    def describe(self) -> str:
        return "bool"


class Text(Codec[str]):
    """UTF-8 text, at most `max_bytes` encoded bytes, never NUL; optionally a validator.

    `rule(text)` says why a text breaks the field's own rule, or None. `quick`, for the generated
    decoder, is Python source over `{x}` that is true only for ASCII text keeping the rule (it may be
    false for some that keep it: the rule then decides); it spares a call on the hot path. `native` is
    the same test for the C decoder (protocol/_recdecode.c): ("charset", allowed ASCII characters),
    ("exclude", refused ASCII characters) or ("file_name",)."""

    def __init__(
        self,
        max_bytes: int,
        min_len: int = 0,
        rule: Callable[[str], str | None] | None = None,
        label: str = "",
        quick: str | None = None,
        native: tuple[str, ...] | None = None,
    ) -> None:
        self.max, self.min, self.rule, self.label = max_bytes, min_len, rule, label
        self.quick = quick if rule is not None else None
        self.native = native if rule is not None else None

    def check(self, v: object) -> None:
        if type(v) is not str:
            raise InvalidMessage(f"expected text, got {type(v).__name__}")
        try:
            n = len(v.encode("utf-8"))
        except UnicodeEncodeError as e:
            raise InvalidMessage("text is not valid Unicode (lone surrogate)") from e
        if n > self.max or len(v) < self.min:
            raise InvalidMessage(f"text of {n} bytes is outside {self.min}..{self.max}")
        if "\x00" in v:
            raise InvalidMessage("text contains NUL")
        if self.rule is not None and (why := self.rule(v)) is not None:
            raise InvalidMessage(why)

    def decode(self, w: object) -> Any:
        if (
            type(w) is not str
            or not w.isascii()
            or not self.min <= len(w) <= self.max
            or "\x00" in w
            or self.rule is not None
        ):
            self.check(w)
        return w

    def quick_test(self, x: str) -> str:
        """A source expression true when text `x` is certainly valid but for the rule: ASCII text is
        one byte per character and cannot hold a lone surrogate. Other text goes to `check`."""
        size = _size_test(x, self.min, self.max)
        return f"type({x}) is str and {x}.isascii() and {size} and NUL not in {x}"

    def inline(self, x: str, src: Source) -> str:
        c = src.bind(self)
        test = self.quick_test(x)
        if self.quick is not None:
            test += " and " + self.quick.format(x=x)
        elif self.rule is not None:
            test += f" and {src.bind(self.rule)}({x}) is None"
        src.emit(f"if not ({test}): {c}.check({x})")
        return x

    def describe(self) -> str:
        text = f"str (UTF-8, {self.min}..{self.max} bytes, no NUL)"
        return f"{text}: {self.label}" if self.label else text


class OneOf(Codec[str]):
    """One string from a closed set."""

    def __init__(self, *choices: str) -> None:
        self.choices = frozenset(choices)
        self.order = choices

    def check(self, v: object) -> None:
        if type(v) is not str or v not in self.choices:
            raise InvalidMessage(f"expected one of {', '.join(self.order)}; got {_show(v)}")

    def decode(self, w: object) -> Any:
        if type(w) is not str or w not in self.choices:
            self.check(w)
        return w

    def inline(self, x: str, src: Source) -> str:
        c = src.bind(self)
        src.emit(f"if type({x}) is not str or {x} not in {src.bind(self.choices)}: {c}.check({x})")
        return x

    def describe(self) -> str:
        return "str, one of " + ", ".join(f"`{c}`" for c in self.order)


class Bin(Codec[bytes]):
    def __init__(self, max_len: int, min_len: int = 0) -> None:
        self.min, self.max = min_len, max_len

    def check(self, v: object) -> None:
        if type(v) is not bytes:
            raise InvalidMessage(f"expected bytes, got {type(v).__name__}")
        if not self.min <= len(v) <= self.max:
            raise InvalidMessage(f"{len(v)} bytes is outside {self.min}..{self.max}")

    def decode(self, w: object) -> Any:
        if type(w) is not bytes or not self.min <= len(w) <= self.max:
            self.check(w)
        return w

    def inline(self, x: str, src: Source) -> str:
        c = src.bind(self)
        src.emit(f"if not (type({x}) is bytes and {_size_test(x, self.min, self.max)}): {c}.check({x})")
        return x

    def to_json(self, v: bytes) -> Any:
        return v.hex()

    def from_json(self, j: object) -> Any:
        return _hex(j)

    def describe(self) -> str:
        if self.min == self.max:
            return f"bin ({self.max} bytes)"
        return f"bin ({self.min}..{self.max} bytes)"


class Key(Codec[NodeId]):
    def check(self, v: object) -> None:
        if type(v) is not NodeId:
            raise InvalidMessage(f"expected a NodeId, got {type(v).__name__}")

    def enc(self, v: NodeId) -> Any:
        return v.raw

    def dec(self, w: object) -> Any:
        if type(w) is not bytes:
            raise InvalidMessage(f"a node id is bin, got {_wire_type(w)}")
        try:
            return NodeId(w)
        except InvalidId as e:
            raise InvalidMessage(str(e)) from None

    decode = dec

    def inline(self, x: str, src: Source) -> str:
        src.emit(f"if type({x}) is not bytes or len({x}) != {KEY_SIZE}: {src.bind(self)}.dec({x})")
        v = src.let("new(NodeId)")
        src.emit(f"set_node_raw({v}, {x})")
        return v

    def to_json(self, v: NodeId) -> Any:
        return str(v)

    def from_json(self, j: object) -> Any:
        if not isinstance(j, str):
            raise InvalidMessage("a node id in JSON is its text form")
        try:
            return NodeId.parse(j)
        except InvalidId as e:
            raise InvalidMessage(str(e)) from None

    def describe(self) -> str:
        return "bin (32 bytes: Ed25519 public key)"


class Hash(Codec[Digest]):
    def check(self, v: object) -> None:
        if type(v) is not Digest:
            raise InvalidMessage(f"expected a Digest, got {type(v).__name__}")

    def enc(self, v: Digest) -> Any:
        return v.raw

    def dec(self, w: object) -> Any:
        if type(w) is not bytes:
            raise InvalidMessage(f"a digest is bin, got {_wire_type(w)}")
        try:
            return Digest(w)
        except InvalidId as e:
            raise InvalidMessage(str(e)) from None

    decode = dec

    def inline(self, x: str, src: Source) -> str:
        src.emit(f"if type({x}) is not bytes or len({x}) != {DIGEST_SIZE}: {src.bind(self)}.dec({x})")
        v = src.let("new(Digest)")
        src.emit(f"set_digest_raw({v}, {x})")
        return v

    def to_json(self, v: Digest) -> Any:
        return v.hex()

    def from_json(self, j: object) -> Any:
        if not isinstance(j, str):
            raise InvalidMessage("a digest in JSON is 64 hex digits")
        try:
            return Digest.parse(j)
        except InvalidId as e:
            raise InvalidMessage(str(e)) from None

    def describe(self) -> str:
        return "bin (32 bytes: SHA-256)"


class Opt(Codec[Any]):
    """A value or nil (None)."""

    def __init__(self, inner: Codec[Any]) -> None:
        self.inner = inner

    def check(self, v: object) -> None:
        if v is not None:
            self.inner.check(v)

    def enc(self, v: Any) -> Any:
        return None if v is None else self.inner.enc(v)

    def dec(self, w: object) -> Any:
        return None if w is None else self.inner.dec(w)

    def decode(self, w: object) -> Any:
        return None if w is None else self.inner.decode(w)

    def inline(self, x: str, src: Source) -> str:
        v = src.fresh("v")
        with src.block(f"if {x} is None:"):
            src.emit(f"{v} = None")
        with src.block("else:"):
            src.emit(f"{v} = {self.inner.inline(x, src)}")
        return v

    def to_json(self, v: Any) -> Any:
        return None if v is None else self.inner.to_json(v)

    def from_json(self, j: object) -> Any:
        return None if j is None else self.inner.from_json(j)

    def describe(self) -> str:
        return f"nil or {self.inner.describe()}"


class Seq(Codec[tuple[Any, ...]]):
    """An array of at most `max_items` values; optionally strictly increasing by `order_key`."""

    def __init__(
        self,
        inner: Codec[Any],
        max_items: int,
        min_items: int = 0,
        order_key: Callable[[Any], Any] | None = None,
    ) -> None:
        self.inner, self.max, self.min, self.order_key = inner, max_items, min_items, order_key

    def check(self, v: object) -> None:
        if type(v) is not tuple:
            raise InvalidMessage(f"expected a tuple, got {type(v).__name__}")
        if not self.min <= len(v) <= self.max:
            raise InvalidMessage(f"{len(v)} items is outside {self.min}..{self.max}")
        check = self.inner.check
        for i, item in enumerate(v):
            try:
                check(item)
            except InvalidMessage as e:
                raise InvalidMessage(f"[{i}]: {e}") from None
        if self.order_key is not None and len(v) > 1:
            keys = [self.order_key(x) for x in v]
            for i in range(1, len(keys)):
                if not keys[i - 1] < keys[i]:
                    raise InvalidMessage(f"[{i}]: items must be sorted and unique")

    def enc(self, v: tuple[Any, ...]) -> Any:
        enc = self.inner.enc
        return tuple(enc(x) for x in v)

    def dec(self, w: object) -> Any:
        if type(w) is not tuple:
            raise InvalidMessage(f"expected an array, got {_wire_type(w)}")
        if len(w) > self.max:
            raise InvalidMessage(f"{len(w)} items is more than {self.max}")
        dec = self.inner.dec
        out = []
        for i, x in enumerate(w):
            try:
                out.append(dec(x))
            except InvalidMessage as e:
                raise InvalidMessage(f"[{i}]: {e}") from None
        return tuple(out)

    def decode(self, w: object) -> Any:
        if type(w) is not tuple:
            raise InvalidMessage(f"expected an array, got {_wire_type(w)}")
        if not self.min <= len(w) <= self.max:
            raise InvalidMessage(f"{len(w)} items is outside {self.min}..{self.max}")
        inner = self.inner
        decode = inner.cls.from_wire if isinstance(inner, Sub) else inner.decode
        try:
            out = tuple([decode(x) for x in w])
        except InvalidMessage:
            for i, x in enumerate(w):
                try:
                    decode(x)
                except InvalidMessage as e:
                    raise InvalidMessage(f"[{i}]: {e}") from None
            raise
        if self.order_key is not None and len(out) > 1:
            keys = [self.order_key(x) for x in out]
            for i in range(1, len(keys)):
                if not keys[i - 1] < keys[i]:
                    raise InvalidMessage(f"[{i}]: items must be sorted and unique")
        return out

    def inline(self, x: str, src: Source) -> str:
        c = src.bind(self)
        src.emit(f"if not (type({x}) is tuple and {_size_test(x, self.min, self.max)}): {c}.decode({x})")
        inner, order = self.inner, self.order_key
        y = src.fresh("y")
        if type(inner) in (Text, Bin) and order is None:
            # the wire array already is the tuple of values: check its items in place and keep it
            with src.block(f"for {y} in {x}:"):
                inner.inline(y, src)
            return x
        items, last = src.fresh("items"), src.fresh("last")
        src.emit(f"{items} = []")
        ordered = src.fresh("ordered")
        if order is not None:
            src.emit(f"{last} = MISSING")
            src.emit(f"{ordered} = len({x}) > 1")  # one item is in order: its (maybe costly) key is unused
        with src.block(f"for {y} in {x}:"):
            item = inner.inline(y, src)
            src.emit(f"{items}.append({item})")
            if order is not None:
                # strictly increasing: each key above the one before
                with src.block(f"if {ordered}:"):
                    key = _key_source(order, item, src)
                    src.emit(f"if {last} is not MISSING and not {last} < {key}: {c}.check(tuple({items}))")
                    src.emit(f"{last} = {key}")
        return src.let(f"tuple({items})")

    def to_json(self, v: tuple[Any, ...]) -> Any:
        return [self.inner.to_json(x) for x in v]

    def from_json(self, j: object) -> Any:
        if not isinstance(j, list):
            raise InvalidMessage("expected a JSON list")
        return tuple(self.inner.from_json(x) for x in j)

    def describe(self) -> str:
        order = ", strictly increasing" if self.order_key is not None else ""
        return f"array ({self.min}..{self.max} items{order}) of {self.inner.describe()}"


class Sub(Codec[Any]):
    """A nested record, encoded as its own array."""

    def __init__(self, cls: type[Record]) -> None:
        self.cls = cls

    def check(self, v: object) -> None:
        if type(v) is not self.cls:
            raise InvalidMessage(f"expected {self.cls.__name__}, got {type(v).__name__}")

    def enc(self, v: Record) -> Any:
        return v.to_wire()

    def dec(self, w: object) -> Any:
        return self.cls.from_wire(w)

    decode = dec

    def inline(self, x: str, src: Source) -> str:
        if src.depth >= MAX_INLINE_DEPTH:
            return src.let(f"{src.bind(_compiled(self.cls))}({x})")
        return _record_source(self.cls, x, src)

    @property
    def from_wire(self) -> Callable[[object], Any]:
        return self.cls.from_wire

    def to_json(self, v: Record) -> Any:
        return v.to_json()

    def from_json(self, j: object) -> Any:
        return self.cls.from_json(j)

    def describe(self) -> str:
        return f"`{self.cls.__name__}`"


BY_NAME = operator.attrgetter("name")
"""Order of named items: by name, which for str is Unicode code point order (= UTF-8 byte order)."""
BY_RAW = operator.attrgetter("raw")


def find_sorted(items: Sequence[T], raw: bytes, key: Callable[[T], bytes]) -> T | None:
    """The item of `items` whose `key` is `raw`, or None; `items` strictly increasing by `key`, as a Seq
    with that order_key keeps them (an offer's manifests, a bid's items, an ack's ids...)."""
    i = bisect.bisect_left(items, raw, key=key)
    return items[i] if i < len(items) and key(items[i]) == raw else None


def _size_test(x: str, low: int, high: int) -> str:
    """Source testing that low <= len(x) <= high."""
    if low == high:
        return f"len({x}) == {low}"
    return f"len({x}) <= {high}" if low == 0 else f"{low} <= len({x}) <= {high}"


def _key_source(key: Callable[[Any], Any], item: str, src: Source) -> str:
    """A local holding `key(item)`: the local the decoder already holds when the key reads one field of
    a record it has just built, else a call."""
    if type(key) is operator.attrgetter:
        names = key.__reduce__()[1]
        known = src.fields.get(item, {})
        if len(names) == 1 and names[0] in known:
            return known[names[0]]
    return src.let(f"{src.bind(key)}({item})")


def w(codec: Codec[Any]) -> Mapping[str, Any]:
    """Field metadata naming the field's codec: `x: int = field(metadata=w(UInt()))`."""
    return {"codec": codec}


class Record:
    """Base of every wire record. Subclasses are frozen slotted dataclasses decorated with @record."""

    __slots__ = ()
    _FIELDS: ClassVar[tuple[tuple[str, Codec[Any]], ...]] = ()

    def __post_init__(self) -> None:
        for name, codec in self._FIELDS:
            try:
                codec.check(getattr(self, name))
            except InvalidMessage as e:
                raise InvalidMessage(f"{type(self).__name__}.{name}: {e}") from None
        self._validate()

    def _validate(self) -> None:
        """Rules between fields; subclasses override."""

    def to_wire(self) -> tuple[Any, ...]:
        """The record's wire array, each field as its codec writes it (`to_wire_reference`), by an
        encoder generated for the record's class on its first use (`_compile_to_wire`)."""
        encode = _ENCODERS.get(type(self))
        if encode is None:
            encode = _compile_to_wire(type(self))
        return encode(self)

    def to_wire_reference(self) -> tuple[Any, ...]:
        """The plain encoder: each field through its codec's `enc`. Tests hold the generated one to it."""
        return tuple(codec.enc(getattr(self, name)) for name, codec in self._FIELDS)

    @classmethod
    def from_wire(cls: type[R], wire: object) -> R:
        """Decode and check a wire array. @record replaces this with a compiled equivalent."""
        return cls.from_wire_reference(wire)

    @classmethod
    def from_wire_reference(cls: type[R], wire: object) -> R:
        """The plain decoder: convert each field and construct, so __init__ checks everything.
        Tests hold the compiled decoder to exactly this behaviour."""
        fields = cls._FIELDS
        _check_shape(cls, wire)
        assert isinstance(wire, tuple)
        values = []
        for (name, codec), x in zip(fields, wire, strict=True):
            try:
                values.append(codec.dec(x))
            except InvalidMessage as e:
                raise InvalidMessage(f"{cls.__name__}.{name}: {e}") from None
        return cls(*values)

    def to_json(self) -> dict[str, Any]:
        return {name: codec.to_json(getattr(self, name)) for name, codec in self._FIELDS}

    @classmethod
    def from_json(cls: type[R], j: object) -> R:
        if not isinstance(j, dict):
            raise InvalidMessage(f"{cls.__name__}: expected a JSON object")
        names = [n for n, _ in cls._FIELDS]
        if sorted(j) != sorted(names):
            raise InvalidMessage(f"{cls.__name__}: expected the fields {', '.join(names)}")
        values = []
        for name, codec in cls._FIELDS:
            try:
                values.append(codec.from_json(j[name]))
            except InvalidMessage as e:
                raise InvalidMessage(f"{cls.__name__}.{name}: {e}") from None
        return cls(*values)


_ENCODERS: dict[type[Record], Callable[[Any], tuple[Any, ...]]] = {}


def _compile_to_wire(cls: type[Record]) -> Callable[[Any], tuple[Any, ...]]:
    """Generate the encoder of one record class: one expression per field, with the codecs' `enc` written
    out (a key or digest is its raw bytes; an optional, an array, a nested record by their own rules;
    a codec whose `enc` is the identity, as is, and any other by calling it), so a record is encoded
    with no call per field. It returns exactly what `to_wire_reference` does."""
    src = Source()

    def expr(codec: Any, value: str) -> str:
        enc = type(codec).enc
        if enc is Key.enc or enc is Hash.enc:
            return f"{value}.raw"
        if enc is Opt.enc:
            return f"(None if {value} is None else {expr(codec.inner, value)})"
        if enc is Seq.enc:
            item = src.fresh("x")
            return f"tuple([{expr(codec.inner, item)} for {item} in {value}])"
        if enc is Sub.enc:
            return f"{value}.to_wire()"
        if enc is Codec.enc:
            return value
        return f"{src.bind(codec)}.enc({value})"

    with src.block("def to_wire(self):"):
        parts = [expr(codec, "self." + name) for name, codec in cls._FIELDS]
        src.emit(f"return ({''.join(part + ', ' for part in parts)})")
    fn: Callable[[Any], tuple[Any, ...]] = src.make("to_wire", f"<{cls.__name__}.to_wire>")
    fn.__qualname__ = f"{cls.__name__}.to_wire"
    _ENCODERS[cls] = fn
    return fn


def record(cls: type[R]) -> type[R]:
    """Collect the field codecs of a dataclass (apply after @dataclass)."""
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    missing = [f.name for f in fields if "codec" not in f.metadata]
    if missing:
        raise TypeError(f"{cls.__name__}: fields without a codec: {missing}")
    cls._FIELDS = tuple((f.name, f.metadata["codec"]) for f in fields)
    cls.from_wire = _compile_on_first_use(cls)  # type: ignore[method-assign,assignment]
    return cls


def _compile_on_first_use(cls: type[R]) -> Callable[[object], R]:
    """A from_wire that compiles the real one on its first call (keeps `e31 inspect` start-up fast)."""

    def from_wire(wire: object) -> R:
        return _compiled(cls)(wire)

    from_wire.lazy = True  # type: ignore[attr-defined]
    return from_wire


def _compiled(cls: type[R]) -> Callable[[object], R]:
    """The compiled decoder of `cls`, compiling it now if it has not been yet."""
    fn: Callable[[object], R] = cls.from_wire
    if getattr(fn, "lazy", False):
        fn = _compile_from_wire(cls)
        cls.from_wire = fn  # type: ignore[method-assign,assignment]
    return fn


def _check_shape(cls: type[Record], wire: object) -> None:
    if type(wire) is not tuple:
        raise InvalidMessage(f"{cls.__name__}: expected an array, got {_wire_type(wire)}")
    if len(wire) != len(cls._FIELDS):
        raise InvalidMessage(f"{cls.__name__}: expected {len(cls._FIELDS)} fields, got {len(wire)}")


def _explain(cls: type[Record], wire: object, error: InvalidMessage) -> InvalidMessage:
    """The error to raise for wire data the compiled decoder refused: the reference decoder's, which
    names the field at fault (the compiled one keeps no note of where it is, to stay fast)."""
    try:
        cls.from_wire_reference(wire)
    except InvalidMessage as precise:
        return precise
    return InvalidMessage(f"{cls.__name__}: {error}")


MAX_INLINE_DEPTH = 4
"""Nested records (Sub fields) up to this depth are written out inline, deeper ones are called."""

MISSING = object()


class Source:
    """The source text of one generated decoder, and the objects it refers to by name (it sees them as
    closure variables, which are cheaper to read than globals and builtins)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.ns: dict[str, Any] = {
            "type": type,
            "len": len,
            "int": int,
            "str": str,
            "bytes": bytes,
            "bool": bool,
            "tuple": tuple,
            "InvalidMessage": InvalidMessage,
            "new": object.__new__,
            "NUL": "\x00",
            "MISSING": MISSING,
            "NodeId": NodeId,
            "Digest": Digest,
            "check_shape": _check_shape,
            "explain": _explain,
            "set_node_raw": _slot_setter(NodeId, "raw"),
            "set_digest_raw": _slot_setter(Digest, "raw"),
        }
        self.depth = 0
        self.fields: dict[str, dict[str, str]] = {}
        """For each local holding a record the decoder built, the locals holding its fields' values."""
        self._indent = 0
        self._names: dict[int, str] = {}
        self._count = 0

    def emit(self, line: str) -> None:
        self.lines.append("    " * self._indent + line)

    @contextmanager
    def block(self, header: str) -> Iterator[None]:
        self.emit(header)
        self._indent += 1
        yield
        self._indent -= 1

    def bind(self, obj: object) -> str:
        """The name under which the generated code sees `obj`."""
        name = self._names.get(id(obj))
        if name is None:
            name = self._names[id(obj)] = f"k{len(self._names)}"
            self.ns[name] = obj
        return name

    def make(self, name: str, label: str) -> Any:
        """The function `name` the emitted lines define, compiled (`label` names its source in
        tracebacks), seeing every bound object as a closure variable."""
        code = "\n".join([f"def make({', '.join(self.ns)}):", *("    " + line for line in self.lines)])
        scope: dict[str, Any] = {}
        exec(compile(f"{code}\n    return {name}", label, "exec"), scope)
        return scope["make"](**self.ns)

    def fresh(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}{self._count}"

    def let(self, expr: str) -> str:
        """Assign `expr` to a new local and return its name."""
        v = self.fresh("v")
        self.emit(f"{v} = {expr}")
        return v


def compiled_decoder(cls: type[R]) -> Callable[[object], R]:
    """A new compiled decoder of `cls`'s fields, whatever its `from_wire` is now: for a record that
    wraps its decoder (a message with an older, shorter form: receipts.UsageReceipt)."""
    return _compile_from_wire(cls)


def _compile_from_wire(cls: type[R]) -> Callable[[object], R]:
    """The decoder of one record class (see the module comment): compiled in C when the extension is
    there, else generated as Python. Decoding is the hot path of verification, right after the
    signature check."""
    if native_decoding():
        return _native_from_wire(cls)
    return _generated_from_wire(cls)


def native_decoding() -> bool:
    """Whether records are decoded by the C extension (built, and E31_PURE_PYTHON not set)."""
    return _recdecode is not None and not _recdecode.DISABLED


def _native_from_wire(cls: type[R]) -> Callable[[object], R]:
    """A from_wire running the C decoder of `cls`, and on a refusal raising the reference's error."""
    decode = _native_decoder(cls)

    def from_wire(wire: object) -> R:
        try:
            record: R = decode(wire)
        except InvalidMessage as e:
            raise _explain(cls, wire, e) from None
        return record

    from_wire.__qualname__ = f"{cls.__name__}.from_wire"
    from_wire.__doc__ = Record.from_wire.__doc__
    return from_wire


_DECODERS: dict[type[Record], _recdecode.Decoder] = {}


def _native_decoder(cls: type[Record]) -> _recdecode.Decoder:
    """The C decoder of `cls` (an `_recdecode.Decoder`), built once."""
    decoder = _DECODERS.get(cls)
    if decoder is None:
        assert _recdecode is not None
        fields = tuple((name, _native_spec(codec)) for name, codec in cls._FIELDS)
        validate = cls._validate if cls._validate is not Record._validate else None
        decoder = _DECODERS[cls] = _recdecode.Decoder(cls, fields, validate, InvalidMessage)
    return decoder


def _native_spec(codec: Codec[Any]) -> tuple[Any, ...]:
    """The spec of one field for `_recdecode.Decoder` (its docstring lists the forms). Exact types only:
    a codec of any other class (a subclass too) is called back through its own `decode`."""
    if type(codec) is UInt and 0 <= codec.min <= codec.max <= U64:
        return ("uint", codec.min, codec.max)
    if type(codec) is Bool:
        return ("bool",)
    if type(codec) is Text:
        return ("text", codec.min, codec.max, codec.rule, codec.check, codec.native)
    if type(codec) is OneOf:
        return ("oneof", codec.choices)
    if type(codec) is Bin:
        return ("bin", codec.min, codec.max)
    if type(codec) is Key:
        return ("id", NodeId, KEY_SIZE)
    if type(codec) is Hash:
        return ("id", Digest, DIGEST_SIZE)
    if type(codec) is Opt:
        return ("opt", _native_spec(codec.inner))
    if type(codec) is Seq:
        return ("seq", _native_spec(codec.inner), codec.min, codec.max, _native_order(codec))
    if type(codec) is Sub:
        return ("sub", _native_decoder(codec.cls))
    return ("call", codec.decode)


def _native_order(seq: Seq) -> str | Callable[[Any], Any] | None:
    """How the C decoder finds an item's order key: the name of the item's slot the key reads, when it
    reads one (a record field, an id's raw bytes), else the key function."""
    key, inner = seq.order_key, seq.inner
    if type(key) is operator.attrgetter:
        names = key.__reduce__()[1]
        if len(names) == 1 and isinstance(names[0], str) and "." not in names[0]:
            slots: tuple[str, ...] = ()
            if type(inner) is Sub:
                slots = tuple(name for name, _ in inner.cls._FIELDS)
            elif type(inner) in (Key, Hash):
                slots = ("raw",)
            if names[0] in slots:
                return str(names[0])
    return key


def _generated_from_wire(cls: type[R]) -> Callable[[object], R]:
    """Generate the Python decoder of one record class."""
    src = Source()
    with src.block("def from_wire(wire):"):
        with src.block("try:"):
            obj = _record_source(cls, "wire", src)
        with src.block("except InvalidMessage as e:"):
            src.emit(f"raise explain({src.bind(cls)}, wire, e) from None")
        src.emit(f"return {obj}")
    fn: Callable[[object], R] = src.make("from_wire", f"<{cls.__name__}.from_wire>")
    fn.__qualname__ = f"{cls.__name__}.from_wire"
    fn.__doc__ = Record.from_wire.__doc__
    return fn


def _record_source(cls: type[Record], wire: str, src: Source) -> str:
    """Write the lines that decode the wire array in variable `wire` into a new `cls`; return the
    variable holding it. The fields are unpacked into locals and checked; then, skipping the frozen
    __setattr__ and the checking __init__ (several times the cost), they are stored into a mutable
    twin of the frozen class which is re-labelled as `cls` (one costly step, then plain slot stores),
    or, for a single field, through the slot's setter."""
    c = src.bind(cls)
    n = len(cls._FIELDS)
    src.emit(f"if type({wire}) is not tuple or len({wire}) != {n}: check_shape({c}, {wire})")
    wires = [src.fresh("x") for _ in range(n)]
    src.emit(f"{', '.join(wires)}, = {wire}")
    src.depth += 1
    values = [codec.inline(x, src) for (_, codec), x in zip(cls._FIELDS, wires, strict=True)]
    src.depth -= 1
    if n == 1:
        obj = src.let(f"new({c})")
        src.emit(f"{src.bind(_slot_setter(cls, cls._FIELDS[0][0]))}({obj}, {values[0]})")
    else:
        obj = src.let(f"{src.bind(_mutable_twin(cls))}()")
        for (name, _), value in zip(cls._FIELDS, values, strict=True):
            src.emit(f"{obj}.{name} = {value}")
        src.emit(f"{obj}.__class__ = {c}")
    if cls._validate is not Record._validate:
        src.emit(f"{obj}._validate()")
    src.fields[obj] = {name: value for (name, _), value in zip(cls._FIELDS, values, strict=True)}
    return obj


_TWINS: dict[type, type] = {}


def _mutable_twin(cls: type) -> type:
    """A class with the same slots and bases as the frozen `cls` but no __setattr__ guard: the
    decoder fills one with plain (fast) attribute stores, then re-labels it as `cls`, which the
    identical layout allows."""
    twin = _TWINS.get(cls)
    if twin is None:
        slots = cls.__dict__["__slots__"]
        bases = cls.__dict__.get("__orig_bases__", cls.__bases__)  # as written (Generic[M], say)
        twin = _TWINS[cls] = types.new_class(
            f"{cls.__name__}Builder", bases, exec_body=lambda ns: ns.update(__slots__=slots)
        )
    return twin


def _slot_setter(cls: type, name: str) -> Callable[[Any, Any], None]:
    setter: Callable[[Any, Any], None] = cls.__dict__[name].__set__
    return setter


def _hex(j: object) -> bytes:
    if not isinstance(j, str):
        raise InvalidMessage("bytes in JSON are hex text")
    try:
        return bytes.fromhex(j)
    except ValueError as e:
        raise InvalidMessage(f"bad hex: {e}") from None


def _wire_type(v: object) -> str:
    return {
        bytes: "bin",
        str: "str",
        int: "int",
        bool: "bool",
        tuple: "array",
        float: "float",
        type(None): "nil",
        dict: "map",
    }.get(type(v), type(v).__name__)


def _show(v: object) -> str:
    try:
        r = repr(v)
    except RecursionError:  # a hostile array nested a thousand deep (msgpack allows 1024)
        return "a value nested too deeply to show"
    return r if len(r) <= 60 else r[:60] + "..."


M = TypeVar("M", bound="Message")

KIND_MAX = 16
NETWORK_MAX = 32


_NETWORK_CHARS = "abcdefghijklmnopqrstuvwxyz0123456789._-"
_NETWORK_NAME = re.compile(r"[a-z0-9._-]+")


def _network_rule(s: str) -> str | None:
    if _NETWORK_NAME.fullmatch(s) is None:
        return f"a network name is 1..{NETWORK_MAX} of a-z 0-9 - . _; got {_show(s)}"
    return None


# quick: stripping the allowed characters from both ends leaves nothing exactly when all are allowed
NETWORK = Text(
    NETWORK_MAX,
    min_len=1,
    rule=_network_rule,
    label="network name (section 3)",
    quick=f"not {{x}}.strip({_NETWORK_CHARS!r})",
    native=("charset", _NETWORK_CHARS),
)
TIME = UInt(label="timestamp (uint64, ms since the Unix epoch)")
"""A timestamp: milliseconds since the Unix epoch (UTC), an unsigned 64-bit integer."""


class Message(Record):
    """A record that travels as the body of a signed envelope.

    Every message names its network and its issuer: `ISSUER` is the field holding the key that
    must have signed the envelope (a dotted path reaches into a nested record). `EXPIRY`, when
    set, is the field whose timestamp bounds the message's life on the network.
    """

    __slots__ = ()
    KIND: ClassVar[str] = ""
    ISSUER: ClassVar[str] = ""
    EXPIRY: ClassVar[str | None] = None

    _GET_ISSUER: ClassVar[operator.attrgetter[NodeId]]

    @property
    def issuer(self) -> NodeId:
        return self._GET_ISSUER(self)

    @property
    def expires(self) -> int | None:
        if self.EXPIRY is None:
            return None
        value: int = getattr(self, self.EXPIRY)
        return value

    @property
    def network_name(self) -> str:
        value: str = self.network  # type: ignore[attr-defined]
        return value


REGISTRY: dict[str, type[Message]] = {}
"""Every message kind, by name. Filled by @message as the message modules are imported."""


def message(kind: str, *, issuer: str, expiry: str | None = None) -> Callable[[type[M]], type[M]]:
    """Register a message dataclass (apply after @dataclass) under `kind`."""

    def apply(cls: type[M]) -> type[M]:
        if not (kind.isascii() and kind.isalpha() and kind.islower() and len(kind) <= KIND_MAX):
            raise TypeError(f"bad kind {kind!r}")
        if kind in REGISTRY:
            raise TypeError(f"kind {kind!r} registered twice")
        record(cls)
        names = [n for n, _ in cls._FIELDS]
        if names[0] != "network" or issuer.split(".")[0] not in names:
            raise TypeError(f"{cls.__name__}: the first field is `network` and the issuer is a field")
        if expiry is not None and expiry not in names:
            raise TypeError(f"{cls.__name__}: no expiry field {expiry!r}")
        cls.KIND, cls.ISSUER, cls.EXPIRY = kind, issuer, expiry
        cls._GET_ISSUER = operator.attrgetter(issuer)
        REGISTRY[kind] = cls
        return cls

    return apply
