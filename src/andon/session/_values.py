"""The values records carry: messages, content blocks, tool outcomes and turn-end reasons.

Every value is frozen and converts to and from the exact JSON of docs/log-format.md (``to_json`` /
``from_json``). The conversion is not written per class: :class:`LogValue` compiles it from the
class's fields (``andon.base``'s shape codec, the same one the wire uses), under :data:`LOG`, the
log's rules. A field marked ``omit`` is left out on disk when it is ``None`` (never written as
``null``); a plain ``X | None`` is always written and may be ``null`` (``exit.code``,
``exit.signal``).
Keys this version does not know are kept in ``extra`` and written back unchanged: reading a record
and writing it again loses nothing.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, Final, Literal, Self, TypeAlias, assert_never, final

from andon.base import (
    CATCH_ALL,
    EMPTY,
    Cause,
    Invalid,
    MessageSource,
    Rules,
    cause_from_dict,
    codec_for,
    hint_codec,
    shape,
)

__all__ = [
    "COUNT",
    "LOG",
    "OMIT",
    "PID",
    "AssistantReply",
    "Block",
    "Blocked",
    "Completed",
    "ExitStatus",
    "Interrupted",
    "LogValue",
    "MaxTokens",
    "ModelInfo",
    "ReasoningBlock",
    "RecordData",
    "TextBlock",
    "ToolCallBlock",
    "ToolErrorInfo",
    "TurnAborted",
    "TurnEndReason",
    "TurnFailed",
    "UserMessage",
    "reason_from_json",
]

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


def pid_problem(value: int) -> str | None:
    """Why ``value`` is no process id, or ``None``: a log's ids reach ``kill`` and ``pidfd_open``
    (crash repair), where 0 or a negative number means a whole process group, so the reader
    refuses them where the record is read and nothing after it ever sees one."""
    if is_pid(value):
        return None
    return f"must be a process id from 1 to {PID_LIMIT - 1}, not {_show(value)}"


def _exit_code_problem(code: int | None) -> str | None:
    # Only what waitid reports: any other number is no status a process ever had.
    if code is None or 0 <= code <= MAX_EXIT_CODE:
        return None
    return f"must be an exit code from 0 to {MAX_EXIT_CODE}, not {_show(code)}"


def _signal_problem(sig: int | None) -> str | None:
    if sig is None or 0 < sig < signal.NSIG:
        return None
    return f"must be a signal number from 1 to {signal.NSIG - 1}, not {_show(sig)}"


def count_problem(value: int | None) -> str | None:
    """Why ``value`` is no count (an index or a number of things), or ``None``."""
    return None if value is None or value >= 0 else f"cannot be negative, not {_show(value)}"


OMIT: Final = shape(omit=True)
"""A field left out on disk when it is its default (``None``, ``False``), and absent when read."""
PID: Final = shape(check=pid_problem)
"""A process id (docs/log-format.md, Tool calls: crash repair signals what these name)."""
COUNT: Final = shape(check=count_problem)
"""An index or a number of things: never negative."""


# --- the log's rules ------------------------------------------------------------------------------


def kind_of(value: object) -> str:
    """A JSON value's kind, for an error message: ``null``, ``a string``, ``an object`` ..."""
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


_WANTS: Final[Mapping[str, str]] = {
    "str": "a string",
    "int": "an integer",
    "float": "a number",
    "bool": "true or false",
    "bytes": "bytes",
    "map": "an object",
    "array": "an array",
}


class _LogRules(Rules):
    """The log's wording (``record 3 (tool/result) data.exit.code must be ...``) and its rules:
    unknown keys are kept (a newer writer's fields), every float is seconds."""

    open = True
    sorted_choices = True

    def kind(self, value: object) -> str:
        return kind_of(value)

    def wrong(self, want: str, value: object, *, nullable: bool = False) -> Invalid:
        either = " or null" if nullable else ""
        return Invalid(f"must be {_WANTS[want]}{either}, not {kind_of(value)}")

    def missing(self, key: str) -> Invalid:
        return Invalid(f"has no {key!r}")

    def unexpected(self, key: object, cls: type[Any]) -> Invalid:
        return Invalid(f"has a key {key!r} that a {cls.__name__} does not have")

    def not_one_of(self, choices: tuple[str, ...], value: object) -> Invalid:
        if type(value) is not str:
            return self.wrong("str", value)
        return Invalid(f"is {value!r}, not one of {', '.join(choices)}")

    def not_tagged(self, key: str, want: str, value: object) -> Invalid:
        if type(value) is not str:
            return self.wrong("str", value)
        return Invalid(f"must be {want!r}")

    def float_(self, value: float | int) -> float | int:
        # Every float of a record is a unix time or a span. An int stays an int, so that a record
        # read and written again is the same bytes.
        if not 0 <= value <= MAX_SECONDS:  # NaN fails this comparison too
            raise Invalid(
                f"must be a number of seconds from 0 to {MAX_SECONDS}, not {_show(value)}"
            )
        return value


