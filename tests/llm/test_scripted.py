"""The scripted model (docs/models.md, Scripted replies): streaming, errors and retries, abort,
validation."""

from __future__ import annotations

import asyncio
import datetime
import json
import time
from pathlib import Path
from typing import Any

import pytest

from andon.base import (
    AbortController,
    Aborted,
    AbortSignal,
    ConfigError,
    ErrorCode,
    Hook,
    ManualClock,
    ModelError,
    ScriptInvalid,
    User,
)
from andon.llm import (
    Chunk,
    Finish,
    Model,
    ModelIdentity,
    ModelRequest,
    ReasoningDelta,
    Scripted,
    ScriptFailure,
    ScriptParser,
    ScriptReply,
    ScriptToolCall,
    TextDelta,
    ToolCallDelta,
    Usage,
)

REQUEST = ModelRequest(messages=({"role": "user", "content": "Fix the build"},))


class Attempts:
    """An ``on_attempt`` that records its calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, ModelError | None, float | None]] = []

    async def __call__(self, n: int, error: ModelError | None, delay: float | None) -> None:
        self.calls.append((n, error, delay))


async def play(model: Scripted, attempts: Attempts | None = None) -> list[Chunk]:
    signal = AbortController().signal
    return [c async for c in model.stream(REQUEST, signal, attempts or Attempts())]


class Consumer:
    """Reads a stream in its own task; the test waits on chunk counts, never on time."""

    def __init__(self, model: Scripted, signal: AbortSignal) -> None:
        self.model = model
        self.signal = signal
        self.attempts = Attempts()
        self.chunks: list[Chunk] = []
        self.error: Exception | None = None
        self._changed = asyncio.Condition()

    async def run(self) -> None:
        try:
            async for chunk in self.model.stream(REQUEST, self.signal, self.attempts):
                self.chunks.append(chunk)
                async with self._changed:
                    self._changed.notify_all()
        except (Aborted, ModelError) as exc:
            self.error = exc

    async def wait_for_chunks(self, n: int) -> None:
        async with self._changed:
            await self._changed.wait_for(lambda: len(self.chunks) >= n)


def texts(chunks: list[Chunk], kind: type[TextDelta] | type[ReasoningDelta]) -> list[str]:
    return [c.text for c in chunks if isinstance(c, kind)]


def calls(chunks: list[Chunk]) -> list[ToolCallDelta]:
    return [c for c in chunks if isinstance(c, ToolCallDelta)]


# --- playing replies --------------------------------------------------------------------------


async def test_text_streams_in_chunks_of_chunk_size() -> None:
    attempts = Attempts()
    chunks = await play(Scripted([{"text": "Running the build.", "chunk_size": 4}]), attempts)
    assert texts(chunks, TextDelta) == ["Runn", "ing ", "the ", "buil", "d."]
    assert chunks[-1] == Finish("stop")
    assert attempts.calls == [(1, None, None)]


async def test_default_chunk_size_is_sixteen() -> None:
    text = "x" * 40
    chunks = await play(Scripted([{"text": text}]))
    assert [len(t) for t in texts(chunks, TextDelta)] == [16, 16, 8]
    assert "".join(texts(chunks, TextDelta)) == text


async def test_reasoning_streams_before_text() -> None:
    reply = {"reasoning": "The build failed; look at the log.", "text": "Running.", "chunk_size": 8}
    chunks = await play(Scripted([reply]))
    kinds = [type(c) for c in chunks]
    assert kinds == [ReasoningDelta] * 5 + [TextDelta] + [Finish]
    assert "".join(texts(chunks, ReasoningDelta)) == reply["reasoning"]
    assert "".join(texts(chunks, TextDelta)) == "Running."


async def test_several_tool_calls_stream_as_fragments_with_ids() -> None:
    model = Scripted(
        [
            {
                "text": "Building.",
                "chunk_size": 5,
                "tool_calls": [
                    {"name": "bash", "arguments": {"command": "make -j2"}},
                    {"name": "read_file", "arguments": {"path": "build.log"}, "id": "call_7"},
                    {"name": "list_files"},
                ],
            }
        ]
    )
    chunks = await play(model)
    deltas = calls(chunks)
    # Tool calls come after the text, then the finish defaults to tool_calls.
    assert isinstance(chunks[0], TextDelta)
    assert chunks[-1] == Finish("tool_calls")
    assert chunks.index(deltas[0]) > max(
        i for i, c in enumerate(chunks) if isinstance(c, TextDelta)
    )
    assert all(len(d.arguments) <= 5 for d in deltas)

    by_index: dict[int, list[ToolCallDelta]] = {}
    for delta in deltas:
        by_index.setdefault(delta.index, []).append(delta)
    assert sorted(by_index) == [0, 1, 2]
    firsts = [by_index[i][0] for i in range(3)]
    assert [(d.provider_id, d.name) for d in firsts] == [
        ("call_0_0", "bash"),
        ("call_7", "read_file"),
        ("call_0_2", "list_files"),
    ]
    for fragments in by_index.values():
        assert all(d.provider_id is None and d.name is None for d in fragments[1:])
    arguments = ["".join(d.arguments for d in by_index[i]) for i in range(3)]
    assert [json.loads(a) for a in arguments] == [
        {"command": "make -j2"},
        {"path": "build.log"},
        {},
    ]


async def test_default_ids_are_deterministic_and_name_the_reply() -> None:
    replies: list[dict[str, Any]] = [
        {"text": "a"},
        {"tool_calls": [{"name": "bash"}, {"name": "bash"}]},
    ]
    model = Scripted(replies)
    await play(model)
    deltas = calls(await play(model))
    assert [d.provider_id for d in deltas] == ["call_1_0", "call_1_1"]
    again = calls(await play(Scripted(replies[1:])))
    assert [d.provider_id for d in again] == ["call_0_0", "call_0_1"]


async def test_string_arguments_pass_through_untouched() -> None:
    broken = '{"command": "make'  # invalid JSON on purpose: the executor must judge it
    chunks = await play(Scripted([{"tool_calls": [{"name": "bash", "arguments": broken}]}]))
    assert "".join(d.arguments for d in calls(chunks)) == broken


async def test_finish_length_keeps_streaming_the_tool_calls() -> None:
    reply = {"tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}], "finish": "length"}
    chunks = await play(Scripted([reply]))
    assert calls(chunks)
    assert chunks[-1] == Finish("length")


async def test_usage_comes_just_before_finish() -> None:
    reply = {"text": "done", "usage": {"prompt_tokens": 10, "completion_tokens": 5}}
    chunks = await play(Scripted([reply]))
    assert chunks[-2:] == [Usage(prompt_tokens=10, completion_tokens=5), Finish("stop")]
    assert chunks[-2].to_dict() == {"prompt_tokens": 10, "completion_tokens": 5}  # type: ignore[union-attr]


async def test_an_empty_reply_just_finishes() -> None:
    assert await play(Scripted([{}])) == [Finish("stop")]


async def test_each_request_consumes_one_reply_and_exhaustion_is_an_error() -> None:
    model = Scripted([{"text": "one"}, {"text": "two"}])
    assert texts(await play(model), TextDelta) == ["one"]
    assert (model.consumed, model.remaining) == (1, 1)
    assert texts(await play(model), TextDelta) == ["two"]
    attempts = Attempts()
    with pytest.raises(ModelError) as info:
        await play(model, attempts)
    assert info.value.code is ErrorCode.SCRIPT_EXHAUSTED
    assert attempts.calls == [(1, None, None)]  # exhaustion is never retried
    assert len(model.requests) == 3
    assert model.requests[0] is REQUEST


async def test_separate_instances_have_separate_cursors() -> None:
    replies = [{"text": "first"}, {"text": "second"}]
    a, b = Scripted(replies), Scripted(replies)
    assert texts(await play(a), TextDelta) == ["first"]
    assert texts(await play(a), TextDelta) == ["second"]
    assert texts(await play(b), TextDelta) == ["first"]


async def test_replies_are_copied_at_construction() -> None:
    replies: list[dict[str, Any]] = [{"text": "as written"}]
    model = Scripted(replies)
    replies[0]["text"] = "changed later"
    assert texts(await play(model), TextDelta) == ["as written"]


def test_info_and_protocol() -> None:
    model = Scripted([])
    assert model.info == ModelIdentity(spec="script:inline", provider="script", name="scripted")
    assert model.info.to_dict() == {
        "spec": "script:inline",
        "provider": "script",
        "name": "scripted",
    }
    assert isinstance(model, Model)


def test_chunks_serialise_as_chunk_record_deltas() -> None:
    assert TextDelta("a").to_dict() == {"type": "text", "text": "a"}
    assert ReasoningDelta("r").to_dict() == {"type": "reasoning", "text": "r"}
    assert ToolCallDelta(0, "call_1", "bash", '{"c').to_dict() == {
        "type": "tool_call",
        "index": 0,
        "provider_id": "call_1",
        "name": "bash",
        "arguments": '{"c',
    }
    assert ToolCallDelta(0, None, None, "x").to_dict() == {
        "type": "tool_call",
        "index": 0,
        "arguments": "x",
    }


def test_model_request_holds_tuples() -> None:
    request = ModelRequest(messages=[{"role": "user", "content": "hi"}])  # type: ignore[arg-type]
    assert request.messages == ({"role": "user", "content": "hi"},)
    assert request.tools == ()
    assert request.max_tokens is None


# --- errors and retries -----------------------------------------------------------------------


async def test_rate_limit_is_retried_after_backoff_then_succeeds() -> None:
    clock = ManualClock()
    model = Scripted([{"error": {"status": 429}}, {"text": "ok"}], clock=clock, rng=lambda: 0.0)
    consumer = Consumer(model, AbortController().signal)
    async with asyncio.TaskGroup() as tg:
        tg.create_task(consumer.run())
        await clock.wait_for_sleepers(1)
        assert consumer.attempts.calls == [(1, None, None)]  # attempt 2 waits for the backoff
        clock.advance(0.5)
    assert consumer.error is None
    assert texts(consumer.chunks, TextDelta) == ["ok"]
    (first, second) = consumer.attempts.calls
    assert first == (1, None, None)
    n, err, delay = second
    assert (n, delay) == (2, 0.5)
    assert isinstance(err, ModelError)
    assert (err.code, err.status) == (ErrorCode.RATE_LIMITED, 429)
    assert "429" in err.message


async def test_retry_after_sets_the_delay() -> None:
    clock = ManualClock()
    model = Scripted([{"error": {"status": 503, "retry_after": 0.2}}, {"text": "ok"}], clock=clock)
    consumer = Consumer(model, AbortController().signal)
    async with asyncio.TaskGroup() as tg:
        tg.create_task(consumer.run())
        await clock.wait_for_sleepers(1)
        clock.advance(0.2)
    assert consumer.attempts.calls[1][0] == 2
    assert consumer.attempts.calls[1][2] == 0.2
    assert consumer.attempts.calls[1][1].code is ErrorCode.OVERLOADED  # type: ignore[union-attr]


async def test_backoff_grows_between_retries() -> None:
    clock = ManualClock()
    failures: list[dict[str, Any]] = [{"error": {"status": 500}}] * 3
    model = Scripted([*failures, {"text": "ok"}], clock=clock, rng=lambda: 0.0)
    consumer = Consumer(model, AbortController().signal)
    async with asyncio.TaskGroup() as tg:
        tg.create_task(consumer.run())
        for expected in (0.5, 1.0, 2.0):
            await clock.wait_for_sleepers(1)
            clock.advance(expected)
    assert [d for _, _, d in consumer.attempts.calls] == [None, 0.5, 1.0, 2.0]
    assert texts(consumer.chunks, TextDelta) == ["ok"]


@pytest.mark.parametrize("status", [400, 401, 402, 403, 404, 422])
async def test_client_errors_are_not_retried(status: int) -> None:
    model = Scripted([{"error": {"status": status}}, {"text": "never"}])
    attempts = Attempts()
    with pytest.raises(ModelError) as info:
        await play(model, attempts)
    assert info.value.status == status
    assert info.value.code in {
        ErrorCode.BAD_REQUEST,
        ErrorCode.AUTH,
        ErrorCode.INSUFFICIENT_BALANCE,
    }
    assert attempts.calls == [(1, None, None)]
    assert model.remaining == 1


async def test_retries_stop_at_max_retries() -> None:
    failure = {"error": {"status": 500, "retry_after": 0, "message": "upstream down"}}
    model = Scripted([failure] * 5, max_retries=3)
    attempts = Attempts()
    with pytest.raises(ModelError) as info:
        await play(model, attempts)
    assert (info.value.code, info.value.message) == (ErrorCode.SERVER, "upstream down")
    assert [n for n, _, _ in attempts.calls] == [1, 2, 3, 4]
    assert model.remaining == 1


async def test_max_retries_zero_raises_the_first_error() -> None:
    model = Scripted([{"error": {"status": 429, "retry_after": 0}}, {"text": "x"}], max_retries=0)
    with pytest.raises(ModelError) as info:
        await play(model)
    assert info.value.code is ErrorCode.RATE_LIMITED
    assert model.remaining == 1


async def test_running_out_during_retries_is_script_exhausted() -> None:
    model = Scripted([{"error": {"status": 502, "retry_after": 0}}])
    attempts = Attempts()
    with pytest.raises(ModelError) as info:
        await play(model, attempts)
    assert info.value.code is ErrorCode.SCRIPT_EXHAUSTED
    assert [n for n, _, _ in attempts.calls] == [1, 2]


@pytest.mark.parametrize(
    ("code", "retried"),
    [
        ("CONNECTION", True),
        ("TIMEOUT", True),
        ("CONTENT_FILTER", False),
        ("STREAM_TRUNCATED", False),
        ("MALFORMED_STREAM", False),
    ],
)
async def test_explicit_error_codes(code: str, retried: bool) -> None:
    model = Scripted([{"error": {"code": code, "retry_after": 0}}, {"text": "recovered"}])
    if retried:
        assert texts(await play(model), TextDelta) == ["recovered"]
    else:
        with pytest.raises(ModelError) as info:
            await play(model)
        assert info.value.code == code
        assert info.value.status is None


async def test_an_explicit_code_wins_over_the_status() -> None:
    model = Scripted([{"error": {"status": 500, "code": "CONTENT_FILTER"}}])
    with pytest.raises(ModelError) as info:
        await play(model)
    assert (info.value.code, info.value.status) == (ErrorCode.CONTENT_FILTER, 500)


# --- abort ------------------------------------------------------------------------------------


async def test_abort_before_start_raises_with_the_cause_and_consumes_nothing() -> None:
    model = Scripted([{"text": "never"}])
    controller = AbortController()
    controller.abort(Hook("turn budget exceeded: 1s"))
    attempts = Attempts()
    with pytest.raises(Aborted) as info:
        async for _ in model.stream(REQUEST, controller.signal, attempts):
            pass
    assert info.value.reason == Hook("turn budget exceeded: 1s")
    assert attempts.calls == []
    assert model.consumed == 0


async def test_abort_while_on_attempt_runs_sends_no_request() -> None:
    model = Scripted([{"text": "never"}])
    controller = AbortController()

    async def abort_on_attempt(n: int, error: ModelError | None, delay: float | None) -> None:
        controller.abort(User())

    with pytest.raises(Aborted):
        async for _ in model.stream(REQUEST, controller.signal, abort_on_attempt):
            pass
    assert model.consumed == 0


async def test_abort_between_chunks_is_seen_before_the_next_chunk() -> None:
    model = Scripted([{"text": "abcdefgh", "chunk_size": 2}])
    controller = AbortController()
    seen: list[Chunk] = []

    async def read_and_abort() -> None:
        async for chunk in model.stream(REQUEST, controller.signal, Attempts()):
            seen.append(chunk)
            controller.abort(User())  # the consumer itself decides to stop

    with pytest.raises(Aborted) as info:
        await read_and_abort()
    assert seen == [TextDelta("ab")]
    assert info.value.reason == User()


async def test_stall_ends_promptly_when_aborted_from_another_task() -> None:
    model = Scripted([{"text": "partial answer", "chunk_size": 4, "stall_after_chunks": 2}])
    controller = AbortController()
    consumer = Consumer(model, controller.signal)
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(consumer.run())
        await consumer.wait_for_chunks(2)
        # sleep-ok: proving that nothing more arrives needs a window of time; 50 ms is plenty for
        # a stream that has no delay between chunks.
        await asyncio.wait({task}, timeout=0.05)
        assert not task.done()
        assert len(consumer.chunks) == 2
        assert len(controller.signal._callbacks) == 1  # parked on the signal, not polling
        started = time.monotonic()
        controller.abort(User())
        await task
        elapsed = time.monotonic() - started
    assert elapsed < 2.0  # a generous bound: the wake-up is one loop iteration
    assert isinstance(consumer.error, Aborted)
    assert consumer.error.reason == User()
    assert consumer.chunks == [TextDelta("part"), TextDelta("ial ")]
    assert not controller.signal._callbacks


async def test_stall_after_all_chunks_withholds_usage_and_finish() -> None:
    reply = {"text": "ab", "usage": {"prompt_tokens": 1, "completion_tokens": 1}}
    model = Scripted([{**reply, "stall_after_chunks": 99}])
    controller = AbortController()
    consumer = Consumer(model, controller.signal)
    async with asyncio.TaskGroup() as tg:
        tg.create_task(consumer.run())
        await consumer.wait_for_chunks(1)
        controller.abort(User())
    assert consumer.chunks == [TextDelta("ab")]
    assert isinstance(consumer.error, Aborted)


async def test_chunk_delay_paces_the_stream_on_the_clock() -> None:
    clock = ManualClock()
    model = Scripted([{"text": "abcd", "chunk_size": 2, "chunk_delay": 1.0}], clock=clock)
    consumer = Consumer(model, AbortController().signal)
    async with asyncio.TaskGroup() as tg:
        tg.create_task(consumer.run())
        await consumer.wait_for_chunks(1)
        await clock.wait_for_sleepers(1)
        clock.advance(0.5)
        assert clock.sleepers == 1
        assert consumer.chunks == [TextDelta("ab")]
        clock.advance(0.5)
        await consumer.wait_for_chunks(2)
        await clock.wait_for_sleepers(1)  # the delay before Finish
        clock.advance(1.0)
    assert consumer.chunks == [TextDelta("ab"), TextDelta("cd"), Finish("stop")]


async def test_abort_during_chunk_delay() -> None:
    clock = ManualClock()
    model = Scripted([{"text": "abcdefgh", "chunk_size": 2, "chunk_delay": 1.0}], clock=clock)
    controller = AbortController()
    consumer = Consumer(model, controller.signal)
    async with asyncio.TaskGroup() as tg:
        tg.create_task(consumer.run())
        await consumer.wait_for_chunks(1)
        await clock.wait_for_sleepers(1)
        controller.abort(Hook("stop"))
    # The clock never moved: the abort alone ended the delay.
    assert clock.monotonic() == 1000.0
    assert clock.sleepers == 0
    assert consumer.chunks == [TextDelta("ab")]
    assert isinstance(consumer.error, Aborted)
    assert consumer.error.reason == Hook("stop")


async def test_abort_during_retry_backoff() -> None:
    clock = ManualClock()
    model = Scripted([{"error": {"status": 429}}, {"text": "late"}], clock=clock)
    controller = AbortController()
    consumer = Consumer(model, controller.signal)
    async with asyncio.TaskGroup() as tg:
        tg.create_task(consumer.run())
        await clock.wait_for_sleepers(1)
        controller.abort(User())
    assert isinstance(consumer.error, Aborted)
    assert consumer.attempts.calls == [(1, None, None)]
    assert model.consumed == 1
    assert clock.sleepers == 0


# --- validation -------------------------------------------------------------------------------

BAD_REPLIES: list[tuple[object, str | None]] = [
    ("just text", None),
    (["text", "x"], None),
    ({"txt": "x"}, "txt"),
    ({"text": 5}, "text"),
    ({"text": None}, "text"),
    ({"reasoning": ["a"]}, "reasoning"),
    ({"chunk_size": -1}, "chunk_size"),
    ({"chunk_size": 0}, "chunk_size"),
    ({"chunk_size": 2.5}, "chunk_size"),
    ({"chunk_size": True}, "chunk_size"),
    ({"chunk_delay": -0.1}, "chunk_delay"),
    ({"chunk_delay": "fast"}, "chunk_delay"),
    ({"chunk_delay": float("inf")}, "chunk_delay"),
    ({"finish": "done"}, "finish"),
    ({"finish": "content_filter"}, "finish"),
    ({"tool_calls": {"name": "bash"}}, "tool_calls"),
    ({"tool_calls": "bash"}, "tool_calls"),
    ({"tool_calls": ["bash"]}, "tool_calls[0]"),
    ({"tool_calls": [{"arguments": {}}]}, "tool_calls[0].name"),
    ({"tool_calls": [{"name": ""}]}, "tool_calls[0].name"),
    ({"tool_calls": [{"name": 3}]}, "tool_calls[0].name"),
    ({"tool_calls": [{"name": "bash", "arguments": 3}]}, "tool_calls[0].arguments"),
    ({"tool_calls": [{"name": "bash", "arguments": ["ls"]}]}, "tool_calls[0].arguments"),
    ({"tool_calls": [{"name": "bash", "arguments": None}]}, "tool_calls[0].arguments"),
    (
        {"tool_calls": [{"name": "a", "arguments": {"x": float("nan")}}]},
        "tool_calls[0].arguments",
    ),
    (
        {"tool_calls": [{"name": "a", "arguments": {"day": datetime.date(2024, 1, 1)}}]},
        "tool_calls[0].arguments",
    ),
    ({"tool_calls": [{"name": "a"}, {"name": "b", "id": 7}]}, "tool_calls[1].id"),
    ({"tool_calls": [{"name": "a", "id": ""}]}, "tool_calls[0].id"),
    ({"tool_calls": [{"name": "b", "args": {}}]}, "tool_calls[0].args"),
    ({"usage": [1, 2]}, "usage"),
    ({"usage": {"prompt_tokens": 1}}, "usage.completion_tokens"),
    ({"usage": {"prompt_tokens": -1, "completion_tokens": 0}}, "usage.prompt_tokens"),
    ({"usage": {"prompt_tokens": 1, "completion_tokens": "2"}}, "usage.completion_tokens"),
    ({"usage": {"prompt_tokens": 1, "completion_tokens": 2, "total": 3}}, "usage.total"),
    ({"stall_after_chunks": -1}, "stall_after_chunks"),
    ({"stall_after_chunks": "2"}, "stall_after_chunks"),
    ({"error": "boom"}, "error"),
    ({"error": {}}, "error"),
    ({"error": {"message": "no status or code"}}, "error"),
    ({"error": {"status": 200}}, "error.status"),
    ({"error": {"status": 700}}, "error.status"),
    ({"error": {"status": "429"}}, "error.status"),
    ({"error": {"code": "NOPE"}}, "error.code"),
    ({"error": {"code": "ABORTED"}}, "error.code"),  # a tool code, not a model code
    ({"error": {"code": 429}}, "error.code"),
    ({"error": {"status": 429, "retry_after": -1}}, "error.retry_after"),
    ({"error": {"status": 429, "retry_after": "soon"}}, "error.retry_after"),
    ({"error": {"status": 429, "message": 5}}, "error.message"),
    ({"error": {"status": 429, "wait": 1}}, "error.wait"),
    ({"error": {"status": 429}, "text": "hi"}, "text"),
]


@pytest.mark.parametrize(("reply", "field"), BAD_REPLIES)
def test_a_bad_reply_is_rejected_naming_index_and_field(reply: object, field: str | None) -> None:
    with pytest.raises(ScriptInvalid) as info:
        Scripted([{"text": "fine"}, reply])  # type: ignore[list-item]
    assert isinstance(info.value, ConfigError)
    assert info.value.index == 1
    assert info.value.field == field
    assert "reply 1" in str(info.value)
    if field is not None:
        assert repr(field) in str(info.value)


@pytest.mark.parametrize("replies", ["a string", {"replies": []}, None, 3])
def test_replies_must_be_a_list(replies: object) -> None:
    with pytest.raises(ScriptInvalid) as info:
        Scripted(replies)  # type: ignore[arg-type]
    assert info.value.field == "replies"
    assert info.value.index is None


def test_the_script_format_is_public_for_doubles_that_extend_it() -> None:
    # What MockModelServer builds on: parsed values, and the field checks with their messages.
    parser = ScriptParser("script.yaml")
    reply = parser.reply(0, {"text": "abc", "chunk_size": 2, "tool_calls": [{"name": "bash"}]})
    assert isinstance(reply, ScriptReply)
    assert reply.tool_calls == (ScriptToolCall("call_0_0", "bash", "{}"),)
    assert reply.content() == [
        TextDelta("ab"),
        TextDelta("c"),
        ToolCallDelta(0, "call_0_0", "bash", "{}"),
    ]
    failing = parser.reply(1, {"error": {"status": 503, "retry_after": 2}})
    assert failing.error == ScriptFailure(ErrorCode.OVERLOADED, "503 from the model API", 503, 2.0)
    assert parser.seconds(2, "pause", 1) == 1.0
    with pytest.raises(ScriptInvalid) as info:
        parser.integer(2, "keepalive", True, minimum=0)
    assert (info.value.index, info.value.field) == (2, "keepalive")
    assert "(in script.yaml)" in str(info.value)


def test_negative_max_retries_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="max_retries"):
        Scripted([], max_retries=-1)


# --- files ------------------------------------------------------------------------------------

YAML_SCRIPT = """\
replies:
  - reasoning: "The build failed; look at the log."
    text: "Running the build."
    tool_calls:
      - {name: bash, arguments: {command: "make -j2"}}
      - {name: read_file, arguments: {path: "build.log"}, id: "call_7"}
    chunk_size: 8
    finish: tool_calls
    usage: {prompt_tokens: 10, completion_tokens: 5}
  - error: {status: 429, retry_after: 0}
  - text: "Build fixed."
