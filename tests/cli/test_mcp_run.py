"""``andon run --mcp``: MCP servers' tools offered to the model as NAME__tool, called, stopped by
SIGINT on the grace timeline, and nothing left after the exit (the real CLI, real workers, a real
server from PyPI and a small server of the tests' own)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from andon import procs
from andon.base import call_tag
from tests.cli.support import assert_balanced, finish, read_until, records, run, script, start
from tests.mcp_servers.everything import command as everything_command
from tests.mcp_servers.everything import filesystem_command
from tests.mcp_servers.support import FAKE, console_script
from tests.support import leftovers


def _calls(*calls: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
    replies: list[dict[str, Any]] = [
        {"tool_calls": [{"name": name, "arguments": arguments}]} for name, arguments in calls
    ]
    return [*replies, {"text": "done"}]


def _results(session: Path) -> list[dict[str, Any]]:
    return [r["data"] for r in records(session) if r["type"] == "tool/result"]


def _fake(name: str, mode: str) -> str:
    return f"{name}={shlex.join([sys.executable, FAKE, mode])}"


def _slow_call(
    tmp_path: Path, killer: list[Any], servers: list[str], *flags: str
) -> tuple[subprocess.Popen[str], str]:
    """``andon run --json`` with ``servers``, calling ``deaf__slow``; returned once the call's
    progress shows, with the session's id."""
    model = script(tmp_path / "s.json", _calls(("deaf__slow", {})))
    mcp = [arg for server in servers for arg in ("--mcp", server)]
    proc = start(
        "run", "--json", *flags, "--model", model, "--session", "s", *mcp, "go", cwd=tmp_path
    )
    killer.append(proc)
    read_until(proc, lambda e: e.get("type") == "tool/output")
    return proc, records(tmp_path / "s")[0]["data"]["session_id"]


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
    # The log names each server, what it said of itself and the tools offered (ignorable: an
    # andon that does not know the record skips it).
    servers = [r for r in records(tmp_path / "s") if r["type"] == "mcp/server"]
    assert [(r["data"]["name"], r["data"]["state"], r.get("ignorable")) for r in servers] == [
        ("time", "started", True),
        ("fake", "started", True),
    ]
    assert "time__get_current_time" in servers[0]["data"]["tools"]
    assert servers[0]["data"]["server_name"] and "tools" in servers[0]["data"]["capabilities"]
    shown = run("log", "s", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "MCP server time (" in shown.stdout and "tools offered" in shown.stdout, shown.stdout


def test_sigint_during_a_call_to_a_deaf_server_stops_it_on_the_grace_timeline(
    tmp_path: Path, killer: list[Any]
) -> None:
    proc, _ = _slow_call(tmp_path, killer, [_fake("deaf", "deaf")], "--grace", "0.5,1")
    os.kill(proc.pid, signal.SIGINT)
    code, _, err = finish(proc)
    assert code == 130, err
    assert "Traceback" not in err
    (result,) = _results(tmp_path / "s")
    # Deaf to notifications/cancelled and to SIGINT: the host's SIGTERM ended it.
    assert result["ended_by"] == "term", result
    assert_balanced(tmp_path / "s")


@pytest.mark.parametrize(
    ("mode", "why"),
    [
        ("exit", "exit status 3"),
        ("garbage", "JSON"),
        ("silent", "initialize"),
    ],
)
def test_a_server_that_cannot_start_is_one_line_and_the_session_goes_on(
    tmp_path: Path, mode: str, why: str
) -> None:
    # (silent: it never answers initialize; its startup_timeout comes from andon.toml.)
    (tmp_path / "andon.toml").write_text(
        f"[mcp.servers.broken]\ncommand = {json.dumps(sys.executable)}\n"
        f"args = [{json.dumps(FAKE)}, {json.dumps(mode)}]\nstartup_timeout = 3\n"
    )
    model = script(tmp_path / "s.json", _calls(("bash", {"command": "echo still here"})))
    done = run("run", "--model", model, "--session", "s", "go", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "MCP server 'broken'" in line]
    assert len(lines) == 1 and "did not start" in lines[0], done.stderr
    (failed,) = [r["data"] for r in records(tmp_path / "s") if r["type"] == "mcp/server"]
    assert failed["state"] == "failed" and why in failed["reason"], failed
    assert "Traceback" not in done.stderr
    assert _results(tmp_path / "s")[0]["content"].startswith("still here")


def test_a_wrong_mcp_flag_is_one_line_and_no_session(tmp_path: Path) -> None:
    done = run(
        "run", "--model", "script:x", "--session", "s", "--mcp", "nocommand", "go", cwd=tmp_path
    )
    assert done.returncode == 2
    assert "expected NAME=COMMAND" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "s").exists()


