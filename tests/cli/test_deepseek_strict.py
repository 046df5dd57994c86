"""DeepSeek V4's reasoning rule through the real CLI (docs/models.md, What is sent):
``andon run`` and two
``andon resume``s against a local server that enforces the rule strictly (HTTP 400 exactly when an
assistant message of a tool-using span lacks ``reasoning_content``), spoken to through a
``deepseek+URL#MODEL`` spec so that DeepSeek's thinking switch and rule apply to a custom URL."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from andon.testing import MockModelServer
from tests.cli.support import env, run

pytestmark = pytest.mark.timeout(120)


def _tool_reply(reasoning: str, command: str) -> dict[str, Any]:
    call = {"name": "bash", "arguments": {"command": command}}
    return {"reasoning": reasoning, "text": "Running it.", "tool_calls": [call]}


REPLIES = [
    _tool_reply("Build first.", "echo built"),
    {"reasoning": "It built.", "text": "Built."},
    _tool_reply("", "echo tested"),  # no reasoning at all: "" must still go back
    {"text": "Tested."},
    _tool_reply("Lint now.", "echo linted"),
    {"reasoning": "Clean.", "text": "Linted."},
]


def test_three_tool_using_turns_through_the_cli_are_all_accepted(tmp_path: Path) -> None:
    environ = env(ANDON_HOME=str(tmp_path / "home"))
    with MockModelServer(REPLIES, strict_reasoning=True) as server:
        spec = f"deepseek+{server.base_url}#deepseek-v4-flash"
        first = run("run", "--json", "--model", spec, "Build it.", cwd=tmp_path, environ=environ)
        assert first.returncode == 0, first.stderr
        summary = json.loads(first.stdout.splitlines()[-1])
        session = summary["session"]
        for prompt in ("Now test it.", "Now lint it."):
            more = run("resume", "--model", spec, session, prompt, cwd=tmp_path, environ=environ)
            assert more.returncode == 0, more.stderr
        assert server.rejected == 0
        requests = server.requests
    assert len(requests) == len(REPLIES)
    for request in requests:
        assert request.body["thinking"] == {"type": "enabled"}
    last = [m for m in requests[-1].body["messages"] if m["role"] == "assistant"]
    # Every assistant message of the two earlier tool-using turns still carries its reasoning
    # ("" for the replies that had none), and so does the current turn's tool call.
    reasoning = [m.get("reasoning_content") for m in last]
    assert reasoning == ["Build first.", "It built.", "", "", "Lint now."]