LOG: Final[Rules] = _LogRules()
"""The log's rules; every value and record class is compiled under them."""


def log_error(exc: Invalid, where: str) -> ValueError:
    """The ``ValueError`` the reader turns into ``LogCorrupted``: where, what, and why."""
    return ValueError(f"{where}{exc.path} {exc.problem}")


@dataclass(frozen=True, slots=True)
class LogValue:
    """A frozen dataclass of the log: ``to_json`` and ``from_json`` come from its fields.

    ``extra`` holds the keys this version does not know, as they were read; they are written back
    after the known ones (keyword-only: every subclass's own fields come first)."""

    extra: Mapping[str, Any] = field(
        default_factory=lambda: EMPTY, repr=False, kw_only=True, metadata=CATCH_ALL
    )

    def to_json(self) -> dict[str, Any]:
        """The exact JSON object of docs/log-format.md (with any unknown keys it was read with)."""
        return codec_for(type(self), LOG).encode(self)

    @classmethod
    def from_json(cls, obj: object, where: str = "value") -> Self:
        """Parse ``obj``; ``ValueError`` names the bad value by its path from ``where``."""
        try:
            return codec_for(cls, LOG).decode(obj)  # type: ignore[no-any-return]
        except Invalid as exc:
            raise log_error(exc, where) from None


@dataclass(frozen=True, slots=True)
class RecordData(LogValue):
    """The ``data`` of one record type (``record_type``: ``"tool/result"``, ...)."""

    record_type: ClassVar[str]

    def __init_subclass__(cls, *, record_type: str | None = None, **kwargs: Any) -> None:
        # ``class ToolResult(CallData, record_type="tool/result")``. dataclass(slots=True) makes
        # the class again, without the keyword: the type set the first time is kept. The explicit
        # super() because slots=True replaces the class the zero-argument form would name.
        super(RecordData, cls).__init_subclass__(**kwargs)
        if record_type is not None:
            cls.record_type = record_type


@dataclass(frozen=True, slots=True)
class TurnData(RecordData):
    """The data of a record about one turn."""

    turn: int
    """1, 2, … in the session; a resumed session goes on counting."""


@dataclass(frozen=True, slots=True)
class StepData(TurnData):
    """The data of a record about one step of a turn: ``step/start`` and ``step/end`` bracket the
    records of a step, and every one of them names the step."""

    step: int
    """1, 2, … in the turn: one model request and the tool calls it asked for."""


@dataclass(frozen=True, slots=True)
class AttemptData(StepData):
    """The data of a record about one model request of a step."""

    attempt: int
    """1 for the first request of the step; a retry is the next attempt."""


@dataclass(frozen=True, slots=True)
class CallData(StepData):
    """The data of a record about one tool call of a step. ``tool/call``, ``tool/started``,
    ``tool/signal`` and ``tool/result`` of one call share its ``call_id``."""

    call_id: str
    """andon's id of the call, ``c<turn>-<step>-<n>`` (docs/log-format.md, Ids)."""


# --- messages -----------------------------------------------------------------------------------


@final
@dataclass(frozen=True, slots=True)
class ModelInfo(LogValue):
    """The model in force: the spec the user gave, the provider and the provider's model name."""

    spec: str
    provider: str
    name: str


@final
@dataclass(frozen=True, slots=True)
class UserMessage(LogValue):
    """``{id, role: "user", content, source}``: one message a person, a hook or a tool entered."""

    id: str
    content: str
    source: MessageSource = "user"
    json_tag: ClassVar = ("role", "user")
    json_keys: ClassVar = ("id", "role", "content", "source")


@final
@dataclass(frozen=True, slots=True)
class TextBlock(LogValue):
    """Visible reply text."""

    text: str
    kind: ClassVar[str] = "text"
    json_tag: ClassVar = ("type", "text")


@final
@dataclass(frozen=True, slots=True)
class ReasoningBlock(LogValue):
    """The model's reasoning (DeepSeek ``reasoning_content``)."""

    text: str
    kind: ClassVar[str] = "reasoning"
    json_tag: ClassVar = ("type", "reasoning")