def test_kill_9_of_andon_mid_call_leaves_no_server_and_the_log_is_repaired(
    tmp_path: Path, killer: list[Any]
) -> None:
    proc, session_id = _slow_call(tmp_path, killer, [_fake("deaf", "deaf-hard")])
    entry = procs.tag_entry(call_tag(session_id, "mcp-deaf-1"))
    assert procs.tagged(entry), "the server and its host carry the host call's tag"
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    # The workers see their supervisor go and kill their call's group: the server with it.
    assert leftovers(entry, timeout=3.0) == []
    repaired = run("repair", "s", cwd=tmp_path)
    assert repaired.returncode == 0, repaired.stderr
    assert_balanced(tmp_path / "s")


def test_a_server_killed_mid_call_gives_an_honest_error_and_is_started_again(
    tmp_path: Path,
) -> None:
    model = script(
        tmp_path / "s.json", _calls(("fake__die", {}), ("fake__echo", {"text": "again"}))
    )
    done = run(
        *("run", "--model", model, "--session", "s", "--mcp", _fake("fake", "ok"), "go"),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    died, again = _results(tmp_path / "s")
    assert died["is_error"] and "exit status 5" in died["content"], died
    assert "again" in again["content"] and not again["is_error"], again
    assert_balanced(tmp_path / "s")


def test_sigint_with_three_servers_exits_130_within_the_grace_bound_leaving_none(
    tmp_path: Path, killer: list[Any]
) -> None:
    servers = [f"time={console_script('mcp-server-time')}", _fake("ok", "ok")]
    proc, session_id = _slow_call(
        tmp_path, killer, [*servers, _fake("deaf", "deaf-hard")], "--grace", "1,1"
    )
    entries = [
        procs.tag_entry(call_tag(session_id, f"mcp-{name}-1")) for name in ("time", "ok", "deaf")
    ]
    assert all(procs.tagged(entry) for entry in entries)
    sent = time.monotonic()
    os.kill(proc.pid, signal.SIGINT)
    code, _, err = finish(proc)
    took = time.monotonic() - sent
    assert code == 130, err
    assert took < 2 + 10, took  # the grace bound (1 + 1), plus slack for a loaded machine
    assert "Traceback" not in err
    (result,) = _results(tmp_path / "s")
    assert result["ended_by"] == "kill", result  # deaf to the cancel, SIGINT and SIGTERM
    assert all(leftovers(entry, timeout=0.5) == [] for entry in entries)
    assert_balanced(tmp_path / "s")


def test_a_server_of_a_thousand_tools_is_one_line_and_a_usable_session(tmp_path: Path) -> None:
    model = script(tmp_path / "s.json", _calls(("many__echo", {"text": "fine"})))
    done = run(
        *("run", "--model", model, "--session", "s", "--mcp", _fake("many", "many"), "go"),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "offers 1006 tools; only 100 are offered" in done.stderr, done.stderr
    assert "fine" in _results(tmp_path / "s")[0]["content"]
    (server,) = [r["data"] for r in records(tmp_path / "s") if r["type"] == "mcp/server"]
    assert len(server["tools"]) == 100


@pytest.mark.timeout(300)  # the first use may install the npm servers (bounded at 180 s each)
def test_tools_of_the_four_reference_servers_in_one_session(tmp_path: Path) -> None:
    everything = everything_command()
    if isinstance(everything, str):
        pytest.skip(f"no @modelcontextprotocol/server-everything: {everything}")
    project = tmp_path / "project"
    project.mkdir()
    (project / "notes.txt").write_text("built on Monday\n")
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    files = filesystem_command(str(project))
    if isinstance(files, str):
        pytest.skip(f"no @modelcontextprotocol/server-filesystem: {files}")
    model = script(
        tmp_path / "s.json",
        _calls(
            ("time__get_current_time", {"timezone": "UTC"}),
            ("everything__echo", {"message": "from everything"}),
            ("files__read_text_file", {"path": str(project / "notes.txt")}),
            ("git__git_status", {"repo_path": str(project)}),
        ),
    )
    done = run(
        *("run", "--model", model, "--session", "s"),
        *("--mcp", f"time={console_script('mcp-server-time')}"),
        *("--mcp", f"everything={shlex.join(everything)}"),
        *("--mcp", f"files={shlex.join(files)}"),
        *("--mcp", f"git={console_script('mcp-server-git')}"),
        "go",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    now, echo, notes, status = _results(tmp_path / "s")
    assert '"timezone": "UTC"' in now["content"], now
    assert echo["content"] == "Echo: from everything", echo
    assert notes["content"].strip() == "built on Monday", notes
    assert "notes.txt" in status["content"] and not status["is_error"], status
    logged = records(tmp_path / "s")
    servers = [r["data"]["name"] for r in logged if r["type"] == "mcp/server"]
    assert servers == ["time", "everything", "files", "git"]
    assert_balanced(tmp_path / "s")
    # Nothing of any server is left, found by the session's own tag of each host call.
    session_id = logged[0]["data"]["session_id"]
    for name in servers:
        assert procs.tagged(procs.tag_entry(call_tag(session_id, f"mcp-{name}-1"))) == []
