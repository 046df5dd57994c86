"""From the data payloads of a chat-completions event stream to typed chunks (docs/models.md, What
comes back).

:class:`StreamParser` sees one ``data:`` payload at a time (SSE framing and comment lines are
httpx-sse's business) and keeps the little state a reply needs: which provider tool-call index
maps to which of ours, the finish reason and the latest usage. It never indexes ``choices[0]``
blindly: usage-only chunks have ``choices: []``, and a choice other than index 0 (``n > 1``, never
requested) is ignored. Roles may appear, or be ``null``, in any delta; they carry nothing.

Text is made safe to log as it is parsed (``_wire.valid_text``): a lone UTF-16 surrogate (a JSON
``"\\ud83d"`` escape from a proxy that slices text by UTF-16 index) becomes U+FFFD instead of
failing the turn. Because such a proxy splits a pair *between* two deltas, a delta of ``content``,
``reasoning_content`` or a call's ``arguments`` that ends in the first half of a pair holds that
half back until the next delta of the same field; if the reply finishes first, it becomes U+FFFD.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final, NoReturn

from andon.base import ErrorCode, ModelError
from andon.llm._failures import payload_error, scrub
from andon.llm._types import (
    Chunk,
    FinishReason,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from andon.llm._wire import REPLACEMENT, ends_in_high_surrogate, usage_from_wire, valid_text

__all__ = ["DONE", "StreamParser"]

DONE: Final = "[DONE]"
"""The data payload that ends an OpenAI-style stream."""

_FINISHES: Final[dict[str, FinishReason]] = {
    "stop": "stop",
    "tool_calls": "tool_calls",
    "length": "length",
    "function_call": "tool_calls",  # the pre-tools name some servers still send
}


def _malformed(detail: str) -> NoReturn:
    raise ModelError(ErrorCode.MALFORMED_STREAM, f"the model API sent a malformed stream: {detail}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_TEXT: Final = -1  # keys of the held-back surrogate halves: these two, or a call's dense index
_REASONING: Final = -2


class StreamParser:
    """Turns data payloads into chunks; raises :class:`ModelError` for errors in the stream."""

    __slots__ = ("_calls", "_has_id", "_held", "_last_key", "_secret", "finish", "usage")

    def __init__(self, secret: str | None = None) -> None:
        self._secret = secret
        self._calls: dict[int, int] = {}  # provider index -> our dense index, in first-seen order
        self._has_id: set[int] = set()
        self._last_key: int | None = None
        self._held: dict[int, str] = {}  # field -> a trailing high surrogate awaiting its pair
        self.finish: FinishReason | None = None
        self.usage: Usage | None = None

    def feed(self, data: str) -> list[Chunk]:
        """The chunks carried by one data payload (``[DONE]`` is the caller's business)."""
        try:
            payload = json.loads(data)
        except ValueError:
            _malformed(f"a chunk is not valid JSON: {scrub(data, self._secret)!r}")
        if not isinstance(payload, dict):
            _malformed(f"a chunk is not a JSON object: {scrub(data, self._secret)!r}")
        error = payload.get("error")
        if error is not None:
            raise payload_error(error, self._secret)
        usage = payload.get("usage")
        if isinstance(usage, Mapping):
            # Accounting is optional: a strange usage object never fails a reply.
            self.usage = usage_from_wire(usage) or self.usage
        choices = payload.get("choices")
        if choices is None:
            return []
        if not isinstance(choices, list):
            _malformed(f"'choices' is a {type(choices).__name__}, not a list")
        out: list[Chunk] = []
        for choice in choices:
            if not isinstance(choice, Mapping):
                _malformed("a choice is not a JSON object")
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if isinstance(delta, Mapping):
                self._delta(delta, out)
            elif delta is not None:
                _malformed("a choice's 'delta' is not a JSON object")
            reason = choice.get("finish_reason")
            if reason is not None:
                self._finish(reason)
        if self.finish is not None and self._held:
            self._flush(out)
        return out

    def _text(self, field: int, piece: str) -> str:
        """``piece`` made valid, after the half pair held back for ``field``, minus a new one."""
        held = self._held.pop(field, None)
        if held is not None:
            piece = held + piece
        if ends_in_high_surrogate(piece):
            self._held[field] = piece[-1]
            piece = piece[:-1]
        return valid_text(piece)

    def _flush(self, out: list[Chunk]) -> None:
        """The reply finished: a half pair still held back had no partner, so it is lone."""
        for field in sorted(self._held):  # reasoning (-2), text (-1), then the calls in order
            if field == _REASONING:
                out.append(ReasoningDelta(REPLACEMENT))
            elif field == _TEXT:
                out.append(TextDelta(REPLACEMENT))
            else:
                out.append(ToolCallDelta(field, None, None, REPLACEMENT))
        self._held.clear()

    def _delta(self, delta: Mapping[str, Any], out: list[Chunk]) -> None:
        # DeepSeek says reasoning_content; vLLM and Ollama's OpenAI layer say reasoning.
        reasoning = delta.get("reasoning_content")
        if reasoning is None:
            reasoning = delta.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            reasoning = self._text(_REASONING, reasoning)
            if reasoning:
                out.append(ReasoningDelta(reasoning))
        content = delta.get("content")
        if isinstance(content, str):
            if content:
                content = self._text(_TEXT, content)
            if content:
                out.append(TextDelta(content))
        elif content is not None:
            _malformed(f"'content' is a {type(content).__name__}, not a string")
        calls = delta.get("tool_calls")
        if calls is None:
            return
        if not isinstance(calls, list):
            _malformed("'tool_calls' is not a list")
        for call in calls:
            if not isinstance(call, Mapping):
                _malformed("a tool call is not a JSON object")
            self._tool_call(call, out)

    def _tool_call(self, call: Mapping[str, Any], out: list[Chunk]) -> None:
        function = call.get("function")
        if function is None:
            function = {}
        if not isinstance(function, Mapping):
            _malformed("a tool call's 'function' is not a JSON object")
        name = function.get("name")
        name = valid_text(name) if isinstance(name, str) and name else None
        key = call.get("index")
        if key is None:
            # A server that omits the index sends each call whole: a name starts a new call, a
            # nameless fragment continues the last one. Synthetic keys are negative.
            if name is not None or self._last_key is None:
                key = -1 - len(self._calls)
            else:
                key = self._last_key
        elif not _is_int(key) or key < 0:
            _malformed(f"a tool call has the index {key!r}")
        self._last_key = key
        arguments = function.get("arguments")
        if arguments is None:
            arguments = ""
        elif isinstance(arguments, Mapping):  # a few servers send the object itself
            arguments = json.dumps(arguments)
        elif not isinstance(arguments, str):
            _malformed(f"a tool call has arguments of type {type(arguments).__name__}")
        provider_id = call.get("id")
        if not (isinstance(provider_id, str) and provider_id):
            provider_id = None
        else:
            provider_id = valid_text(provider_id)

        ours = self._calls.get(key)
        first = ours is None
        if ours is None:
            if name is None:
                _malformed(f"tool call {len(self._calls)} arrived without a name")
            ours = self._calls[key] = len(self._calls)
        if arguments:
            arguments = self._text(ours, arguments)
        if first:
            if provider_id is not None:
                self._has_id.add(ours)
            out.append(ToolCallDelta(ours, provider_id, name, arguments))
            return
        # A later fragment: a repeated name is dropped; an id is passed on only if the first
        # fragment had none.
        new_id = None
        if provider_id is not None and ours not in self._has_id:
            self._has_id.add(ours)
            new_id = provider_id
        if arguments or new_id is not None:
            out.append(ToolCallDelta(ours, new_id, None, arguments))

    def _finish(self, reason: object) -> None:
        if reason == "content_filter":
            raise ModelError(
                ErrorCode.CONTENT_FILTER,
                "the provider's content filter stopped the reply (finish content_filter); "
                "rephrase the request or change what the tools return",
            )
        if reason == "insufficient_system_resource":
            raise ModelError(
                ErrorCode.OVERLOADED,
                "the model API ran out of capacity for this request "
                "(finish insufficient_system_resource); try again later",
            )
        finish = _FINISHES.get(reason) if isinstance(reason, str) else None
        if finish is None:
            _malformed(f"unknown finish_reason {reason!r}")
        self.finish = finish
