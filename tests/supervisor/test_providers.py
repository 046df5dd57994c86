"""``open_agent(providers=...)``: tools from elsewhere (the shape MCP servers take). The pool's
workers hold the provider's hidden tool, the model never sees or reaches it, the provider's own
tools run through it, and the provider is closed after the agent and before the pool."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

import andon
from andon.base import AbortController, ConfigError, GracePolicy
from andon.fleet import WorkerPool, WorkerPoolConfig
from andon.llm import OpenAICompatible, Scripted
from andon.session import EventData
from andon.supervisor import ToolCallRequest, ToolExecutor, ToolOutcome
from andon.testing import MockModelServer
from andon.workers import Tool, ToolRegistry, default
from tests.supervisor.support import assert_sound, records


@andon.tool
def hidden_echo(text: str) -> str:
    """A worker tool only the provider calls."""
    return f"hidden said {text}"


class EchoProvider:
    """Offers ``shout``, which runs the worker tool ``hidden_echo`` through its own executor."""

    def __init__(self) -> None:
        self.events: list[str] = []

    @property
    def worker_tools(self) -> Sequence[Tool]:
        return [hidden_echo]

    @contextlib.asynccontextmanager
    async def open(
        self, workers: WorkerPool, owner: str, write: Callable[[EventData], object]
    ) -> AsyncIterator[Sequence[Tool]]:
        self.events.append(f"open {bool(owner)}")
        executor = ToolExecutor(workers, ToolRegistry([hidden_echo]))

        async def shout(call: Any) -> ToolOutcome:
            request = ToolCallRequest(
                f"shout-{call.call_id}", "hidden_echo", {"text": call.arguments["text"]}, "."
            )
            inner = await executor.execute(request, AbortController().signal)
            return ToolOutcome(call.call_id, inner.content.upper(), inner.is_error, "exit", 0.0)

        tool = Tool(
            name="shout",
            description="Say it loud.",
            parameters={
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
            },
            fn=shout,
            kind="supervisor",
        )
        try:
            yield [tool]
        finally:
            self.events.append(f"close, pool up: {bool(workers.workers)}")


def _call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


async def test_a_provider_offers_its_tools_and_hides_the_workers_own(tmp_path: Path) -> None:
    replies = [_call("shout", {"text": "hi"}), _call("hidden_echo", {"text": "x"}), {"text": "ok"}]
    provider = EchoProvider()
    async with (
        MockModelServer(replies) as server,
        OpenAICompatible(server.base_url, "m", api_key_env=None) as model,
    ):
        async with andon.open_agent(
            tmp_path,
            model=model,
            tools=default(),
            pool=WorkerPoolConfig(size=1),
            grace=GracePolicy(term_after=1.0, kill_after=1.0),
            providers=[provider],
        ) as agent:
            agent.followup("go")
            await agent.when_idle()
        offered = [t["function"]["name"] for t in server.requests[0].body["tools"]]
    assert "shout" in offered and "bash" in offered and "hidden_echo" not in offered
    results = [r["data"] for r in records(tmp_path) if r["type"] == "tool/result"]
    assert results[0]["content"] == "HIDDEN SAID HI"
    assert results[1]["is_error"] and "unknown tool 'hidden_echo'" in results[1]["content"]
    assert provider.events == ["open True", "close, pool up: True"]
    assert_sound(tmp_path)


async def test_a_tool_name_offered_twice_is_refused(tmp_path: Path) -> None:
    clash = ToolRegistry(
        [*default(), Tool("shout", "taken", {"type": "object"}, kind="supervisor")]
    )
    provider = EchoProvider()
    with pytest.raises(ConfigError, match="'shout' is offered twice"):
        async with andon.open_agent(
            tmp_path,
            model=Scripted([{"text": "never"}]),
            tools=clash,
            pool=WorkerPoolConfig(size=1),
            providers=[provider],
        ):
            pass
    # Opened, its tool refused, and closed again: nothing of it is left.
    assert provider.events == ["open True", "close, pool up: True"]
