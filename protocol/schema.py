"""Field codecs and the record machinery behind every message class.

A record is a frozen dataclass whose fields each carry a codec (in the field's metadata). The
codec says how the field's Python value is checked, how it is written to the wire (inside a
msgpack array, in field order) and read back, and how it looks in JSON (inspect, vectors).

Construction validates every field (`check`), then the rules between fields (`_validate`).
Decoding must accept exactly what construction accepts, and it is the hot path of verification,
so each record class gets a generated decoder (`_compile_from_wire`) with every codec's checks
inlined; `from_wire_reference` is the plain equivalent (convert each field with `dec`, then
construct) that the tests hold the generated one to. Every failure is InvalidMessage.
"""

from __future__ import annotations

import dataclasses
import operator
import re
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Generic, TypeVar

from .errors import InvalidMessage
from .ids import DIGEST_SIZE, KEY_SIZE, Digest, InvalidId, NodeId

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

    def inline(self, c: str, bind: Callable[[object], str]) -> list[str]:
        """Source lines (for Record's compiled decoder) turning wire value `x` into checked `v`;
        `c` is an expression naming this codec, `bind(obj)` names any other object the lines need."""
        return [f"v = {c}.decode(x)"]

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

    def inline(self, c: str, bind: Callable[[object], str]) -> list[str]:
        return [f"if type(x) is not int or not {self.min} <= x <= {self.max}: {c}.check(x)", "v = x"]

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

    def describe(self) -> str:
        return "bool"


class Text(Codec[str]):
    """UTF-8 text, at most `max_bytes` encoded bytes, never NUL; optionally a validator."""

    def __init__(self, max_bytes: int, min_len: int = 0,
                 rule: Callable[[str], str | None] | None = None, label: str = "") -> None:
        self.max, self.min, self.rule, self.label = max_bytes, min_len, rule, label

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
        if type(w) is not str or len(w) * 4 > self.max or len(w) < self.min or "\x00" in w or self.rule:
            self.check(w)
        return w

    def inline(self, c: str, bind: Callable[[object], str]) -> list[str]:
        lines = [f"if type(x) is not str or len(x) * 4 > {self.max} or len(x) < {self.min} or NUL in x: "
                 f"{c}.check(x)"]
        if self.rule is not None:
            lines.append(f"if {c}.rule(x) is not None: {c}.check(x)")
        return [*lines, "v = x"]

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

    def inline(self, c: str, bind: Callable[[object], str]) -> list[str]:
        return [f"if type(x) is not str or x not in {c}.choices: {c}.check(x)", "v = x"]

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

    def inline(self, c: str, bind: Callable[[object], str]) -> list[str]:
        return [f"if type(x) is not bytes or not {self.min} <= len(x) <= {self.max}: {c}.check(x)", "v = x"]

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

    def inline(self, c: str, bind: Callable[[object], str]) -> list[str]:
        return [f"if type(x) is not bytes or len(x) != {KEY_SIZE}: {c}.dec(x)",
                "v = new(NodeId)", "set_node_raw(v, x)"]

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

    def inline(self, c: str, bind: Callable[[object], str]) -> list[str]:
        return [f"if type(x) is not bytes or len(x) != {DIGEST_SIZE}: {c}.dec(x)",
                "v = new(Digest)", "set_digest_raw(v, x)"]

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

    def inline(self, c: str, bind: Callable[[object], str]) -> list[str]:
        inner = ["    " + line for line in self.inner.inline(f"{c}.inner", bind)]
        return ["if x is None:", "    v = None", "else:", *inner]

    def to_json(self, v: Any) -> Any:
        return None if v is None else self.inner.to_json(v)

    def from_json(self, j: object) -> Any:
        return None if j is None else self.inner.from_json(j)

    def describe(self) -> str:
        return f"nil or {self.inner.describe()}"


class Seq(Codec[tuple[Any, ...]]):
    """An array of at most `max_items` values; optionally strictly increasing by `order_key`."""

    def __init__(self, inner: Codec[Any], max_items: int, min_items: int = 0,
                 order_key: Callable[[Any], Any] | None = None) -> None:
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

    def element_decoder(self) -> Callable[[object], Any]:
        inner = self.inner
        return inner.cls.from_wire if isinstance(inner, Sub) else inner.decode

    def inline(self, c: str, bind: Callable[[object], str]) -> list[str]:
        lines = [f"if type(x) is not tuple or not {self.min} <= len(x) <= {self.max}: {c}.decode(x)"]
        inner = self.inner
        if type(inner) is Text and inner.rule is None:
            # the wire array is already a tuple of the values: check them in place, keep it as is
            lines += ["for y in x:",
                      f"    if type(y) is not str or len(y) * 4 > {inner.max} or len(y) < {inner.min} "
                      f"or NUL in y: {c}.inner.check(y)",
                      "v = x"]
        else:
            decode = _compiled(inner.cls) if isinstance(inner, Sub) else inner.decode
            lines.append(f"v = tuple([{bind(decode)}(y) for y in x])")
        if self.order_key is not None:
            # strictly increasing exactly when the keys equal their sorted set
            lines += ["if len(v) > 1:",
                      f"    k = list(map({bind(self.order_key)}, v))",
                      f"    if k != sorted(set(k)): {c}.check(v)"]
        return lines

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

    def inline(self, c: str, bind: Callable[[object], str]) -> list[str]:
        return [f"v = {c}.from_wire(x)"]

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
"""Nested records (Sub fields) up to this depth are decoded inline, without a call of their own."""


