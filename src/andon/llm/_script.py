"""The script format of the scripted model (docs/models.md, Scripted replies): reply dicts parsed
into frozen values, validated as a whole before anything plays.

:class:`ScriptParser` turns the plain dicts of a script into :class:`ScriptReply` values or
raises :class:`~andon.base.ScriptInvalid` naming the reply index and the field.
:class:`~andon.llm.Scripted` plays the values in-process; ``andon.testing.MockModelServer`` serves
the same values over HTTP and validates its own extra fields with the parser's field checks, so
both report a mistake alike.

Two things a script may say are made to match what the HTTP adapter makes of the wire: every
string is :func:`~andon.llm._wire.valid_text` (a lone surrogate becomes U+FFFD, as the adapter
makes it, so a script cannot put text into a turn that the session log refuses), and ``usage`` is a
chat-completions usage object in either provider's shape, read by the adapter's own rule.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, NoReturn, final

from andon.base import FINISH_REASONS, MODEL_ERROR_CODES, ErrorCode, ModelError, ScriptInvalid
from andon.llm._overflow import overflow_figures
from andon.llm._retry import code_for_status
from andon.llm._types import (
    Chunk,
    FinishReason,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from andon.llm._wire import usage_from_wire, valid_text

__all__ = [
    "ScriptFailure",
    "ScriptParser",
    "ScriptReply",
    "ScriptToolCall",
]

DEFAULT_CHUNK_SIZE: Final = 16
"""Characters per streamed fragment when a reply gives no ``chunk_size``."""

_REPLY_FIELDS: Final = (
    "reasoning",
    "text",
    "tool_calls",
    "chunk_size",
    "chunk_delay",
    "finish",
    "usage",
    "stall_after_chunks",
    "error",
)
_TOOL_CALL_FIELDS: Final = ("name", "arguments", "id")
_USAGE_REQUIRED: Final = ("prompt_tokens", "completion_tokens")
_USAGE_COUNTS: Final = (
    *_USAGE_REQUIRED,
    "total_tokens",
    "prompt_cache_hit_tokens",  # DeepSeek
    "prompt_cache_miss_tokens",  # DeepSeek
)
_USAGE_DETAILS: Final = {  # the counts andon reads first; the others are OpenAI's, passed along
    "prompt_tokens_details": ("cached_tokens", "audio_tokens"),
    "completion_tokens_details": (
        "reasoning_tokens",
        "audio_tokens",
        "accepted_prediction_tokens",
        "rejected_prediction_tokens",
    ),
}
_USAGE_FIELDS: Final = (*_USAGE_COUNTS, *_USAGE_DETAILS)
_ERROR_FIELDS: Final = ("status", "retry_after", "message", "code")
_FINISHES: Final = FINISH_REASONS
_MODEL_CODES: Final = {code.value: code for code in MODEL_ERROR_CODES}


# --- the parsed script ------------------------------------------------------------------------


@final
@dataclass(frozen=True, slots=True)
class ScriptToolCall:
    """One tool call of a reply: the provider's id (given, or ``call_<reply>_<n>``), the name and
    the argument string exactly as it is streamed."""

    provider_id: str
    name: str
    arguments: str  # already a string: what the provider would send, valid JSON or not


@final
@dataclass(frozen=True, slots=True)
class ScriptFailure:
    """What an ``error`` reply fails with instead of streaming: a model error code, its message,
    the HTTP status (if the script gave one; the mock server needs it) and ``Retry-After``."""

    code: ErrorCode
    message: str
    status: int | None
    retry_after: float | None

    def to_error(self) -> ModelError:
        """The failure as the exception an adapter raises."""
        # A fresh exception per raise: an exception object carries its traceback, and a script
        # may be replayed many times.
        limit = requested = None
        if self.code == ErrorCode.CONTEXT_OVERFLOW:  # the figures its message names, as over HTTP
            limit, requested = overflow_figures(self.message)
        return ModelError(
            self.code,
            self.message,
            status=self.status,
            retry_after=self.retry_after,
            limit=limit,
            requested=requested,
        )


@final
@dataclass(frozen=True, slots=True)
class ScriptReply:
    """One validated reply: its content, pacing and finish, or (``error`` set) a failure.

    Field meanings are those of the reply dicts (docs/models.md, Scripted replies); :meth:`content`
    cuts the content into the deltas a model would stream.
    """

    reasoning: str = ""
    text: str = ""
    tool_calls: tuple[ScriptToolCall, ...] = ()
    chunk_size: int = DEFAULT_CHUNK_SIZE
    chunk_delay: float = 0.0
    finish: FinishReason = "stop"
    usage: Usage | None = None
    stall_after_chunks: int | None = None
    error: ScriptFailure | None = None

    def content(self) -> list[Chunk]:
        """The streamed deltas, in emission order: reasoning, text, then each tool call."""
        out: list[Chunk] = [ReasoningDelta(p) for p in _split(self.reasoning, self.chunk_size)]
        out += [TextDelta(p) for p in _split(self.text, self.chunk_size)]
        for index, call in enumerate(self.tool_calls):
            # A call with empty arguments still needs one delta to carry its id and name.
            pieces = _split(call.arguments, self.chunk_size) or [""]
            out.append(ToolCallDelta(index, call.provider_id, call.name, pieces[0]))
            out += [ToolCallDelta(index, None, None, piece) for piece in pieces[1:]]
        return out


def _split(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def _valid_strings(value: Any) -> Any:
    """``value`` (decoded JSON-like data) with every string, keys included, made valid text."""
    if isinstance(value, str):
        return valid_text(value)
    if isinstance(value, Mapping):
        return {_valid_strings(k): _valid_strings(v) for k, v in value.items()}
    if _is_list(value):
        return [_valid_strings(item) for item in value]
    return value


# --- validation -------------------------------------------------------------------------------


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # bool is an int subclass


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_list(value: object) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str | bytes)


class ScriptParser:
    """Turns plain dicts into :class:`ScriptReply` values, or raises
    :class:`~andon.base.ScriptInvalid` naming the reply index, the field and ``source`` (a file
    name, or ``None`` for an inline script).

    Besides :meth:`replies` and :meth:`reply`, the field checks (:meth:`string`,
    :meth:`integer`, :meth:`seconds`, :meth:`known_fields`, :meth:`fail`) are public so that a
    double serving the same scripts with extra fields (``andon.testing.MockModelServer``)
    validates them with the same rules and messages.
    """

    def __init__(self, source: str | None) -> None:
        self._where = f" (in {source})" if source else ""

    def fail(self, index: int | None, field: str | None, detail: str) -> NoReturn:
        """Raise :class:`~andon.base.ScriptInvalid` for reply ``index`` and ``field``."""
        raise ScriptInvalid(detail + self._where, index=index, field=field)

    def replies(self, raw: object) -> tuple[ScriptReply, ...]:
        """A whole script: a list of reply dicts."""
        if not _is_list(raw):
            self.fail(None, "replies", f"must be a list of replies, got {_kind(raw)}")
        assert isinstance(raw, Sequence)  # for the type checker; _is_list said so
        return tuple(self.reply(index, item) for index, item in enumerate(raw))

    def reply(self, index: int, raw: object) -> ScriptReply:
        """Reply number ``index`` (0-based); rejects fields it does not know."""
        if not isinstance(raw, Mapping):
            self.fail(index, None, f"a reply must be a mapping, got {_kind(raw)}")
        self.known_fields(index, "", raw, _REPLY_FIELDS)
        if "error" in raw:
            others = [str(key) for key in raw if key != "error"]
            if others:
                self.fail(index, others[0], "an error reply streams nothing; drop this field")
            return ScriptReply(error=self.error(index, raw["error"]))

        tool_calls = self.tool_calls(index, raw.get("tool_calls", []))
        finish = raw.get("finish", "tool_calls" if tool_calls else "stop")
        if finish not in _FINISHES:
            self.fail(index, "finish", f"must be one of {', '.join(_FINISHES)}, got {finish!r}")
        stall = raw.get("stall_after_chunks")
        if stall is not None:
            stall = self.integer(index, "stall_after_chunks", stall, minimum=0)
        return ScriptReply(
            reasoning=self.string(index, "reasoning", raw.get("reasoning", "")),
            text=self.string(index, "text", raw.get("text", "")),
            tool_calls=tool_calls,
            chunk_size=self.integer(
                index, "chunk_size", raw.get("chunk_size", DEFAULT_CHUNK_SIZE), minimum=1
            ),
            chunk_delay=self.seconds(index, "chunk_delay", raw.get("chunk_delay", 0.0)),
            finish=finish,
            usage=self.usage(index, raw["usage"]) if "usage" in raw else None,
            stall_after_chunks=stall,
        )

    def known_fields(
        self, index: int, prefix: str, raw: Mapping[Any, Any], known: tuple[str, ...]
    ) -> None:
        """Reject any key of ``raw`` outside ``known`` (named with ``prefix``, e.g. ``usage.``)."""
        for key in raw:
            if key not in known:
                self.fail(index, f"{prefix}{key}", f"unknown field; expected {', '.join(known)}")

    def string(self, index: int, field: str, value: object) -> str:
        """``value`` if it is a string (lone surrogates replaced by U+FFFD)."""
        if not isinstance(value, str):
            self.fail(index, field, f"must be a string, got {_kind(value)}")
        return valid_text(value)

    def integer(self, index: int, field: str, value: object, *, minimum: int) -> int:
        """``value`` if it is an integer (not a bool) of at least ``minimum``."""
        if not _is_int(value):
            self.fail(index, field, f"must be an integer, got {_kind(value)}")
        assert isinstance(value, int)
        if value < minimum:
            self.fail(index, field, f"must be >= {minimum}, got {value}")
        return value

    def seconds(self, index: int, field: str, value: object) -> float:
        """``value`` as float seconds if it is a finite number ``>= 0`` (not a bool)."""
        if not _is_number(value):
            self.fail(index, field, f"must be a number of seconds, got {_kind(value)}")
        assert isinstance(value, int | float)
        if not (math.isfinite(value) and value >= 0):
            self.fail(index, field, f"must be a finite number >= 0, got {value!r}")
        return float(value)

    def tool_calls(self, index: int, raw: object) -> tuple[ScriptToolCall, ...]:
        """A reply's ``tool_calls`` list."""
        if not _is_list(raw):
            self.fail(index, "tool_calls", f"must be a list of tool calls, got {_kind(raw)}")
        assert isinstance(raw, Sequence)
        return tuple(self.tool_call(index, i, call) for i, call in enumerate(raw))

    def tool_call(self, index: int, i: int, raw: object) -> ScriptToolCall:
        """Tool call ``i`` of reply ``index``; mapping arguments are encoded as JSON."""
        field = f"tool_calls[{i}]"
        if not isinstance(raw, Mapping):
            self.fail(index, field, f"a tool call must be a mapping, got {_kind(raw)}")
        self.known_fields(index, f"{field}.", raw, _TOOL_CALL_FIELDS)
        if "name" not in raw:
            self.fail(index, f"{field}.name", "a tool call needs a name")
        name = self.string(index, f"{field}.name", raw["name"])
        if not name:
            self.fail(index, f"{field}.name", "must not be empty")
        arguments = raw.get("arguments", {})
        if isinstance(arguments, str):
            arguments = valid_text(arguments)
        elif isinstance(arguments, Mapping):
            try:
                arguments = json.dumps(_valid_strings(dict(arguments)), allow_nan=False)
            except (TypeError, ValueError) as exc:  # a YAML date, a NaN ...
                self.fail(index, f"{field}.arguments", f"cannot be encoded as JSON: {exc}")
        else:
            # A string passes through (only made valid text), so a script can send invalid
            # JSON on purpose.
            self.fail(
                index,
                f"{field}.arguments",
                f"must be a mapping or a string, got {_kind(arguments)}",
            )
        # Deterministic and unique within a script; real providers' ids look similar.
        provider_id = raw.get("id", f"call_{index}_{i}")
        if not isinstance(provider_id, str) or not provider_id:
            self.fail(index, f"{field}.id", f"must be a non-empty string, got {provider_id!r}")
        return ScriptToolCall(provider_id=valid_text(provider_id), name=name, arguments=arguments)

    def usage(self, index: int, raw: object) -> Usage:
        """A reply's ``usage``: a chat-completions usage object, as a provider sends it.

        ``prompt_tokens`` and ``completion_tokens`` are required; optional are ``total_tokens``,
        DeepSeek's ``prompt_cache_hit_tokens`` / ``prompt_cache_miss_tokens``, OpenAI's
        ``prompt_tokens_details: {cached_tokens, audio_tokens}`` and (both)
        ``completion_tokens_details: {reasoning_tokens, ...}``. Every count is an integer >= 0.
        The :class:`Usage` is the one the HTTP adapter would make of the same object.
        """
        if not isinstance(raw, Mapping):
            self.fail(index, "usage", f"must be a mapping, got {_kind(raw)}")
        self.known_fields(index, "usage.", raw, _USAGE_FIELDS)
        for name in _USAGE_REQUIRED:
            if name not in raw:
                self.fail(index, f"usage.{name}", "missing")
        for name in _USAGE_COUNTS:
            if name in raw:
                self.integer(index, f"usage.{name}", raw[name], minimum=0)
        for group, names in _USAGE_DETAILS.items():
            if group not in raw:
                continue
            details = raw[group]
            if not isinstance(details, Mapping):
                self.fail(index, f"usage.{group}", f"must be a mapping, got {_kind(details)}")
            self.known_fields(index, f"usage.{group}.", details, names)
            for name in names:
                if name in details:
                    self.integer(index, f"usage.{group}.{name}", details[name], minimum=0)
        usage = usage_from_wire(raw)
        assert usage is not None  # both base counts were checked above
        return usage

    def error(self, index: int, raw: object) -> ScriptFailure:
        """A reply's ``error`` mapping: a status, a model error code, or both (the code wins)."""
        if not isinstance(raw, Mapping):
            self.fail(index, "error", f"must be a mapping, got {_kind(raw)}")
        self.known_fields(index, "error.", raw, _ERROR_FIELDS)
        if "status" not in raw and "code" not in raw:
            self.fail(index, "error", "needs a status or a code")
        status: int | None = None
        if "status" in raw:
            status = self.integer(index, "error.status", raw["status"], minimum=400)
            if status > 599:
                self.fail(index, "error.status", f"must be an HTTP error status, got {status}")
        if "code" in raw:
            code = _MODEL_CODES.get(raw["code"]) if isinstance(raw["code"], str) else None
            if code is None:
                self.fail(
                    index,
                    "error.code",
                    f"must be a model error code ({', '.join(sorted(_MODEL_CODES))}), "
                    f"got {raw['code']!r}",
                )
        else:
            assert status is not None
            code = code_for_status(status)
        retry_after = None
        if "retry_after" in raw:
            retry_after = self.seconds(index, "error.retry_after", raw["retry_after"])
        default_message = (
            f"{status} from the model API" if status is not None else f"scripted {code} error"
        )
        message = self.string(index, "error.message", raw.get("message", default_message))
        return ScriptFailure(code=code, message=message, status=status, retry_after=retry_after)
