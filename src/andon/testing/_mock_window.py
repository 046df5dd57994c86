"""The mock server's context window (docs/models.md, The mock server): the one rule it counts a
request's prompt tokens by, and the answer each provider gives a request over its window, exactly
as that provider answers it (docs/models.md, Context windows)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, Final

from andon.llm import SUMMARY_MARKER

__all__ = [
    "MOCK_BYTES_PER_TOKEN",
    "OVERFLOW_SHAPES",
    "SUMMARY_MARKER",
    "last_text",
    "mock_prompt_tokens",
    "overflow_answer",
]

OVERFLOW_SHAPES: Final[tuple[str, ...]] = (
    "openai",
    "deepseek",
    "vllm",
    "llamacpp",
    "llama-cpp-python",
    "empty-stream",
)
"""How the mock answers a request over its ``context_window`` (see :class:`MockModelServer`)."""

MOCK_BYTES_PER_TOKEN: Final = 4
"""The mock's one token rule: see :func:`mock_prompt_tokens`."""


def mock_prompt_tokens(body: Mapping[str, Any]) -> int:
    """The prompt tokens the mock server counts for a chat-completions request ``body``: the
    UTF-8 bytes of ``json.dumps([messages, tools], ensure_ascii=False, separators=(",", ":"))``
    divided by :data:`MOCK_BYTES_PER_TOKEN` (4), rounded up (``tools`` is ``[]`` when absent).

    One rule, documented, so a test can compute exactly what the mock will accept; no real
    tokenizer works like this, which is the point: andon must calibrate from ``usage``."""
    messages = body.get("messages", [])
    tools = body.get("tools") or []
    text = json.dumps([messages, tools], ensure_ascii=False, separators=(",", ":"))
    return math.ceil(len(text.encode("utf-8", "surrogatepass")) / MOCK_BYTES_PER_TOKEN)


def overflow_answer(shape: str, window: int, tokens: int, body: Mapping[str, Any]) -> bytes:
    """The HTTP 400 body a real server of ``shape`` answers for a request of ``tokens`` prompt
    tokens over a window of ``window`` (docs/models.md, The mock server)."""
    completion = body.get("max_tokens")
    if shape == "openai":
        error: dict[str, Any] = {
            "message": f"This model's maximum context length is {window} tokens. However, your "
            f"messages resulted in {tokens} tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    elif shape in ("deepseek", "llama-cpp-python"):
        # DeepSeek counts an absent max_tokens as 0; llama-cpp-python formats the request's
        # max_tokens as it is, None included.
        shown = completion if shape == "llama-cpp-python" else (completion or 0)
        total = tokens + (completion if isinstance(completion, int) else 0)
        error = {
            "message": f"This model's maximum context length is {window} tokens. However, you "
            f"requested {total} tokens ({tokens} in the messages, {shown} in the completion). "
            "Please reduce the length of the messages or completion.",
            "type": "invalid_request_error",
            "param": "messages" if shape == "llama-cpp-python" else None,
            "code": "context_length_exceeded"
            if shape == "llama-cpp-python"
            else "invalid_request_error",
        }
    elif shape == "vllm":
        error = {
            "message": f"This model's maximum context length is {window} tokens. However, your "
            f"request has {tokens} input tokens. Please reduce the length of the input messages.",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        }
    else:  # llamacpp
        error = {
            "code": 400,
            "message": f"request ({tokens} tokens) exceeds the available context size "
            f"({window} tokens), try increasing it",
            "type": "exceed_context_size_error",
            "n_prompt_tokens": tokens,
            "n_ctx": window,
        }
    return json.dumps({"error": error}).encode()


def last_text(messages: object) -> str:
    """The text of the last message of a request (its string content, or its text parts)."""
    if not isinstance(messages, list) or not messages or not isinstance(messages[-1], Mapping):
        return ""
    content = messages[-1].get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, Mapping) and isinstance(part.get("text"), str)
        )
    return ""
