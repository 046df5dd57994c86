"""The scripted model (llm.md, Scripted model): plays a list of replies without a network.

It drives the offline demo, the benchmarks and most tests, so it behaves like the HTTP adapter
wherever a caller can tell: replies stream in fragments, errors are typed and retried by the same
:class:`~andon.llm.RetryPolicy`, ``on_attempt`` is awaited before every attempt, and the abort
signal is observed at every point where the stream can wait — before each chunk, during the delay
between chunks and during a stall — so cancelling a scripted turn is as immediate as cancelling a
real one.

Every reply is validated when the script is loaded; nothing is checked lazily, so a broken script
fails before any turn starts, naming the reply index and the field.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, NoReturn

import yaml

from andon.base import (
    MODEL_ERROR_CODES,
    Aborted,
    AbortSignal,
    Clock,
    ErrorCode,
    ModelError,
    ScriptInvalid,
    SystemClock,
)
from andon.llm._retry import RandomSource, RetryPolicy, abortable_sleep, code_for_status
from andon.llm._types import (
    Chunk,
    Finish,
    FinishReason,
    ModelInfo,
    ModelRequest,
    OnAttempt,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
)

__all__ = ["Scripted"]

DEFAULT_CHUNK_SIZE: Final = 16

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
_USAGE_FIELDS: Final = ("prompt_tokens", "completion_tokens")
_ERROR_FIELDS: Final = ("status", "retry_after", "message", "code")
_FINISHES: Final[tuple[FinishReason, ...]] = ("stop", "tool_calls", "length")
_MODEL_CODES: Final = {code.value: code for code in MODEL_ERROR_CODES}


# --- the parsed script ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _ToolCall:
    provider_id: str
    name: str
    arguments: str  # already a string: what the provider would send, valid JSON or not


@dataclass(frozen=True, slots=True)
class _ErrorReply:
    code: ErrorCode
    message: str
    status: int | None
    retry_after: float | None

    def to_error(self) -> ModelError:
        # A fresh exception per raise: an exception object carries its traceback, and a script
        # may be replayed many times.
        return ModelError(self.code, self.message, status=self.status, retry_after=self.retry_after)


@dataclass(frozen=True, slots=True)
class _Reply:
    reasoning: str = ""
    text: str = ""
    tool_calls: tuple[_ToolCall, ...] = ()
    chunk_size: int = DEFAULT_CHUNK_SIZE
    chunk_delay: float = 0.0
    finish: FinishReason = "stop"
    usage: Usage | None = None
    stall_after_chunks: int | None = None
    error: _ErrorReply | None = None

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


# --- validation -------------------------------------------------------------------------------


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # bool is an int subclass


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_list(value: object) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str | bytes)


class _Parser:
    """Turns plain dicts into :class:`_Reply` values, or raises ScriptInvalid naming the spot."""

    def __init__(self, source: str | None) -> None:
        self._where = f" (in {source})" if source else ""

    def fail(self, index: int | None, field: str | None, detail: str) -> NoReturn:
        raise ScriptInvalid(detail + self._where, index=index, field=field)

    def replies(self, raw: object) -> tuple[_Reply, ...]:
        if not _is_list(raw):
            self.fail(None, "replies", f"must be a list of replies, got {_kind(raw)}")
        assert isinstance(raw, Sequence)  # for the type checker; _is_list said so
        return tuple(self.reply(index, item) for index, item in enumerate(raw))

    def reply(self, index: int, raw: object) -> _Reply:
        if not isinstance(raw, Mapping):
            self.fail(index, None, f"a reply must be a mapping, got {_kind(raw)}")
        self.known_fields(index, "", raw, _REPLY_FIELDS)
        if "error" in raw:
            others = [str(key) for key in raw if key != "error"]
            if others:
                self.fail(index, others[0], "an error reply streams nothing; drop this field")
            return _Reply(error=self.error(index, raw["error"]))

        tool_calls = self.tool_calls(index, raw.get("tool_calls", []))
        finish = raw.get("finish", "tool_calls" if tool_calls else "stop")
        if finish not in _FINISHES:
            self.fail(index, "finish", f"must be one of {', '.join(_FINISHES)}, got {finish!r}")
        stall = raw.get("stall_after_chunks")
        if stall is not None:
            stall = self.integer(index, "stall_after_chunks", stall, minimum=0)
        return _Reply(
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
        for key in raw:
            if key not in known:
                self.fail(index, f"{prefix}{key}", f"unknown field; expected {', '.join(known)}")

    def string(self, index: int, field: str, value: object) -> str:
        if not isinstance(value, str):
            self.fail(index, field, f"must be a string, got {_kind(value)}")
        return value

    def integer(self, index: int, field: str, value: object, *, minimum: int) -> int:
        if not _is_int(value):
            self.fail(index, field, f"must be an integer, got {_kind(value)}")
        assert isinstance(value, int)
        if value < minimum:
            self.fail(index, field, f"must be >= {minimum}, got {value}")
        return value

    def seconds(self, index: int, field: str, value: object) -> float:
        if not _is_number(value):
            self.fail(index, field, f"must be a number of seconds, got {_kind(value)}")
        assert isinstance(value, int | float)
        if not (math.isfinite(value) and value >= 0):
            self.fail(index, field, f"must be a finite number >= 0, got {value!r}")
        return float(value)

    def tool_calls(self, index: int, raw: object) -> tuple[_ToolCall, ...]:
        if not _is_list(raw):
            self.fail(index, "tool_calls", f"must be a list of tool calls, got {_kind(raw)}")
        assert isinstance(raw, Sequence)
        return tuple(self.tool_call(index, i, call) for i, call in enumerate(raw))

    def tool_call(self, index: int, i: int, raw: object) -> _ToolCall:
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
        if isinstance(arguments, Mapping):
            try:
                arguments = json.dumps(dict(arguments), allow_nan=False)
            except (TypeError, ValueError) as exc:  # a YAML date, a NaN ...
                self.fail(index, f"{field}.arguments", f"cannot be encoded as JSON: {exc}")
        elif not isinstance(arguments, str):
            # A string passes through untouched, so a script can send invalid JSON on purpose.
            self.fail(
                index,
                f"{field}.arguments",
                f"must be a mapping or a string, got {_kind(arguments)}",
            )
        # Deterministic and unique within a script; real providers' ids look similar.
        provider_id = raw.get("id", f"call_{index}_{i}")
        if not isinstance(provider_id, str) or not provider_id:
            self.fail(index, f"{field}.id", f"must be a non-empty string, got {provider_id!r}")
        return _ToolCall(provider_id=provider_id, name=name, arguments=arguments)

    def usage(self, index: int, raw: object) -> Usage:
        if not isinstance(raw, Mapping):
            self.fail(index, "usage", f"must be a mapping, got {_kind(raw)}")
        self.known_fields(index, "usage.", raw, _USAGE_FIELDS)
        counts: list[int] = []
        for name in _USAGE_FIELDS:
            if name not in raw:
                self.fail(index, f"usage.{name}", "missing")
            counts.append(self.integer(index, f"usage.{name}", raw[name], minimum=0))
        return Usage(prompt_tokens=counts[0], completion_tokens=counts[1])

    def error(self, index: int, raw: object) -> _ErrorReply:
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
        return _ErrorReply(code=code, message=message, status=status, retry_after=retry_after)


# --- the model --------------------------------------------------------------------------------


class Scripted:
    """A :class:`~andon.llm.Model` that plays ``replies`` in order, one per model request.

    Each reply is a plain dict (llm.md, Scripted model): ``reasoning``, ``text``, ``tool_calls``
    (``[{name, arguments, id?}]``; mapping arguments are sent as JSON, a string as is),
    ``chunk_size`` (characters per streamed fragment, default 16), ``chunk_delay`` (seconds
    between chunks on ``clock``, default 0), ``finish`` (``stop`` | ``tool_calls`` | ``length``;
    default ``tool_calls`` when there are tool calls, else ``stop``), ``usage``
    (``{prompt_tokens, completion_tokens}``), ``stall_after_chunks`` (stream that many content
    fragments, then nothing — no usage, no finish — until the request is aborted), or
    ``error`` (``{status?, code?, retry_after?, message?}``: the request fails instead of
    streaming).

    A failed attempt whose code is retryable is retried like the HTTP adapter does: after the
    retry policy's delay, the next reply answers the next attempt, at most ``max_retries`` times.
    Running out of replies raises ``ModelError(SCRIPT_EXHAUSTED)``, which is never retried.

    Every reply is validated here; a bad one raises :class:`~andon.base.ScriptInvalid` naming
    its index and field. Each instance has its own cursor. ``source`` names the script in
    ``info.spec`` (``script:<source>``) and in error messages.
    """

    def __init__(
        self,
        replies: Sequence[Mapping[str, Any]],
        *,
        max_retries: int = 3,
        clock: Clock | None = None,
        rng: RandomSource | None = None,
        source: str = "inline",
    ) -> None:
        self._replies = _Parser(None if source == "inline" else source).replies(replies)
        self._policy = RetryPolicy(max_retries=max_retries)
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._rng = rng
        self._cursor = 0
        self._requests: list[ModelRequest] = []
        self._info = ModelInfo(spec=f"script:{source}", provider="script", name="scripted")

    @classmethod
    def from_file(
        cls,
        path: str | os.PathLike[str],
        *,
        max_retries: int = 3,
        clock: Clock | None = None,
        rng: RandomSource | None = None,
    ) -> Scripted:
        """Load a script from YAML or JSON (``{"replies": [...]}`` or a bare list of replies).

        A ``.json`` file is parsed as JSON, anything else as YAML. An unreadable or unparsable
        file, or a malformed reply, raises :class:`~andon.base.ScriptInvalid` naming the file.
        """
        name = os.fspath(path)
        parser = _Parser(name)
        file = Path(name)
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ScriptInvalid(f"cannot read {name}: {exc}", index=None, field=None) from exc
        try:
            data = json.loads(text) if file.suffix.lower() == ".json" else yaml.safe_load(text)
        except (ValueError, yaml.YAMLError) as exc:  # json.JSONDecodeError is a ValueError
            raise ScriptInvalid(f"cannot parse {name}: {exc}", index=None, field=None) from exc
        if isinstance(data, Mapping):
            for key in data:
                if key != "replies":
                    parser.fail(None, str(key), "unknown top-level field; expected replies")
            if "replies" not in data:
                parser.fail(None, "replies", "missing")
            data = data["replies"]
        return cls(data, max_retries=max_retries, clock=clock, rng=rng, source=name)

    @property
    def info(self) -> ModelInfo:
        """``ModelInfo(spec="script:<source>", provider="script", name="scripted")``."""
        return self._info

    @property
    def consumed(self) -> int:
        """How many replies have been used (one per attempt, error replies included)."""
        return self._cursor

    @property
    def remaining(self) -> int:
        """How many replies are left."""
        return len(self._replies) - self._cursor

    @property
    def requests(self) -> tuple[ModelRequest, ...]:
        """Every request passed to :meth:`stream`, in order (for tests to inspect what the
        driver sent; the scripted replies themselves never depend on it)."""
        return tuple(self._requests)

    def __repr__(self) -> str:
        return f"<Scripted {self._info.spec} reply {self._cursor}/{len(self._replies)}>"

    def _take(self) -> _Reply:
        if self._cursor >= len(self._replies):
            raise ModelError(
                ErrorCode.SCRIPT_EXHAUSTED,
                f"no scripted reply left for this request ({self._info.spec}: all "
                f"{len(self._replies)} replies were used); add replies to the script",
            )
        reply = self._replies[self._cursor]
        self._cursor += 1
        return reply

    async def stream(
        self, request: ModelRequest, signal: AbortSignal, on_attempt: OnAttempt
    ) -> AsyncIterator[Chunk]:
        """Answer ``request`` with the next reply(ies); see the class docstring and llm.md."""
        self._requests.append(request)
        attempt = 1
        cause: ModelError | None = None
        delay: float | None = None
        while True:
            # An aborted request never goes out, so it consumes no reply.
            signal.throw_if_aborted()
            await on_attempt(attempt, cause, delay)
            signal.throw_if_aborted()
            reply = self._take()
            if reply.error is None:
                break
            error = reply.error.to_error()
            # Nothing has streamed for an error reply, so the policy alone decides.
            delay = self._policy.next_delay(error, attempt, self._rng)
            if delay is None:
                raise error
            await abortable_sleep(self._clock, delay, signal)
            cause = error
            attempt += 1

        chunks = reply.content()
        stall = reply.stall_after_chunks
        if stall is not None:
            chunks = chunks[:stall]  # a stalled stream never gets to usage or finish
        else:
            if reply.usage is not None:
                chunks.append(reply.usage)
            chunks.append(Finish(reply.finish))
        for n, chunk in enumerate(chunks):
            if n and reply.chunk_delay > 0:
                await abortable_sleep(self._clock, reply.chunk_delay, signal)
            # The per-chunk checkpoint: the consumer may have aborted while handling the last one.
            signal.throw_if_aborted()
            yield chunk
        if stall is not None:
            # No polling: wake exactly when the signal fires, like a silent socket being closed.
            raise Aborted(await signal.wait())
