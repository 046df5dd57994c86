"""A request longer than the model's context window is ``CONTEXT_OVERFLOW`` in every provider's
shape (docs/models.md, Context windows): over real HTTP through the mock server's shapes and the
real adapter, streamed error events, and the bodies servers answer, read for their figures."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from andon.base import AbortController, ConfigError, ErrorCode, ModelError
from andon.llm import (
    ModelRequest,
    OpenAICompatible,
    RetryPolicy,
    Scripted,
    Usage,
    is_empty_stream,
    overflow_figures,
)
from andon.llm._failures import Context, payload_error, status_error
from andon.testing import OVERFLOW_SHAPES, SUMMARY_MARKER, MockModelServer, mock_prompt_tokens

FAST = RetryPolicy(max_retries=3, base_delay=0.001, max_delay=0.001)
LONG = ModelRequest(messages=({"role": "user", "content": "x" * 2000},))
SHORT = ModelRequest(messages=({"role": "user", "content": "hi"},))
CONTEXT = Context(url="http://127.0.0.1:1/v1", model="m", key_env=None, key_sent=False, secret=None)


class Attempts:
    def __init__(self) -> None:
        self.count = 0

    async def __call__(self, n: int, error: ModelError | None, delay: float | None) -> None:
        self.count += 1


def adapter(server: MockModelServer) -> OpenAICompatible:
    return OpenAICompatible(server.base_url, "mock", api_key_env=None, retry_policy=FAST)


async def failure(model: OpenAICompatible, request: ModelRequest, attempts: Attempts) -> ModelError:
    with pytest.raises(ModelError) as info:
        async for _ in model.stream(request, AbortController().signal, attempts):
            pass
    return info.value


@pytest.mark.parametrize("shape", ["openai", "deepseek", "vllm", "llamacpp", "llama-cpp-python"])
async def test_each_shape_over_real_http_is_context_overflow_with_its_figures(shape: str) -> None:
    async with MockModelServer(
        [{"text": "fits"}], context_window=100, overflow_shape=shape
    ) as server:
        model = adapter(server)
        attempts = Attempts()
        error = await failure(model, LONG, attempts)
        tokens = mock_prompt_tokens(model.request_body(LONG))
        assert error.code is ErrorCode.CONTEXT_OVERFLOW
        assert error.status == 400
        assert (error.limit, error.requested) == (100, tokens)
        assert overflow_figures(error) == (100, tokens)
        assert "context window" in error.message and "100" in error.message
        assert attempts.count == 1  # never retried: the same request overflows again
        assert server.overflows == 1 and server.consumed == 0
        # A request that fits is answered, and its usage is the mock's count.
        chunks = [c async for c in model.stream(SHORT, AbortController().signal, Attempts())]
        usage = next(c for c in chunks if isinstance(c, Usage))
        assert usage.prompt_tokens == mock_prompt_tokens(model.request_body(SHORT))
        assert server.largest_prompt_tokens == tokens
        await model.aclose()


async def test_the_empty_stream_shape_is_a_truncated_stream_with_no_event() -> None:
    async with MockModelServer(
        [{"text": "fits"}], context_window=100, overflow_shape="empty-stream"
    ) as server:
        model = adapter(server)
        error = await failure(model, LONG, Attempts())
        await model.aclose()
    assert error.code is ErrorCode.STREAM_TRUNCATED
    assert is_empty_stream(error)
    assert server.overflows == 1


LLAMACPP_EVENT = {
    "code": 400,
    "message": "request (4476 tokens) exceeds the available context size (4096 tokens), "
    "try increasing it",
    "type": "exceed_context_size_error",
    "n_prompt_tokens": 4476,
    "n_ctx": 4096,
}


@pytest.mark.parametrize(
    ("event", "figures"),
    [
        ({"message": "This model's maximum context length is 8192 tokens. However, your "
          "messages resulted in 9000 tokens.", "type": "invalid_request_error",
          "code": "context_length_exceeded"}, (8192, 9000)),
        ({"message": LLAMACPP_EVENT["message"], "type": "exceed_context_size_error",
          "code": 400}, (4096, 4476)),
    ],
)  # fmt: skip
async def test_a_streamed_error_event_is_context_overflow(
    event: dict[str, Any], figures: tuple[int, int]
) -> None:
    async with MockModelServer([{"text": "never", "error_event": event}]) as server:
        model = adapter(server)
        attempts = Attempts()
        error = await failure(model, SHORT, attempts)
        await model.aclose()
    assert error.code is ErrorCode.CONTEXT_OVERFLOW
    assert (error.limit, error.requested) == figures
    assert attempts.count == 1


async def test_a_plain_bad_request_stays_bad_request() -> None:
    replies = [{"error": {"status": 400, "message": "Invalid max_tokens value, [1, 8192]"}}]
    async with MockModelServer(replies) as server:
        model = adapter(server)
        error = await failure(model, SHORT, Attempts())
        await model.aclose()
    assert error.code is ErrorCode.BAD_REQUEST
    assert (error.limit, error.requested) == (None, None)
    assert overflow_figures(error) == (None, None)


def _status(status: int, body: object) -> ModelError:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return status_error(status, raw, None, CONTEXT)


@pytest.mark.parametrize(
    ("body", "figures"),
    [
        # OpenAI with functions: the input is messages + functions.
        ({"error": {"message": "This model's maximum context length is 8192 tokens. However, you "
          "requested 8213 tokens (6683 in the messages, 730 in the functions, and 800 in the "
          "completion). Please reduce the length of the messages, functions, or completion.",
          "type": "invalid_request_error", "param": "messages",
          "code": "context_length_exceeded"}}, (8192, 7413)),
        # DeepSeek: code invalid_request_error; the message decides.
        ({"error": {"message": "This model's maximum context length is 131072 tokens. However, "
          "you requested 131134 tokens (122942 in the messages, 8192 in the completion). Please "
          "reduce the length of the messages or completion.", "type": "invalid_request_error",
          "param": None, "code": "invalid_request_error"}}, (131072, 122942)),
        # vLLM, old: a top-level error object.
        ({"object": "error", "message": "This model's maximum context length is 131072 tokens. "
          "However, you requested 351430 tokens. Please reduce the length of the messages or "
          "completion.", "type": "BadRequestError", "param": None, "code": 400},
         (131072, 351430)),
        # vLLM, max_tokens too large for what is left of the window.
        ({"error": {"message": "'max_tokens' or 'max_completion_tokens' is too large: 8000. This "
          "model's maximum context length is 4096 tokens and your request has 2778 input tokens "
          "(8000 > 4096 - 2778). None", "type": "BadRequestError", "param": None, "code": 400}},
         (4096, 2778)),
        # Ollama quoting llama.cpp's body as a string.
        ({"error": json.dumps({"error": LLAMACPP_EVENT})}, (4096, 4476)),
        # llama-cpp-python with no max_tokens in the request.
        ({"error": {"message": "This model's maximum context length is 2048 tokens. However, you "
          "requested 7106 tokens (7106 in the messages, None in the completion). Please reduce "
          "the length of the messages or completion.", "type": "invalid_request_error",
          "param": "messages", "code": "context_length_exceeded"}}, (2048, 7106)),
        # OpenAI's newer wording names no figures.
        ({"error": {"message": "Your input exceeds the context window of this model. Please "
          "adjust your input and try again.", "type": "invalid_request_error",
          "param": "input", "code": "context_length_exceeded"}}, (None, None)),
    ],
)  # fmt: skip
def test_server_bodies_and_their_figures(
    body: object, figures: tuple[int | None, int | None]
) -> None:
    error = _status(400, body)
    assert error.code is ErrorCode.CONTEXT_OVERFLOW
    assert (error.limit, error.requested) == figures
    assert overflow_figures(error) == figures


def test_other_statuses_and_other_400s_are_not_overflow() -> None:
    said = {"error": {"message": "This model's maximum context length is 10 tokens.", "code": 1}}
    assert _status(429, said).code is ErrorCode.RATE_LIMITED
    assert _status(503, said).code is ErrorCode.OVERLOADED
    assert _status(400, said).code is ErrorCode.CONTEXT_OVERFLOW
    assert _status(400, b"not json at all").code is ErrorCode.BAD_REQUEST
    assert _status(400, {"error": {"message": "context is fine", "code": "x"}}).code == (
        ErrorCode.BAD_REQUEST
    )


def test_figures_of_an_error_rebuilt_from_its_message() -> None:
    original = payload_error(LLAMACPP_EVENT, None)
    rebuilt = ModelError(ErrorCode.CONTEXT_OVERFLOW, original.message)
    assert overflow_figures(rebuilt) == (4096, 4476)
    assert overflow_figures("request (5 tokens) exceeds the available context size (4 tokens)") == (
        4,
        5,
    )
    assert overflow_figures(ModelError(ErrorCode.BAD_REQUEST, original.message)) == (None, None)


def test_context_overflow_is_never_retried() -> None:
    error = ModelError(ErrorCode.CONTEXT_OVERFLOW, "too long", status=400)
    assert RetryPolicy().next_delay(error, 1) is None


# --- the mock server's window ------------------------------------------------------------------


async def test_summary_requests_are_answered_without_consuming_the_script() -> None:
    summary_request = ModelRequest(
        messages=(
            {"role": "user", "content": "work"},
            {"role": "user", "content": f"{SUMMARY_MARKER} summarise the above"},
        )
    )
    async with MockModelServer(
        [{"text": "scripted"}], summaries="SUMMARY", context_window=10_000
    ) as server:
        model = adapter(server)
        signal = AbortController().signal
        summary = [c async for c in model.stream(summary_request, signal, Attempts())]
        scripted = [c async for c in model.stream(SHORT, signal, Attempts())]
        await model.aclose()
    assert "".join(getattr(c, "text", "") for c in summary) == "SUMMARY"
    assert "".join(getattr(c, "text", "") for c in scripted) == "scripted"
    assert server.summaries_served == 1 and server.consumed == 1
    usage = next(c for c in summary if isinstance(c, Usage))
    assert usage.prompt_tokens == mock_prompt_tokens(model.request_body(summary_request))
    assert usage.completion_tokens == 2  # "SUMMARY": 7 bytes / 4, rounded up
    assert [r.prompt_tokens for r in server.requests] == [
        mock_prompt_tokens(model.request_body(r)) for r in (summary_request, SHORT)
    ]


async def test_without_a_window_nothing_changes() -> None:
    replies = [{"text": "a" * 10, "usage": {"prompt_tokens": 3, "completion_tokens": 1}}]
    async with MockModelServer(replies) as server:
        model = adapter(server)
        chunks = [c async for c in model.stream(LONG, AbortController().signal, Attempts())]
        await model.aclose()
    assert next(c for c in chunks if isinstance(c, Usage)).prompt_tokens == 3  # as scripted
    assert server.overflows == 0 and server.context_window is None


def test_the_token_rule_and_bad_options() -> None:
    body = {"messages": [{"role": "user", "content": "é"}], "tools": []}
    text = json.dumps([body["messages"], []], ensure_ascii=False, separators=(",", ":"))
    assert mock_prompt_tokens(body) == -(-len(text.encode()) // 4)
    assert mock_prompt_tokens({"messages": body["messages"]}) == mock_prompt_tokens(body)
    with pytest.raises(ConfigError, match="overflow_shape"):
        MockModelServer([], context_window=10, overflow_shape="nope")
    with pytest.raises(ConfigError, match="context_window"):
        MockModelServer([], context_window=0)
    assert set(OVERFLOW_SHAPES) == {
        "openai",
        "deepseek",
        "vllm",
        "llamacpp",
        "llama-cpp-python",
        "empty-stream",
    }


def test_the_mock_model_command_takes_a_window_and_a_shape(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"text": "fits"}]))
    andon = str(Path(sys.executable).parent / "andon")  # the CLI forwards the flags
    argv = [andon, "mock-model", "--script", str(script), "--context-window", "20"]
    proc = subprocess.Popen(
        [*argv, "--overflow-shape", "llamacpp"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = f"{proc.stdout.readline().strip()}/chat/completions"
        body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "x" * 200}]}
        with httpx.Client(timeout=5.0) as client:
            refused = client.post(url, json=body)
        assert refused.status_code == 400
        error = refused.json()["error"]
        assert error["type"] == "exceed_context_size_error" and error["n_ctx"] == 20
        assert error["n_prompt_tokens"] == mock_prompt_tokens(body)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    bad = subprocess.run(
        [*argv, "--overflow-shape", "nope"], capture_output=True, text=True, timeout=30
    )
    assert bad.returncode == 2 and "--overflow-shape" in bad.stderr


async def test_a_scripted_overflow_carries_its_figures_and_is_not_retried() -> None:
    said = "request (300 tokens) exceeds the available context size (256 tokens)"
    model = Scripted(
        [{"error": {"code": "CONTEXT_OVERFLOW", "message": said}}, {"text": "never reached"}]
    )
    attempts = Attempts()
    with pytest.raises(ModelError) as info:
        async for _ in model.stream(SHORT, AbortController().signal, attempts):
            pass
    assert info.value.code is ErrorCode.CONTEXT_OVERFLOW
    assert (info.value.limit, info.value.requested) == (256, 300)
    assert attempts.count == 1


async def test_a_stream_cut_after_data_is_not_an_empty_stream() -> None:
    replies: list[dict[str, Any]] = [
        {"text": "abcd", "chunk_size": 1, "truncate_after_chunks": 2},
        {"raw_events": ["data: [DONE]"]},
    ]
    async with MockModelServer(replies) as server:
        model = adapter(server)
        cut = await failure(model, SHORT, Attempts())
        done_only = await failure(model, SHORT, Attempts())
        await model.aclose()
    assert cut.code is ErrorCode.STREAM_TRUNCATED and not is_empty_stream(cut)
    assert is_empty_stream(done_only)
    assert not is_empty_stream(ModelError(ErrorCode.BAD_REQUEST, cut.message))
