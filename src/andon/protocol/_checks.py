"""Generic validation of unpacked msgpack values against dataclass type hints.

A checker is compiled once per message class from its fields' hints, so adding a message never
means writing a validator. Supported field types (anything else fails at import time):

* ``str``, ``bool``, ``bytes``; ``int`` (a bool is rejected: it is never a count or a pid);
  ``float`` (an int is accepted and converted; NaN is rejected: every float field is a time or a
  duration, and NaN there means a bug upstream);
* ``X | None``; ``Literal["a", "b", ...]`` of strings; ``StrEnum`` subclasses;
* ``tuple[X, ...]`` (from an array), ``dict[str, X]``;
* ``dict[str, Any]``: JSON-like values only (None, bool, int, float, str, arrays, str-keyed
  maps), nested at most ``MAX_JSON_DEPTH`` levels; these are the tool's data, not andon's, so
  their floats are not checked for NaN;
* frozen dataclasses, from a map that has exactly their fields.

A failed check raises :class:`Invalid`, whose ``describe()`` names the field path
(``grace.term_after``, ``env_remove[2]``, ``arguments['a'][0]``).
"""

from __future__ import annotations

import dataclasses
import enum
import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Final

__all__ = ["MAX_JSON_DEPTH", "Checker", "Invalid", "checker_for", "kind", "preview"]

MAX_JSON_DEPTH: Final = 64
"""How deeply JSON-like values (a run's ``arguments``) may nest. Tool arguments come from a model's
JSON and are shallow; the bound keeps validation's recursion far from Python's limit."""

Checker = Callable[[object], object]
"""Validate a value unpacked from msgpack and return it converted to the field's type."""


