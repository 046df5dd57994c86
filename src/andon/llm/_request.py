"""The request builder: a :class:`~andon.llm.ModelRequest` becomes an OpenAI chat-completions body.

The messages are OpenAI chat dicts as ``andon.session.history`` produces them (an optional leading
``system`` message, then ``user``, ``assistant`` and ``tool`` messages). They pass through as they
are, with one per-provider change: what happens to an assistant message's ``reasoning_content``.

* DeepSeek thinking mode **requires** the reasoning of every assistant message in a span between
  two user messages in which the model called tools, in every later request, even when that
  reasoning is empty; otherwise the API answers HTTP 400 ("The reasoning_content in the thinking
  mode must be passed back to the API"). Reasoning of a span without tool calls is not needed (the
  API ignores it), so it is left out to keep requests small. The span that follows the last user
  message is the case llm.md spells out; earlier spans with tool calls keep their reasoning too,
  because DeepSeek's guide says it must be passed back "in all subsequent requests".
* Every other provider gets no ``reasoning_content`` at all: it is not part of the OpenAI format,
  and strict servers reject unknown message fields.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from andon.llm._types import ModelRequest

__all__ = ["DEEPSEEK", "build_request_body", "reasoning_needed"]

DEEPSEEK: Final = "deepseek"
"""The provider name whose requests carry ``thinking`` and pass reasoning back."""

_REASONING: Final = "reasoning_content"


def reasoning_needed(messages: Sequence[dict[str, Any]]) -> list[bool]:
    """For each message, whether DeepSeek needs its ``reasoning_content`` sent back.

    llm.md's rule: once the model has made tool calls since the last user message, every
    assistant message of that span (after the last user message) goes back with its reasoning,
    even when empty. Reasoning of earlier spans, or of a span without tool calls, is not sent.
    """
    needed = [False] * len(messages)
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    span = [
        i for i in range(last_user + 1, len(messages)) if messages[i].get("role") == "assistant"
    ]
    if any(messages[i].get("tool_calls") for i in span):
        for i in span:
            needed[i] = True
    return needed


def build_request_body(
    request: ModelRequest,
    *,
    model: str,
    provider: str,
    thinking: bool | None,
    stream: bool = True,
) -> dict[str, Any]:
    """The JSON body of ``POST {base_url}/chat/completions`` for ``request``.

    ``thinking`` is sent for DeepSeek only, always explicitly (``None`` means the API's own
    default, which is on). ``max_tokens`` is sent as ``max_completion_tokens`` to OpenAI (its
    reasoning models reject the older name) and as ``max_tokens`` elsewhere. An empty tool list is
    left out, since some servers reject ``"tools": []``. The request's dicts are copied, never
    changed.
    """
    deepseek = provider == DEEPSEEK
    needed = reasoning_needed(request.messages) if deepseek else None
    messages: list[dict[str, Any]] = []
    for index, original in enumerate(request.messages):
        message = dict(original)
        if message.get("role") == "assistant":
            reasoning = message.pop(_REASONING, None)
            if needed is not None and needed[index]:
                message[_REASONING] = reasoning if isinstance(reasoning, str) else ""
        messages.append(message)

    body: dict[str, Any] = {"model": model, "messages": messages, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    if request.tools:
        body["tools"] = [dict(tool) for tool in request.tools]
    if request.max_tokens is not None:
        body["max_completion_tokens" if provider == "openai" else "max_tokens"] = request.max_tokens
    if deepseek:
        body["thinking"] = {"type": "disabled" if thinking is False else "enabled"}
    return body
