"""``andon run --mcp``: MCP servers' tools offered to the model as NAME__tool, called, stopped by
SIGINT on the grace timeline, and nothing left after the exit (the real CLI, real workers, a real
server from PyPI and a small server of the tests' own)."""

from __future__ import annotations

import os
import shlex
import signal
import sys
from pathlib import Path
from typing import Any

from tests.cli.support import assert_balanced, finish, read_until, records, run, script, start
from tests.mcp_servers.support import FAKE, console_script


def _calls(*calls: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
    replies: list[dict[str, Any]] = [
        {"tool_calls": [{"name": name, "arguments": arguments}]} for name, arguments in calls
    ]
    return [*replies, {"text": "done"}]


def _results(session: Path) -> list[dict[str, Any]]:
    return [r["data"] for r in records(session) if r["type"] == "tool/result"]


def _fake(name: str, mode: str) -> str:
    return f"{name}={shlex.join([sys.executable, FAKE, mode])}"


def test_tools_of_two_servers_answer_in_one_session(tmp_path: Path) -> None:
    model = script(
        tmp_path / "s.json",
        _calls(
            ("time__get_current_time", {"timezone": "UTC"}),
            ("fake__echo", {"text": "hello"}),
            ("time__get_current_time", {"timezone": "Not/AZone"}),
            ("bash", {"command": "echo plain"}),
        ),
    )
    done = run(
        *("run", "--model", model, "--session", "s"),
        *("--mcp", f"time={console_script('mcp-server-time')}"),
        *("--mcp", _fake("fake", "ok")),
        "go",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    now, echo, wrong, plain = _results(tmp_path / "s")
    assert '"timezone": "UTC"' in now["content"] and not now["is_error"], now
    assert "hello" in echo["content"] and not echo["is_error"], echo
    assert wrong["is_error"], wrong
    assert plain["content"].startswith("plain")
    assert_balanced(tmp_path / "s")  # and the conftest fails the test if a server was left


def test_sigint_during_a_call_to_a_deaf_server_stops_it_on_the_grace_timeline(
    tmp_path: Path, killer: list[Any]
) -> None:
    model = script(tmp_path / "s.json", _calls(("deaf__slow", {})))
    proc = start(
        *("run", "--json", "--grace", "0.5,1", "--model", model, "--session", "s"),
        *("--mcp", _fake("deaf", "deaf")),
        "go",
        cwd=tmp_path,
    )
    killer.append(proc)
    read_until(proc, lambda e: e.get("type") == "tool/output")  # the server's progress
    os.kill(proc.pid, signal.SIGINT)
    code, _, err = finish(proc)
    assert code == 130, err
    assert "Traceback" not in err
    (result,) = _results(tmp_path / "s")
    # Deaf to notifications/cancelled and to SIGINT: the host's SIGTERM ended it.
    assert result["ended_by"] == "term", result
    assert_balanced(tmp_path / "s")


def test_a_server_that_cannot_start_is_one_line_and_the_session_goes_on(tmp_path: Path) -> None:
    model = script(tmp_path / "s.json", _calls(("bash", {"command": "echo still here"})))
    done = run(
        *("run", "--model", model, "--session", "s"),
        *("--mcp", _fake("broken", "exit")),
        "go",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "MCP server 'broken' did not start" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert _results(tmp_path / "s")[0]["content"].startswith("still here")


def test_a_wrong_mcp_flag_is_one_line_and_no_session(tmp_path: Path) -> None:
    done = run(
        "run", "--model", "script:x", "--session", "s", "--mcp", "nocommand", "go", cwd=tmp_path
    )
    assert done.returncode == 2
    assert "expected NAME=COMMAND" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "s").exists()