class Invalid(Exception):
    """A value does not fit its field. Containers add their path segment as it propagates, so
    building a path costs nothing unless validation fails."""

    def __init__(self, problem: str, segment: str | None = None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.segments: list[str] = [] if segment is None else [segment]

    def describe(self) -> str:
        path = "".join(reversed(self.segments)).lstrip(".")
        return f"field {path!r}: {self.problem}" if path else f"payload: {self.problem}"


_KINDS: Final[Mapping[type, str]] = {
    type(None): "nil",
    bool: "bool",
    int: "int",
    float: "float",
    str: "str",
    bytes: "bytes",
    list: "array",
    dict: "map",
}


def kind(value: object) -> str:
    """The msgpack name of a value's type, for error messages."""
    return _KINDS.get(type(value), type(value).__name__)


def preview(value: object) -> object:
    """A value safe to put into an error message (never a deep or huge repr)."""
    if value is None or type(value) in (bool, int, float):
        return value
    if type(value) is str:
        return value if len(value) <= 64 else value[:64] + "…"
    return f"<{kind(value)}>"


def _expected(what: str, value: object) -> Invalid:
    return Invalid(f"expected {what}, got {kind(value)}")


def _check_str(value: object) -> object:
    if type(value) is not str:
        raise _expected("a str", value)
    return value


def _check_int(value: object) -> object:
    # type() rather than isinstance(): a bool is an int to Python but never a count or a pid.
    if type(value) is not int:
        raise _expected("an int", value)
    return value


def _check_float(value: object) -> object:
    if type(value) is float:
        # Every float field is a time, a duration or an interval: NaN means a bug upstream.
        if math.isnan(value):
            raise Invalid("expected a float, got NaN")
        return value
    if type(value) is int:
        return float(value)
    raise _expected("a float", value)


def _check_bool(value: object) -> object:
    if type(value) is not bool:
        raise _expected("a bool", value)
    return value


def _check_bytes(value: object) -> object:
    if type(value) is not bytes:
        raise _expected("bytes", value)
    return value


def _check_json(value: object, depth: int = 0) -> object:
    """JSON-like values: None, bool, int, float, str, arrays and str-keyed maps, bounded depth."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if depth >= MAX_JSON_DEPTH and type(value) in (list, dict):
        raise Invalid(f"nests deeper than {MAX_JSON_DEPTH} levels")
    if type(value) is list:
        for i, item in enumerate(value):
            try:
                _check_json(item, depth + 1)
            except Invalid as exc:
                exc.segments.append(f"[{i}]")
                raise
        return value
    if type(value) is dict:
        for key, item in value.items():
            if type(key) is not str:
                raise Invalid(f"a map key is {kind(key)}, not str")
            try:
                _check_json(item, depth + 1)
            except Invalid as exc:
                exc.segments.append(f"[{preview(key)!r}]")
                raise
        return value
    raise _expected("a JSON value", value)


_SCALARS: Final[Mapping[object, Checker]] = {
    str: _check_str,
    int: _check_int,
    float: _check_float,
    bool: _check_bool,
    bytes: _check_bytes,
}


def checker_for(hint: object) -> Checker:
    """Compile a checker for one type hint. Unsupported hints fail at import, not on the wire."""
    scalar = _SCALARS.get(hint)
    if scalar is not None:
        return scalar
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        others = [a for a in args if a is not type(None)]
        if len(others) == 1 and len(args) == 2:
            return _optional(checker_for(others[0]))
    elif origin is typing.Literal:
        if all(type(a) is str for a in args):
            return _literal(tuple(typing.cast(tuple[str, ...], args)))
    elif origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return _homogeneous_tuple(checker_for(args[0]))
    elif origin is dict:
        if len(args) == 2 and args[0] is str:
            if args[1] is Any:
                return _json_map
            return _str_map(checker_for(args[1]))
    elif isinstance(hint, type) and issubclass(hint, enum.StrEnum):
        return _str_enum(hint)
    elif isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return dataclass_checker(hint)
    raise TypeError(f"the protocol codec does not support fields of type {hint!r}")


def _optional(inner: Checker) -> Checker:
    def check(value: object) -> object:
        return None if value is None else inner(value)

    return check


def _literal(allowed: tuple[str, ...]) -> Checker:
    members = frozenset(allowed)
    spelled = ", ".join(repr(a) for a in allowed)

    def check(value: object) -> object:
        if type(value) is not str or value not in members:
            got = repr(preview(value)) if type(value) is str else kind(value)
            raise Invalid(f"expected one of {spelled}, got {got}")
        return value

    return check


def _str_enum(cls: type[enum.StrEnum]) -> Checker:
    members = {m.value: m for m in cls}

    def check(value: object) -> object:
        member = members.get(value) if type(value) is str else None
        if member is None:
            got = repr(preview(value)) if type(value) is str else kind(value)
            raise Invalid(f"expected a {cls.__name__} value, got {got}")
        return member

    return check


def _homogeneous_tuple(inner: Checker) -> Checker:
    def check(value: object) -> object:
        if type(value) is not list and type(value) is not tuple:
            raise _expected("an array", value)
        out = []
        for i, item in enumerate(typing.cast(list[object], value)):
            try:
                out.append(inner(item))
            except Invalid as exc:
                exc.segments.append(f"[{i}]")
                raise
        return tuple(out)

    return check


def _str_map(inner: Checker) -> Checker:
    def check(value: object) -> object:
        if type(value) is not dict:
            raise _expected("a map", value)
        out: dict[str, object] = {}
        for key, item in typing.cast(dict[object, object], value).items():
            if type(key) is not str:
                raise Invalid(f"a map key is {kind(key)}, not str")
            try:
                out[key] = inner(item)
            except Invalid as exc:
                exc.segments.append(f"[{preview(key)!r}]")
                raise
        return out

    return check


def _json_map(value: object) -> object:
    if type(value) is not dict:
        raise _expected("a map", value)
    return _check_json(value)


def dataclass_checker(cls: type[Any]) -> Checker:
    """A checker that builds ``cls`` from a map holding exactly its fields.

    A ``ValueError`` or ``TypeError`` from the class's own ``__post_init__`` (``GracePolicy``
    refuses negative seconds) is reported like any other invalid field.
    """
    hints = typing.get_type_hints(cls)
    fields: dict[str, Checker] = {
        f.name: checker_for(hints[f.name]) for f in dataclasses.fields(cls)
    }

    def check(value: object) -> object:
        if type(value) is not dict:
            raise _expected("a map", value)
        data = typing.cast(dict[object, object], value)
        kwargs: dict[str, object] = {}
        for name, inner in fields.items():
            if name not in data:
                raise Invalid("missing", f".{name}")
            try:
                kwargs[name] = inner(data[name])
            except Invalid as exc:
                exc.segments.append(f".{name}")
                raise
        if len(data) != len(fields):
            unexpected = next(k for k in data if k not in fields)
            raise Invalid(
                f"unexpected ({cls.__name__} has no such field)", f".{preview(unexpected)}"
            )
        try:
            return cls(**kwargs)
        except (TypeError, ValueError) as exc:  # a __post_init__ check, e.g. GracePolicy's
            raise Invalid(f"invalid: {exc}") from None

    return check
