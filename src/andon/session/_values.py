"""The values records carry: messages, content blocks, tool outcomes and turn-end reasons.

Every value is frozen and converts to and from the exact JSON of docs/log-format.md (``to_json`` /
``from_json``). Absent optional fields are omitted on disk, never written as ``null``, except where
the format shows ``null`` (``exit.code``, ``exit.signal``). Keys this version does not know are
kept in ``extra`` and written back unchanged: reading a record and writing it again loses nothing.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar, Final, Literal, TypeAlias, assert_never

from andon.base import (
    MESSAGE_SOURCES,
    Cause,
    MessageSource,
    cause_from_dict,
)

__all__ = [
    "AssistantReply",
    "Block",
    "Blocked",
    "Completed",
    "ExitStatus",
    "Interrupted",
    "MaxTokens",
    "ModelInfo",
    "ReasoningBlock",
    "TextBlock",
    "ToolCallBlock",
    "ToolErrorInfo",
    "TurnAborted",
    "TurnEndReason",
    "TurnFailed",
    "UserMessage",
    "reason_from_json",
]

EMPTY: Mapping[str, Any] = MappingProxyType({})

# --- bounds of the numbers a log hands to the system ---------------------------------------------

MAX_SECONDS: Final = 253_402_300_799
"""9999-12-31 23:59:59 UTC. Every float a record holds is seconds (a unix time or a span), and
``andon log`` formats them with ``time.gmtime``, which fails beyond this (or on infinity)."""

PID_LIMIT: Final = 1 << 22
"""Linux's ``PID_MAX_LIMIT``: ``pid_max`` can be set no higher, so every process id is below it."""

MAX_EXIT_CODE: Final = 255
"""What ``waitid`` reports of an exit status: its low 8 bits."""


def _show(value: int | float) -> str:
    """A number for an error message, short however large it is."""
    if type(value) is int and value.bit_length() > 64:
        return f"a {value.bit_length()}-bit integer"
    return repr(value)


def is_pid(value: object) -> bool:
    """Whether ``value`` is a process id a kernel can hand out (a positive int below the limit)."""
    return type(value) is int and 0 < value < PID_LIMIT


def check_pid(value: int, where: str) -> None:
    """``ValueError`` unless ``value`` is a process id: a log's ids reach ``kill`` and
    ``pidfd_open`` (crash repair), where 0 or a negative number means a whole process group."""
    if not is_pid(value):
        raise ValueError(
            f"{where} must be a process id from 1 to {PID_LIMIT - 1}, not {_show(value)}"
        )


def no_extra() -> Mapping[str, Any]:
    """Default factory for ``extra``: one shared, read-only empty mapping."""
    return EMPTY


def extra_field() -> Any:
    """The ``extra`` field of a record class (a dataclass field cannot be one shared object)."""
    return field(default_factory=no_extra, repr=False)


def _kind_of(value: object) -> str:
    match value:
        case None:
            return "null"
        case bool():
            return "a boolean"
        case int() | float():
            return "a number"
        case str():
            return "a string"
        case list():
            return "an array"
        case dict():
            return "an object"
        case _:
            return type(value).__name__


