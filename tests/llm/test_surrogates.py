"""Lone UTF-16 surrogates (a JSON ``"\\ud83d"`` escape from a proxy that slices by UTF-16 index)
become U+FFFD where a stream is parsed, over real HTTP and in scripts alike, so the session log can
always write the reply. Valid pairs survive, also when split between two deltas."""

from __future__ import annotations

import json
from typing import Any

import pytest

from andon.base import AbortController, ModelError
from andon.llm import (
    Chunk,
    ModelRequest,
    OpenAICompatible,
    ReasoningDelta,
    Scripted,
    TextDelta,
    ToolCallDelta,
)
from andon.llm._sse import StreamParser
from andon.llm._wire import valid_text
from andon.testing import MockModelServer

REQUEST = ModelRequest(messages=({"role": "user", "content": "hi"},))
HIGH, LOW, FFFD = "\ud83d", "\ude00", "\ufffd"
SMILE = "\U0001f600"  # HIGH + LOW as one character


async def on_attempt(n: int, error: ModelError | None, delay: float | None) -> None:
    pass


def delta(payload: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    # json.dumps (ensure_ascii) writes a lone surrogate as the \\udXXX escape a proxy would send.
    return {"choices": [{"index": 0, "delta": payload, "finish_reason": finish}]}


async def over_http(*deltas: dict[str, Any], finish: str = "stop") -> list[Chunk]:
    events: list[Any] = [*deltas, delta({}, finish), "data: [DONE]"]
    async with (
        MockModelServer([{"raw_events": events}]) as server,
        OpenAICompatible(server.base_url, "m", api_key_env=None) as model,
    ):
        return [c async for c in model.stream(REQUEST, AbortController().signal, on_attempt)]


def texts(chunks: list[Chunk], kind: type[TextDelta] | type[ReasoningDelta]) -> str:
    return "".join(c.text for c in chunks if isinstance(c, kind))


def all_text_is_utf8(chunks: list[Chunk]) -> bool:
    for c in chunks:
        for value in (getattr(c, name, None) for name in ("text", "name", "arguments")):
            if isinstance(value, str):
                value.encode("utf-8")  # raises on a surrogate
        if isinstance(c, ToolCallDelta) and c.provider_id is not None:
            c.provider_id.encode("utf-8")
    return True


def test_the_escape_really_is_on_the_wire() -> None:
    assert json.dumps(delta({"content": HIGH})).count("\\ud83d") == 1


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (f"a{HIGH}b", f"a{FFFD}b"),  # lone high
        (f"a{LOW}b", f"a{FFFD}b"),  # lone low
        (f"a{HIGH}{LOW}b", f"a{SMILE}b"),  # a pair, escaped as two \\u: one character
        (f"{LOW}{HIGH}", f"{FFFD}{FFFD}"),  # the wrong order is two lone halves
        (f"{HIGH}{HIGH}{LOW}", f"{FFFD}{SMILE}"),
        (f"x{HIGH}", f"x{FFFD}"),  # ends lone: replaced when the reply finishes
    ],
    ids=["lone-high", "lone-low", "pair", "reversed", "high-then-pair", "trailing-high"],
)
async def test_content_over_http(content: str, expected: str) -> None:
    chunks = await over_http(delta({"content": content}))
    assert texts(chunks, TextDelta) == expected
    assert all_text_is_utf8(chunks)


async def test_a_pair_split_between_two_deltas_survives() -> None:
    chunks = await over_http(
        delta({"content": f"a{HIGH}"}),
        delta({"content": f"{LOW}b"}),
        delta({"reasoning_content": HIGH}),  # a delta of only the first half
        delta({"reasoning_content": LOW}),
    )
    assert [c for c in chunks if isinstance(c, TextDelta | ReasoningDelta)] == [
        TextDelta("a"),
        TextDelta(f"{SMILE}b"),
        ReasoningDelta(SMILE),
    ]


async def test_reasoning_and_a_half_pair_left_at_the_finish() -> None:
    chunks = await over_http(
        delta({"reasoning_content": f"think{LOW}"}),
        delta({"reasoning_content": f"more{HIGH}"}),
        delta({"content": "answer"}),  # another field does not complete the pair
    )
    assert texts(chunks, ReasoningDelta) == f"think{FFFD}more{FFFD}"
    assert texts(chunks, TextDelta) == "answer"


