"""Compaction keeps every request within the model's context window (docs/agent-loop.md,
Compaction): against a real HTTP server that refuses any request over its window in each
provider's shape, a long job completes, the log checks, and the history rebuilds what was sent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from andon.llm import SUMMARY_MARKER, OpenAICompatible, from_spec
from andon.session import SessionLog, history, read
from andon.testing import MockModelServer
from tests.supervisor.support import agent_for, assert_sound, records

SUMMARY = "Summary: the job printed blocks of text; nothing failed so far."


def printing_job(steps: int, size: int) -> list[dict[str, Any]]:
    """``steps`` bash calls each printing ``size`` bytes, then a final answer."""
    command = f"printf '%{size}s' | tr ' ' a"
    replies: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "bash", "arguments": {"command": command}}]} for _ in range(steps)
    ]
    replies.append({"text": "done"})
    return replies


def sent(server: MockModelServer) -> list[dict[str, Any]]:
    """The step requests the server answered (summary requests left out)."""
    out = []
    for request in server.requests:
        messages = request.body["messages"]
        if SUMMARY_MARKER not in json.dumps(messages[-1]):
            out.append(request.body)
    return out


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    "shape", ["openai", "deepseek", "vllm", "llamacpp", "llama-cpp-python", "empty-stream"]
)
async def test_a_long_job_completes_within_the_window(tmp_path: Path, shape: str) -> None:
    async with MockModelServer(
        printing_job(40, 6000), context_window=8000, overflow_shape=shape, summaries=SUMMARY
    ) as server:
        await _run(tmp_path, server, "print forty blocks", context_window=8000)
        assert server.overflows == 0, f"{server.overflows} requests went over the window"
        assert server.largest_prompt_tokens <= 8000
    log = records(tmp_path)
    assert [r["data"]["reason"]["kind"] for r in log if r["type"] == "turn/end"] == ["completed"]
    types = [r["type"] for r in log]
    assert "context/trimmed" in types and "context/compacted" in types
    assert_sound(tmp_path)
    # The history the log rebuilds is the last request's, message for message (and the reply).
    last = sent(server)[-1]["messages"]
    rebuilt = history(read(tmp_path))
    assert [m.get("content") for m in last[1:]] == [m.get("content") for m in rebuilt[:-1]]
    assert rebuilt[-1]["content"] == "done"


@pytest.mark.timeout(240)
async def test_a_strict_deepseek_server_accepts_every_request_of_a_compacted_session(
    tmp_path: Path,
) -> None:
    # Thinking on: every reply reasons and calls a tool, so every span is a tool-using one and
    # must send all its reasoning back, before and after each compaction and across two turns.
    job: list[dict[str, Any]] = [
        {"reasoning": f"step {n}: look at the output. " * 20, **reply}
        for n, reply in enumerate(printing_job(24, 6000))
    ]
    follow: list[dict[str, Any]] = [
        {"reasoning": f"again {n}. " * 30, **reply} for n, reply in enumerate(printing_job(8, 6000))
    ]
    async with MockModelServer(
        [*job, *follow], context_window=8000, strict_reasoning=True, summaries=SUMMARY
    ) as server:
        spec = f"deepseek+{server.base_url}#deepseek-v4-flash"
        await _run(tmp_path, server, "print blocks", "print more", spec=spec, context_window=8000)
        assert server.rejected == 0 and server.overflows == 0
    types = [r["type"] for r in records(tmp_path)]
    assert types.count("context/compacted") >= 2
    assert [r["data"]["reason"]["kind"] for r in records(tmp_path) if r["type"] == "turn/end"] == [
        "completed",
        "completed",
    ]
    assert_sound(tmp_path)


async def _run(
    folder: Path, server: MockModelServer, *texts: str, spec: str = "", **options: Any
) -> Any:
    """Each of ``texts`` as a turn of an agent on ``folder``, its model ``spec`` (default: the
    server's own, as a plain OpenAI-compatible URL); the window the agent ended up knowing."""
    model = from_spec(spec or f"{server.base_url}#mock")
    assert isinstance(model, OpenAICompatible)
    try:
        async with agent_for(folder, model, **options) as agent:
            for text in texts:
                agent.followup(text)
                await agent.when_idle()
            return agent.context_window
    finally:
        await model.aclose()


@pytest.mark.timeout(240)
@pytest.mark.parametrize("shape", ["openai", "deepseek", "vllm", "llamacpp", "llama-cpp-python"])
async def test_a_window_andon_did_not_know_is_learned_from_the_refusal(
    tmp_path: Path, shape: str
) -> None:
    # No window given: the first request over the server's is refused, which names the window;
    # andon compacts, sends it once more, and keeps within it from then on.
    async with MockModelServer(
        printing_job(30, 6000), context_window=8000, overflow_shape=shape, summaries=SUMMARY
    ) as server:
        learned = await _run(tmp_path, server, "print blocks")
        assert server.overflows == 1
    assert learned == 8000
    log = records(tmp_path)
    retries = [r["data"]["error"]["code"] for r in log if r["type"] == "llm/retry"]
    assert retries == ["CONTEXT_OVERFLOW"]
    assert [r["data"]["reason"]["kind"] for r in log if r["type"] == "turn/end"] == ["completed"]
    assert_sound(tmp_path)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("shape", ["openai", "llamacpp", "empty-stream"])
async def test_a_prompt_too_long_for_any_compaction_fails_the_turn_clearly(
    tmp_path: Path, shape: str
) -> None:
    async with MockModelServer(
        [{"text": "never"}], context_window=2048, overflow_shape=shape, summaries=SUMMARY
    ) as server:
        await _run(tmp_path, server, "word " * 8000, context_window=2048)
    (end,) = [r["data"]["reason"] for r in records(tmp_path) if r["type"] == "turn/end"]
    assert end["kind"] == "error"
    assert end["error"]["code"] == "CONTEXT_OVERFLOW"
    assert "2048-token context window" in end["error"]["message"]
    assert "context/compacted" not in [r["type"] for r in records(tmp_path)]
    assert_sound(tmp_path)


@pytest.mark.timeout(120)
async def test_compact_between_turns_writes_records_without_a_turn(tmp_path: Path) -> None:
    async with MockModelServer(
        [*printing_job(6, 6000), *printing_job(1, 10)], summaries=SUMMARY
    ) as server:
        model = from_spec(f"{server.base_url}#mock")
        assert isinstance(model, OpenAICompatible)
        try:
            # A window large enough for the first turn; then a smaller one for the next.
            async with agent_for(tmp_path, model, context_window=100_000) as agent:
                agent.followup("print blocks")
                await agent.when_idle()
                assert not await agent.compact()  # nothing to do: well within the window
                assert await agent.compact(force=True)
                agent.followup("once more")
                await agent.when_idle()
        finally:
            await model.aclose()
    log = records(tmp_path)
    compacted = [r for r in log if r["type"].startswith("context/")]
    assert compacted and all("turn" not in r["data"] for r in compacted)
    assert [r["data"]["reason"]["kind"] for r in log if r["type"] == "turn/end"] == [
        "completed",
        "completed",
    ]
    assert_sound(tmp_path)
    # The second turn was sent the summary in place of the oldest outputs (within a large
    # window the summary replaces what is before the earliest cut that keeps 35 % of it).
    last = json.dumps(sent(server)[-1]["messages"])
    assert SUMMARY in last
    assert last.count("a" * 6000) < 6


@pytest.mark.timeout(120)
async def test_the_newest_results_reach_the_model_whole(tmp_path: Path) -> None:
    # Prose piles up (nothing the first tier can stub), then one large output: the summary
    # that makes room for it must not take it in, or the model would never see it whole.
    prose = "The step went through as expected; nothing to report. " * 30
    job: list[dict[str, Any]] = [
        {"text": prose, "tool_calls": [{"name": "bash", "arguments": {"command": "echo ok"}}]}
        for _ in range(5)
    ]
    big = "printf '%8000s' | tr ' ' b"
    job.append({"tool_calls": [{"name": "bash", "arguments": {"command": big}}]})
    job.append({"text": "done"})
    async with MockModelServer(job, context_window=6000, summaries=SUMMARY) as server:
        await _run(tmp_path, server, "print", context_window=6000)
        assert server.overflows == 0
        after_big = sent(server)[6]["messages"]
    assert "b" * 8000 in json.dumps(after_big)
    assert SUMMARY in json.dumps(after_big)  # room was made by a summary, around it
    assert_sound(tmp_path)


@pytest.mark.timeout(240)
async def test_a_resumed_session_sends_the_history_it_had_from_the_part_it_reads(
    tmp_path: Path,
) -> None:
    # A resumed agent reads only session/start, the first message and the log from the last
    # cut on (andon.session._history_start); what it sends must be what a full read rebuilds.
    async with MockModelServer(
        printing_job(30, 6000), context_window=8000, summaries=SUMMARY
    ) as server:
        await _run(tmp_path, server, "print thirty blocks", context_window=8000)
    before = read(tmp_path)
    assert any(r.type == "context/compacted" for r in before)
    with SessionLog.open(tmp_path, durability="none", keep="history") as log:
        assert log.loaded.cut is not None and len(log.loaded.events) < len(before)
    async with MockModelServer([{"text": "resumed"}], context_window=64_000) as server:
        await _run(tmp_path, server, "and now?", context_window=64_000)
        first = sent(server)[0]["messages"]
    # (The plain OpenAI wire carries no reasoning_content; the history keeps it for DeepSeek.)
    rebuilt = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in history(before)]
    assert first[1:-1] == rebuilt
    assert first[-1] == {"role": "user", "content": "and now?"}
    assert_sound(tmp_path)
