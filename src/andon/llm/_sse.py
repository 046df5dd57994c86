"""From the data payloads of a chat-completions event stream to typed chunks (llm.md, Wire format).

:class:`StreamParser` sees one ``data:`` payload at a time (SSE framing and comment lines are
httpx-sse's business) and keeps the little state a reply needs: which provider tool-call index
maps to which of ours, the finish reason and the latest usage. It never indexes ``choices[0]``
blindly: usage-only chunks have ``choices: []``, and a choice other than index 0 (``n > 1``, never
requested) is ignored. Roles may appear, or be ``null``, in any delta; they carry nothing.
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


def _usage(raw: Mapping[str, Any]) -> Usage | None:
    prompt, completion = raw.get("prompt_tokens"), raw.get("completion_tokens")
    if (
        isinstance(prompt, int)
        and isinstance(completion, int)
        and _is_int(prompt)
        and _is_int(completion)
        and prompt >= 0
        and completion >= 0
    ):
        return Usage(prompt_tokens=prompt, completion_tokens=completion)
    return None  # accounting is optional; a strange usage object never fails a reply


class StreamParser:
    """Turns data payloads into chunks; raises :class:`ModelError` for errors in the stream."""

    __slots__ = ("_calls", "_has_id", "_last_key", "_secret", "finish", "usage")

    def __init__(self, secret: str | None = None) -> None:
        self._secret = secret
        self._calls: dict[int, int] = {}  # provider index -> our dense index, in first-seen order
        self._has_id: set[int] = set()
        self._last_key: int | None = None
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
            self.usage = _usage(usage) or self.usage
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
        return out

    def _delta(self, delta: Mapping[str, Any], out: list[Chunk]) -> None:
        # DeepSeek says reasoning_content; vLLM and Ollama's OpenAI layer say reasoning.
        reasoning = delta.get("reasoning_content")
        if reasoning is None:
            reasoning = delta.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            out.append(ReasoningDelta(reasoning))
        content = delta.get("content")
        if isinstance(content, str):
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
        if not (isinstance(name, str) and name):
            name = None
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

        ours = self._calls.get(key)
        if ours is None:
            if name is None:
                _malformed(f"tool call {len(self._calls)} arrived without a name")
            ours = self._calls[key] = len(self._calls)
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