async def test_tool_call_name_id_and_arguments() -> None:
    first = {"index": 0, "id": f"call{HIGH}", "function": {"name": f"ba{LOW}sh", "arguments": ""}}
    chunks = await over_http(
        delta({"tool_calls": [first]}),
        delta({"tool_calls": [{"index": 0, "function": {"arguments": f'{{"x": "{HIGH}'}}]}),
        delta({"tool_calls": [{"index": 0, "function": {"arguments": f'{LOW}", "y": "{LOW}"}}'}}]}),
        delta(
            {"tool_calls": [{"index": 1, "id": "c2", "function": {"name": "f", "arguments": HIGH}}]}
        ),
        finish="tool_calls",
    )
    calls = [c for c in chunks if isinstance(c, ToolCallDelta)]
    assert calls[0] == ToolCallDelta(0, f"call{FFFD}", f"ba{FFFD}sh", "")
    arguments = "".join(c.arguments for c in calls if c.index == 0)
    assert json.loads(arguments) == {"x": SMILE, "y": FFFD}
    assert "".join(c.arguments for c in calls if c.index == 1) == FFFD  # flushed at the finish
    assert all_text_is_utf8(chunks)


async def test_an_error_message_with_a_lone_surrogate_is_made_valid() -> None:
    events = [{"error": {"message": f"bad {HIGH} thing", "type": "server_error"}}]
    async with (
        MockModelServer([{"raw_events": events}]) as server,
        OpenAICompatible(server.base_url, "m", api_key_env=None, max_retries=0) as model,
    ):
        with pytest.raises(ModelError) as info:
            [c async for c in model.stream(REQUEST, AbortController().signal, on_attempt)]
    assert f"bad {FFFD} thing" in info.value.message


def test_valid_text_keeps_valid_text_as_it_is() -> None:
    text = "plain, café, 日本, " + SMILE
    assert valid_text(text) is text
    assert valid_text(HIGH + LOW) == SMILE  # two code units (a Python or YAML literal): joined


async def test_a_script_cannot_inject_a_lone_surrogate() -> None:
    reply = {
        "reasoning": f"r{HIGH}",
        "text": f"t{LOW} {HIGH}{LOW}",
        "chunk_size": 1,  # pieces of one code point: the pair is one character by then
        "tool_calls": [
            {
                "name": f"n{HIGH}",
                "arguments": {"k": f"v{LOW}", f"key{HIGH}": [HIGH]},
                "id": f"i{LOW}",
            },
            {"name": "raw", "arguments": f'{{"s": "{HIGH}"}}'},
        ],
    }
    model = Scripted([reply])
    chunks = [c async for c in model.stream(REQUEST, AbortController().signal, on_attempt)]
    assert all_text_is_utf8(chunks)
    assert texts(chunks, ReasoningDelta) == f"r{FFFD}"
    assert texts(chunks, TextDelta) == f"t{FFFD} {SMILE}"
    calls = [c for c in chunks if isinstance(c, ToolCallDelta)]
    assert calls[0].name == f"n{FFFD}" and calls[0].provider_id == f"i{FFFD}"
    first = "".join(c.arguments for c in calls if c.index == 0)
    assert json.loads(first) == {"k": f"v{FFFD}", f"key{FFFD}": [FFFD]}
    assert "".join(c.arguments for c in calls if c.index == 1) == f'{{"s": "{FFFD}"}}'


async def test_the_mock_server_serves_such_a_script_instead_of_failing_to_encode_it() -> None:
    async with (
        MockModelServer([{"text": f"a{HIGH}b"}]) as server,
        OpenAICompatible(server.base_url, "m", api_key_env=None) as model,
    ):
        chunks = [c async for c in model.stream(REQUEST, AbortController().signal, on_attempt)]
    assert texts(chunks, TextDelta) == f"a{FFFD}b"


def test_half_pairs_left_in_several_fields_are_flushed_in_stream_order() -> None:
    parser = StreamParser()
    chunks: list[Chunk] = []
    calls = [
        {"index": 0, "id": "a", "function": {"name": "f", "arguments": f"x{HIGH}"}},
        {"index": 1, "id": "b", "function": {"name": "g", "arguments": HIGH}},
    ]
    for payload in (
        delta({"reasoning_content": f"r{HIGH}", "content": f"t{HIGH}"}),
        delta({"tool_calls": calls}),
        delta({}, "tool_calls"),
    ):
        chunks += parser.feed(json.dumps(payload))
    assert chunks[-4:] == [
        ReasoningDelta(FFFD),
        TextDelta(FFFD),
        ToolCallDelta(0, None, None, FFFD),
        ToolCallDelta(1, None, None, FFFD),
    ]
    assert all_text_is_utf8(chunks)
