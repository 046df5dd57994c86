"""The request builder (docs/models.md, What is sent): history + tools -> a chat-completions body,
with DeepSeek's rule for passing reasoning back (the V4 rule; test_reasoning_rule.py has the
histories and the strict server)."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from andon.llm import ModelRequest, ResponseSchema, build_request_body, reasoning_needed

SYSTEM = {"role": "system", "content": "You are a careful build engineer."}
TOOLS = (
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    },
)


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(
    text: str | None, *, calls: Sequence[str] = (), reasoning: str | None = None
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [
            {"id": call, "type": "function", "function": {"name": "bash", "arguments": "{}"}}
            for call in calls
        ]
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    return message


def tool(call_id: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


# Turn 1 used tools; turn 2 was a plain answer; turn 3 is using tools right now.
HISTORY = (
    SYSTEM,
    user("Fix the build"),
    assistant("Running make.", calls=["c1-1-1"], reasoning="The log says"),
    tool("c1-1-1", "error: missing ;"),
    assistant(None, calls=["c1-2-1", "c1-2-2"]),  # no reasoning recorded: must be sent as ""
    tool("c1-2-1", "fixed"),
    tool("c1-2-2", "ok"),
    assistant("Build fixed.", reasoning="Done."),
    user("Thanks. What changed?"),
    assistant("One semicolon.", reasoning="Recall the diff."),
    user("Run the tests"),
    assistant("Running the tests.", calls=["c3-1-1"], reasoning=""),
    tool("c3-1-1", "12 passed"),
    assistant(None, calls=["c3-2-1"], reasoning="All green; check lint."),
    tool("c3-2-1", "clean"),
)


def reasoning_of(body: dict[str, Any]) -> list[str | None]:
    return [m.get("reasoning_content") for m in body["messages"]]


def test_openai_compatible_body_has_the_wire_shape() -> None:
    request = ModelRequest(messages=HISTORY, tools=TOOLS, max_tokens=512)
    body = build_request_body(request, model="qwen3", provider="openai-compatible", thinking=None)
    assert body["model"] == "qwen3"
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["tools"] == list(TOOLS)
    assert body["max_tokens"] == 512
    assert "thinking" not in body
    # Passed through in order; system first; tool results keep tool_call_id.
    assert [m["role"] for m in body["messages"]] == [m["role"] for m in HISTORY]
    assert body["messages"][0] == SYSTEM
    assert body["messages"][3] == {
        "role": "tool",
        "tool_call_id": "c1-1-1",
        "content": "error: missing ;",
    }
    assert body["messages"][2]["tool_calls"][0]["id"] == "c1-1-1"
    # Other providers never get reasoning back.
    assert reasoning_of(body) == [None] * len(HISTORY)


def test_the_request_is_not_changed() -> None:
    before = copy.deepcopy(HISTORY)
    build_request_body(
        ModelRequest(messages=HISTORY), model="m", provider="deepseek", thinking=True
    )
    build_request_body(ModelRequest(messages=HISTORY), model="m", provider="openai", thinking=None)
    assert before == HISTORY


def test_deepseek_passes_back_the_reasoning_of_every_tool_using_span() -> None:
    body = build_request_body(
        ModelRequest(messages=HISTORY, tools=TOOLS),
        model="deepseek-v4-flash",
        provider="deepseek",
        thinking=True,
    )
    assert body["thinking"] == {"type": "enabled"}
    assert reasoning_of(body) == [
        None,  # system
        None,  # user
        "The log says",  # span 1 used tools: all its replies, in every later request (V4 rule)
        None,
        "",  # no reasoning recorded: sent as ""
        None,
        None,
        "Done.",  # span 1's last reply made no call itself, but its span did
        None,  # user
        None,  # span 2 called no tools: its reasoning is not needed and not sent
        None,  # user (the last one)
        "",  # the current span called tools: every reply of it, empty reasoning included
        None,
        "All green; check lint.",
        None,
    ]


def test_deepseek_before_any_tool_call_sends_no_reasoning() -> None:
    messages = (user("hi"), assistant("Hello.", reasoning="Greet back."), user("and now?"))
    body = build_request_body(
        ModelRequest(messages=messages), model="m", provider="deepseek", thinking=True
    )
    assert body["thinking"] == {"type": "enabled"}
    assert reasoning_of(body) == [None, None, None]


def test_deepseek_with_thinking_off_sends_no_reasoning_at_all() -> None:
    body = build_request_body(
        ModelRequest(messages=HISTORY), model="m", provider="deepseek", thinking=False
    )
    assert body["thinking"] == {"type": "disabled"}
    assert reasoning_of(body) == [None] * len(HISTORY)


def test_deepseek_thinking_is_always_sent_explicitly() -> None:
    request = ModelRequest(messages=(user("hi"),))
    for thinking, expected in ((None, "enabled"), (True, "enabled"), (False, "disabled")):
        body = build_request_body(request, model="m", provider="deepseek", thinking=thinking)
        assert body["thinking"] == {"type": expected}


def test_openai_gets_max_completion_tokens_and_empty_tools_are_left_out() -> None:
    request = ModelRequest(messages=(user("hi"),), tools=(), max_tokens=64)
    body = build_request_body(request, model="gpt-4.1", provider="openai", thinking=None)
    assert body["max_completion_tokens"] == 64
    assert "max_tokens" not in body
    assert "tools" not in body
    unbounded = build_request_body(
        ModelRequest(messages=(user("hi"),)), model="m", provider="x", thinking=None
    )
    assert "max_tokens" not in unbounded


VERDICT = ResponseSchema("verdict", {"type": "object", "required": ["verdict"]})


def test_a_response_schema_is_openais_json_schema_format_and_nobody_elses() -> None:
    request = ModelRequest(messages=(user("Say it"),), tools=TOOLS, response_schema=VERDICT)
    body = build_request_body(request, model="gpt-4.1", provider="openai", thinking=None)
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {
            "name": "verdict",
            "schema": {"type": "object", "required": ["verdict"]},
            "strict": False,
        },
    }
    assert body["tools"] == [dict(t) for t in TOOLS]  # the tools stay: tool steps go on
    # DeepSeek's json_object and a generic server's json_schema would force JSON on tool steps.
    for provider, thinking in (("deepseek", True), ("openai-compatible", None)):
        other = build_request_body(request, model="m", provider=provider, thinking=thinking)
        assert "response_format" not in other


def test_non_streaming_body_has_no_stream_options() -> None:
    body = build_request_body(
        ModelRequest(messages=(user("hi"),)), model="m", provider="x", thinking=None, stream=False
    )
    assert body["stream"] is False
    assert "stream_options" not in body


# -- property: the rule, stated independently ---------------------------------------------------

_messages = st.lists(
    st.one_of(
        st.just(user("u")),
        st.builds(
            assistant,
            st.one_of(st.none(), st.just("text")),
            calls=st.lists(st.just("c"), max_size=2),
            reasoning=st.one_of(st.none(), st.text(max_size=3)),
        ),
        st.just(tool("c", "r")),
    ),
    max_size=12,
)


@given(_messages)
def test_reasoning_goes_back_iff_the_span_of_the_message_called_tools(
    messages: list[dict[str, Any]],
) -> None:
    body = build_request_body(
        ModelRequest(messages=tuple(messages)), model="m", provider="deepseek", thinking=True
    )
    needed = reasoning_needed(messages)
    other = build_request_body(
        ModelRequest(messages=tuple(messages)), model="m", provider="vllm", thinking=None
    )
    for index, (sent, original) in enumerate(zip(body["messages"], messages, strict=True)):
        # Find this message's span and whether any assistant in it called tools.
        start = max((i for i in range(index + 1) if messages[i]["role"] == "user"), default=-1)
        end = next(
            (i for i in range(index + 1, len(messages)) if messages[i]["role"] == "user"),
            len(messages),
        )
        span_called = any(
            m["role"] == "assistant" and m.get("tool_calls") for m in messages[start + 1 : end]
        )
        expect = original["role"] == "assistant" and span_called
        assert needed[index] is expect
        assert ("reasoning_content" in sent) is expect
        if expect:
            assert sent["reasoning_content"] == (original.get("reasoning_content") or "")
        assert "reasoning_content" not in other["messages"][index]
