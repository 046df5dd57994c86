"""The request builder: a :class:`~andon.llm.ModelRequest` becomes an OpenAI chat-completions body.

The messages are OpenAI chat dicts as ``andon.session.history`` produces them (an optional leading
``system`` message, then ``user``, ``assistant`` and ``tool`` messages; the fold keeps
``reasoning_content`` on every assistant message, ``""`` when it had none). They pass through as
they are, with one per-provider change: what happens to an assistant message's
``reasoning_content`` (docs/models.md, What is sent).

* DeepSeek with thinking on (the V4 rule, DeepSeek's "Thinking Mode → Tool Calls"): split the
  messages into *spans* at every ``user`` message. In every span in which the model made a tool
  call, **every** assistant message goes back with its ``reasoning_content`` (``""`` when it had
  none) — in this and in every later request, also after later user messages and however long
  ago the span was. Otherwise the API answers HTTP 400 ("The reasoning_content in the thinking
  mode must be passed back to the API"). Reasoning of a span without tool calls is left out: the
  API ignores it, and leaving it out keeps requests small.

  A ``steer`` or ``inject`` delivered inside a turn is a ``user`` message in the history, so it
  splits the turn into two spans, and the tool-using span before it keeps its reasoning. (The
  V3.2-era rule kept only the span after the *last* user message; with it, every request after
  such a second user message failed.) ``system`` and ``tool`` messages never split a span: a
  leading system message belongs to the first span and changes nothing, since only assistant
  messages carry reasoning.
* DeepSeek with thinking off (``thinking=False``), and every other provider: no
  ``reasoning_content`` at all. It is not part of the OpenAI format, strict servers reject
  unknown message fields, and without thinking DeepSeek has no reasoning to continue.

A request's ``response_schema`` (``--output-schema``) becomes OpenAI's ``response_format``
(``json_schema``) for OpenAI only, the one provider whose parameter leaves tool calls alone: the
model still calls tools, and only its answer to the user follows the schema. It is sent with
``strict: false``, since strict mode accepts only a subset of JSON Schema and answers HTTP 400 to
any other schema, and andon validates the answer against the full schema anyway. DeepSeek's
``json_object`` mode and a generic server's ``json_schema`` (llama.cpp compiles it into a grammar
that has no room for a tool call) would force JSON on every step of the turn, tool steps
included, so those get the schema in the prompt only (docs/models.md, Structured output).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from andon.llm._types import ModelRequest

__all__ = ["DEEPSEEK", "OPENAI", "build_request_body", "reasoning_needed"]

DEEPSEEK: Final = "deepseek"
"""The provider name whose requests carry ``thinking`` and pass reasoning back."""
OPENAI: Final = "openai"
"""OpenAI's own API: ``max_completion_tokens``, and the ``json_schema`` response format."""

_REASONING: Final = "reasoning_content"


def reasoning_needed(messages: Sequence[dict[str, Any]]) -> list[bool]:
    """For each message, whether DeepSeek (thinking on) needs its ``reasoning_content`` back.

    The V4 rule of the module docstring: an assistant message is needed exactly when its span —
    the messages between two ``user`` messages (or the start or end of the list) — contains an
    assistant message with tool calls. Every other message is not.
    """
    needed = [False] * len(messages)
    span: list[int] = []  # the assistant messages of the current span
    called = False  # whether one of them made tool calls

    def close() -> None:
        if called:
            for i in span:
                needed[i] = True

    for index, message in enumerate(messages):
        role = message.get("role")
        if role == "user":
            close()
            span, called = [], False
        elif role == "assistant":
            span.append(index)
            called = called or bool(message.get("tool_calls"))
    close()
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
    default, which is on); reasoning goes back per :func:`reasoning_needed` only while it is on.
    ``max_tokens`` is sent as ``max_completion_tokens`` to OpenAI (its reasoning models reject
    the older name) and as ``max_tokens`` elsewhere. An empty tool list is left out, since some
    servers reject ``"tools": []``. The request's dicts are copied, never changed.
    """
    deepseek = provider == DEEPSEEK
    needed = reasoning_needed(request.messages) if deepseek and thinking is not False else None
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
        body["max_completion_tokens" if provider == OPENAI else "max_tokens"] = request.max_tokens
    if deepseek:
        body["thinking"] = {"type": "disabled" if thinking is False else "enabled"}
    if request.response_schema is not None and provider == OPENAI:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {
                "name": request.response_schema.name,
                "schema": dict(request.response_schema.schema),
                "strict": False,
            },
        }
    return body
