"""Tools: the ``@andon.tool`` decorator, JSON schemas from type hints, argument validation.

A registry travels to local workers when they start (pickled for the forkserver: a tool of an
importable module by its name, a tool of a user's script by value, with dill), so a tool defined
in a user's module runs in the worker without being named anywhere else.
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, final, overload

from andon.base import GracePolicy

__all__ = [
    "ArgumentError",
    "Tool",
    "ToolKind",
    "ToolRegistry",
    "schema_from_signature",
    "tool",
    "validate_arguments",
]

# "supervisor" tools (a subagent) run in the supervisor process; workers never receive them.
ToolKind = Literal["shell", "python", "supervisor"]

_JSON_TYPES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


@final
@dataclass(frozen=True)
class Tool:
    """A tool the model can call.

    ``kind`` is ``shell`` for commands run in their own process group by the worker (``bash``),
    ``python`` for a function run in a call process forked from the worker (``_pycall``).
    """

    name: str
    description: str
    parameters: Mapping[str, Any]  # JSON schema (type object)
    fn: Callable[..., Any] | None = None
    kind: ToolKind = "python"
    parallel_safe: bool = False
    timeout: float | None = None  # seconds; None = the agent's default
    max_timeout: float | None = None  # cap on a per-call "timeout" argument
    grace: GracePolicy | None = None  # None = the agent's default
    takes_signal: bool = False
    is_async: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __reduce_ex__(self, protocol: Any) -> Any:
        """Pickled by name where the tool is an attribute of an importable module under its
        function's name (``@tool`` at module level): the worker imports the module and takes that
        very tool. Otherwise field by field, as any dataclass (then a function that its module
        does not name, such as ``@tool``'s, takes dill to pickle: by value)."""
        fn = self.fn
        module_name = getattr(fn, "__module__", None)
        qualname = getattr(fn, "__qualname__", "")
        module = sys.modules.get(module_name) if isinstance(module_name, str) else None
        if module is not None and module_name != "__main__" and "<" not in qualname:
            found: Any = module
            for part in qualname.split("."):
                found = getattr(found, part, None)
            if found is self:
                return (_tool_named, (module_name, qualname))
        return object.__reduce_ex__(self, protocol)

    def openai_schema(self) -> dict[str, Any]:
        """The tool as an OpenAI ``tools`` entry."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": dict(self.parameters),
            },
        }


def _tool_named(module_name: str, qualname: str) -> Tool:
    """The tool ``module_name`` names ``qualname`` (how a tool pickled by name is loaded)."""
    found: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        found = getattr(found, part)
    if not isinstance(found, Tool):
        raise TypeError(f"{module_name}.{qualname} is no longer a tool")
    return found


class ArgumentError(ValueError):
    """Arguments that are not JSON or fail the schema; ``field`` names the offending field."""

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


@overload
def tool(
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    parallel_safe: bool = False,
    timeout: float | None = None,
    grace: GracePolicy | None = None,
    description: str | None = None,
) -> Tool: ...


@overload
def tool(
    fn: None = None,
    *,
    name: str | None = None,
    parallel_safe: bool = False,
    timeout: float | None = None,
    grace: GracePolicy | None = None,
    description: str | None = None,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    parallel_safe: bool = False,
    timeout: float | None = None,
    grace: GracePolicy | None = None,
    description: str | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Declare a Python tool; its JSON schema comes from the type hints.

    ``@andon.tool`` or ``@andon.tool(name=..., parallel_safe=..., timeout=..., grace=...)``. The
    function may be sync or async; a keyword-only ``signal`` parameter receives the call's
    ``AbortSignal`` (a sync function runs in a thread and should poll ``signal.aborted`` or block
    on ``signal.wait_blocking``).
    """

    def wrap(f: Callable[..., Any]) -> Tool:
        sig = inspect.signature(f)
        return Tool(
            name=name or f.__name__,
            description=description or inspect.getdoc(f) or "",
            parameters=schema_from_signature(f),
            fn=f,
            kind="python",
            parallel_safe=parallel_safe,
            timeout=timeout,
            grace=grace,
            takes_signal="signal" in sig.parameters,
            is_async=inspect.iscoroutinefunction(f),
        )

    if fn is not None:
        return wrap(fn)
    return wrap


def schema_from_signature(fn: Callable[..., Any]) -> dict[str, Any]:
    """A JSON schema (type object) for ``fn``'s parameters, ``signal`` excluded."""
    hints = typing.get_type_hints(fn)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for param in inspect.signature(fn).parameters.values():
        if param.name == "signal" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        hint = hints.get(param.name, str)
        properties[param.name] = _schema_of(hint, f"{fn.__name__}({param.name})")
        if param.default is inspect.Parameter.empty:
            required.append(param.name)
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


def _schema_of(hint: Any, where: str) -> dict[str, Any]:
    if hint in _JSON_TYPES:
        return {"type": _JSON_TYPES[hint]}
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is Literal:
        return {"enum": list(args)}
    if origin in (list, tuple) and args:
        return {"type": "array", "items": _schema_of(args[0], where)}
    if origin in (dict, Mapping) or hint is dict:
        return {"type": "object"}
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            inner = _schema_of(options[0], where)
            if "type" in inner:
                return {**inner, "type": [inner["type"], "null"]}
            return inner
    raise TypeError(f"{where}: type {hint!r} has no JSON schema mapping in andon")


def validate_arguments(schema: Mapping[str, Any], raw: str | Mapping[str, Any]) -> dict[str, Any]:
    """Parse (if needed) and check arguments against a tool schema of the subset we generate."""
    if isinstance(raw, str):
        try:
            value = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError as e:
            raise ArgumentError(
                f"arguments are not valid JSON: {e.msg} at position {e.pos}"
            ) from None
    else:
        value = dict(raw)
    if not isinstance(value, dict):
        raise ArgumentError(f"arguments must be a JSON object, not {type(value).__name__}")
    properties: Mapping[str, Any] = schema.get("properties", {})
    for name in schema.get("required", ()):
        if name not in value:
            raise ArgumentError(f"missing required field {name!r}", field=name)
    for name, item in value.items():
        if name not in properties:
            if schema.get("additionalProperties", True) is False:
                raise ArgumentError(f"unexpected field {name!r}", field=name)
            continue
        _check(item, properties[name], name)
    return value


def _check(value: Any, schema: Mapping[str, Any], path: str) -> None:
    if "enum" in schema and value not in schema["enum"]:
        raise ArgumentError(f"field {path!r} must be one of {schema['enum']!r}", field=path)
    expected = schema.get("type")
    if expected is None:
        return
    allowed = expected if isinstance(expected, list) else [expected]
    if not any(_is_type(value, t) for t in allowed):
        shown = " or ".join(allowed)
        raise ArgumentError(
            f"field {path!r} must be {shown}, not {_json_type_name(value)}", field=path
        )
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            _check(item, schema["items"], f"{path}[{i}]")


def _is_type(value: Any, name: str) -> bool:
    match name:
        case "string":
            return isinstance(value, str)
        case "integer":
            return isinstance(value, int) and not isinstance(value, bool)
        case "number":
            return isinstance(value, int | float) and not isinstance(value, bool)
        case "boolean":
            return isinstance(value, bool)
        case "array":
            return isinstance(value, list)
        case "object":
            return isinstance(value, dict)
        case "null":
            return value is None
    return False


def _json_type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


@final
class ToolRegistry:
    """An ordered set of tools by name."""

    def __init__(self, tools: typing.Iterable[Tool | Callable[..., Any]] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for t in tools:
            self.add(t)

    def add(self, item: Tool | Callable[..., Any]) -> Tool:
        """Add a tool (a plain function is wrapped as ``@tool`` would); names must be unique."""
        t = item if isinstance(item, Tool) else tool(item)
        if t.name in self._tools:
            raise ValueError(f"a tool named {t.name!r} is already registered")
        self._tools[t.name] = t
        return t

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._tools)

    def for_workers(self) -> ToolRegistry:
        """The tools a worker can run (supervisor tools stay in the supervisor)."""
        return ToolRegistry(t for t in self._tools.values() if t.kind != "supervisor")

    def openai_schemas(self) -> list[dict[str, Any]]:
        return [t.openai_schema() for t in self._tools.values()]
