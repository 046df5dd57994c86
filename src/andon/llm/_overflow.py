"""Recognising "the request is longer than the model's context window" in every shape a server
says it (docs/models.md, Context windows), and reading the figures it names.

Servers disagree on everything but the gist, so the error object's ``code``/``type`` decides when
it names the condition, else the message text does. The shapes, as each server answers them:

* OpenAI: HTTP 400, ``code: "context_length_exceeded"``, "This model's maximum context length is
  N tokens. However, your messages resulted in M tokens." (or "you requested M tokens (X in the
  messages, Y in the completion)"; lately also "Your input exceeds the context window of this
  model");
* DeepSeek: HTTP 400, ``code: "invalid_request_error"``, "This model's maximum context length is
  N tokens. However, you requested M tokens (X in the messages, Y in the completion). Please
  reduce the length of the messages or completion.";
* vLLM: HTTP 400, ``type: "BadRequestError"``, "This model's maximum context length is N tokens.
  However, your request has M input tokens." (older releases: "However, you requested M tokens
  (...)", in a top-level ``{"object": "error", "message": ...}``);
* llama.cpp's server: HTTP 400, ``type: "exceed_context_size_error"``, "request (M tokens) exceeds
  the available context size (N tokens), try increasing it", with ``n_prompt_tokens`` and
  ``n_ctx`` beside it (Ollama, which runs it, may quote that body as a string in its own error);
* llama-cpp-python's server: HTTP 400, ``code: "context_length_exceeded"``, the OpenAI wording
  with "(X in the messages, Y in the completion)".

``requested`` is the request's *input* as the server counted it: the messages (and functions)
part when the message splits the total, else the total it names — what a caller compacting the
history needs, since the completion part is the caller's ``max_tokens``, not history.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from andon.base import ErrorCode, ModelError

__all__ = ["EMPTY_STREAM", "detect_overflow", "is_empty_stream", "overflow_figures"]

EMPTY_STREAM: Final = (
    "the model stream ended without any event after 0 data event(s): the server accepted the "
    "request and sent nothing (llama-cpp-python's server answers a streamed request longer than "
    "its context window so); the reply is incomplete"
)
"""The message of the ``STREAM_TRUNCATED`` of an event stream that ended without a data event."""

_OVERFLOW_NAMES: Final = ("context_length_exceeded", "exceed_context_size_error")
"""``code``/``type`` values that name the condition by themselves."""

_LIMIT: Final = re.compile(r"maximum context length is (\d+) tokens", re.IGNORECASE)
_SPLIT: Final = re.compile(
    r"you requested (\d+) tokens\s*\((\d+) in (?:the messages|your prompt)"
    r"(?:,\s*(\d+) in the functions)?",
    re.IGNORECASE,
)
_INPUT: Final = (
    re.compile(r"you requested (\d+) tokens", re.IGNORECASE),
    re.compile(r"your messages resulted in (\d+) tokens", re.IGNORECASE),
    re.compile(r"your request has (\d+) input tokens", re.IGNORECASE),
    re.compile(r"your prompt contains at least (\d+) input tokens", re.IGNORECASE),
)
# (requested, limit) in this order in the text.
_BOTH: Final = (
    re.compile(
        r"request \((\d+) tokens\) exceeds the available context size \((\d+) tokens\)",
        re.IGNORECASE,
    ),
    re.compile(
        r"input \((\d+) tokens\) is larger than the max context size \((\d+) tokens\)",
        re.IGNORECASE,
    ),
    re.compile(r"requested tokens \((\d+)\) exceed context window of (\d+)", re.IGNORECASE),
)
_PLAIN: Final = re.compile(
    r"exceeds the context window|context length exceeded|context_length_exceeded"
    r"|exceed_context_size_error",
    re.IGNORECASE,
)


def _count(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int) and value >= 0:
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def _from_text(text: str) -> tuple[bool, int | None, int | None]:
    """Whether ``text`` says the window was exceeded, and the (limit, requested) it names."""
    for pattern in _BOTH:
        found = pattern.search(text)
        if found is not None:
            return True, int(found.group(2)), int(found.group(1))
    limit_match = _LIMIT.search(text)
    if limit_match is None:
        return _PLAIN.search(text) is not None, None, None
    limit = int(limit_match.group(1))
    split = _SPLIT.search(text)
    if split is not None:
        return True, limit, int(split.group(2)) + int(split.group(3) or 0)
    for pattern in _INPUT:
        found = pattern.search(text)
        if found is not None:
            return True, limit, int(found.group(1))
    return True, limit, None


def detect_overflow(
    error: Mapping[str, Any] | None, text: str
) -> tuple[int | None, int | None] | None:
    """``(limit, requested)`` if the error object ``error`` (an ``{"error": ...}`` value, or
    ``None``) or the server's ``text`` says the request exceeded the context window, else
    ``None``. Pure: no I/O, never raises."""
    named = False
    limit = requested = None
    if error is not None:
        for field in ("code", "type"):
            value = error.get(field)
            if isinstance(value, str) and value.lower() in _OVERFLOW_NAMES:
                named = True
        limit = _count(error.get("n_ctx"))
        requested = _count(error.get("n_prompt_tokens"))
    said, text_limit, text_requested = _from_text(text)
    if not (named or said):
        return None
    return (
        limit if limit is not None else text_limit,
        requested if requested is not None else text_requested,
    )


def overflow_figures(error: ModelError | str) -> tuple[int | None, int | None]:
    """``(limit, requested)`` of a context overflow: the window in tokens and the request's input
    tokens, as the server stated them (``None`` where it did not).

    For a :class:`~andon.base.ModelError` of code ``CONTEXT_OVERFLOW`` its own ``limit`` and
    ``requested``, else what its message names (an error rebuilt from a log record, say); for any
    other code ``(None, None)``. A string is read as a server's message.
    """
    if isinstance(error, ModelError):
        if error.code != ErrorCode.CONTEXT_OVERFLOW:
            return None, None
        if error.limit is not None or error.requested is not None:
            return error.limit, error.requested
        text = error.message
    else:
        text = error
    _, limit, requested = _from_text(text)
    return limit, requested


def is_empty_stream(error: ModelError) -> bool:
    """Whether ``error`` is an HTTP 200 event stream that ended without a single data event (or
    with only ``[DONE]``): a ``STREAM_TRUNCATED`` that cannot be told from a context overflow by
    itself (llama-cpp-python's server answers a streamed overflow so), only by a caller that knows
    the request was near the window."""
    return error.code == ErrorCode.STREAM_TRUNCATED and error.message == EMPTY_STREAM
