"""Streamed deltas: shown live one by one (``assistant/delta``), logged coalesced
(``assistant/chunk``: one record per 16 ms or 4 KiB of deltas: docs/log-format.md, Streamed deltas),
and every delta that was shown is in the log before anything that ends or follows the stream."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import andon
from andon.base import AbortSignal, ManualClock, User
from andon.fleet import WorkerPoolConfig
from andon.llm import (
    Chunk,
    Finish,
    ModelIdentity,
    ModelRequest,
    OnAttempt,
    ReasoningDelta,
    RetryDecider,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from andon.session import AssistantDelta
from andon.supervisor._reply import CHUNK_FLUSH_AFTER, CHUNK_FLUSH_BYTES, ChunkLog
from tests.supervisor.support import Watcher, agent_for, assert_sound, records

# --- through the agent --------------------------------------------------------------------------


def _chunk_records(folder: Path) -> list[dict[str, Any]]:
    return [r for r in records(folder) if r["type"] == "assistant/chunk"]


def _text(deltas: Sequence[Mapping[str, Any]], kind: str = "text") -> str:
    return "".join(d["text"] for d in deltas if d["type"] == kind)


async def test_a_long_reply_is_a_few_records_and_every_delta_live(tmp_path: Path) -> None:
    text = "".join(f"line {i} of a long answer\n" for i in range(2000))  # ~50 KB
    reply = {"reasoning": "first think", "text": text, "chunk_size": 4}
    clock = ManualClock()  # the clock never moves: only the 4 KiB rule and the stream end flush
    async with agent_for(tmp_path, [reply], clock=clock) as agent:
        watcher = Watcher(agent)
        agent.followup("go")
        await agent.when_idle()
        await watcher.wait_type("turn/end")
        await watcher.close()
    chunks = _chunk_records(tmp_path)
    logged = [d for r in chunks for d in r["data"]["deltas"]]
    assert _text(logged) == text and _text(logged, "reasoning") == "first think"
    size = len(text.encode()) + len("first think")
    assert len(chunks) <= size // CHUNK_FLUSH_BYTES + 2
    for record in chunks[:-1]:  # every record but the last was flushed at 4 KiB
        assert sum(len(d["text"]) for d in record["data"]["deltas"]) >= CHUNK_FLUSH_BYTES
    # adjacent deltas of one kind are merged: the reasoning, then one text delta per record
    assert [d["type"] for d in chunks[0]["data"]["deltas"]] == ["reasoning", "text"]
    assert all(len(r["data"]["deltas"]) == 1 for r in chunks[1:])
    # live: one event per fragment, in order, never merged, before its record
    live = watcher.live(AssistantDelta)
    assert len(live) == -(-len("first think") // 4) + -(-len(text) // 4)  # ceil: the fragments
    assert all("seq" not in e.to_dict() for e in live)
    assert {(e.turn, e.step, e.attempt) for e in live} == {(1, 1, 1)}
    assert _text([e.delta for e in live]) == text
    assert all(len(e.delta["text"]) <= 4 for e in live)
    first_record = next(i for i, e in enumerate(watcher.items) if e.type == "assistant/chunk")
    first_live = next(i for i, e in enumerate(watcher.items) if e.type == "assistant/delta")
    assert first_live < first_record
    # the records come before assistant/message, which holds the same text
    kinds = [r["type"] for r in records(tmp_path)]
    assert kinds.index("assistant/message") > max(
        i for i, k in enumerate(kinds) if k == "assistant/chunk"
    )
    assert_sound(tmp_path)


async def test_a_stalled_model_has_its_delta_logged_16_ms_later(tmp_path: Path) -> None:
    clock = ManualClock()
    replies = [{"text": "one word then nothing", "chunk_size": 8, "stall_after_chunks": 1}]
    async with agent_for(tmp_path, replies, clock=clock) as agent:
        watcher = Watcher(agent)
        agent.followup("go")
        await watcher.wait_type("assistant/delta")
        assert _chunk_records(tmp_path) == []  # shown, buffered, the timer armed
        clock.advance(CHUNK_FLUSH_AFTER)
        record = await watcher.wait_type("assistant/chunk")
        assert agent.status == "running"  # still streaming (stalled): the timer wrote it
        assert record.to_dict()["data"]["deltas"] == [{"type": "text", "text": "one word"}]
        agent.cancel(User())
        await agent.when_idle()
        await watcher.close()
    kinds = [r["type"] for r in records(tmp_path)]
    # written once: the cancel found nothing left to flush
    assert kinds.count("assistant/chunk") == 1
    assert kinds[kinds.index("assistant/chunk") + 1] == "assistant/message"
    assert_sound(tmp_path)


async def test_a_cancel_logs_every_shown_delta_before_the_salvaged_prefix(tmp_path: Path) -> None:
    clock = ManualClock()  # never advanced: the deltas are still buffered when the cancel lands
    replies = [{"text": "visible words " * 5, "chunk_size": 3, "stall_after_chunks": 7}]
    async with agent_for(tmp_path, replies, clock=clock) as agent:
        watcher = Watcher(agent)
        agent.followup("go")
        await watcher.wait(lambda e: len(watcher.live(AssistantDelta)) == 7)
        assert _chunk_records(tmp_path) == []
        agent.cancel(User())
        await agent.when_idle()
        await watcher.close()
    recs = records(tmp_path)
    kinds = [r["type"] for r in recs]
    i = kinds.index("assistant/chunk")
    assert kinds[i : i + 4] == ["assistant/chunk", "assistant/message", "step/end", "turn/end"]
    shown = "".join(e.delta["text"] for e in watcher.live(AssistantDelta))
    assert recs[i]["data"]["deltas"] == [{"type": "text", "text": shown}]
    assert recs[i + 1]["data"]["message"]["content"] == [{"type": "text", "text": shown}]
    assert_sound(tmp_path)


async def test_tool_call_fragments_merge_per_call(tmp_path: Path) -> None:
    replies: list[dict[str, Any]] = [
        {
            "text": "Two calls.",
            "chunk_size": 5,
            "tool_calls": [
                {"name": "env_probe", "arguments": {"name": "PATH"}},
                {"name": "env_probe", "arguments": {"name": "HOME"}},
            ],
        },
        {"text": "done"},
    ]
    async with agent_for(tmp_path, replies, clock=ManualClock()) as agent:
        agent.followup("go")
        await agent.when_idle()
    recs = records(tmp_path)
    deltas = next(r for r in recs if r["type"] == "assistant/chunk")["data"]["deltas"]
    message = next(r for r in recs if r["type"] == "assistant/message")["data"]["message"]
    calls = [b for b in message["content"] if b["type"] == "tool_call"]
    # per call: the fragment that names it, then its other fragments merged into one
    named = [d for d in deltas if d["type"] == "tool_call" and "name" in d]
    assert [d["index"] for d in named] == [0, 1]
    for index, call in enumerate(calls):
        fragments = [d for d in deltas if d["type"] == "tool_call" and d["index"] == index]
        assert len(fragments) <= 2
        assert "".join(d["arguments"] for d in fragments) == call["arguments"]
    assert_sound(tmp_path)


# --- usage --------------------------------------------------------------------------------------

_EXTRAS = ("cached_prompt_tokens", "uncached_prompt_tokens", "reasoning_tokens")


def _usage(prompt: int, completion: int, **extra: int) -> Usage:
    """A ``Usage``, with the optional counts this version of it has."""
    known = {f.name for f in dataclasses.fields(Usage)}
    return Usage(prompt, completion, **{k: v for k, v in extra.items() if k in known})


class _UsageModel:
    """Replies ``text`` with the given usage chunks, one reply per request."""

    def __init__(self, usages: list[Usage | None]) -> None:
        self._usages = usages
        self._info = ModelIdentity("usage-test", "test", "usage-test")

    @property
    def info(self) -> ModelIdentity:
        return self._info

    async def stream(
        self,
        request: ModelRequest,
        signal: AbortSignal,
        on_attempt: OnAttempt,
        *,
        decide_retry: RetryDecider | None = None,
    ) -> AsyncIterator[Chunk]:
        await on_attempt(1, None, None)
        usage = self._usages.pop(0)
        yield TextDelta("ok")
        if usage is not None:
            yield usage
        yield Finish("stop")


async def test_usage_totals_sum_the_reported_extras_only(tmp_path: Path) -> None:
    usages: list[Usage | None] = [
        _usage(10, 2),  # a provider that reports no extras
        None,  # no usage at all
        _usage(20, 5, cached_prompt_tokens=16, uncached_prompt_tokens=4, reasoning_tokens=3),
        _usage(30, 1, cached_prompt_tokens=24, uncached_prompt_tokens=6),
    ]
    pool = WorkerPoolConfig(size=1, containment="subreaper")
    async with andon.open_agent(tmp_path, model=_UsageModel(usages), pool=pool) as agent:
        agent.followup("a")
        await agent.when_idle()
        assert agent.usage == {"prompt_tokens": 10, "completion_tokens": 2}  # no extras shown
        for text in ("b", "c", "d"):
            agent.followup(text)
            await agent.when_idle()
        totals = dict(agent.usage)
    supported = {f.name for f in dataclasses.fields(Usage)}
    expected = {"prompt_tokens": 60, "completion_tokens": 8}
    expected.update(
        {
            k: v
            for k, v in {
                "cached_prompt_tokens": 40,
                "uncached_prompt_tokens": 10,
                "reasoning_tokens": 3,
            }.items()
            if k in supported
        }
    )
    assert totals == expected
    # assistant/message.usage is the provider's Usage.to_dict(), extras included
    logged = [r["data"].get("usage") for r in records(tmp_path) if r["type"] == "assistant/message"]
    assert logged[0] == {"prompt_tokens": 10, "completion_tokens": 2}
    assert logged[1] is None
    assert (
        logged[2]
        == _usage(
            20, 5, cached_prompt_tokens=16, uncached_prompt_tokens=4, reasoning_tokens=3
        ).to_dict()
    )
    assert_sound(tmp_path)


def test_usage_totals_take_only_whole_numbers() -> None:
    from andon.supervisor import Agent

    add = Agent._add_usage
    holder = SimpleNamespace(usage={"prompt_tokens": 0, "completion_tokens": 0})
    add(holder, {"prompt_tokens": 3, "completion_tokens": True, "reasoning_tokens": "7"})  # type: ignore[arg-type]
    add(holder, {"prompt_tokens": 1, "completion_tokens": 1, "cached_prompt_tokens": 0})  # type: ignore[arg-type]
    add(holder, None)  # type: ignore[arg-type]
    assert holder.usage == {"prompt_tokens": 4, "completion_tokens": 1, "cached_prompt_tokens": 0}


# --- the buffer itself --------------------------------------------------------------------------


class _Host:
    """What ``ChunkLog`` uses of a turn host: the log port and the clock."""

    def __init__(self, clock: ManualClock) -> None:
        self.written: list[Any] = []
        self.live: list[AssistantDelta] = []
        self.clock = clock
        self.log = SimpleNamespace(write=self.written.append, publish=self.live.append)


def _deltas(host: _Host) -> list[list[dict[str, Any]]]:
    return [[dict(d) for d in chunk.deltas] for chunk in host.written]


async def test_the_deadline_is_also_checked_at_each_delta() -> None:
    # A fast stream may not yield to the loop: the 16 ms rule must not wait for the timer.
    clock = ManualClock()
    host = _Host(clock)
    log = ChunkLog(host, 1, 1)  # type: ignore[arg-type]
    log.attempt = 1
    log.add(TextDelta("a").to_dict())
    clock.advance(CHUNK_FLUSH_AFTER)  # the timer is due, but the loop does not turn before:
    log.add(TextDelta("b").to_dict())
    assert _deltas(host) == [[{"type": "text", "text": "ab"}]]
    log.add(TextDelta("c").to_dict())
    log.close()
    assert _deltas(host)[1:] == [[{"type": "text", "text": "c"}]]
    assert [e.delta["text"] for e in host.live] == ["a", "b", "c"]
    assert clock.sleepers == 0  # no timer is left behind


async def test_merging_keeps_what_a_fold_of_the_deltas_gives() -> None:
    host = _Host(ManualClock())
    log = ChunkLog(host, 2, 3)  # type: ignore[arg-type]
    log.attempt = 2
    chunks: list[ReasoningDelta | TextDelta | ToolCallDelta] = [
        ReasoningDelta("think "),
        ReasoningDelta("more"),
        TextDelta("say "),
        TextDelta("it"),
        ReasoningDelta("again"),
        ToolCallDelta(0, "call_a", "bash", '{"comm'),
        ToolCallDelta(0, None, None, 'and": '),
        ToolCallDelta(0, None, None, '"ls"}'),
        ToolCallDelta(1, "call_b", None, ""),
        ToolCallDelta(1, None, "echo", "{}"),
    ]
    for chunk in chunks:
        log.add(chunk.to_dict())
    log.close()
    assert _deltas(host) == [
        [
            {"type": "reasoning", "text": "think more"},
            {"type": "text", "text": "say it"},
            {"type": "reasoning", "text": "again"},
            {
                "type": "tool_call",
                "index": 0,
                "provider_id": "call_a",
                "name": "bash",
                "arguments": '{"command": "ls"}',
            },
            {"type": "tool_call", "index": 1, "provider_id": "call_b", "arguments": ""},
            {"type": "tool_call", "index": 1, "name": "echo", "arguments": "{}"},
        ]
    ]
    chunk = host.written[0]
    assert (chunk.turn, chunk.step, chunk.attempt) == (2, 3, 2)
    # live events are the deltas as they arrived, untouched by the merge
    assert host.live == [AssistantDelta(2, 3, 2, c.to_dict()) for c in chunks]


async def test_the_size_rule_counts_utf8_bytes() -> None:
    host = _Host(ManualClock())
    log = ChunkLog(host, 1, 1)  # type: ignore[arg-type]
    log.add(TextDelta("é" * (CHUNK_FLUSH_BYTES // 2 - 1)).to_dict())  # 4094 bytes
    assert host.written == []
    log.add(TextDelta("é").to_dict())
    assert len(host.written) == 1
    log.close()
    assert len(host.written) == 1  # nothing was left to write


async def test_a_failed_timer_flush_is_raised_by_the_next_delta() -> None:
    clock = ManualClock()
    tried = asyncio.Event()

    def write(record: Any) -> None:
        tried.set()
        raise ValueError("cannot be written")

    host = _Host(clock)
    host.log = SimpleNamespace(write=write, publish=host.live.append)
    log = ChunkLog(host, 1, 1)  # type: ignore[arg-type]
    log.add(TextDelta("x").to_dict())
    clock.advance(CHUNK_FLUSH_AFTER)
    await tried.wait()  # the due timer ran on the loop, where its failure has no one to go to
    with pytest.raises(ValueError, match="cannot be written"):
        log.add(TextDelta("y").to_dict())
    log.abandon()  # a path already raising swallows a second failure
