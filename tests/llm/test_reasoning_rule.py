"""DeepSeek V4's reasoning pass-back rule (docs/models.md, What is sent): the rule on histories,
and the real adapter against the mock server in strict mode, which answers HTTP 400 exactly as
DeepSeek does when a tool-using span's reasoning is missing."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import httpx
import pytest

from andon.base import AbortController, ErrorCode, ModelError
from andon.llm import (
    Chunk,
    ModelRequest,
    OpenAICompatible,
    ReasoningDelta,
    RetryPolicy,
    TextDelta,
    ToolCallDelta,
    build_request_body,
    reasoning_needed,
)
from andon.llm import _request as request_module
from andon.testing import MockModelServer

SYSTEM = {"role": "system", "content": "You fix builds."}
FAST = RetryPolicy(max_retries=3, base_delay=0.001, max_delay=0.001)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str | None, *calls: str, reasoning: str = "") -> dict[str, Any]:
    """An assistant message as the session's history fold writes it: ``reasoning_content`` always
    present, ``""`` when the reply had none."""
    message: dict[str, Any] = {"role": "assistant", "content": text, "reasoning_content": reasoning}
    if calls:
        message["tool_calls"] = [
            {"id": c, "type": "function", "function": {"name": "bash", "arguments": "{}"}}
            for c in calls
        ]
    return message


def tool(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": "ok"}


def _v32_rule(messages: Sequence[dict[str, Any]]) -> list[bool]:
    """The old (V3.2-era) rule, kept to show that V4 rejects it: only the span after the last user
    message keeps its reasoning."""
    needed = [False] * len(messages)
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    span = [
        i for i in range(last_user + 1, len(messages)) if messages[i].get("role") == "assistant"
    ]
    if any(messages[i].get("tool_calls") for i in span):
        for i in span:
            needed[i] = True
    return needed


def sent_reasoning(messages: Sequence[dict[str, Any]], **options: Any) -> list[str | None]:
    options.setdefault("provider", "deepseek")
    options.setdefault("thinking", True)
    body = build_request_body(ModelRequest(messages=tuple(messages)), model="m", **options)
    return [m.get("reasoning_content") for m in body["messages"]]


# --- the rule on histories ------------------------------------------------------------------------


def test_one_tool_using_span_keeps_every_reply_s_reasoning() -> None:
    history = [
        SYSTEM,
        user("Fix the build"),
        assistant("Running make.", "c1", reasoning="The log says"),
        tool("c1"),
        assistant("Fixed.", reasoning="Done."),  # no call of its own: its span had one
    ]
    assert reasoning_needed(history) == [False, False, True, False, True]
    assert sent_reasoning(history) == [None, None, "The log says", None, "Done."]


def test_two_tool_using_spans_both_keep_it_after_later_user_messages() -> None:
    history = [
        user("Fix the build"),
        assistant(None, "c1", reasoning="r1"),
        tool("c1"),
        assistant("Fixed."),
        user("Now lint"),
        assistant(None, "c2"),
        tool("c2"),
        assistant("Clean.", reasoning="r2"),
        user("Thanks"),
        assistant("You're welcome.", reasoning="polite"),
    ]
    assert sent_reasoning(history) == [
        None,
        "r1",
        None,
        "",  # had none: sent as ""
        None,
        "",
        None,
        "r2",
        None,
        None,  # the last span made no call
    ]


def test_a_span_without_tools_between_two_tool_spans_is_left_out() -> None:
    history = [
        user("a"),
        assistant(None, "c1", reasoning="r1"),
        tool("c1"),
        assistant("done a", reasoning="r1b"),
        user("b"),
        assistant("plain answer", reasoning="no tools here"),
        user("c"),
        assistant(None, "c2", reasoning="r3"),
        tool("c2"),
    ]
    assert sent_reasoning(history) == [None, "r1", None, "r1b", None, None, None, "r3", None]


def test_a_steer_mid_turn_splits_the_turn_and_the_span_before_it_keeps_its_reasoning() -> None:
    # The steer arrives while the turn is using tools: it is a user message in the history.
    history = [
        user("Fix the build"),
        assistant(None, "c1", reasoning="r1"),
        tool("c1"),
        user("also run the tests"),  # the steer
        assistant("Done, tests pass.", reasoning="r2"),
    ]
    assert reasoning_needed(history) == [False, True, False, False, False]
    assert _v32_rule(history) == [False] * 5  # what the old rule sent: nothing, a 400 at V4
    more = [*history[:-1], assistant(None, "c2", reasoning="r2"), tool("c2")]
    assert reasoning_needed(more) == [False, True, False, False, True, False]


def test_system_messages_do_not_split_spans_and_a_leading_one_changes_nothing() -> None:
    body = [user("a"), assistant(None, "c1"), tool("c1"), assistant("ok", reasoning="r")]
    assert reasoning_needed([SYSTEM, *body])[1:] == reasoning_needed(body)
    # A system message mid-span (a reminder, say) neither ends the span nor needs reasoning.
    mid = [user("a"), assistant(None, "c1"), tool("c1"), SYSTEM, assistant("ok", reasoning="r")]
    assert reasoning_needed(mid) == [False, True, False, False, True]


def test_histories_without_user_messages_or_with_empty_tool_calls() -> None:
    assert reasoning_needed([]) == []
    assert reasoning_needed([SYSTEM, assistant(None, "c1"), tool("c1")]) == [False, True, False]
    empty_calls = {**assistant("x"), "tool_calls": []}
    assert reasoning_needed([user("a"), empty_calls]) == [False, False]


def test_a_message_without_the_field_is_sent_with_an_empty_string() -> None:
    bare = {"role": "assistant", "content": None, "tool_calls": assistant(None, "c1")["tool_calls"]}
    assert sent_reasoning([user("a"), bare, tool("c1")]) == [None, "", None]


@pytest.mark.parametrize(
    "options",
    [
        {"provider": "deepseek", "thinking": False},
        {"provider": "openai-compatible", "thinking": None},
        {"provider": "openai", "thinking": None},
    ],
    ids=["thinking-off", "generic", "openai"],
)
def test_thinking_off_or_another_provider_sends_no_reasoning(options: dict[str, Any]) -> None:
    history = [user("a"), assistant(None, "c1", reasoning="r1"), tool("c1"), assistant("done")]
    assert sent_reasoning(history, **options) == [None] * 4


# --- the strict mock server ----------------------------------------------------------------------


class Conversation:
    """Drives the real adapter through a conversation, building each request's messages the way
    the session's history fold does (docs/models.md, What is sent; docs/log-format.md,
    What is derived from the log): every assistant message carries its ``reasoning_content``,
    ``""`` when none streamed."""

    def __init__(self, model: OpenAICompatible) -> None:
        self.model = model
        self.messages: list[dict[str, Any]] = [SYSTEM]
        self.attempts = 0

    def user(self, text: str) -> None:
        self.messages.append(user(text))

    async def reply(self) -> dict[str, Any]:
        async def on_attempt(n: int, error: ModelError | None, delay: float | None) -> None:
            self.attempts += 1

        request = ModelRequest(messages=tuple(self.messages))
        chunks = [c async for c in self.model.stream(request, AbortController().signal, on_attempt)]
        message = _assistant_message(chunks)
        self.messages.append(message)
        for call in message.get("tool_calls", []):
            self.messages.append(tool(call["id"]))
        return message


def _assistant_message(chunks: list[Chunk]) -> dict[str, Any]:
    text = "".join(c.text for c in chunks if isinstance(c, TextDelta))
    calls: dict[int, dict[str, Any]] = {}
    for c in chunks:
        if isinstance(c, ToolCallDelta):
            call = calls.setdefault(
                c.index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
            )
            call["id"] = call["id"] or c.provider_id
            call["function"]["name"] += c.name or ""
            call["function"]["arguments"] += c.arguments
    message: dict[str, Any] = {
        "role": "assistant",
        "content": text or None,
        "reasoning_content": "".join(c.text for c in chunks if isinstance(c, ReasoningDelta)),
    }
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


def call(name: str, call_id: str) -> dict[str, Any]:
    return {"name": name, "arguments": {"command": name}, "id": call_id}


# Three user turns with tool calls, and a steer (a second user message) inside the first
# tool-using span. Some replies carry reasoning, some do not (sent back as "").
REPLIES: list[dict[str, Any]] = [
    {"reasoning": "Read the log first.", "tool_calls": [call("make", "c1")]},
    {"tool_calls": [call("cat build.log", "c2")]},  # no reasoning at all
    # the steer arrives here
    {"reasoning": "Tests too, then.", "tool_calls": [call("pytest", "c3")]},
    {"text": "Build fixed and tests pass.", "reasoning": "All green."},
    # user turn 2
    {"reasoning": "Summarise the diff.", "text": "One missing semicolon."},
    # user turn 3
    {"tool_calls": [call("ruff check", "c4")]},
    {"text": "Lint is clean."},
    # user turn 4: a plain question long after the tool-using spans
    {"text": "Yes.", "reasoning": "Recall."},
]


async def converse(model: OpenAICompatible) -> Conversation:
    chat = Conversation(model)
    chat.user("Fix the build")
    await chat.reply()
    await chat.reply()
    chat.user("also run the tests")  # a steer inside the tool-using span
    await chat.reply()
    await chat.reply()
    chat.user("What changed?")
    await chat.reply()
    chat.user("Run lint")
    await chat.reply()
    await chat.reply()
    chat.user("Is that all?")
    await chat.reply()
    return chat


def deepseek(server: MockModelServer) -> OpenAICompatible:
    return OpenAICompatible(
        server.base_url,
        "deepseek-v4-flash",
        api_key_env=None,
        provider="deepseek",
        thinking=True,
        retry_policy=FAST,
    )


async def test_the_strict_server_accepts_every_request_of_a_long_conversation() -> None:
    async with (
        MockModelServer(REPLIES, strict_reasoning=True) as server,
        deepseek(server) as model,
    ):
        chat = await converse(model)
        assert server.rejected == 0
        assert server.remaining == 0
        requests = server.requests
    assert len(requests) == len(REPLIES) == chat.attempts  # no request needed a retry
    last = requests[-1].body["messages"]
    # The last request still carries every reply of both tool-using spans (the first split by
    # the steer into two), and none of the plain span's.
    assert [(m["role"], m.get("reasoning_content")) for m in last if m["role"] != "tool"] == [
        ("system", None),
        ("user", None),
        ("assistant", "Read the log first."),
        ("assistant", ""),
        ("user", None),
        ("assistant", "Tests too, then."),
        ("assistant", "All green."),
        ("user", None),
        ("assistant", None),  # a span without tool calls
        ("user", None),
        ("assistant", ""),
        ("assistant", ""),
        ("user", None),
    ]


async def test_the_old_rule_is_rejected_by_the_strict_server_after_the_steer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(request_module, "reasoning_needed", _v32_rule)
    async with (
        MockModelServer(REPLIES, strict_reasoning=True) as server,
        deepseek(server) as model,
    ):
        with pytest.raises(ModelError) as info:
            await converse(model)
        assert server.rejected == 1
        assert server.consumed == 2  # the two replies before the steer; the 400 used none
        assert len(server.requests) == 3
    error = info.value
    assert error.code == ErrorCode.BAD_REQUEST  # not retried: retrying cannot help
    assert error.status == 400
    assert "reasoning_content" in error.message
    assert "--thinking off" in error.message and "proxy" in error.message


def _strict_post(server: MockModelServer, messages: list[dict[str, Any]], **extra: Any) -> Any:
    body = {"model": "m", "stream": True, "messages": messages, **extra}
    with httpx.Client(timeout=5.0) as client:
        return client.post(f"{server.base_url}/chat/completions", json=body)


MISSING = [user("a"), {"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]}]


def test_the_strict_server_answers_with_deepseek_s_error_body() -> None:
    with MockModelServer([{"text": "ok"}], strict_reasoning=True) as server:
        response = _strict_post(server, MISSING)
        assert response.status_code == 400
        assert response.json() == {
            "error": {
                "message": "The `reasoning_content` in the thinking mode must be passed back to "
                "the API.",
                "type": "invalid_request_error",
                "param": None,
                "code": "invalid_request_error",
            }
        }
        assert (server.rejected, server.consumed) == (1, 0)
        # Explicitly enabled thinking is checked the same; a null reasoning is no reasoning.
        null = [MISSING[0], {**MISSING[1], "reasoning_content": None}]
        assert _strict_post(server, null, thinking={"type": "enabled"}).status_code == 400
        assert server.rejected == 2


@pytest.mark.parametrize(
    ("messages", "extra"),
    [
        (MISSING, {"thinking": {"type": "disabled"}}),  # thinking off: no rule
        ([user("a"), {"role": "assistant", "content": "no tools"}, user("b")], {}),
        ([*MISSING[:1], {**MISSING[1], "reasoning_content": ""}], {}),  # "" is passed back
    ],
    ids=["thinking-off", "no-tools", "empty-string"],
)
def test_the_strict_server_accepts_what_deepseek_accepts(
    messages: list[dict[str, Any]], extra: dict[str, Any]
) -> None:
    with MockModelServer([{"text": "ok"}], strict_reasoning=True) as server:
        response = _strict_post(server, messages, **extra)
        assert response.status_code == 200
        assert (server.rejected, server.consumed) == (0, 1)


def test_without_strict_mode_the_server_checks_nothing() -> None:
    with MockModelServer([{"text": "ok"}]) as server:
        assert _strict_post(server, MISSING).status_code == 200


def test_the_strict_server_streams_reasoning_content_deltas() -> None:
    reply = {"reasoning": "think", "text": "ok", "chunk_size": 8}
    with MockModelServer([reply], strict_reasoning=True) as server:
        response = _strict_post(server, [user("a")])
    deltas = [
        json.loads(line.removeprefix("data: "))["choices"][0]["delta"]
        for line in response.text.splitlines()
        if line.startswith("data: {")
    ]
    assert deltas[0]["reasoning_content"] == "think" and deltas[0]["content"] is None
    assert deltas[1]["content"] == "ok"


# --- the 400 itself: BAD_REQUEST, not retried, with advice ---------------------------------------

DEEPSEEK_400 = "The `reasoning_content` in the thinking mode must be passed back to the API."


async def rejection(provider: str, message: str = DEEPSEEK_400) -> tuple[ModelError, int, str]:
    replies: list[dict[str, Any]] = [
        {"error": {"status": 400, "message": message}},
        {"text": "never reached"},
    ]
    async with MockModelServer(replies) as server:
        thinking = True if provider == "deepseek" else None
        model = OpenAICompatible(
            server.base_url,
            "deepseek-v4-flash",
            api_key_env=None,
            provider=provider,
            thinking=thinking,
            retry_policy=FAST,
        )
        async with model:
            with pytest.raises(ModelError) as info:
                await Conversation(model).reply()
        return info.value, len(server.requests), server.base_url


async def test_the_400_for_missing_reasoning_says_what_it_means() -> None:
    error, requests, url = await rejection("deepseek")
    assert (error.code, error.status, requests) == (ErrorCode.BAD_REQUEST, 400, 1)
    assert error.message == (
        f"the model API rejected the request (HTTP 400 from {url}: {DEEPSEEK_400}); "
        "DeepSeek's thinking mode needs the reasoning of every span that used tools passed back "
        "(reasoning_content on each of its assistant messages, in every later request): this is "
        "a bug in andon, or in a proxy between andon and the API that strips that field; "
        "--thinking off (thinking=False) avoids it"
    )


async def test_the_same_400_from_an_endpoint_not_named_deepseek_says_to_name_it() -> None:
    error, requests, _ = await rejection("openai-compatible")
    assert (error.code, requests) == (ErrorCode.BAD_REQUEST, 1)
    assert "deepseek+URL#MODEL" in error.message
    assert "--thinking off" not in error.message  # refused for such a spec: not advice to give


async def test_another_400_gets_no_reasoning_advice() -> None:
    error, _, _ = await rejection("deepseek", "max_tokens is too large")
    assert error.code == ErrorCode.BAD_REQUEST
    assert error.message.endswith("max_tokens is too large)")
