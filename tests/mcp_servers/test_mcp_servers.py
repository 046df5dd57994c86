"""MCP stdio servers under a tool worker's containment (docs/tools.md, MCP servers): real worker
pools, real servers (``mcp-server-time`` from PyPI, and tests/mcp_servers/fake_server.py for the
behaviours a real server has only by accident), real signals."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sys

import pytest

from andon.base import AbortController, ConfigError, User
from andon.mcp import McpError, McpServer, McpServerConfig
from andon.supervisor import ToolExecutor
from tests.mcp_servers.everything import command as everything_command
from tests.mcp_servers.support import FAKE, Lines, console_script, executor, fake


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def _pid(server: McpServer) -> int:
    outcome = await server.call("pid", {}, AbortController().signal)
    assert not outcome.is_error, outcome
    return int(outcome.content)


@pytest.mark.parametrize("containment", ["auto", "subreaper", "pgroup"])
async def test_a_real_server_lists_and_answers(containment: str) -> None:
    command = console_script("mcp-server-time")
    if not os.path.exists(command):
        pytest.skip("mcp-server-time is not installed (pip install 'andon[test]')")
    async with executor(containment) as ex:  # type: ignore[arg-type]
        server = McpServer(McpServerConfig("time", (command,)), ex)
        tools = await server.start()
        try:
            by_name = {t.name: t for t in tools}
            assert "get_current_time" in by_name
            assert "timezone" in by_name["get_current_time"].input_schema["properties"]
            signal = AbortController().signal
            answer = await server.call("get_current_time", {"timezone": "UTC"}, signal)
            assert not answer.is_error, answer
            assert answer.ended_by == "exit"
            assert json.loads(answer.content)["timezone"] == "UTC"
            wrong = await server.call("get_current_time", {"timezone": "Nowhere/Else"}, signal)
            assert wrong.is_error
            assert "Nowhere/Else" in wrong.content
        finally:
            await server.aclose()


async def test_the_server_gets_no_secret_of_the_supervisor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A model key never reaches a worker at all; any other variable of the supervisor's (a
    # deploy token, say) reaches the worker, and the host must not pass it on.
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("DEPLOY_TOKEN", "not-for-servers")
    async with executor() as ex:
        config = McpServerConfig("fake", (sys.executable, FAKE, "ok"), env={"SERVER_SETTING": "on"})
        async with McpServer(config, ex) as server:
            outcome = await server.call("env", {}, AbortController().signal)
    env = json.loads(outcome.content)
    assert "OPENAI_API_KEY" not in env
    assert "DEPLOY_TOKEN" not in env
    assert env["SERVER_SETTING"] == "on"
    assert "PATH" in env
    assert env.get("ANDON_CALL_TAG"), "the call's tag must reach the server (pgroup mode)"


async def test_a_cancel_the_server_takes_ends_by_interrupt_and_keeps_it() -> None:
    # A generous term_after: the wait ends at the server's answer, and at load 40 on 2 cores an
    # answer may take seconds.
    async with executor() as ex, McpServer(fake("ok", term_after=30), ex) as server:
        pid = await _pid(server)
        lines, stop = Lines(), AbortController()
        call = server.call("slow", {}, stop.signal, lines)
        task = asyncio.ensure_future(call)
        await lines.wait_for("progress 1/10")
        stop.abort(User())
        outcome = await task
        assert outcome.ended_by == "interrupt", outcome
        assert outcome.is_error
        # The server was told (``notifications/cancelled`` naming the call): its call is over.
        left = await server.call("pending", {}, AbortController().signal)
        assert left.content == "[]"
        # The same server answers on: nothing was killed.
        assert await _pid(server) == pid


@pytest.mark.parametrize(("mode", "stage"), [("deaf", "term"), ("deaf-hard", "kill")])
async def test_a_deaf_server_is_stopped_by_the_ladder_and_restarted(mode: str, stage: str) -> None:
    config = fake(mode, term_after=0.5, kill_after=0.5)
    async with executor() as ex, McpServer(config, ex) as server:
        pid = await _pid(server)
        lines, stop = Lines(), AbortController()
        task = asyncio.ensure_future(server.call("slow", {}, stop.signal, lines))
        await lines.wait_for("progress 1/10")
        stop.abort(User())
        outcome = await task
        assert outcome.ended_by == stage, outcome
        assert "did not stop on the cancel" in outcome.content
        assert _gone(pid)
        # The next call starts a fresh server.
        echoed = await server.call("echo", {"text": "again"}, AbortController().signal)
        assert echoed.content == "again"
        assert await _pid(server) != pid


async def test_a_server_that_dies_mid_call_answers_that_call_and_restarts() -> None:
    async with executor() as ex, McpServer(fake("ok"), ex) as server:
        outcome = await server.call("die", {}, AbortController().signal)
        assert outcome.is_error
        assert outcome.ended_by == "exit"
        assert "exit status 5" in outcome.content, outcome
        echoed = await server.call("echo", {"text": "back"}, AbortController().signal)
        assert echoed.content == "back"


async def test_kill_9_of_the_server_mid_call_answers_that_call_and_restarts() -> None:
    async with executor() as ex, McpServer(fake("deaf", term_after=30), ex) as server:
        pid = await _pid(server)
        lines = Lines()
        task = asyncio.ensure_future(server.call("slow", {}, AbortController().signal, lines))
        await lines.wait_for("progress 1/10")  # the call is under way in the server
        os.kill(pid, signal.SIGKILL)
        outcome = await asyncio.wait_for(task, 30)
        assert outcome.is_error and outcome.ended_by == "exit", outcome
        assert "signal 9" in outcome.content or "SIGKILL" in outcome.content, outcome
        assert await _pid(server) != pid  # a fresh server answers the next call


async def test_a_server_that_exits_at_start_is_disabled_after_three_tries() -> None:
    async with executor() as ex:
        server = McpServer(fake("exit"), ex)
        for _ in range(2):
            with pytest.raises(McpError) as failed:
                await server.start()
            assert "exit status 3" in str(failed.value)
            assert "no configuration, giving up" in str(failed.value)
            assert server.disabled is None
        with pytest.raises(McpError, match="is disabled: it failed to start 3 times"):
            await server.start()
        with pytest.raises(McpError, match="is disabled"):
            await server.call("echo", {}, AbortController().signal)
        await server.aclose()


async def test_a_server_that_never_answers_initialize_is_a_clear_error() -> None:
    async with executor() as ex:
        server = McpServer(fake("silent", startup_timeout=1.0), ex)
        with pytest.raises(McpError, match="did not answer initialize within 1s"):
            await server.start()
        await server.aclose()


async def test_a_server_that_writes_garbage_is_a_clear_error() -> None:
    async with executor() as ex:
        server = McpServer(fake("garbage"), ex)
        with pytest.raises(McpError, match="not JSON-RPC: 'Server starting"):
            await server.start()
        await server.aclose()


async def test_a_command_that_does_not_exist_is_a_clear_error() -> None:
    async with executor() as ex:
        server = McpServer(McpServerConfig("nothing", ("/nonexistent/mcp-server",)), ex)
        with pytest.raises(McpError, match="cannot start the MCP server '/nonexistent/mcp-server'"):
            await server.start()


async def test_a_server_with_no_free_worker_is_a_clear_error() -> None:
    async with executor(size=1) as ex, McpServer(fake("ok"), ex):
        second = McpServer(fake("ok", startup_timeout=1.0), ex)
        with pytest.raises(McpError, match=r"did not start within 1s .*is a worker of the pool"):
            await second.start()
        await second.aclose()


async def test_aclose_leaves_nothing() -> None:
    async with executor() as ex:
        server = McpServer(fake("deaf-hard", term_after=0.2, kill_after=0.2), ex)
        await server.start()
        pid = await _pid(server)
        await server.aclose()
        assert _gone(pid)
        await server.aclose()  # idempotent


async def test_an_executor_without_the_host_or_with_a_default_timeout_is_refused() -> None:
    async with executor() as ex:
        timed = ToolExecutor(ex.pool, ex.registry, default_timeout=60)
        with pytest.raises(ConfigError, match="default timeout"):
            McpServer(fake("ok"), timed)


@pytest.fixture(scope="session")
def everything() -> tuple[str, ...]:
    found = everything_command()
    if isinstance(found, str):
        pytest.skip(f"no @modelcontextprotocol/server-everything: {found}")
    return found


@pytest.mark.timeout(240)  # the first use may install the server from npm (bounded at 180 s)
async def test_the_reference_server_reports_progress_takes_a_cancel_and_answers_on(
    everything: tuple[str, ...],
) -> None:
    config = McpServerConfig("everything", everything, term_after=30)  # see the fake's test
    async with executor() as ex, McpServer(config, ex) as server:
        assert {"echo", "trigger-long-running-operation"} <= {t.name for t in server.tools}
        lines, stop = Lines(), AbortController()
        arguments = {"duration": 60, "steps": 60}
        call = server.call("trigger-long-running-operation", arguments, stop.signal, lines)
        task = asyncio.ensure_future(call)
        await lines.wait_for("progress 1/60")
        stop.abort(User())
        outcome = await task
        assert outcome.ended_by == "interrupt", outcome
        assert outcome.is_error
        echoed = await server.call("echo", {"message": "after"}, AbortController().signal)
        assert echoed.content == "Echo: after"
        assert not echoed.is_error


@pytest.mark.timeout(300)
async def test_the_long_operation_cancelled_at_twenty_seeded_moments(
    everything: tuple[str, ...],
) -> None:
    # Moments: before the call starts (an aborted signal), as it starts (before its request is
    # written: no await between), and at a seeded moment of its progress. Every call is answered,
    # within the ladder, and the server (or a fresh one) answers the next call.
    rng = random.Random(38)
    config = McpServerConfig("everything", everything, term_after=30, kill_after=5)
    async with executor() as ex, McpServer(config, ex) as server:
        ended: list[str] = []
        for trial in range(20):
            stop = AbortController()
            moment = ("before", "at-start", "mid-progress")[trial % 3]
            if moment == "before":
                stop.abort(User())
            lines = Lines()
            arguments = {"duration": 30, "steps": 300}
            task = asyncio.ensure_future(
                server.call("trigger-long-running-operation", arguments, stop.signal, lines)
            )
            if moment == "at-start":
                stop.abort(User())
            elif moment == "mid-progress":
                await lines.wait_for("progress 1/300")
                await asyncio.sleep(rng.uniform(0, 0.3))  # sleep-ok: a seeded moment to stop at
                stop.abort(User())
            outcome = await asyncio.wait_for(task, 60)
            assert outcome.ended_by in ("interrupt", "term", "kill"), (trial, moment, outcome)
            assert outcome.is_error, (trial, moment, outcome)
            ended.append(outcome.ended_by)
            echoed = await server.call("echo", {"message": str(trial)}, AbortController().signal)
            assert echoed.content == f"Echo: {trial}", (trial, moment, echoed)
        # A server that takes the cancel is never killed for it.
        assert set(ended) == {"interrupt"}, ended