class Fields:
    """Reads the fields of one JSON object; every error names where the bad value is.

    Remembers which keys were read so that :meth:`extra` can return the ones this version does
    not know. Errors are ``ValueError`` (the reader turns them into ``LogCorrupted``).
    """

    __slots__ = ("_obj", "_read", "where")

    def __init__(self, obj: object, where: str) -> None:
        if not isinstance(obj, dict):
            raise ValueError(f"{where} must be an object, not {_kind_of(obj)}")
        self._obj: dict[str, Any] = obj
        self._read: list[str] = []
        self.where = where

    def _take(self, key: str) -> Any:
        try:
            value = self._obj[key]
        except KeyError:
            raise ValueError(f"{self.where} has no {key!r}") from None
        self._read.append(key)
        return value

    def _bad(self, key: str, want: str, value: object) -> ValueError:
        return ValueError(f"{self.where}.{key} must be {want}, not {_kind_of(value)}")

    def has(self, key: str) -> bool:
        return key in self._obj

    def req_int(self, key: str) -> int:
        value = self._take(key)
        if type(value) is not int:
            raise self._bad(key, "an integer", value)
        return value

    def req_num(self, key: str) -> float:
        """A number of seconds (every float of a record is a unix time or a span): finite,
        from 0 to :data:`MAX_SECONDS`."""
        value = self._take(key)
        if type(value) is not float and type(value) is not int:
            raise self._bad(key, "a number", value)
        if not 0 <= value <= MAX_SECONDS:  # NaN fails this comparison too
            raise ValueError(
                f"{self.where}.{key} must be a number of seconds from 0 to {MAX_SECONDS}, "
                f"not {_show(value)}"
            )
        return value

    def req_str(self, key: str) -> str:
        value = self._take(key)
        if type(value) is not str:
            raise self._bad(key, "a string", value)
        return value

    def req_bool(self, key: str) -> bool:
        value = self._take(key)
        if type(value) is not bool:
            raise self._bad(key, "true or false", value)
        return value

    def req_obj(self, key: str) -> dict[str, Any]:
        value = self._take(key)
        if not isinstance(value, dict):
            raise self._bad(key, "an object", value)
        return value

    def req_list(self, key: str) -> list[Any]:
        value = self._take(key)
        if not isinstance(value, list):
            raise self._bad(key, "an array", value)
        return value

    def req_choice(self, key: str, choices: frozenset[str]) -> str:
        value = self.req_str(key)
        if value not in choices:
            raise ValueError(
                f"{self.where}.{key} is {value!r}, not one of {', '.join(sorted(choices))}"
            )
        return value

    def opt_int(self, key: str) -> int | None:
        return self.req_int(key) if key in self._obj else None

    def opt_str(self, key: str) -> str | None:
        return self.req_str(key) if key in self._obj else None

    def opt_obj(self, key: str) -> dict[str, Any] | None:
        return self.req_obj(key) if key in self._obj else None

    def opt_choice(self, key: str, choices: frozenset[str]) -> str | None:
        return self.req_choice(key, choices) if key in self._obj else None

    def nullable_int(self, key: str) -> int | None:
        """A field that is always present but may be ``null`` (``exit.code``)."""
        value = self._take(key)
        if value is None or type(value) is int:
            return value
        raise self._bad(key, "an integer or null", value)

    def nullable_str(self, key: str) -> str | None:
        value = self._take(key)
        if value is None or type(value) is str:
            return value
        raise self._bad(key, "a string or null", value)

    def flag(self, key: str) -> bool:
        """An optional ``true`` marker (``interrupted``): absent means false."""
        return self.req_bool(key) if key in self._obj else False

    def extra(self) -> Mapping[str, Any]:
        """The keys that were never read: fields of a newer writer, kept as they are."""
        if len(self._read) == len(self._obj):
            return EMPTY
        read = set(self._read)
        return MappingProxyType({k: v for k, v in self._obj.items() if k not in read})


def with_extra(out: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``out`` plus the unknown keys a record was read with (they never override known ones)."""
    if extra:
        for key, value in extra.items():
            out.setdefault(key, value)
    return out


# --- messages -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """The model in force: the spec the user gave, the provider and the provider's model name."""

    spec: str
    provider: str
    name: str
    extra: Mapping[str, Any] = field(default_factory=no_extra, repr=False)

    def to_json(self) -> dict[str, Any]:
        return with_extra(
            {"spec": self.spec, "provider": self.provider, "name": self.name}, self.extra
        )

    @classmethod
    def from_json(cls, obj: object, where: str = "model") -> ModelInfo:
        f = Fields(obj, where)
        return cls(f.req_str("spec"), f.req_str("provider"), f.req_str("name"), f.extra())


@dataclass(frozen=True, slots=True)
class UserMessage:
    """``{id, role: "user", content, source}``: one message a person, a hook or a tool entered."""

    id: str
    content: str
    source: MessageSource = "user"
    extra: Mapping[str, Any] = field(default_factory=no_extra, repr=False)

    def to_json(self) -> dict[str, Any]:
        return with_extra(
            {"id": self.id, "role": "user", "content": self.content, "source": self.source},
            self.extra,
        )

    @classmethod
    def from_json(cls, obj: object, where: str = "message") -> UserMessage:
        f = Fields(obj, where)
        msg_id = f.req_str("id")
        if f.req_str("role") != "user":
            raise ValueError(f"{where}.role must be 'user'")
        content = f.req_str("content")
        source: Any = f.req_choice("source", MESSAGE_SOURCES)
        return cls(msg_id, content, source, f.extra())


@dataclass(frozen=True, slots=True)
class TextBlock:
    """Visible reply text."""

    text: str
    extra: Mapping[str, Any] = field(default_factory=no_extra, repr=False)
    kind: ClassVar[str] = "text"

    def to_json(self) -> dict[str, Any]:
        return with_extra({"type": "text", "text": self.text}, self.extra)


@dataclass(frozen=True, slots=True)
class ReasoningBlock:
    """The model's reasoning (DeepSeek ``reasoning_content``)."""

    text: str
    extra: Mapping[str, Any] = field(default_factory=no_extra, repr=False)
    kind: ClassVar[str] = "reasoning"

    def to_json(self) -> dict[str, Any]:
        return with_extra({"type": "reasoning", "text": self.text}, self.extra)


@dataclass(frozen=True, slots=True)
class ToolCallBlock:
    """A tool call the model asked for. ``call_id`` is andon's own id (``c<turn>-<step>-<n>``);
    ``provider_id`` is the provider's, kept for reference only (providers reuse or omit ids)."""

    call_id: str
    name: str
    arguments: str
    provider_id: str | None = None
    extra: Mapping[str, Any] = field(default_factory=no_extra, repr=False)
    kind: ClassVar[str] = "tool_call"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "tool_call", "call_id": self.call_id}
        if self.provider_id is not None:
            out["provider_id"] = self.provider_id
        out["name"] = self.name
        out["arguments"] = self.arguments
        return with_extra(out, self.extra)


