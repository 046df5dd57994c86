"""``--tools MODULE:NAME``: a user's Python tools, from a scratch module in the current directory,
offered beside the built-in ones by ``andon run`` and stopped like them (the real CLI, real
workers, real call processes)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.cli.support import (
    assert_balanced,
    env,
    finish,
    read_until,
    records,
    run,
    script,
    start,
)

TOOLS = '''
import signal
import time

import andon


@andon.tool
def add(a: int, b: int) -> str:
    """Add two whole numbers."""
    return str(a + b)


@andon.tool
def stubborn(seconds: float) -> str:
    """Sleep, deaf to the interrupt: only the grace ladder's SIGTERM ends it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    time.sleep(seconds)  # sleep-ok: the tool under test is a long call, not a race order
    return "slept"


TOOLS = [add, stubborn]
'''


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project folder holding a scratch module of tools, ``mytools.py``."""
    (tmp_path / "mytools.py").write_text(TOOLS)
    return tmp_path


def _calls(*calls: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
    replies: list[dict[str, Any]] = [
        {"tool_calls": [{"name": name, "arguments": arguments}]} for name, arguments in calls
    ]
    return [*replies, {"text": "done"}]


def _results(session: Path) -> list[dict[str, Any]]:
    return [r["data"] for r in records(session) if r["type"] == "tool/result"]


def test_a_tool_of_a_scratch_module_runs_beside_the_built_in_ones(project: Path) -> None:
    model = script(
        project / "s.json", _calls(("add", {"a": 2, "b": 3}), ("bash", {"command": "echo hi"}))
    )
    done = run(
        "run", "--model", model, "--session", "s", "--tools", "mytools:TOOLS", "go", cwd=project
    )
    assert done.returncode == 0, done.stderr
    assert [(r["content"], r["is_error"]) for r in _results(project / "s")] == [
        ("5", False),
        ("hi\n[exit code 0]", False),
    ]
    assert_balanced(project / "s")


def test_tools_come_from_andon_toml_and_the_environment_too(project: Path) -> None:
    model = script(project / "s.json", _calls(("add", {"a": 20, "b": 22})))
    (project / "andon.toml").write_text('tools = ["mytools:TOOLS"]\n')
    done = run("run", "--model", model, "--session", "a", "go", cwd=project)
    assert done.returncode == 0, done.stderr
    assert _results(project / "a")[0]["content"] == "42"
    (project / "andon.toml").unlink()
    model = script(project / "s.json", _calls(("add", {"a": 1, "b": 1})))
    done = run(
        "run",
        "--model",
        model,
        "--session",
        "b",
        "go",
        cwd=project,
        environ=env(ANDON_TOOLS="mytools:TOOLS"),
    )
    assert done.returncode == 0, done.stderr
    assert _results(project / "b")[0]["content"] == "2"


def test_a_python_tool_deaf_to_sigint_is_stopped_by_the_grace_ladder(
    project: Path, killer: list[Any]
) -> None:
    model = script(project / "s.json", _calls(("stubborn", {"seconds": 600})))
    proc = start(
        "run",
        "--json",
        "--grace",
        "0.5,2",
        "--model",
        model,
        "--session",
        "s",
        "--tools",
        "mytools:TOOLS",
        "go",
        cwd=project,
    )
    killer.append(proc)
    read_until(proc, lambda e: e.get("type") == "tool/started")
    os.kill(proc.pid, signal.SIGINT)
    code, _, err = finish(proc)
    assert code == 130, err
    assert "Traceback" not in err
    (result,) = _results(project / "s")
    assert result["ended_by"] == "term", result  # SIGINT ignored; SIGTERM after 0.5 s ended it
    end = [r for r in records(project / "s") if r["type"] == "turn/end"][-1]
    assert end["data"]["reason"]["kind"] == "aborted"
    assert_balanced(project / "s")  # and the conftest fails the test if a process was left


BROKEN = "raise RuntimeError('the module cannot start')\n"
CLASH = """
import andon


@andon.tool
def bash(command: str) -> str:
    return command


TOOLS = [bash]
"""


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("mytools:NOPE", "'mytools' has no 'NOPE'"),
        ("nomod:TOOLS", "cannot import 'nomod'"),
        ("mytools", "MODULE:NAME"),
        ("broken:TOOLS", "importing 'broken' failed: RuntimeError: the module cannot start"),
        ("clash:TOOLS", "a tool named 'bash' is already offered"),
        ("mytools:signal", "not a ToolRegistry or a list of tools"),
    ],
)
def test_a_wrong_tools_spec_is_one_line_and_no_session(project: Path, spec: str, said: str) -> None:
    (project / "broken.py").write_text(BROKEN)
    (project / "clash.py").write_text(CLASH)
    model = script(project / "s.json", _calls(("add", {"a": 1, "b": 2})))
    done = run("run", "--model", model, "--session", "s", "--tools", spec, "go", cwd=project)
    assert done.returncode == 2, done.stderr
    assert said in done.stderr and "Traceback" not in done.stderr
    assert not (project / "s").exists()
