"""What llama.cpp's OpenAI-compatible server (llama-cpp-python 0.3.36, the version .ci/run pins)
really answers, pinned against the real server with SmolLM2-135M-Instruct (docs/models.md, Local
servers and the context window). andon's handling of the window is built on these facts.

Every request asks for few tokens and greedy sampling (``temperature: 0``): the model is tiny but
the CPU is shared, and greedy output is the same on every run.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest

from tests.llamaserver import MODEL_ALIAS, LlamaServer, why_unavailable
from tests.support import tagged_processes

pytestmark = [pytest.mark.timeout(240)]

# Bounds each request; the test's timeout bounds the test (a loaded machine is slow, not stuck).
HTTP_TIMEOUT = 180.0
# About 7,000 tokens: far over the 2,048-token window (tokenizing it is cheap, nothing is
# evaluated: the server refuses before it runs the model).
OVERSIZED = " ".join(["hello world"] * 3500)
# A typical English prompt, for the bytes-per-token figure.
ENGLISH = (
    "The build failed because the linker could not find the math library. Add -lm to the link "
    "flags in the Makefile, run the tests again, and report which of them still fail and why. "
    "Keep the change small and explain it in one sentence."
)
# Each is one token for SmolLM2's tokenizer, at the start and after a space.
ONE_TOKEN_WORDS = ("one", "two", "three", "four", "five", "six", "seven")
LENGTH_MESSAGE = re.compile(
    r"This model's maximum context length is (\d+) tokens\. However, you requested (\d+) tokens "
    r"\((\d+) in the messages, (\w+) in the completion\)\. Please reduce the length of the "
    r"messages or completion\."
)


def chat(server: LlamaServer, messages: list[dict[str, Any]], **fields: Any) -> httpx.Response:
    body = {"model": MODEL_ALIAS, "messages": messages, "temperature": 0, **fields}
    return httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=HTTP_TIMEOUT)


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def stream_events(server: LlamaServer, body: dict[str, Any]) -> tuple[httpx.Response, bytes]:
    with httpx.stream(
        "POST", f"{server.base_url}/chat/completions", json=body, timeout=HTTP_TIMEOUT
    ) as response:
        return response, response.read()


def data_lines(raw: bytes) -> list[str]:
    return [line[len("data: ") :] for line in raw.decode().splitlines() if line.startswith("data:")]


def test_the_server_carries_the_run_tag_and_is_kept_across_tests(llama_server: LlamaServer) -> None:
    # The leftover check would find it (it inherited the run's tag), and passes over it only
    # because the session-long fixture said so.
    assert llama_server.pid in [p.pid for p in tagged_processes(include_kept=True)]
    assert llama_server.pid not in [p.pid for p in tagged_processes()]


def test_over_the_window_without_streaming_is_400_context_length_exceeded(
    llama_server: LlamaServer,
) -> None:
    response = chat(llama_server, user(OVERSIZED), max_tokens=8)
    assert response.status_code == 400
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert set(response.json()) == {"error"}
    assert error["type"] == "invalid_request_error"
    assert error["param"] == "messages"
    assert error["code"] == "context_length_exceeded"
    match = LENGTH_MESSAGE.fullmatch(error["message"])
    assert match is not None, error["message"]
    window, requested, in_messages, completion = match.groups()
    assert int(window) == llama_server.n_ctx == 2048
    assert completion == "8" and int(requested) == int(in_messages) + 8
    assert int(in_messages) > 2 * int(window)


def test_without_max_tokens_the_message_says_none_in_the_completion(
    llama_server: LlamaServer,
) -> None:
    # andon sends no max_tokens unless a turn sets one: this is the message it gets.
    response = chat(llama_server, user(OVERSIZED))
    assert response.status_code == 400
    match = LENGTH_MESSAGE.fullmatch(response.json()["error"]["message"])
    assert match is not None, response.text
    _, requested, in_messages, completion = match.groups()
    assert completion == "None" and requested == in_messages


def test_over_the_window_streaming_is_200_with_an_empty_body(llama_server: LlamaServer) -> None:
    # The refusal happens after the event stream's headers went out: no error event, no finish,
    # no [DONE], not one byte. A client sees a stream that ended without a finish.
    body = {
        "model": MODEL_ALIAS,
        "messages": user(OVERSIZED),
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    response, raw = stream_events(llama_server, body)
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert raw == b""


def test_the_window_is_nowhere_but_in_the_overflow_message(llama_server: LlamaServer) -> None:
    # llama.cpp's C++ server answers GET /props with default_generation_settings.n_ctx; this one
    # has no /props, and its model list says nothing of the window.
    base = llama_server.base_url.removesuffix("/v1")
    props = httpx.get(f"{base}/props", timeout=HTTP_TIMEOUT)
    assert props.status_code == 404
    assert props.json() == {"detail": "Not Found"}
    assert httpx.get(f"{base}/v1/props", timeout=HTTP_TIMEOUT).status_code == 404
    models = httpx.get(f"{llama_server.base_url}/models", timeout=HTTP_TIMEOUT)
    assert models.status_code == 200
    assert models.json() == {
        "object": "list",
        "data": [{"id": MODEL_ALIAS, "object": "model", "owned_by": "me", "permissions": []}],
    }
    paths = httpx.get(f"{base}/openapi.json", timeout=HTTP_TIMEOUT).json()["paths"]
    assert sorted(paths) == [
        "/extras/detokenize",
        "/extras/tokenize",
        "/extras/tokenize/count",
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/models",
    ]


def test_usage_only_without_streaming(llama_server: LlamaServer) -> None:
    response = chat(llama_server, user("Say hi."), max_tokens=4)
    assert response.status_code == 200
    usage = response.json()["usage"]
    assert set(usage) == {"prompt_tokens", "completion_tokens", "total_tokens"}
    assert usage["prompt_tokens"] > 0 and 0 < usage["completion_tokens"] <= 4
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]

    # stream_options.include_usage is ignored: no chunk carries usage, the finish chunk is last.
    body = {
        "model": MODEL_ALIAS,
        "messages": user("Say hi."),
        "temperature": 0,
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    streamed, raw = stream_events(llama_server, body)
    assert streamed.status_code == 200
    events = data_lines(raw)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all("usage" not in chunk for chunk in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all(chunk["choices"] for chunk in chunks)


def test_english_is_about_four_bytes_per_token(llama_server: LlamaServer) -> None:
    messages = [
        {"role": "system", "content": "You are a careful software agent."},
        {"role": "user", "content": ENGLISH * 4},
    ]
    response = chat(llama_server, messages, max_tokens=1)
    assert response.status_code == 200
    prompt_tokens = response.json()["usage"]["prompt_tokens"]
    sent = len(json.dumps(messages).encode())
    # The template adds a few tokens per message (ChatML's <|im_start|>role ... <|im_end|>).
    assert 3.5 < sent / prompt_tokens < 5.0, (sent, prompt_tokens)
    # The server counts any text's tokens (its own extension, not OpenAI's).
    count = httpx.post(
        f"{llama_server.base_url.removesuffix('/v1')}/extras/tokenize/count",
        json={"input": ENGLISH * 4},
        timeout=HTTP_TIMEOUT,
    )
    assert count.status_code == 200
    assert 0 < count.json()["count"] < prompt_tokens


def test_json_object_is_honoured_and_json_schema_is_a_500(llama_server: LlamaServer) -> None:
    question = user("Is the sky blue? Answer as JSON with a field ok.")
    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}},
        "required": ["ok"],
        "additionalProperties": False,
    }
    # json_object constrains the output to JSON by a grammar; llama-cpp-python's own extension
    # `schema` beside it constrains it to that schema.
    constrained = chat(
        llama_server,
        question,
        max_tokens=24,
        response_format={"type": "json_object", "schema": schema},
    )
    assert constrained.status_code == 200
    choice = constrained.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    value = json.loads(choice["message"]["content"])
    assert set(value) == {"ok"} and isinstance(value["ok"], bool)

    # Without a schema: this question gets prose, and with json_object a JSON object.
    free = chat(llama_server, user("Is the sky blue?"), max_tokens=24)
    assert not free.json()["choices"][0]["message"]["content"].lstrip().startswith("{")
    plain = chat(
        llama_server,
        user("Is the sky blue?"),
        max_tokens=24,
        response_format={"type": "json_object"},
    )
    assert plain.status_code == 200
    choice = plain.json()["choices"][0]
    # The grammar holds every token to JSON; only a reply cut by max_tokens may be unfinished.
    # (Greedy gives "{}" here, but which earlier prompt's tokens the server reuses may move a
    # near tie.)
    assert choice["message"]["content"].lstrip().startswith("{")
    if choice["finish_reason"] == "stop":
        assert isinstance(json.loads(choice["message"]["content"]), dict)

    # OpenAI's json_schema fails the request's validation, which this server turns into a 500
    # (a status a client retries as the server's trouble), streaming or not.
    openai_style = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": schema}}
    for stream in (False, True):
        refused = chat(
            llama_server, question, max_tokens=24, response_format=openai_style, stream=stream
        )
        assert refused.status_code == 500
        error = refused.json()["error"]
        assert error["type"] == "internal_server_error"
        assert error["code"] is None and error["param"] is None
        assert "Input should be 'text' or 'json_object'" in error["message"]


@pytest.mark.slow
def test_the_window_edge_is_the_prompt_alone() -> None:
    """A prompt of n_ctx tokens is refused whatever max_tokens says; one token less is answered,
    max_tokens cut to what is left of the window (finish "length"). On a server of its own with a
    256-token window, so that the prompts stay short."""
    reason = why_unavailable()
    if reason is not None:
        pytest.skip(f"no real model server: {reason}")
    with LlamaServer(n_ctx=256) as small:
        count_url = f"{small.base_url.removesuffix('/v1')}/extras/tokenize/count"

        def words(n: int) -> str:
            return " ".join(ONE_TOKEN_WORDS[i % len(ONE_TOKEN_WORDS)] for i in range(n))

        probe = chat(small, user(words(10)), max_tokens=1)
        assert probe.status_code == 200, probe.text
        counted = httpx.post(count_url, json={"input": words(10)}, timeout=HTTP_TIMEOUT)
        assert counted.json() == {"count": 10}
        overhead = probe.json()["usage"]["prompt_tokens"] - 10  # the chat template's tokens

        last = chat(small, user(words(255 - overhead)), max_tokens=100)
        assert last.status_code == 200, last.text
        assert last.json()["usage"]["prompt_tokens"] == 255
        assert last.json()["usage"]["completion_tokens"] == 1
        assert last.json()["choices"][0]["finish_reason"] == "length"

        full = chat(small, user(words(256 - overhead)), max_tokens=100)
        assert full.status_code == 400
        assert full.json()["error"]["message"] == (
            "This model's maximum context length is 256 tokens. However, you requested 356 tokens "
            "(256 in the messages, 100 in the completion). Please reduce the length of the "
            "messages or completion."
        )
