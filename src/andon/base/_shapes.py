"""Frozen dataclasses from plain values and back, driven by their type hints.

The wire (msgpack maps between the supervisor and its workers) and the log (JSON objects in
``events.jsonl``) both carry frozen dataclasses as maps of their fields. Both read untrusted data,
so both must check every value; writing that check by hand for every class is how the two drift
and how a field gets forgotten. Here a decoder and an encoder are compiled once per class from its
fields' hints; the layer that owns the data only says how it words a problem (:class:`Rules`:
``expected an int, got str`` on the wire, ``must be an integer, not a string`` in the log) and
marks the fields that are not plain (:func:`shape`, in an ``Annotated`` hint).

Supported hints (anything else fails when the class is compiled, at import, never on data):

* ``str``, ``bool``, ``bytes``, ``int`` (a bool is refused: it is never a count or a pid),
  ``float`` (what an int becomes, and which floats are refused, is the :class:`Rules`' choice);
* ``Literal["a", "b", ...]`` of strings; ``StrEnum`` subclasses;
* ``X | None``: present and maybe null, or, with ``shape(omit=True)``, absent when ``None``;
* ``tuple[X, ...]`` (an array); ``dict[str, X]``; ``dict[str, Any]`` / ``Mapping[str, Any]``
  (JSON-like data that is not andon's, such as a tool's arguments or a model's usage);
* frozen dataclasses (a map of their fields), and unions of dataclasses that each carry a
  ``json_tag`` class variable with the same key (the tag picks the class: ``{"type": "text"}``).

A class may say more with class variables: ``json_tag = (key, value)``, a constant key written
first and checked on reading; ``json_keys``, the order of the keys when it is not the fields' (logs
are compared byte for byte); ``json_nest``, a key under which all its fields live. A field made by
:func:`catch_all` receives the keys the class does not know, and they are written back unchanged, so
that reading a newer writer's record and writing it again loses nothing.

A failed check raises :class:`Invalid` with the path of the bad value (``exit.code``,
``env_remove[2]``, ``arguments['a'][0]``); each layer turns it into its own error.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "CATCH_ALL",
    "EMPTY",
    "Codec",
    "Decoder",
    "Encoder",
    "Invalid",
    "Rules",
    "catch_all",
    "codec_for",
    "hint_codec",
    "shape",
]

Decoder = Callable[[object], Any]
"""Check a plain value and return it converted to the field's type, or raise :class:`Invalid`."""
Encoder = Callable[[Any], object]
"""A value as plain data (maps, lists, strings, numbers) for JSON or msgpack."""

EMPTY: Final[Mapping[str, Any]] = types.MappingProxyType({})
"""The catch-all of a value with no unknown keys: one shared, read-only empty mapping."""

_META: Final = "andon.shape"


