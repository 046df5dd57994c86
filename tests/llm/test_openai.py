"""The HTTP adapter against the mock server over real HTTP (docs/models.md): deltas, usage, finish
reasons, keep-alives and timeouts, stream errors, HTTP errors and retries, cancellation, the request
body and the API key's secrecy."""

from __future__ import annotations

import asyncio
import http.server
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

from andon.base import (
    AbortController,
    Aborted,
    AbortSignal,
    ErrorCode,
    ManualClock,
    ModelError,
    SystemClock,
    Timer,
    User,
)
from andon.llm import (
    Chunk,
    Finish,
    Model,
    ModelRequest,
    OpenAICompatible,
    ReasoningDelta,
    RetryPolicy,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from andon.llm._sse import StreamParser
from andon.testing import MockModelServer

REQUEST = ModelRequest(messages=({"role": "user", "content": "Fix the build"},))
FAST = RetryPolicy(max_retries=3, base_delay=0.001, max_delay=0.001)
USAGE = {"prompt_tokens": 12, "completion_tokens": 5}
GENEROUS = 1.0  # seconds: "at once" on a shared, noisy machine; the benchmark measures precisely


class Attempts:
    """An ``on_attempt`` that records its calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, ModelError | None, float | None]] = []

    async def __call__(self, n: int, error: ModelError | None, delay: float | None) -> None:
        self.calls.append((n, error, delay))

    @property
    def codes(self) -> list[ErrorCode | None]:
        return [error.code if error else None for _, error, _ in self.calls]


def adapter(server: MockModelServer, **options: Any) -> OpenAICompatible:
    options.setdefault("retry_policy", FAST)
    options.setdefault("api_key_env", None)
    return OpenAICompatible(server.base_url, "mock-model", **options)


async def collect(
    model: Model,
    attempts: Attempts | None = None,
    signal: AbortSignal | None = None,
    request: ModelRequest = REQUEST,
) -> list[Chunk]:
    signal = signal or AbortController().signal
    return [c async for c in model.stream(request, signal, attempts or Attempts())]


async def failure(model: Model, attempts: Attempts | None = None) -> ModelError:
    with pytest.raises(ModelError) as info:
        await collect(model, attempts)
    return info.value


async def serve(
    replies: Sequence[Mapping[str, Any]], attempts: Attempts | None = None, **options: Any
) -> tuple[list[Chunk], MockModelServer]:
    async with MockModelServer(replies) as server, adapter(server, **options) as model:
        return await collect(model, attempts), server


def text_of(chunks: list[Chunk], kind: type[TextDelta] | type[ReasoningDelta]) -> str:
    return "".join(c.text for c in chunks if isinstance(c, kind))


def calls_of(chunks: list[Chunk]) -> list[dict[str, Any]]:
    calls: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        if isinstance(chunk, ToolCallDelta):
            call = calls.setdefault(chunk.index, {"id": None, "name": None, "arguments": ""})
            call["id"] = call["id"] or chunk.provider_id
            call["name"] = call["name"] or chunk.name
            call["arguments"] += chunk.arguments
    return [calls[i] for i in sorted(calls)]


class Consumer:
    """Reads a stream in its own task; the test waits on chunk counts, never on time."""

    def __init__(self, model: Model, request: ModelRequest = REQUEST) -> None:
        self.controller = AbortController()
        self.attempts = Attempts()
        self.chunks: list[Chunk] = []
        self.error: BaseException | None = None
        self.ended_at: float | None = None
        self._changed = asyncio.Condition()
        self.task = asyncio.create_task(self._run(model, request))

    async def _run(self, model: Model, request: ModelRequest) -> None:
        try:
            async for chunk in model.stream(request, self.controller.signal, self.attempts):
                self.chunks.append(chunk)
                async with self._changed:
                    self._changed.notify_all()
        except (Aborted, ModelError) as exc:
            self.error = exc
        finally:
            self.ended_at = time.perf_counter()

    async def wait_for_chunks(self, n: int) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: len(self.chunks) >= n)

    async def abort_and_time(self) -> float:
        """Abort and return the seconds until the stream had ended."""
        started = time.perf_counter()
        self.controller.abort(User())
        await self.task
        assert self.ended_at is not None
        return self.ended_at - started


class TimerWatch(SystemClock):
    """The real clock, telling a test when a timer of a given length has been set (the adapter
    waits with ``call_at`` timers, never with sleeping tasks)."""

    def __init__(self) -> None:
        self.timers: list[float] = []
        self._changed: asyncio.Event | None = None

    def call_at(self, when: float, fn: Callable[[], object]) -> Timer:
        self.timers.append(when - self.monotonic())
        if self._changed is not None:
            self._changed.set()
        return super().call_at(when, fn)

    async def wait_for_timer(self, seconds: float) -> None:
        # Within a second: the delay is read back from an absolute deadline on a moving clock.
        while not any(abs(t - seconds) < 1.0 for t in self.timers):
            self._changed = asyncio.Event()
            await self._changed.wait()


# --- deltas, usage, finish ------------------------------------------------------------------------


async def test_text_reply_streams_in_fragments_with_usage_on_the_finish_chunk() -> None:
    attempts = Attempts()
    chunks, server = await serve(
        [{"text": "Running the build.", "chunk_size": 5, "usage": USAGE}], attempts
    )
    assert chunks == [
        TextDelta("Runni"),
        TextDelta("ng th"),
        TextDelta("e bui"),
        TextDelta("ld."),
        Usage(12, 5),
        Finish("stop"),
    ]
    assert attempts.calls == [(1, None, None)]
    (request,) = server.requests
    assert request.path == "/v1/chat/completions"
    assert request.body["stream"] is True
    assert request.body["stream_options"] == {"include_usage": True}


async def test_reasoning_then_text() -> None:
    chunks, _ = await serve(
        [{"reasoning": "The log says make failed.", "text": "Running make.", "chunk_size": 6}]
    )
    assert text_of(chunks, ReasoningDelta) == "The log says make failed."
    assert text_of(chunks, TextDelta) == "Running make."
    kinds = [type(c).__name__ for c in chunks]
    assert kinds.index("TextDelta") > max(i for i, k in enumerate(kinds) if k == "ReasoningDelta")
    assert chunks[-1] == Finish("stop")


async def test_parallel_tool_calls_accumulate_by_index_from_split_fragments() -> None:
    reply = {
        "text": "Checking three things.",
        "tool_calls": [
            {"name": "bash", "arguments": {"command": "make -j2"}, "id": "call_a"},
            {"name": "read_file", "arguments": {"path": "build.log"}},
            {"name": "list_files", "arguments": {}},
        ],
        "chunk_size": 4,
        "usage": USAGE,
    }
    chunks, _ = await serve([reply])
    assert sum(isinstance(c, ToolCallDelta) for c in chunks) > 6  # really split
    calls = calls_of(chunks)
    assert [c["name"] for c in calls] == ["bash", "read_file", "list_files"]
    assert [c["id"] for c in calls] == ["call_a", "call_0_1", "call_0_2"]
    assert [json.loads(c["arguments"]) for c in calls] == [
        {"command": "make -j2"},
        {"path": "build.log"},
        {},
    ]
    assert chunks[-2:] == [Usage(12, 5), Finish("tool_calls")]


def _chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}


async def test_interleaved_fragments_null_roles_and_extra_choices_are_handled() -> None:
    def fn(index: int, args: str, name: str | None = None) -> dict[str, Any]:
        call: dict[str, Any] = {"index": index, "function": {"arguments": args}}
        if name:
            call.update(id=f"p{index}", type="function")
            call["function"]["name"] = name
        return call

    raw = [
        ": keep-alive",
        _chunk({"role": "assistant", "content": ""}),
        _chunk({"role": None, "tool_calls": [fn(0, '{"a"', "one"), fn(1, '{"b"', "two")]}),
        {"choices": [{"index": 1, "delta": {"content": "other choice"}}]},
        _chunk({"role": None, "content": None, "tool_calls": [fn(1, ": 2}")]}, usage=None),
        _chunk({"tool_calls": [fn(0, ": 1}")]}),
        {"choices": []},
        _chunk({}, "tool_calls"),
        {"choices": [], "usage": USAGE},
        "data: [DONE]",
    ]
    chunks, _ = await serve([{"raw_events": raw}])
    assert calls_of(chunks) == [
        {"id": "p0", "name": "one", "arguments": '{"a": 1}'},
        {"id": "p1", "name": "two", "arguments": '{"b": 2}'},
    ]
    assert not any(isinstance(c, TextDelta) for c in chunks)
    assert chunks[-2:] == [Usage(12, 5), Finish("tool_calls")]


async def test_usage_on_a_separate_chunk_with_empty_choices() -> None:
    chunks, _ = await serve([{"text": "Done.", "usage": USAGE, "usage_chunk": "separate"}])
    assert chunks == [TextDelta("Done."), Usage(12, 5), Finish("stop")]


@pytest.mark.parametrize("finish", ["stop", "tool_calls", "length"])
async def test_each_normal_finish_reason(finish: str) -> None:
    reply: dict[str, Any] = {"text": "partial", "finish": finish}
    if finish == "tool_calls":
        reply["tool_calls"] = [{"name": "bash", "arguments": {"command": "true"}}]
    chunks, _ = await serve([reply])
    assert chunks[-1] == Finish(finish)  # type: ignore[arg-type]


async def test_finish_without_done_at_eof_completes() -> None:
    raw = [_chunk({"content": "ok"}), _chunk({}, "stop")]
    chunks, _ = await serve([{"raw_events": raw}])
    assert chunks == [TextDelta("ok"), Finish("stop")]


async def test_finish_then_silence_delivers_the_finished_reply_at_the_idle_timeout() -> None:
    # The usage chunk and [DONE] never come: the reply itself is complete, so it is delivered.
    raw = [_chunk({"content": "ok"}), _chunk({}, "stop")]
    chunks, _ = await serve([{"raw_events": raw, "stall_after_chunks": 2}], idle_timeout=0.1)
    assert chunks == [TextDelta("ok"), Finish("stop")]


async def test_content_filter_is_an_error_and_not_retried() -> None:
    replies = [{"text": "I was about to", "finish": "content_filter"}, {"text": "unused"}]
    async with MockModelServer(replies) as server, adapter(server) as model:
        attempts = Attempts()
        error = await failure(model, attempts)
        assert error.code == ErrorCode.CONTENT_FILTER
        assert "content filter" in error.message
        assert len(server.requests) == 1 and len(attempts.calls) == 1


async def test_insufficient_system_resource_is_retried_only_before_any_output() -> None:
    replies = [
        {"finish": "insufficient_system_resource"},  # nothing streamed: retried
        {"text": "Hello", "finish": "insufficient_system_resource"},  # text streamed: final
        {"text": "unused"},
    ]
    async with MockModelServer(replies) as server, adapter(server) as model:
        consumer = Consumer(model)
        await consumer.task
        assert isinstance(consumer.error, ModelError)
        assert consumer.error.code == ErrorCode.OVERLOADED
        assert consumer.chunks == [TextDelta("Hello")]
        assert consumer.attempts.codes == [None, ErrorCode.OVERLOADED]
        assert server.remaining == 1


# --- keep-alives and timeouts ---------------------------------------------------------------------


async def test_keepalive_comments_are_ignored() -> None:
    async with MockModelServer([{"text": "hi", "keepalive": 5}]) as server:
        async with adapter(server) as model:
            assert await collect(model) == [TextDelta("hi"), Finish("stop")]
        assert server.keepalives_sent == 5


async def test_keepalives_after_data_do_not_rearm_the_idle_timeout() -> None:
    replies: list[dict[str, Any]] = [
        {"text": "abcdef", "chunk_size": 2, "stall_after_chunks": 1, "keepalive_interval": 0.01},
        {"text": "unused"},
    ]
    async with MockModelServer(replies) as server, adapter(server, idle_timeout=0.3) as model:
        consumer = Consumer(model)
        await consumer.task
        assert isinstance(consumer.error, ModelError)
        assert consumer.error.code == ErrorCode.TIMEOUT
        assert "idle timeout" in consumer.error.message
        assert consumer.chunks == [TextDelta("ab")]
        assert server.keepalives_sent >= 5  # they kept coming, and did not count as progress
        assert len(server.requests) == 1  # data had started: not retried
        await server.wait_for_client_closes(1)


async def test_first_content_timeout_with_only_keepalives_is_retried() -> None:
    replies: list[dict[str, Any]] = [
        {"stall_after_chunks": 0, "keepalive_interval": 0.01},
        {"text": "ok"},
    ]
    attempts = Attempts()
    chunks, server = await serve(replies, attempts, first_content_timeout=0.2)
    assert chunks == [TextDelta("ok"), Finish("stop")]
    assert attempts.codes == [None, ErrorCode.TIMEOUT]
    error = attempts.calls[1][1]
    assert error is not None and "first-content timeout" in error.message
    assert server.keepalives_sent > 0


async def test_total_timeout_ends_a_slow_stream() -> None:
    reply = {"text": "x" * 200, "chunk_size": 1, "chunk_delay": 0.01}
    replies: list[dict[str, Any]] = [reply, {"text": "unused"}]
    async with MockModelServer(replies) as server, adapter(server, total_timeout=0.2) as model:
        error = await failure(model)
    assert error.code == ErrorCode.TIMEOUT
    assert "total timeout" in error.message


class PacedServer:
    """A real HTTP server on the test's own loop that answers one request with an event stream
    and sends the next SSE block only when the test calls :meth:`send` — the test, not a timer,
    decides when data arrives (MockModelServer's pacing is real time)."""

    def __init__(self) -> None:
        self._blocks: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.requested = asyncio.Event()
        self._ended = asyncio.Event()
        self._server: asyncio.Server | None = None

    @property
    def base_url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/v1"

    def send(self, payload: dict[str, Any]) -> None:
        self._blocks.put_nowait(b"data: " + json.dumps(payload).encode() + b"\n\n")

    async def __aenter__(self) -> PacedServer:
        self._server = await asyncio.start_server(self._answer, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        if self.requested.is_set():
            self._blocks.put_nowait(None)  # ends the one answer
            await self._ended.wait()
        await self._server.wait_closed()

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
            length = int(head.split("content-length:")[1].split("\r\n")[0])
            await reader.readexactly(length)
            self.requested.set()
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
            )
            while (block := await self._blocks.get()) is not None:
                writer.write(b"%x\r\n%s\r\n" % (len(block), block))
                await writer.drain()
        except ConnectionError:
            pass  # the adapter closed the response (the timeout under test)
        finally:
            writer.close()
            self._ended.set()


async def test_the_watchdog_is_a_timer_on_the_clock_not_a_task() -> None:
    clock = ManualClock()
    replies: list[dict[str, Any]] = [{"stall_after_chunks": 0}, {"text": "ok"}]
    no_wait = RetryPolicy(base_delay=0.0, max_delay=0.0)  # the retry needs no clock time
    options = {"clock": clock, "first_content_timeout": 5.0, "retry_policy": no_wait}
    async with MockModelServer(replies) as server, adapter(server, **options) as model:
        before = asyncio.all_tasks()
        consumer = Consumer(model)
        await server.wait_for_requests(1)
        await clock.wait_for_sleepers(1)  # the first-content deadline
        # The consumer and the attempt's one reader task; the deadline has no task of its own.
        assert len(asyncio.all_tasks() - before) == 2
        clock.advance(5.0)
        await consumer.task
        assert consumer.chunks == [TextDelta("ok"), Finish("stop")]
        assert consumer.attempts.codes == [None, ErrorCode.TIMEOUT]
        assert clock.sleepers == 0  # the second attempt's deadline went with it


async def test_the_idle_watchdog_waits_again_when_data_moved_its_deadline() -> None:
    clock = ManualClock()
    async with (
        PacedServer() as server,
        OpenAICompatible(
            server.base_url, "m", api_key_env=None, clock=clock, idle_timeout=10.0
        ) as model,
    ):
        consumer = Consumer(model)
        await server.requested.wait()
        server.send(_chunk({"content": "ab"}))
        await consumer.wait_for_chunks(1)  # data at t=0: the idle deadline is t=10
        clock.advance(6.0)
        server.send(_chunk({"content": "cd"}))
        await consumer.wait_for_chunks(2)  # data at t=6: the deadline moved to t=16
        clock.advance(4.0)  # the timer set for t=10 fires and finds the deadline later ...
        await clock.wait_for_sleepers(1)  # ... so it waits again instead of timing out
        # Compared as a pair, not narrowed: the task sets consumer.error later in this test.
        assert (consumer.error, consumer.task.done()) == (None, False)
        clock.advance(5.0)
        assert clock.sleepers == 1 and not consumer.task.done()
        clock.advance(1.0)
        await consumer.task
    assert isinstance(consumer.error, ModelError)
    assert consumer.error.code == ErrorCode.TIMEOUT
    assert "idle timeout" in consumer.error.message
    assert consumer.chunks == [TextDelta("ab"), TextDelta("cd")]
    assert consumer.attempts.codes == [None]  # data had streamed: not retried


# --- errors inside the stream ---------------------------------------------------------------------


async def test_error_payload_mid_stream_maps_its_code_and_is_not_retried() -> None:
    replies: list[dict[str, Any]] = [
        {
            "text": "Hello there",
            "chunk_size": 5,
            "error_event": {
                "after_chunks": 1,
                "message": "Rate limit reached for requests",
                "code": "rate_limit_exceeded",
            },
        },
        {"text": "unused"},
    ]
    async with MockModelServer(replies) as server, adapter(server) as model:
        consumer = Consumer(model)
        await consumer.task
        assert consumer.chunks == [TextDelta("Hello")]
        assert isinstance(consumer.error, ModelError)
        assert consumer.error.code == ErrorCode.RATE_LIMITED
        assert "Rate limit reached for requests" in consumer.error.message
        assert len(server.requests) == 1


async def test_unknown_error_payload_is_a_server_error_and_never_content() -> None:
    replies = [{"text": "Hi", "error_event": {"after_chunks": 1, "message": "boom"}}]
    async with MockModelServer(replies) as server, adapter(server) as model:
        error = await failure(model)
    assert error.code == ErrorCode.SERVER
    assert "boom" in error.message


async def test_error_payload_before_any_output_is_retried_when_its_code_is() -> None:
    replies: list[dict[str, Any]] = [
        {"error_event": {"message": "busy", "type": "overloaded_error"}},
        {"text": "ok"},
    ]
    attempts = Attempts()
    chunks, _ = await serve(replies, attempts)
    assert chunks == [TextDelta("ok"), Finish("stop")]
    assert attempts.codes == [None, ErrorCode.OVERLOADED]


async def test_eof_without_finish_is_stream_truncated() -> None:
    replies: list[dict[str, Any]] = [
        {"text": "abcdef", "chunk_size": 2, "truncate_after_chunks": 2},
        {"text": "x"},
    ]
    async with MockModelServer(replies) as server, adapter(server) as model:
        consumer = Consumer(model)
        await consumer.task
        assert consumer.chunks == [TextDelta("ab"), TextDelta("cd")]
        assert isinstance(consumer.error, ModelError)
        assert consumer.error.code == ErrorCode.STREAM_TRUNCATED
        assert len(server.requests) == 1


async def test_done_without_finish_is_stream_truncated() -> None:
    replies = [{"raw_events": [_chunk({"content": "half"}), "data: [DONE]"]}]
    async with MockModelServer(replies) as server, adapter(server) as model:
        error = await failure(model)
    assert error.code == ErrorCode.STREAM_TRUNCATED
    assert "without a finish reason" in error.message


async def test_bad_json_is_malformed_stream() -> None:
    replies: list[dict[str, Any]] = [
        {"text": "abcdef", "chunk_size": 2, "malformed_after_chunks": 1},
        {"text": "x"},
    ]
    async with MockModelServer(replies) as server, adapter(server) as model:
        consumer = Consumer(model)
        await consumer.task
        assert consumer.chunks == [TextDelta("ab")]
        assert isinstance(consumer.error, ModelError)
        assert consumer.error.code == ErrorCode.MALFORMED_STREAM
        assert "not valid JSON" in consumer.error.message
        assert len(server.requests) == 1


async def test_tool_call_without_a_name_is_malformed_stream() -> None:
    nameless = {"tool_calls": [{"index": 0, "id": "c", "function": {"arguments": "{}"}}]}
    replies = [{"raw_events": [_chunk({"content": "Let me"}), _chunk(nameless)]}]
    async with MockModelServer(replies) as server, adapter(server) as model:
        error = await failure(model)
    assert error.code == ErrorCode.MALFORMED_STREAM
    assert "without a name" in error.message


# --- HTTP errors and retries ----------------------------------------------------------------------


async def test_429_with_retry_after_is_retried_then_succeeds() -> None:
    replies: list[dict[str, Any]] = [
        {"error": {"status": 429, "retry_after": 0.05}},
        {"text": "ok"},
    ]
    attempts = Attempts()
    chunks, server = await serve(replies, attempts)
    assert chunks == [TextDelta("ok"), Finish("stop")]
    assert [(n, delay) for n, _, delay in attempts.calls] == [(1, None), (2, 0.05)]
    error = attempts.calls[1][1]
    assert error is not None
    assert (error.code, error.status, error.retry_after) == (ErrorCode.RATE_LIMITED, 429, 0.05)
    assert len(server.requests) == 2


@pytest.mark.parametrize(
    ("status", "code"),
    [(500, ErrorCode.SERVER), (502, ErrorCode.SERVER), (503, ErrorCode.OVERLOADED)],
)
async def test_server_errors_are_retried(status: int, code: ErrorCode) -> None:
    attempts = Attempts()
    chunks, _ = await serve([{"error": {"status": status}}, {"text": "ok"}], attempts)
    assert chunks[-1] == Finish("stop")
    assert attempts.codes == [None, code]


@pytest.mark.parametrize(
    ("status", "code", "says"),
    [
        (401, ErrorCode.AUTH, "ANDON_TEST_MODEL_KEY"),
        (403, ErrorCode.AUTH, "ANDON_TEST_MODEL_KEY"),
        (402, ErrorCode.INSUFFICIENT_BALANCE, "top up"),
        (400, ErrorCode.BAD_REQUEST, "messages[3] must have a tool_call_id"),
        (404, ErrorCode.BAD_REQUEST, "check the model name"),
        (422, ErrorCode.BAD_REQUEST, "messages[3] must have a tool_call_id"),
    ],
)
async def test_client_errors_are_not_retried_and_say_what_to_do(
    status: int, code: ErrorCode, says: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANDON_TEST_MODEL_KEY", "k-123")
    message = "messages[3] must have a tool_call_id"
    replies: list[dict[str, Any]] = [
        {"error": {"status": status, "message": message}},
        {"text": "unused"},
    ]
    async with MockModelServer(replies) as server:
        async with adapter(server, api_key_env="ANDON_TEST_MODEL_KEY") as model:
            attempts = Attempts()
            error = await failure(model, attempts)
        assert (error.code, error.status) == (code, status)
        assert says in error.message
        assert message in error.message  # the server's own words are always quoted
        assert len(attempts.calls) == 1 and len(server.requests) == 1


async def test_auth_error_without_a_key_says_which_variable_to_set() -> None:
    async with MockModelServer([{"error": {"status": 401}}]) as server:
        model = OpenAICompatible(
            server.base_url,
            "m",
            api_key_env="ANDON_TEST_UNSET_KEY",
            api_key_required=False,
        )
        async with model:
            error = await failure(model)
    assert error.code == ErrorCode.AUTH
    assert "no API key was sent: set $ANDON_TEST_UNSET_KEY" in error.message


async def test_retries_stop_at_max_retries() -> None:
    replies = [{"error": {"status": 500, "retry_after": 0}}] * 4 + [{"text": "unused"}]
    async with MockModelServer(replies) as server:
        async with adapter(server, retry_policy=RetryPolicy(max_retries=3)) as model:
            attempts = Attempts()
            error = await failure(model, attempts)
        assert error.code == ErrorCode.SERVER
        assert [n for n, _, _ in attempts.calls] == [1, 2, 3, 4]
        assert len(server.requests) == 4 and server.remaining == 1


async def test_connection_refused_is_retried_then_fails_with_connection() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    model = OpenAICompatible(
        f"http://127.0.0.1:{port}/v1", "m", api_key_env=None, retry_policy=FAST
    )
    async with model:
        attempts = Attempts()
        error = await failure(model, attempts)
    assert error.code == ErrorCode.CONNECTION
    assert "cannot connect" in error.message
    assert attempts.codes == [None] + [ErrorCode.CONNECTION] * 3


async def test_dropped_connection_before_the_answer_is_retried() -> None:
    attempts = Attempts()
    chunks, _ = await serve([{"disconnect": True}, {"text": "ok"}], attempts)
    assert chunks[-1] == Finish("stop")
    assert attempts.codes == [None, ErrorCode.CONNECTION]


async def test_connections_are_reused_across_requests() -> None:
    replies: list[dict[str, Any]] = [
        {"text": "one", "usage": USAGE},
        {"text": "two", "usage_chunk": "separate"},
    ] * 2
    async with MockModelServer(replies) as server, adapter(server) as model:
        for _ in range(4):
            assert (await collect(model))[-1] == Finish("stop")
        assert server.connections == 1


# --- cancellation ---------------------------------------------------------------------------------


async def test_abort_during_a_stall_ends_the_stream_at_once_and_closes_the_connection() -> None:
    async with (
        MockModelServer([{"text": "abcdef", "chunk_size": 2, "stall_after_chunks": 2}]) as server,
        adapter(server) as model,
    ):
        consumer = Consumer(model)
        await consumer.wait_for_chunks(2)
        elapsed = await consumer.abort_and_time()
        assert isinstance(consumer.error, Aborted)
        assert consumer.error.reason == User()
        assert elapsed < GENEROUS
        await server.wait_for_client_closes(1)


async def test_abort_while_waiting_for_headers() -> None:
    replies = [{"stall_before_headers": True}]
    async with MockModelServer(replies) as server, adapter(server) as model:
        consumer = Consumer(model)
        await server.wait_for_requests(1)
        elapsed = await consumer.abort_and_time()
        assert isinstance(consumer.error, Aborted)
        assert elapsed < GENEROUS
        assert consumer.chunks == []
        await server.wait_for_client_closes(1)


async def test_abort_during_backoff() -> None:
    clock = TimerWatch()
    replies: list[dict[str, Any]] = [
        {"error": {"status": 429, "retry_after": 30}},
        {"text": "unused"},
    ]
    async with MockModelServer(replies) as server, adapter(server, clock=clock) as model:
        consumer = Consumer(model)
        await clock.wait_for_timer(30)
        elapsed = await consumer.abort_and_time()
        assert isinstance(consumer.error, Aborted)
        assert elapsed < GENEROUS
        assert [n for n, _, _ in consumer.attempts.calls] == [1]
        assert len(server.requests) == 1


async def test_abort_between_chunks_ends_at_the_next_read() -> None:
    async with (
        MockModelServer([{"text": "abcdef", "chunk_size": 2, "stall_after_chunks": 3}]) as server,
        adapter(server) as model,
    ):
        controller = AbortController()
        stream = model.stream(REQUEST, controller.signal, Attempts())
        assert await anext(stream) == TextDelta("ab")
        controller.abort(User())  # the caller is busy, not waiting on the stream
        await server.wait_for_client_closes(1)  # closed anyway, without another read
        with pytest.raises(Aborted):
            await anext(stream)


async def test_an_aborted_signal_sends_nothing() -> None:
    async with MockModelServer([{"text": "unused"}]) as server, adapter(server) as model:
        controller = AbortController()
        controller.abort(User())
        attempts = Attempts()
        with pytest.raises(Aborted):
            await collect(model, attempts, controller.signal)
        assert attempts.calls == [] and server.requests == ()


async def test_cancelling_the_consumer_task_closes_the_connection() -> None:
    replies = [{"text": "abcdef", "chunk_size": 2, "stall_after_chunks": 1}]
    async with MockModelServer(replies) as server, adapter(server) as model:
        consumer = Consumer(model)
        await consumer.wait_for_chunks(1)
        consumer.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await consumer.task
        await server.wait_for_client_closes(1)


def test_the_adapter_is_a_model() -> None:
    model = OpenAICompatible("http://127.0.0.1:9/v1", "m", api_key_env=None)
    assert isinstance(model, Model)
    assert model.info.provider == "openai-compatible"


async def test_closing_the_iterator_early_closes_the_connection() -> None:
    async with (
        MockModelServer([{"text": "abcdef", "chunk_size": 2, "stall_after_chunks": 2}]) as server,
        adapter(server) as model,
    ):
        stream = model.stream(REQUEST, AbortController().signal, Attempts())
        assert await anext(stream) == TextDelta("ab")
        await stream.aclose()  # type: ignore[attr-defined]
        await server.wait_for_client_closes(1)


# --- the request ----------------------------------------------------------------------------------


HISTORY = (
    {"role": "system", "content": "You fix builds."},
    {"role": "user", "content": "Fix the build"},
    {
        "role": "assistant",
        "content": "Running make.",
        "reasoning_content": "The log says make failed.",
        "tool_calls": [
            {"id": "c1-1-1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1-1-1", "content": "error: missing ;"},
    {"role": "assistant", "content": "Fixed.", "reasoning_content": "One char."},
    {"role": "user", "content": "Run the tests"},
    {"role": "assistant", "content": "Sure.", "reasoning_content": "Not needed."},
    {"role": "user", "content": "Now lint"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c3-1-1", "type": "function", "function": {"name": "lint", "arguments": "{}"}}
        ],
    },
    {"role": "tool", "tool_call_id": "c3-1-1", "content": "clean"},
)
TOOLS = (
    {
        "type": "function",
        "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}},
    },
)


async def test_deepseek_request_body_as_the_server_receives_it() -> None:
    request = ModelRequest(messages=HISTORY, tools=TOOLS, max_tokens=1000)
    async with MockModelServer([{"text": "ok"}]) as server:
        model = OpenAICompatible(
            server.base_url,
            "deepseek-v4-flash",
            api_key_env=None,
            provider="deepseek",
            thinking=True,
        )
        async with model:
            await collect(model, request=request)
        (received,) = server.requests
    body = received.body
    assert body["model"] == "deepseek-v4-flash"
    assert body["thinking"] == {"type": "enabled"}
    assert body["tools"] == list(TOOLS)
    assert body["max_tokens"] == 1000
    messages = body["messages"]
    assert [m["role"] for m in messages] == [m["role"] for m in HISTORY]
    assert messages[3] == {"role": "tool", "tool_call_id": "c1-1-1", "content": "error: missing ;"}
    assert messages[9]["tool_call_id"] == "c3-1-1"
    assert [m.get("reasoning_content") for m in messages] == [
        None,
        None,
        "The log says make failed.",  # a tool-using span: needed in all later requests (V4)
        None,
        "One char.",  # same span, no tool call of its own: needed too
        None,
        None,  # a span without tool calls: not sent
        None,
        "",  # the current span called tools: sent even when empty
        None,
    ]
    assert received.headers["content-type"] == "application/json"
    assert received.headers["accept"] == "text/event-stream"
    assert "authorization" not in received.headers


async def test_other_providers_never_get_reasoning_back() -> None:
    async with MockModelServer([{"text": "ok"}]) as server, adapter(server) as model:
        await collect(model, request=ModelRequest(messages=HISTORY))
        (received,) = server.requests
    assert all("reasoning_content" not in m for m in received.body["messages"])
    assert "thinking" not in received.body


# --- the API key ----------------------------------------------------------------------------------

SECRET = "sk-andon-test-7f3a9c0e5d1b-SECRET"


async def test_the_api_key_appears_only_in_the_authorization_header(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("ANDON_TEST_SECRET_KEY", SECRET)
    caplog.set_level(logging.DEBUG)
    replies: list[dict[str, Any]] = [
        {"text": "ok"},
        {"error": {"status": 429, "retry_after": 0, "message": f"slow down, {SECRET}"}},
        {"error": {"status": 401, "message": f"Incorrect API key provided: {SECRET}"}},
        {"text": "x", "error_event": {"after_chunks": 1, "message": f"key {SECRET} revoked"}},
    ]
    errors: list[ModelError] = []
    async with MockModelServer(replies) as server:
        model = adapter(server, api_key_env="ANDON_TEST_SECRET_KEY")
        async with model:
            await collect(model)
            attempts = Attempts()
            errors.append(await failure(model, attempts))
            errors += [e for _, e, _ in attempts.calls if e is not None]
            errors.append(await failure(model))
        shown = [repr(model), str(model), repr(model.info), str(model.info.to_dict())]
        requests = server.requests
    assert [e.code for e in errors] == [ErrorCode.AUTH, ErrorCode.RATE_LIMITED, ErrorCode.SERVER]
    for error in errors:
        shown += [str(error), repr(error), error.message]
    shown += [record.getMessage() for record in caplog.records]
    shown += [json.dumps(r.body) for r in requests]
    shown += [
        json.dumps({k: v for k, v in r.headers.items() if k != "authorization"}) for r in requests
    ]
    assert all(SECRET not in text for text in shown)
    assert "ANDON_TEST_SECRET_KEY" in errors[0].message  # AUTH names the variable, not the key
    assert all(r.headers["authorization"] == f"Bearer {SECRET}" for r in requests)


# --- odd servers ----------------------------------------------------------------------------------


async def test_a_json_answer_instead_of_a_stream_is_malformed_stream() -> None:
    class JsonOnly(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            body = b'{"choices": [{"message": {"content": "not streamed"}}]}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), JsonOnly)
    thread = threading.Thread(target=server.serve_forever)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}/v1"
        async with OpenAICompatible(base, "m", api_key_env=None) as model:
            error = await failure(model)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert error.code == ErrorCode.MALFORMED_STREAM
    assert "application/json" in error.message and "stream: true" in error.message


# --- the stream parser on its own ----------------------------------------------------------------


def parse(*payloads: Any) -> tuple[list[Chunk], StreamParser]:
    parser = StreamParser()
    chunks: list[Chunk] = []
    for payload in payloads:
        chunks += parser.feed(payload if isinstance(payload, str) else json.dumps(payload))
    return chunks, parser


def test_parser_accepts_the_variants_servers_send() -> None:
    chunks, parser = parse(
        _chunk({"reasoning": "vLLM names it reasoning"}),
        _chunk({"tool_calls": [{"id": "a", "function": {"name": "f", "arguments": {"x": 1}}}]}),
        _chunk({"tool_calls": [{"function": {"arguments": ""}}]}),  # nothing new: no chunk
        _chunk({"tool_calls": [{"function": {"name": "g"}}]}),  # no index, a name: a new call
        _chunk({}, "function_call", usage={"prompt_tokens": True, "completion_tokens": 1}),
    )
    assert chunks == [
        ReasoningDelta("vLLM names it reasoning"),
        ToolCallDelta(0, "a", "f", '{"x": 1}'),
        ToolCallDelta(1, None, "g", ""),
    ]
    assert parser.finish == "tool_calls"
    assert parser.usage is None  # a strange usage object is ignored, never fatal


def test_parser_passes_on_a_late_provider_id_once() -> None:
    chunks, _ = parse(
        _chunk({"tool_calls": [{"index": 3, "function": {"name": "f", "arguments": "{"}}]}),
        _chunk({"tool_calls": [{"index": 3, "id": "late", "function": {"arguments": "}"}}]}),
        _chunk({"tool_calls": [{"index": 3, "id": "late", "function": {"name": "f"}}]}),
    )
    assert chunks == [ToolCallDelta(0, None, "f", "{"), ToolCallDelta(0, "late", None, "}")]


@pytest.mark.parametrize(
    ("payload", "says"),
    [
        ("[1, 2]", "not a JSON object"),
        ({"choices": {"index": 0}}, "not a list"),
        ({"choices": ["x"]}, "not a JSON object"),
        (_chunk({"content": ["parts"]}), "'content' is a list"),
        (_chunk({"tool_calls": {"index": 0}}), "'tool_calls' is not a list"),
        (_chunk({"tool_calls": [{"index": -1, "function": {"name": "f"}}]}), "index -1"),
        (_chunk({"tool_calls": [{"index": 0, "function": {"name": "f", "arguments": 3}}]}), "int"),
        (_chunk({}, "eos"), "unknown finish_reason 'eos'"),
    ],
)
def test_parser_refuses_what_it_cannot_trust(payload: Any, says: str) -> None:
    with pytest.raises(ModelError, match=says) as info:
        parse(payload)
    assert info.value.code == ErrorCode.MALFORMED_STREAM