Block: TypeAlias = TextBlock | ReasoningBlock | ToolCallBlock


def block_from_json(obj: object, where: str) -> Block:
    f = Fields(obj, where)
    kind = f.req_str("type")
    match kind:
        case "text":
            return TextBlock(f.req_str("text"), f.extra())
        case "reasoning":
            return ReasoningBlock(f.req_str("text"), f.extra())
        case "tool_call":
            call = f.req_str("call_id")
            provider_id = f.opt_str("provider_id")
            return ToolCallBlock(
                call, f.req_str("name"), f.req_str("arguments"), provider_id, f.extra()
            )
        case _:
            raise ValueError(f"{where}.type is {kind!r}, not text, reasoning or tool_call")


@dataclass(frozen=True, slots=True)
class AssistantReply:
    """``{role: "assistant", content: [blocks]}``: what the model said, in stream order."""

    content: tuple[Block, ...]
    extra: Mapping[str, Any] = field(default_factory=no_extra, repr=False)

    @property
    def text(self) -> str:
        """The visible text blocks joined (``""`` when there are none)."""
        return "".join(b.text for b in self.content if isinstance(b, TextBlock))

    @property
    def reasoning(self) -> str | None:
        """The reasoning blocks joined, or ``None`` when the reply carries no reasoning."""
        parts = [b.text for b in self.content if isinstance(b, ReasoningBlock)]
        return "".join(parts) if parts else None

    @property
    def tool_calls(self) -> tuple[ToolCallBlock, ...]:
        """The tool calls, in model order."""
        return tuple(b for b in self.content if isinstance(b, ToolCallBlock))

    def to_json(self) -> dict[str, Any]:
        return with_extra(
            {"role": "assistant", "content": [b.to_json() for b in self.content]}, self.extra
        )

    @classmethod
    def from_json(cls, obj: object, where: str = "message") -> AssistantReply:
        f = Fields(obj, where)
        if f.req_str("role") != "assistant":
            raise ValueError(f"{where}.role must be 'assistant'")
        blocks = f.req_list("content")
        content = tuple(block_from_json(b, f"{where}.content[{i}]") for i, b in enumerate(blocks))
        return cls(content, f.extra())


# --- tool outcomes ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ToolErrorInfo:
    """``{name, code, message}`` of an andon error in a tool result (``code``: docs/log-format.md,
    Error codes)."""

    name: str
    code: str
    message: str
    extra: Mapping[str, Any] = field(default_factory=no_extra, repr=False)

    def to_json(self) -> dict[str, Any]:
        return with_extra(
            {"name": self.name, "code": self.code, "message": self.message}, self.extra
        )

    @classmethod
    def from_json(cls, obj: object, where: str = "error") -> ToolErrorInfo:
        f = Fields(obj, where)
        return cls(f.req_str("name"), f.req_str("code"), f.req_str("message"), f.extra())


@dataclass(frozen=True, slots=True)
class ExitStatus:
    """``{code, signal}`` of the tool's leader process; both keys always present, one is null."""

    code: int | None
    signal: int | None
    extra: Mapping[str, Any] = field(default_factory=no_extra, repr=False)

    def to_json(self) -> dict[str, Any]:
        return with_extra({"code": self.code, "signal": self.signal}, self.extra)

    @classmethod
    def from_json(cls, obj: object, where: str = "exit") -> ExitStatus:
        f = Fields(obj, where)
        code, sig = f.nullable_int("code"), f.nullable_int("signal")
        # Only what waitid reports: any other number is no status a process ever had.
        if code is not None and not 0 <= code <= MAX_EXIT_CODE:
            raise ValueError(
                f"{where}.code must be an exit code from 0 to {MAX_EXIT_CODE}, not {_show(code)}"
            )
        if sig is not None and not 0 < sig < signal.NSIG:
            raise ValueError(
                f"{where}.signal must be a signal number from 1 to {signal.NSIG - 1}, "
                f"not {_show(sig)}"
            )
        return cls(code, sig, f.extra())


