"""How long a tool call may run (docs/workers.md, Tools; ``ToolExecutor.timeout_choice``).

Precedence: the model's ``timeout`` argument (clamped to the cap) > the agent's ``tool_timeout``
(``--tool-timeout``) > the tool's own default; the cap is the largest of the tool's own cap,
``max_tool_timeout`` and ``tool_timeout``. Timeouts of minutes are run for real on a manual
clock: a real bash call in a real worker, the clock advanced to the deadline, and the result the
agent logged names the timeout the call ran with.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from andon.base import ManualClock
from andon.fleet import WorkerPool, WorkerPoolConfig
from andon.supervisor import ToolExecutor
from andon.workers import BASH, Tool, default
from tests.supervisor.support import Watcher, agent_for, assert_sound, records


def _long_bash(**arguments: Any) -> dict[str, Any]:
    command = "echo ready; exec sleep 1000"
    return {"tool_calls": [{"name": "bash", "arguments": {"command": command, **arguments}}]}


async def _timed_out_at(
    tmp_path: Path, deadline: float, reply: dict[str, Any], **options: Any
) -> dict[str, Any]:
    """Run ``reply``'s long bash call, move the clock to ``deadline`` seconds after it printed,
    and return its ``tool/result`` data."""
    clock = ManualClock()
    async with agent_for(tmp_path, [reply, {"text": "done"}], clock=clock, **options) as agent:
        watcher = Watcher(agent)
        agent.followup("build")
        await watcher.wait_output("ready")
        clock.advance(deadline)
        await agent.when_idle()
        await watcher.close()
    assert_sound(tmp_path)
    (data,) = [r["data"] for r in records(tmp_path) if r["type"] == "tool/result"]
    assert isinstance(data, dict)
    assert data["error"]["code"] == "TOOL_TIMEOUT", data
    return data


async def test_tool_timeout_above_120s_is_bashs_default(tmp_path: Path) -> None:
    data = await _timed_out_at(tmp_path, 300, _long_bash(), tool_timeout=300)
    # The one deadline of the call's timeline was 300 s, not bash's own 120 s.
    assert data["error"]["message"] == "tool call timed out after 300s"
    assert "[timed out after 300s" in data["content"]
    assert "capped" not in data["content"]


async def test_a_model_timeout_under_the_raised_cap_is_what_the_call_gets(tmp_path: Path) -> None:
    data = await _timed_out_at(tmp_path, 700, _long_bash(timeout=700), tool_timeout=900)
    assert data["error"]["message"] == "tool call timed out after 700s"
    assert "capped" not in data["content"]


async def test_a_model_timeout_over_the_cap_runs_with_the_cap_and_says_so(tmp_path: Path) -> None:
    data = await _timed_out_at(tmp_path, 600, _long_bash(timeout=900))
    assert data["error"]["message"] == "tool call timed out after 600s"
    lines = data["content"].splitlines()
    assert lines[-2].startswith("[timed out after 600s")
    assert lines[-1] == "[timeout: 900s asked, capped at 600s (the most bash may run here)]"


async def test_max_tool_timeout_raises_bashs_cap(tmp_path: Path) -> None:
    data = await _timed_out_at(tmp_path, 1800, _long_bash(timeout=3600), max_tool_timeout=1800)
    assert data["error"]["message"] == "tool call timed out after 1800s"
    assert data["content"].endswith(
        "[timeout: 3600s asked, capped at 1800s (the most bash may run here)]"
    )


_OWN = Tool(name="own", description="", parameters={"type": "object"}, timeout=50.0)
_SHELL_NO_CAP = Tool(name="sh", description="", parameters={"type": "object"}, kind="shell")


@pytest.mark.parametrize(
    ("tool", "arguments", "tool_timeout", "max_tool_timeout", "seconds", "asked"),
    [
        (BASH, {}, None, None, 120.0, None),  # bash's own default
        (BASH, {}, 300.0, None, 300.0, None),  # --tool-timeout wins over bash's default
        (BASH, {}, 30.0, None, 30.0, None),  # also when it is shorter
        (BASH, {"timeout": 45}, 300.0, None, 45.0, None),  # the model's argument wins
        (BASH, {"timeout": 900}, None, None, 600.0, 900.0),  # clamped to bash's cap
        (BASH, {"timeout": 900}, 30.0, None, 600.0, 900.0),  # a short default keeps the cap
        (BASH, {"timeout": 900}, 1200.0, None, 900.0, None),  # the cap is raised to 1200
        (BASH, {"timeout": 2000}, 1200.0, None, 1200.0, 2000.0),
        (BASH, {"timeout": 2000}, None, 1800.0, 1800.0, 2000.0),  # max_tool_timeout raises it
        (BASH, {"timeout": 2000}, None, 60.0, 600.0, 2000.0),  # ...and never lowers it
        (BASH, {"timeout": 0}, None, None, 120.0, None),  # not a timeout: the default applies
        (BASH, {"timeout": True}, None, None, 120.0, None),  # a bool is no number of seconds
        (BASH, {"timeout": 0.5}, None, None, 0.5, None),
        (BASH, {"timeout": math.inf}, None, None, 600.0, math.inf),  # JSON's Infinity: clamped
        (_OWN, {}, None, None, 50.0, None),  # a Python tool's own default
        (_OWN, {}, 300.0, None, 300.0, None),  # --tool-timeout is every tool's default
        (_OWN, {"timeout": 10}, None, None, 50.0, None),  # Python tools take no argument for it
        (_SHELL_NO_CAP, {"timeout": 5000}, None, None, 5000.0, None),  # no cap anywhere
        (_SHELL_NO_CAP, {"timeout": 5000}, 100.0, 1000.0, 1000.0, 5000.0),
        (_SHELL_NO_CAP, {}, None, None, None, None),  # no timeout at all
    ],
)
def test_timeout_precedence(
    tool: Tool,
    arguments: dict[str, Any],
    tool_timeout: float | None,
    max_tool_timeout: float | None,
    seconds: float | None,
    asked: float | None,
) -> None:
    # A real executor over a real (never started: nothing is dispatched here) pool.
    registry = default()
    executor = ToolExecutor(
        WorkerPool(WorkerPoolConfig(size=1), registry),
        registry,
        default_timeout=tool_timeout,
        max_timeout=max_tool_timeout,
    )
    choice = executor.timeout_choice(tool, arguments)
    assert (choice.seconds, choice.asked) == (seconds, asked)
    assert executor.timeout_for(tool, arguments) == seconds
    assert bool(choice.note(tool.name)) == (asked is not None)


def test_the_clamp_note_names_what_was_asked_and_what_was_given() -> None:
    registry = default()
    executor = ToolExecutor(WorkerPool(WorkerPoolConfig(size=1), registry), registry)
    note = executor.timeout_choice(BASH, {"timeout": 900.5}).note("bash")
    assert note == "[timeout: 900.5s asked, capped at 600s (the most bash may run here)]"
    unlimited = executor.timeout_choice(BASH, {"timeout": math.inf}).note("bash")
    assert unlimited == "[timeout: no limit asked, capped at 600s (the most bash may run here)]"
    assert executor.timeout_choice(BASH, {"timeout": 600}).note("bash") == ""