class Invalid(Exception):
    """A value does not fit its field. Containers add their path segment as the error passes
    through them, so building a path costs nothing unless a check fails."""

    def __init__(self, problem: str, segment: str | None = None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.segments: list[str] = [] if segment is None else [segment]

    @property
    def path(self) -> str:
        """Where the bad value is, from the value checked (``.exit.code``, ``[2]``; ``""``: it)."""
        return "".join(reversed(self.segments))

    def describe(self) -> str:
        """``field 'grace.term_after': expected a float, got str`` (the wire's wording)."""
        path = self.path.lstrip(".")
        return f"field {path!r}: {self.problem}" if path else f"payload: {self.problem}"


@dataclass(frozen=True, slots=True)
class _Shape:
    """What :func:`shape` says of a field."""

    key: str | None = None
    omit: bool = False
    check: Callable[[Any], str | None] | None = None
    codec: tuple[Encoder, Decoder] | None = None
    catch_all: bool = False


def shape(
    *,
    key: str | None = None,
    omit: bool = False,
    check: Callable[[Any], str | None] | None = None,
    codec: tuple[Encoder, Decoder] | None = None,
) -> Any:
    """What a field that is not plain says of itself, in its hint: ``Annotated[int, shape(...)]``.

    ``key``: its name in the data, when it differs from the field's. ``omit``: the key is absent
    when the value is the field's default (``None``, ``False``) and may be absent when read.
    ``check``: returns a problem (``"must be a process id ..."``) or ``None``, after the type is
    checked. ``codec``: ``(encode, decode)`` for a type the hints cannot describe; ``decode``
    raises ``ValueError`` for bad data.
    """
    return _Shape(key, omit, check, codec)


CATCH_ALL: Final[Mapping[str, Any]] = types.MappingProxyType({_META: _Shape(catch_all=True)})
"""The ``metadata`` of a catch-all field written out with ``dataclasses.field`` (which the type
checker reads, so that it knows the field is keyword-only)."""


def catch_all() -> Any:
    """The field that keeps the keys a class does not know (``Mapping[str, Any]``, not in repr).

    It is keyword-only, so a base class can declare it and its subclasses' fields still come
    first in their constructors."""
    return dataclasses.field(
        default_factory=lambda: EMPTY,
        repr=False,
        kw_only=True,
        metadata=CATCH_ALL,
    )


class Rules:
    """How one layer words a problem and which plain values it accepts. Subclasses override.

    One instance a layer: it holds the codecs compiled under it.
    """

    open: bool = False
    """Whether unknown keys are accepted (kept by a :func:`catch_all` field, else dropped)."""
    sorted_choices: bool = False
    """Whether a Literal's words are listed sorted in an error (else in declared order)."""

    def __init__(self) -> None:
        self.codecs: dict[type[Any], Codec] = {}

    def kind(self, value: object) -> str:
        """The name of a value's type in an error: ``got str`` / ``not a string``."""
        raise NotImplementedError

    def wrong(self, want: str, value: object, *, nullable: bool = False) -> Invalid:
        """``value`` is not ``want`` (``str``, ``int``, ``float``, ``bool``, ``bytes``, ``map``,
        ``array``, ``json``); ``nullable``: null would have been fine."""
        raise NotImplementedError

    def missing(self, key: str) -> Invalid:
        raise NotImplementedError

    def unexpected(self, key: object, cls: type[Any]) -> Invalid:
        raise NotImplementedError

    def not_one_of(self, choices: tuple[str, ...], value: object) -> Invalid:
        raise NotImplementedError

    def not_member(self, cls: type[enum.StrEnum], value: object) -> Invalid:
        """``value`` is no value of the string enum ``cls``."""
        return self.not_one_of(tuple(m.value for m in cls), value)

    def not_tagged(self, key: str, want: str, value: object) -> Invalid:
        """A tagged class's ``key`` holds ``value``, not ``want``."""
        raise NotImplementedError

    def refused(self, exc: Exception) -> Invalid:
        """The class's own check (``__post_init__``) refused the values."""
        return Invalid(f"invalid: {exc}")

    def float_(self, value: float | int) -> float | int:
        """A number read for a ``float`` field (the type is checked); raise :class:`Invalid`."""
        return value

    def json(self, value: dict[Any, Any]) -> dict[Any, Any]:
        """A map read for a ``dict[str, Any]`` field; raise :class:`Invalid`."""
        return value


# --- compiling ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Key:
    """One key of a class's data: where it comes from and how it is read and written."""

    key: str
    name: str
    decode: Decoder
    encode: Encoder
    omit: bool
    default: Any


class Codec:
    """The compiled decoder and encoder of one dataclass under one :class:`Rules`."""

    def __init__(self, cls: type[Any], rules: Rules) -> None:
        rules.codecs[cls] = self  # before the fields: a class may contain itself
        self.cls = cls
        self.rules = rules
        hints = typing.get_type_hints(cls, include_extras=True)
        self.tag: tuple[str, str] | None = getattr(cls, "json_tag", None)
        self.nest: str | None = getattr(cls, "json_nest", None)
        self.catch_all: str | None = None
        keys: list[_Key] = []
        for f in dataclasses.fields(cls):
            spec = f.metadata.get(_META, _Shape())
            if spec.catch_all:
                self.catch_all = f.name
                continue
            hint = hints[f.name]
            if typing.get_origin(hint) is typing.Annotated:
                hint, *marks = typing.get_args(hint)
                spec = next((m for m in marks if isinstance(m, _Shape)), spec)
            if spec.omit and f.default is dataclasses.MISSING:
                raise TypeError(f"{cls.__name__}.{f.name} is omitted when default but has none")
            if spec.omit:
                # Absent is how an omitted field says None: an explicit null is refused.
                args = typing.get_args(hint)
                if type(None) in args and len(args) == 2:
                    hint = next(a for a in args if a is not type(None))
            decode, encode = _compile(hint, rules, spec)
            default = f.default
            keys.append(_Key(spec.key or f.name, f.name, decode, encode, spec.omit, default))
        self.keys = tuple(keys)
        self.known = frozenset(k.key for k in keys) | ({self.tag[0]} if self.tag else set())
        order: tuple[str, ...] | None = getattr(cls, "json_keys", None)
        by_key = {k.key: k for k in keys}
        if order is None:
            self.order: tuple[_Key | str, ...] = ((self.tag[0],) if self.tag else ()) + self.keys
        else:
            if set(order) != self.known:
                raise TypeError(f"{cls.__name__}.json_keys must list exactly its keys")
            self.order = tuple(k if self.tag and k == self.tag[0] else by_key[k] for k in order)

    # -- reading --

    def decode(self, value: object) -> Any:
        rules = self.rules
        if type(value) is not dict:
            raise rules.wrong("map", value)
        data: dict[str, Any] = value
        if self.nest is not None:
            data = self._unnest(data)
        if self.tag is not None:
            key, want = self.tag
            if key not in data:
                raise rules.missing(key)
            if data[key] != want:
                error = rules.not_tagged(key, want, data[key])
                error.segments.append(f".{key}")
                raise error
        kwargs: dict[str, Any] = {}
        present = 1 if self.tag is not None else 0
        for k in self.keys:
            if k.key not in data:
                if k.omit:
                    kwargs[k.name] = k.default
                    continue
                raise rules.missing(k.key)
            present += 1
            try:
                kwargs[k.name] = k.decode(data[k.key])
            except Invalid as exc:
                exc.segments.append(f".{k.key}")
                raise
        unknown: Mapping[str, Any] = EMPTY
        if len(data) > present:
            unknown = types.MappingProxyType({k: v for k, v in data.items() if k not in self.known})
            if not rules.open:
                raise rules.unexpected(next(iter(unknown)), self.cls)
        if self.catch_all is not None:
            kwargs[self.catch_all] = unknown
        try:
            return self.cls(**kwargs)
        except (TypeError, ValueError) as exc:  # the class's own __post_init__ check
            raise rules.refused(exc) from None

    def _unnest(self, outer: dict[str, Any]) -> dict[str, Any]:
        """The fields of a class that keeps them under one key (``{"kind", "error": {...}}``)."""
        assert self.nest is not None
        rules = self.rules
        allowed = {self.nest} | ({self.tag[0]} if self.tag else set())
        for key in outer:
            if key not in allowed:
                raise rules.unexpected(key, self.cls)
        if self.nest not in outer:
            raise rules.missing(self.nest)
        inner = outer[self.nest]
        if type(inner) is not dict:
            error = rules.wrong("map", inner)
            error.segments.append(f".{self.nest}")
            raise error
        if self.tag is not None and self.tag[0] in outer:
            return {self.tag[0]: outer[self.tag[0]], **inner}
        return dict(inner)

    # -- writing --

    def encode(self, obj: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k in self.order:
            if isinstance(k, str):  # the tag
                assert self.tag is not None
                out[k] = self.tag[1]
                continue
            value = getattr(obj, k.name)
            if k.omit and value == k.default:
                continue
            out[k.key] = k.encode(value)
        if self.nest is not None:
            inner = {key: v for key, v in out.items() if not self.tag or key != self.tag[0]}
            _add_unknown(inner, obj, self.catch_all)
            return {self.tag[0]: self.tag[1], self.nest: inner} if self.tag else {self.nest: inner}
        _add_unknown(out, obj, self.catch_all)
        return out


def _add_unknown(out: dict[str, Any], obj: Any, catch_all: str | None) -> None:
    # A known key always wins: a catch-all is what was read, and what was read was unknown.
    if catch_all is not None:
        for key, value in getattr(obj, catch_all).items():
            out.setdefault(key, value)


def _same(value: Any) -> Any:
    return value


def _compile(hint: object, rules: Rules, shape: _Shape = _Shape()) -> tuple[Decoder, Encoder]:
    """The decoder and encoder of one field's hint, with the field's own check and codec."""
    if shape.codec is not None:
        encode, inner = shape.codec

        def decode_custom(value: object) -> object:
            try:
                return inner(value)
            except ValueError as exc:
                raise Invalid(str(exc)) from None

        return _checked(decode_custom, shape.check), encode
    decode, encode = _compile_hint(hint, rules)
    return _checked(decode, shape.check), encode


def _checked(decode: Decoder, check: Callable[[Any], str | None] | None) -> Decoder:
    if check is None:
        return decode

    def decode_checked(value: object) -> object:
        out = decode(value)
        problem = check(out)
        if problem is not None:
            raise Invalid(problem)
        return out

    return decode_checked


def _compile_hint(hint: object, rules: Rules) -> tuple[Decoder, Encoder]:
    scalar = _scalar(hint, rules, nullable=False)
    if scalar is not None:
        return scalar, _same
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        others = tuple(a for a in args if a is not type(None))
        if len(others) == 1 and len(args) == 2:
            return _nullable(others[0], rules)
        if len(others) == len(args) and all(dataclasses.is_dataclass(a) for a in args):
            return _tagged_union(typing.cast(tuple[type[Any], ...], args), rules)
    elif origin is typing.Literal and all(type(a) is str for a in args):
        return _literal(typing.cast(tuple[str, ...], args), rules), _same
    elif origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return _array(*_compile_hint(args[0], rules), rules)
    elif origin in (dict, Mapping) and len(args) == 2 and args[0] is str:
        if args[1] is Any:
            return _json_map(rules), dict
        if origin is dict:
            return _str_map(*_compile_hint(args[1], rules), rules)
    elif isinstance(hint, type) and issubclass(hint, enum.StrEnum):
        return _str_enum(hint, rules), _same
    elif isinstance(hint, type) and dataclasses.is_dataclass(hint):
        codec = codec_for(hint, rules)
        return codec.decode, codec.encode
    raise TypeError(f"no decoder for fields of type {hint!r}")


def hint_codec(hint: object, rules: Rules) -> tuple[Decoder, Encoder]:
    """The decoder and encoder of any supported hint (a union of tagged classes, a tuple ...)."""
    return _compile_hint(hint, rules)


def codec_for(cls: type[Any], rules: Rules) -> Codec:
    """The compiled codec of ``cls`` under ``rules`` (compiled once, on first use)."""
    found = rules.codecs.get(cls)
    return found if found is not None else Codec(cls, rules)


# --- the forms ------------------------------------------------------------------------------

_PLAIN: Final[Mapping[object, str]] = {str: "str", int: "int", bool: "bool", bytes: "bytes"}


def _scalar(hint: object, rules: Rules, *, nullable: bool) -> Decoder | None:
    if hint is float:

        def decode_float(value: object) -> object:
            if value is None and nullable:
                return None
            if type(value) is not float and type(value) is not int:
                raise rules.wrong("float", value, nullable=nullable)
            return rules.float_(typing.cast(float, value))

        return decode_float
    want = _PLAIN.get(hint)
    if want is None:
        return None
    exact = typing.cast(type, hint)

    # type() rather than isinstance(): a bool is an int to Python but never a count or a pid.
    def decode_plain(value: object) -> object:
        if type(value) is exact or (value is None and nullable):
            return value
        raise rules.wrong(want, value, nullable=nullable)

    return decode_plain


def _nullable(inner: object, rules: Rules) -> tuple[Decoder, Encoder]:
    scalar = _scalar(inner, rules, nullable=True)
    if scalar is not None:
        return scalar, _same
    decode, encode = _compile_hint(inner, rules)

    def decode_nullable(value: object) -> object:
        return None if value is None else decode(value)

    def encode_nullable(value: object) -> object:
        return None if value is None else encode(value)

    return decode_nullable, encode_nullable


def _literal(allowed: tuple[str, ...], rules: Rules) -> Decoder:
    members = frozenset(allowed)
    listed = tuple(sorted(allowed)) if rules.sorted_choices else allowed

    def decode_literal(value: object) -> object:
        if type(value) is not str or value not in members:
            raise rules.not_one_of(listed, value)
        return value

    return decode_literal


def _str_enum(cls: type[enum.StrEnum], rules: Rules) -> Decoder:
    members = {m.value: m for m in cls}

    def decode_enum(value: object) -> object:
        member = members.get(value) if type(value) is str else None
        if member is None:
            raise rules.not_member(cls, value)
        return member

    return decode_enum


def _array(decode: Decoder, encode: Encoder, rules: Rules) -> tuple[Decoder, Encoder]:
    def decode_array(value: object) -> object:
        if type(value) is not list and type(value) is not tuple:
            raise rules.wrong("array", value)
        out = []
        for i, item in enumerate(typing.cast(list[object], value)):
            try:
                out.append(decode(item))
            except Invalid as exc:
                exc.segments.append(f"[{i}]")
                raise
        return tuple(out)

    def encode_array(value: Any) -> object:
        return [encode(item) for item in value]

    return decode_array, encode_array


def _str_map(decode: Decoder, encode: Encoder, rules: Rules) -> tuple[Decoder, Encoder]:
    def decode_map(value: object) -> object:
        if type(value) is not dict:
            raise rules.wrong("map", value)
        out: dict[str, object] = {}
        for key, item in typing.cast(dict[object, object], value).items():
            if type(key) is not str:
                raise Invalid(f"a map key is {rules.kind(key)}, not str")
            try:
                out[key] = decode(item)
            except Invalid as exc:
                exc.segments.append(f"[{_short(key)!r}]")
                raise
        return out

    def encode_map(value: Any) -> object:
        return {key: encode(item) for key, item in value.items()}

    return decode_map, encode_map


def _json_map(rules: Rules) -> Decoder:
    def decode_json(value: object) -> object:
        if type(value) is not dict:
            raise rules.wrong("map", value)
        return rules.json(value)

    return decode_json


def _tagged_union(classes: tuple[type[Any], ...], rules: Rules) -> tuple[Decoder, Encoder]:
    tags = [getattr(c, "json_tag", None) for c in classes]
    keys = {t[0] for t in tags if t is not None}
    if None in tags or len(keys) != 1:
        raise TypeError(f"the classes of {classes!r} need json_tag with one key")
    key = keys.pop()
    by_tag = {typing.cast(tuple[str, str], t)[1]: c for t, c in zip(tags, classes, strict=True)}
    listed = tuple(by_tag)

    def decode_union(value: object) -> object:
        if type(value) is not dict:
            raise rules.wrong("map", value)
        if key not in value:
            raise rules.missing(key)
        tag = value[key]
        cls = by_tag.get(tag) if type(tag) is str else None
        if cls is None:
            error = rules.not_one_of(listed, tag)
            error.segments.append(f".{key}")
            raise error
        return codec_for(cls, rules).decode(value)

    def encode_union(value: Any) -> object:
        return codec_for(type(value), rules).encode(value)

    return decode_union, encode_union


def _short(value: object) -> object:
    """A map key safe to put into an error message."""
    if type(value) is str and len(value) > 64:
        return value[:64] + "…"
    return value