# --- turn-end reasons ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Completed:
    """The last step finished with no tool continuation owed and no next-step input pending."""

    extra: Mapping[str, Any] = field(default_factory=no_extra, repr=False)
    kind: ClassVar[Literal["completed"]] = "completed"

    def to_json(self) -> dict[str, Any]:
        return with_extra({"kind": self.kind}, self.extra)


@dataclass(frozen=True, slots=True)
class MaxTokens:
    """Some step of the turn finished with ``length`` (sticky for the whole turn)."""

    extra: Mapping[str, Any] = field(default_factory=no_extra, repr=False)
    kind: ClassVar[Literal["max-tokens"]] = "max-tokens"

    def to_json(self) -> dict[str, Any]:
        return with_extra({"kind": self.kind}, self.extra)


@dataclass(frozen=True, slots=True)
class Blocked:
    """A pre-step hook rejected the step; ``by`` names it."""

    by: str
    extra: Mapping[str, Any] = field(default_factory=no_extra, repr=False)
    kind: ClassVar[Literal["blocked"]] = "blocked"

    def to_json(self) -> dict[str, Any]:
        return with_extra({"kind": self.kind, "by": self.by}, self.extra)


@dataclass(frozen=True, slots=True)
class TurnAborted:
    """The turn's signal was aborted; ``cause`` is the first cause given. On disk:
    ``{"kind": "aborted", "reason": {"kind": "user"}}``."""

    cause: Cause
    extra: Mapping[str, Any] = field(default_factory=no_extra, repr=False)
    kind: ClassVar[Literal["aborted"]] = "aborted"

    def to_json(self) -> dict[str, Any]:
        return with_extra({"kind": self.kind, "reason": self.cause.to_dict()}, self.extra)


@dataclass(frozen=True, slots=True)
class TurnFailed:
    """Any other failure. On disk: ``{"kind": "error", "error": {"message", "code"}}``.

    ``extra`` holds further keys of the ``error`` object (for example a model error's ``status``).
    """

    message: str
    code: str
    extra: Mapping[str, Any] = field(default_factory=no_extra, repr=False)
    kind: ClassVar[Literal["error"]] = "error"

    def to_json(self) -> dict[str, Any]:
        error = with_extra({"message": self.message, "code": self.code}, self.extra)
        return {"kind": self.kind, "error": error}


@dataclass(frozen=True, slots=True)
class Interrupted:
    """Written only by crash repair: the process stopped without ending the turn."""

    extra: Mapping[str, Any] = field(default_factory=no_extra, repr=False)
    kind: ClassVar[Literal["interrupted"]] = "interrupted"

    def to_json(self) -> dict[str, Any]:
        return with_extra({"kind": self.kind}, self.extra)


TurnEndReason: TypeAlias = Completed | MaxTokens | Blocked | TurnAborted | TurnFailed | Interrupted


def reason_from_json(obj: object, where: str = "reason") -> TurnEndReason:
    """Parse a turn-end reason; ``ValueError`` names what is wrong."""
    f = Fields(obj, where)
    kind = f.req_str("kind")
    match kind:
        case "completed":
            return Completed(f.extra())
        case "max-tokens":
            return MaxTokens(f.extra())
        case "blocked":
            return Blocked(f.req_str("by"), f.extra())
        case "aborted":
            try:
                cause = cause_from_dict(f.req_obj("reason"))
            except ValueError as exc:
                raise ValueError(f"{where}.reason: {exc}") from None
            return TurnAborted(cause, f.extra())
        case "error":
            e = Fields(f.req_obj("error"), f"{where}.error")
            failed = TurnFailed(e.req_str("message"), e.req_str("code"), e.extra())
            if f.extra():
                raise ValueError(f"{where} has unknown keys beside 'error'")
            return failed
        case "interrupted":
            return Interrupted(f.extra())
        case _:
            raise ValueError(f"{where}.kind is {kind!r}, not a turn-end reason")


def describe_reason(reason: TurnEndReason) -> str:
    """A short phrase for people: ``completed``, ``aborted (by user)``, ``error: …``."""
    match reason:
        case Completed():
            return "completed"
        case MaxTokens():
            return "max-tokens (the model hit its output limit)"
        case Blocked(by=by):
            return f"blocked by {by}"
        case TurnAborted(cause=cause):
            return f"aborted ({cause.describe()})"
        case TurnFailed(message=message, code=code):
            return f"error {code}: {message}"
        case Interrupted():
            return "interrupted (the process stopped before the turn could end)"
        case _:
            assert_never(reason)
