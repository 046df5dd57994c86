"""Token usage (docs/models.md, What comes back): DeepSeek's and OpenAI's cache and reasoning
counts, read by the real adapter over HTTP and by the scripted model alike; malformed values are
dropped, never fatal; ``Usage.to_dict`` keeps its two base keys and adds only what is known."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from andon.base import AbortController, ModelError, ScriptInvalid
from andon.llm import (
    Chunk,
    Finish,
    ModelRequest,
    OpenAICompatible,
    Scripted,
    Usage,
)
from andon.llm._wire import usage_from_wire
from andon.testing import MockModelServer

REQUEST = ModelRequest(messages=({"role": "user", "content": "hi"},))

DEEPSEEK_USAGE = {
    "prompt_tokens": 1200,
    "completion_tokens": 90,
    "prompt_cache_hit_tokens": 1024,
    "prompt_cache_miss_tokens": 176,
    "completion_tokens_details": {"reasoning_tokens": 60},
}
OPENAI_USAGE = {
    "prompt_tokens": 1200,
    "completion_tokens": 90,
    "prompt_tokens_details": {"cached_tokens": 1024, "audio_tokens": 0},
    "completion_tokens_details": {"reasoning_tokens": 60, "accepted_prediction_tokens": 0},
}
FULL = Usage(
    prompt_tokens=1200,
    completion_tokens=90,
    cached_prompt_tokens=1024,
    uncached_prompt_tokens=176,
    reasoning_tokens=60,
)


async def on_attempt(n: int, error: ModelError | None, delay: float | None) -> None:
    pass


async def stream(server: MockModelServer) -> list[Chunk]:
    async with OpenAICompatible(server.base_url, "m", api_key_env=None) as model:
        return [c async for c in model.stream(REQUEST, AbortController().signal, on_attempt)]


def usage_of(chunks: list[Chunk]) -> Usage | None:
    found = [c for c in chunks if isinstance(c, Usage)]
    assert isinstance(chunks[-1], Finish)
    return found[-1] if found else None


def test_to_dict_has_the_two_base_keys_and_only_the_known_extras() -> None:
    assert Usage(10, 5).to_dict() == {"prompt_tokens": 10, "completion_tokens": 5}
    assert FULL.to_dict() == {
        "prompt_tokens": 1200,
        "completion_tokens": 90,
        "cached_prompt_tokens": 1024,
        "uncached_prompt_tokens": 176,
        "reasoning_tokens": 60,
    }
    zero = Usage(10, 5, cached_prompt_tokens=0, reasoning_tokens=0)  # 0 is known, so kept
    assert zero.to_dict() == {
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "cached_prompt_tokens": 0,
        "reasoning_tokens": 0,
    }


async def test_deepseek_usage_on_the_finish_chunk() -> None:
    async with MockModelServer([{"text": "ok", "usage": DEEPSEEK_USAGE}]) as server:
        chunks = await stream(server)
    assert usage_of(chunks) == FULL
    assert chunks[-2:] == [FULL, Finish("stop")]


async def test_openai_usage_on_a_separate_chunk() -> None:
    reply = {"text": "ok", "usage": OPENAI_USAGE, "usage_chunk": "separate"}
    async with MockModelServer([reply]) as server:
        chunks = await stream(server)
    assert usage_of(chunks) == FULL  # uncached = prompt - cached


def test_the_mock_server_sends_the_script_s_usage_as_written() -> None:
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    with MockModelServer([{"text": "ok", "usage": DEEPSEEK_USAGE}]) as server:
        response = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=5.0)
    payloads = [
        json.loads(line.removeprefix("data: "))
        for line in response.text.splitlines()
        if line.startswith("data: {")
    ]
    finish = payloads[-1]
    assert finish["choices"][0]["finish_reason"] == "stop"
    assert finish["usage"] == {**DEEPSEEK_USAGE, "total_tokens": 1290}  # total added, as DeepSeek


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({}, Usage(100, 7)),  # the base counts only: no extras invented
        ({"prompt_cache_hit_tokens": True}, Usage(100, 7)),  # a bool is not a count
        ({"prompt_cache_hit_tokens": -3}, Usage(100, 7)),
        ({"prompt_cache_hit_tokens": 2.5}, Usage(100, 7)),
        ({"prompt_cache_hit_tokens": "80"}, Usage(100, 7)),
        ({"prompt_cache_miss_tokens": None}, Usage(100, 7)),
        ({"prompt_tokens_details": None}, Usage(100, 7)),  # vLLM sends null
        ({"prompt_tokens_details": [80]}, Usage(100, 7)),
        ({"prompt_tokens_details": {"cached_tokens": False}}, Usage(100, 7)),
        ({"completion_tokens_details": {"reasoning_tokens": -1}}, Usage(100, 7)),
        ({"completion_tokens_details": "lots"}, Usage(100, 7)),
        # More cached than the whole prompt: kept as reported, but no negative rest derived.
        ({"prompt_tokens_details": {"cached_tokens": 150}}, Usage(100, 7, 150, None)),
        # Only a hit count: the miss is derived like OpenAI's.
        ({"prompt_cache_hit_tokens": 80}, Usage(100, 7, 80, 20)),
        # A bad hit count falls back to OpenAI's field, which DeepSeek may send too.
        (
            {"prompt_cache_hit_tokens": "x", "prompt_tokens_details": {"cached_tokens": 64}},
            Usage(100, 7, 64, 36),
        ),
        # Both shapes: DeepSeek's own counts win.
        (
            {
                "prompt_cache_hit_tokens": 80,
                "prompt_cache_miss_tokens": 20,
                "prompt_tokens_details": {"cached_tokens": 64},
            },
            Usage(100, 7, 80, 20),
        ),
    ],
)
def test_malformed_extra_counts_are_dropped(extra: dict[str, Any], expected: Usage) -> None:
    assert usage_from_wire({"prompt_tokens": 100, "completion_tokens": 7, **extra}) == expected


@pytest.mark.parametrize(
    "raw",
    [
        {"prompt_tokens": True, "completion_tokens": 1},
        {"prompt_tokens": 1},
        {"prompt_tokens": -1, "completion_tokens": 1, "prompt_cache_hit_tokens": 1},
    ],
)
def test_without_valid_base_counts_there_is_no_usage(raw: dict[str, Any]) -> None:
    assert usage_from_wire(raw) is None


async def test_malformed_usage_over_http_never_fails_the_stream() -> None:
    usage = {
        "prompt_tokens": 10,
        "completion_tokens": 2,
        "prompt_cache_hit_tokens": -5,
        "prompt_cache_miss_tokens": "ten",
        "completion_tokens_details": {"reasoning_tokens": True},
    }
    events = [
        {"choices": [{"index": 0, "delta": {"content": "ok"}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": usage},
        "data: [DONE]",
    ]
    async with MockModelServer([{"raw_events": events}]) as server:
        chunks = await stream(server)
    assert usage_of(chunks) == Usage(10, 2)


async def test_scripted_reads_the_same_shapes() -> None:
    model = Scripted(
        [
            {"text": "a", "usage": DEEPSEEK_USAGE},
            {"text": "b", "usage": OPENAI_USAGE},
            {"text": "c", "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}},
        ]
    )
    found = []
    for _ in range(3):
        chunks = [c async for c in model.stream(REQUEST, AbortController().signal, on_attempt)]
        found.append(usage_of(chunks))
    assert found == [FULL, FULL, Usage(3, 1)]


@pytest.mark.parametrize(
    ("usage", "field"),
    [
        ({"prompt_cache_hit_tokens": -1}, "usage.prompt_cache_hit_tokens"),
        ({"prompt_cache_miss_tokens": True}, "usage.prompt_cache_miss_tokens"),
        ({"total_tokens": "3"}, "usage.total_tokens"),
        ({"prompt_tokens_details": 3}, "usage.prompt_tokens_details"),
        ({"prompt_tokens_details": {"audio": 1}}, "usage.prompt_tokens_details.audio"),
        (
            {"completion_tokens_details": {"audio_tokens": -1}},
            "usage.completion_tokens_details.audio_tokens",
        ),
        (
            {"completion_tokens_details": {"reasoning_tokens": 1.5}},
            "usage.completion_tokens_details.reasoning_tokens",
        ),
        ({"cached_prompt_tokens": 3}, "usage.cached_prompt_tokens"),  # andon's name, not the wire's
    ],
)
def test_a_script_s_usage_is_validated_strictly(usage: dict[str, Any], field: str) -> None:
    with pytest.raises(ScriptInvalid) as info:
        Scripted([{"text": "x", "usage": {"prompt_tokens": 3, "completion_tokens": 1, **usage}}])
    assert info.value.field == field
    assert info.value.index == 0
