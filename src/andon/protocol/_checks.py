"""How the wire checks what it unpacks: the wording of :mod:`andon.base`'s shape checks for msgpack.

A checker is compiled once per message class from its fields' hints (``andon.base`` lists the
supported forms), so adding a message never means writing a validator. What the wire adds:

* msgpack's names in errors: ``expected an int, got bool``, ``field 'grace.term_after': ...``;
* a ``float`` field takes an int (converted) and refuses NaN: every float of a message is a time,
  a duration or an interval, and NaN there means a bug upstream (``inf`` is a real "never");
* ``dict[str, Any]`` holds JSON-like values only (None, bool, int, float, str, arrays, str-keyed
  maps), nested at most ``MAX_JSON_DEPTH`` levels; these are the tool's data, not andon's, so their
  floats are not checked for NaN;
* a message is exactly its fields: a missing or an unknown key is refused.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from typing import Any, Final

from andon.base import Invalid, Rules, codec_for

__all__ = ["MAX_JSON_DEPTH", "WIRE", "Checker", "dataclass_checker", "kind", "preview"]

MAX_JSON_DEPTH: Final = 64
"""How deeply JSON-like values (a run's ``arguments``) may nest. Tool arguments come from a model's
JSON and are shallow; the bound keeps validation's recursion far from Python's limit."""

Checker = Callable[[object], object]
"""Validate a value unpacked from msgpack and return it converted to the field's type."""

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

_WANTS: Final[Mapping[str, str]] = {
    "str": "a str",
    "int": "an int",
    "float": "a float",
    "bool": "a bool",
    "bytes": "bytes",
    "map": "a map",
    "array": "an array",
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


def _got(value: object) -> object:
    return repr(preview(value)) if type(value) is str else kind(value)


def _check_json(value: object, depth: int = 0) -> None:
    """JSON-like values: None, bool, int, float, str, arrays and str-keyed maps, bounded depth."""
    if value is None or type(value) in (str, int, float, bool):
        return
    if depth >= MAX_JSON_DEPTH and type(value) in (list, dict):
        raise Invalid(f"nests deeper than {MAX_JSON_DEPTH} levels")
    if type(value) is list:
        for i, item in enumerate(value):
            try:
                _check_json(item, depth + 1)
            except Invalid as exc:
                exc.segments.append(f"[{i}]")
                raise
        return
    if type(value) is dict:
        for key, item in value.items():
            if type(key) is not str:
                raise Invalid(f"a map key is {kind(key)}, not str")
            try:
                _check_json(item, depth + 1)
            except Invalid as exc:
                exc.segments.append(f"[{preview(key)!r}]")
                raise
        return
    raise Invalid(f"expected a JSON value, got {kind(value)}")


class _WireRules(Rules):
    def kind(self, value: object) -> str:
        return kind(value)

    def wrong(self, want: str, value: object, *, nullable: bool = False) -> Invalid:
        return Invalid(f"expected {_WANTS[want]}, got {kind(value)}")

    def missing(self, key: str) -> Invalid:
        return Invalid("missing", f".{key}")

    def unexpected(self, key: object, cls: type[Any]) -> Invalid:
        return Invalid(f"unexpected ({cls.__name__} has no such field)", f".{preview(key)}")

    def not_one_of(self, choices: tuple[str, ...], value: object) -> Invalid:
        spelled = ", ".join(repr(c) for c in choices)
        return Invalid(f"expected one of {spelled}, got {_got(value)}")

    def not_member(self, cls: type[enum.StrEnum], value: object) -> Invalid:
        return Invalid(f"expected a {cls.__name__} value, got {_got(value)}")

    def not_tagged(self, key: str, want: str, value: object) -> Invalid:
        return Invalid(f"expected {want!r}, got {_got(value)}")

    def float_(self, value: float | int) -> float | int:
        if value != value:  # NaN
            raise Invalid("expected a float, got NaN")
        return float(value)

    def json(self, value: dict[Any, Any]) -> dict[Any, Any]:
        _check_json(value)
        return value


WIRE: Final[Rules] = _WireRules()
"""The wire's rules; every message class is compiled under them."""


def dataclass_checker(cls: type[Any]) -> Checker:
    """A checker that builds ``cls`` from a map holding exactly its fields.

    A ``ValueError`` or ``TypeError`` from the class's own ``__post_init__`` (``GracePolicy``
    refuses negative seconds) is reported like any other invalid field.
    """
    return codec_for(cls, WIRE).decode