def _compile_from_wire(cls: type[R]) -> Callable[[object], R]:
    """Generate the decoder of one record class: the checks of every field's codec inlined, nested
    records inlined too, each record's values stored into a mutable twin that then becomes the frozen
    class (a frozen dataclass's __init__ would redo every check at several times the cost). Decoding
    is the hot path of verification, right after the signature check. Any refusal is re-explained by
    the reference decoder (`_explain`), so both raise the same error."""
    ns: dict[str, Any] = {
        "InvalidMessage": InvalidMessage, "cls": cls, "new": object.__new__, "NUL": "\x00",
        "NodeId": NodeId, "Digest": Digest, "check_shape": _check_shape, "explain": _explain,
        "set_node_raw": _slot_setter(NodeId, "raw"), "set_digest_raw": _slot_setter(Digest, "raw"),
    }
    names: dict[int, str] = {}

    def bind(obj: object) -> str:
        name = names.get(id(obj))
        if name is None:
            name = names[id(obj)] = f"k{len(names)}"
            ns[name] = obj
        return name

    lines = ["def from_wire(wire):", "    try:"]
    lines += ["        " + line for line in _record_lines(cls, "wire", "obj", bind, 0)]
    lines += [
        "    except InvalidMessage as e:",
        "        raise explain(cls, wire, e) from None",
        "    return obj",
    ]
    exec(compile("\n".join(lines), f"<{cls.__name__}.from_wire>", "exec"), ns)
    fn: Callable[[object], R] = ns["from_wire"]
    fn.__qualname__ = f"{cls.__name__}.from_wire"
    fn.__doc__ = Record.from_wire.__doc__
    return fn


SMALL_RECORD = 5
"""Records with at most this many fields are filled through their frozen slots' setters; larger ones
through a mutable twin whose class is then switched (one costly step, then cheap stores)."""


def _record_lines(cls: type[Record], src: str, dst: str, bind: Callable[[object], str],
                  depth: int) -> list[str]:
    """Lines that decode the wire array in variable `src` into a `cls` in variable `dst`."""
    c = bind(cls)
    small = len(cls._FIELDS) <= SMALL_RECORD
    lines = [f"if type({src}) is not tuple or len({src}) != {len(cls._FIELDS)}: check_shape({c}, {src})",
             f"{dst} = new({c if small else bind(_mutable_twin(cls))})"]

    def store(name: str, value: str) -> str:
        if small:
            return f"{bind(_slot_setter(cls, name))}({dst}, {value})"
        return f"{dst}.{name} = {value}"

    for i, (name, codec) in enumerate(cls._FIELDS):
        if isinstance(codec, Sub) and depth < MAX_INLINE_DEPTH:
            inner_src, inner_dst = f"w{depth + 1}", f"o{depth + 1}"
            lines.append(f"{inner_src} = {src}[{i}]")
            lines += _record_lines(codec.cls, inner_src, inner_dst, bind, depth + 1)
            lines.append(store(name, inner_dst))
        else:
            lines.append(f"x = {src}[{i}]")
            lines += codec.inline(bind(codec), bind)
            lines.append(store(name, "v"))
    if not small:
        lines.append(f"{dst}.__class__ = {c}")
    if cls._validate is not Record._validate:
        lines.append(f"{dst}._validate()")
    return lines


def _mutable_twin(cls: type) -> type:
    """A class with the same slots and bases as the frozen `cls` but no __setattr__ guard: the
    decoder fills one with plain (fast) attribute stores, then re-labels it as `cls`, which the
    identical layout allows. Setting frozen slots one by one costs several times more."""
    return type(f"{cls.__name__}Builder", cls.__bases__, {"__slots__": cls.__dict__["__slots__"]})


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
    return {bytes: "bin", str: "str", int: "int", bool: "bool", tuple: "array", float: "float",
            type(None): "nil", dict: "map"}.get(type(v), type(v).__name__)


def _show(v: object) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:60] + "..."


M = TypeVar("M", bound="Message")

KIND_MAX = 16
NETWORK_MAX = 32


_NETWORK_NAME = re.compile(r"[a-z0-9._-]+")


def _network_rule(s: str) -> str | None:
    if _NETWORK_NAME.fullmatch(s) is None:
        return f"a network name is 1..{NETWORK_MAX} of a-z 0-9 - . _; got {_show(s)}"
    return None


NETWORK = Text(NETWORK_MAX, min_len=1, rule=_network_rule, label="network name (section 3)")
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