"""


async def test_from_file_yaml(tmp_path: Path) -> None:
    path = tmp_path / "script.yaml"
    path.write_text(YAML_SCRIPT)
    model = Scripted.from_file(path)
    assert model.info.spec == f"script:{path}"
    assert model.info.provider == "script"
    first = await play(model)
    assert "".join(texts(first, TextDelta)) == "Running the build."
    assert [d.provider_id for d in calls(first) if d.name] == ["call_0_0", "call_7"]
    assert first[-2:] == [Usage(10, 5), Finish("tool_calls")]
    attempts = Attempts()
    assert texts(await play(model, attempts), TextDelta) == ["Build fixed."]
    assert [(n, d) for n, _, d in attempts.calls] == [(1, None), (2, 0.0)]


async def test_from_file_json_bare_list_and_mapping(tmp_path: Path) -> None:
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps([{"text": "from a list"}]))
    assert texts(await play(Scripted.from_file(bare)), TextDelta) == ["from a list"]
    wrapped = tmp_path / "wrapped.json"
    wrapped.write_text(json.dumps({"replies": [{"text": "from a mapping"}]}))
    assert texts(await play(Scripted.from_file(str(wrapped))), TextDelta) == ["from a mapping"]


@pytest.mark.parametrize(
    ("name", "content", "fragment"),
    [
        ("broken.yaml", "replies: [ {text: 'unclosed'\n", "cannot parse"),
        ("broken.json", '{"replies": [', "cannot parse"),
        ("scalar.yaml", "just words\n", "must be a list"),
        ("empty.yaml", "", "must be a list"),
        ("extra.yaml", "replies: []\nmodel: x\n", "unknown top-level field"),
        ("noreplies.yaml", "answers: []\n", "unknown top-level field"),
        ("badreply.yaml", "replies:\n  - text: ok\n  - chunk_size: -3\n", "reply 1"),
        ("binary.yaml", b"\xff\xfe\x00garbage", "cannot read"),
    ],
)
def test_from_file_with_a_broken_file_names_it(
    tmp_path: Path, name: str, content: str | bytes, fragment: str
) -> None:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(ScriptInvalid) as info:
        Scripted.from_file(path)
    assert str(path) in str(info.value)
    assert fragment in str(info.value)


def test_from_file_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match="cannot read") as info:
        Scripted.from_file(path)
    assert str(path) in str(info.value)


def test_a_bad_reply_in_a_file_names_index_and_field(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("replies:\n  - text: ok\n  - tool_calls: [{arguments: {}}]\n")
    with pytest.raises(ScriptInvalid) as info:
        Scripted.from_file(path)
    assert (info.value.index, info.value.field) == (1, "tool_calls[0].name")
    assert str(path) in str(info.value)