@final
@dataclass(frozen=True, slots=True)
class ToolCallBlock(LogValue):
    """A tool call the model asked for. ``call_id`` is andon's own id (``c<turn>-<step>-<n>``);
    ``provider_id`` is the provider's, kept for reference only (providers reuse or omit ids)."""

    call_id: str
    name: str
    arguments: str
    provider_id: Annotated[str | None, OMIT] = None
    kind: ClassVar[str] = "tool_call"
    json_tag: ClassVar = ("type", "tool_call")
    json_keys: ClassVar = ("type", "call_id", "provider_id", "name", "arguments")


Block: TypeAlias = TextBlock | ReasoningBlock | ToolCallBlock


@final
@dataclass(frozen=True, slots=True)
class AssistantReply(LogValue):
    """``{role: "assistant", content: [blocks]}``: what the model said, in stream order."""

    content: tuple[Block, ...]
    json_tag: ClassVar = ("role", "assistant")

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


# --- tool outcomes ------------------------------------------------------------------------------


@final
@dataclass(frozen=True, slots=True)
class ToolErrorInfo(LogValue):
    """``{name, code, message}`` of an andon error in a tool result (``code``: docs/log-format.md,
    Error codes)."""

    name: str
    code: str
    message: str


@final
@dataclass(frozen=True, slots=True)
class ExitStatus(LogValue):
    """``{code, signal}`` of the tool's leader process; both keys always present, one is null."""

    code: Annotated[int | None, shape(check=_exit_code_problem)]
    signal: Annotated[int | None, shape(check=_signal_problem)]


# --- turn-end reasons ---------------------------------------------------------------------------


@final
@dataclass(frozen=True, slots=True)
class Completed(LogValue):
    """The last step finished with no tool continuation owed and no next-step input pending."""

    kind: ClassVar[Literal["completed"]] = "completed"
    json_tag: ClassVar = ("kind", "completed")


@final
@dataclass(frozen=True, slots=True)
class MaxTokens(LogValue):
    """Some step of the turn finished with ``length`` (sticky for the whole turn)."""

    kind: ClassVar[Literal["max-tokens"]] = "max-tokens"
    json_tag: ClassVar = ("kind", "max-tokens")


@final
@dataclass(frozen=True, slots=True)
class Blocked(LogValue):
    """A pre-step hook rejected the step; ``by`` names it."""

    by: str
    kind: ClassVar[Literal["blocked"]] = "blocked"
    json_tag: ClassVar = ("kind", "blocked")


def _cause_to_json(cause: Cause) -> dict[str, Any]:
    return cause.to_dict()


def _cause_from_json(value: object) -> Cause:
    try:
        return cause_from_dict(value)
    except ValueError as exc:
        raise ValueError(f"is no cancel cause: {exc}") from None


@final
@dataclass(frozen=True, slots=True)
class TurnAborted(LogValue):
    """The turn's signal was aborted; ``cause`` is the first cause given. On disk:
    ``{"kind": "aborted", "reason": {"kind": "user"}}``."""

    cause: Annotated[Cause, shape(key="reason", codec=(_cause_to_json, _cause_from_json))]
    kind: ClassVar[Literal["aborted"]] = "aborted"
    json_tag: ClassVar = ("kind", "aborted")


@final
@dataclass(frozen=True, slots=True)
class TurnFailed(LogValue):
    """Any other failure. On disk: ``{"kind": "error", "error": {"message", "code"}}``.

    ``extra`` holds further keys of the ``error`` object (for example a model error's ``status``);
    no other key may stand beside ``error``.
    """

    message: str
    code: str
    kind: ClassVar[Literal["error"]] = "error"
    json_tag: ClassVar = ("kind", "error")
    json_nest: ClassVar = "error"


@final
@dataclass(frozen=True, slots=True)
class Interrupted(LogValue):
    """Written only by crash repair: the process stopped without ending the turn."""

    kind: ClassVar[Literal["interrupted"]] = "interrupted"
    json_tag: ClassVar = ("kind", "interrupted")


TurnEndReason: TypeAlias = Completed | MaxTokens | Blocked | TurnAborted | TurnFailed | Interrupted

_REASON_DECODE, _ = hint_codec(TurnEndReason, LOG)


def reason_from_json(obj: object, where: str = "reason") -> TurnEndReason:
    """Parse a turn-end reason; ``ValueError`` names what is wrong."""
    try:
        return _REASON_DECODE(obj)  # type: ignore[no-any-return]
    except Invalid as exc:
        raise log_error(exc, where) from None


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
