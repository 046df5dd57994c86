"""Liveness lines (docs/ci.md, Liveness in CI logs): a silent tool and a slow start are said every
interval, a chatty tool is not, and nothing is said once a call or the start is over.

The timers run on a ManualClock: time is moved by the test, never slept through. The end-to-end
tests at the bottom run the real ``andon run`` with a tiny interval and a tool that stays silent
until the test releases it through a file.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from andon.base import ManualClock
from andon.cli._liveness import Liveness, RunProgress, span
from andon.session import (
    Record,
    SubagentEvent,
    ToolCall,
    ToolOutput,
    ToolResult,
    ToolStarted,
    TurnStart,
)
from tests.cli.support import ANDON, env, records, script


class Lines:
    def __init__(self) -> None:
        self.text: list[str] = []
        self.events: list[dict[str, Any]] = []

    def __call__(self, text: str, event: RunProgress) -> None:
        self.text.append(text)
        self.events.append(event.to_json())  # what --json prints, but for the rounding


_SEQ = iter(range(1_000_000))


def call(kind: str, call_id: str = "c1-1-1") -> Record:
    data: ToolCall | ToolStarted | ToolResult
    if kind == "tool/call":
        data = ToolCall(1, 1, call_id, "bash", "{}")
    elif kind == "tool/started":
        data = ToolStarted(1, 1, call_id, "w1", "host", 4242, 4242, 1.0)
    else:
        data = ToolResult(1, 1, call_id, "[exit code 0]", False, 1.0)
    return Record(next(_SEQ), 1.0, data)


def output(call_id: str = "c1-1-1") -> ToolOutput:
    return ToolOutput(call_id, "building…\n")


async def advance(clock: ManualClock, seconds: float) -> None:
    clock.advance(seconds)
    await clock.sleep(0)  # one loop turn: the timers that came due run (call_soon)


def test_span_reads_like_a_clock() -> None:
    assert [span(s) for s in (0, 5.9, 45, 150, 3599, 3900)] == [
        "0s",
        "5s",
        "45s",
        "2m30s",
        "59m59s",
        "1h05m",
    ]


async def test_a_silent_tool_is_said_every_interval_until_its_result() -> None:
    clock, lines = ManualClock(), Lines()
    live = Liveness(30, lines, clock=clock)
    live.feed(call("tool/call"))
    live.feed(call("tool/started"))
    live.feed(output())  # it said something at once, then nothing
    await advance(clock, 29.9)
    assert lines.text == []
    await advance(clock, 0.1)
    assert lines.text == ["c1-1-1 still running: 30s, last output 30s ago"]
    for _ in range(4):
        await advance(clock, 30)
    assert lines.text[-1] == "c1-1-1 still running: 2m30s, last output 2m30s ago"
    assert len(lines.text) == 5  # one an interval, not more
    assert lines.events[-1] == {
        "type": "run/progress",
        "phase": "tool",
        "call_id": "c1-1-1",
        "elapsed": 150.0,
        "silent": 150.0,
    }
    assert list(lines.events[-1]) == ["type", "phase", "call_id", "elapsed", "silent"]
    live.feed(call("tool/result"))
    await advance(clock, 300)
    assert len(lines.text) == 5  # the call is over: not another word
    assert clock.sleepers == 0  # and no timer left behind


async def test_a_chatty_tool_gets_no_line_and_silence_counts_from_its_last_output() -> None:
    clock, lines = ManualClock(), Lines()
    live = Liveness(30, lines, clock=clock)
    live.feed(call("tool/call"))
    live.feed(call("tool/started"))
    for _ in range(12):  # two minutes of a line every 10 s
        await advance(clock, 10)
        live.feed(output())
    assert lines.text == []
    await advance(clock, 29)
    assert lines.text == []
    await advance(clock, 1)
    assert lines.text == ["c1-1-1 still running: 2m30s, last output 30s ago"]


async def test_no_output_yet_and_a_call_that_waits_for_a_worker_are_said_as_such() -> None:
    clock, lines = ManualClock(), Lines()
    live = Liveness(30, lines, clock=clock)
    live.feed(call("tool/call", "c1-1-1"))
    live.feed(call("tool/started", "c1-1-1"))
    live.feed(call("tool/call", "c1-1-2"))  # no worker free for it yet
    live.feed(call("tool/call", "c1-1-3"))  # a subagent: no tool/started, its own events
    live.feed(SubagentEvent("c1-1-3", Record(0, 1.0, TurnStart(1))))
    await advance(clock, 30)
    assert sorted(lines.text) == [
        "c1-1-1 still running: 30s, no output yet",
        "c1-1-2 still waiting for a tool worker: 30s",
        "c1-1-3 still running: 30s, no output yet",
    ]
    # Each line's JSON keys in the order --json prints them.
    assert sorted(lines.events, key=lambda e: str(e["call_id"])) == [
        {"type": "run/progress", "phase": "tool", "call_id": "c1-1-1", "elapsed": 30.0},
        {
            "type": "run/progress",
            "phase": "tool",
            "call_id": "c1-1-2",
            "waiting": "worker",
            "elapsed": 30.0,
        },
        {"type": "run/progress", "phase": "tool", "call_id": "c1-1-3", "elapsed": 30.0},
    ]
    assert [list(e) for e in lines.events if e["call_id"] == "c1-1-2"] == [
        ["type", "phase", "call_id", "waiting", "elapsed"]
    ]
    live.close()


async def test_a_slow_start_is_said_after_5_s_then_every_interval_until_ready() -> None:
    clock, lines = ManualClock(), Lines()
    live = Liveness(30, lines, clock=clock, waiting_for="the tool workers to start")
    live.starting()
    await advance(clock, 4.9)
    assert lines.text == []
    await advance(clock, 0.1)
    assert lines.text == ["still starting: 5s (waiting for the tool workers to start)"]
    assert lines.events[0] == {
        "type": "run/progress",
        "phase": "starting",
        "elapsed": 5.0,
        "waiting_for": "the tool workers to start",
    }
    assert list(lines.events[0]) == ["type", "phase", "elapsed", "waiting_for"]
    await advance(clock, 30)
    assert lines.text[-1] == "still starting: 35s (waiting for the tool workers to start)"
    live.ready()
    await advance(clock, 600)
    assert len(lines.text) == 2
    assert clock.sleepers == 0


async def test_a_quick_start_says_nothing_and_a_short_interval_comes_first() -> None:
    clock, lines = ManualClock(), Lines()
    live = Liveness(30, lines, clock=clock)
    live.starting()
    await advance(clock, 4)
    live.ready()
    await advance(clock, 60)
    assert lines.text == []
    short = Liveness(2, lines, clock=clock)
    short.starting()
    await advance(clock, 2)
    assert lines.text == ["still starting: 2s"]
    short.close()


async def test_interval_0_says_nothing_and_close_cancels_every_timer() -> None:
    clock, lines = ManualClock(), Lines()
    off = Liveness(0, lines, clock=clock)
    off.starting()
    off.feed(call("tool/call"))
    await advance(clock, 3600)
    assert lines.text == [] and clock.sleepers == 0
    on = Liveness(30, lines, clock=clock)
    on.starting()
    on.feed(call("tool/call"))
    on.close()
    await advance(clock, 3600)
    assert lines.text == [] and clock.sleepers == 0


# -- end to end: the real andon run, a tiny interval, a tool silent until released -------------


def silent_until(tmp_path: Path) -> tuple[str, Path]:
    """A script whose one tool call says one line, then waits silently for a file the test
    creates."""
    release = tmp_path / "release"
    command = f"echo started; while [ ! -e {release} ]; do sleep 0.02; done; echo released"
    model = script(
        tmp_path / "s.json",
        [
            {"text": "Go.", "tool_calls": [{"name": "bash", "arguments": {"command": command}}]},
            {"text": "Done."},
        ],
    )
    return model, release


def start_run(tmp_path: Path, model: str, *extra: str, **environ: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [ANDON, "run", "--model", model, "--session", str(tmp_path / "session"), *extra, "go"],
        cwd=tmp_path,
        env=env(**environ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )


def wait_for_line(proc: subprocess.Popen[str], needle: str) -> str:
    """The first stderr line that holds ``needle`` (the test's timeout bounds the wait)."""
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if needle in line:
            return line
    raise AssertionError(f"andon ended without {needle!r}: {seen[-5:]}")


@pytest.mark.parametrize("mode", ["text", "json"])
def test_a_silent_tool_is_said_in_the_job_log_and_no_more_once_it_ends(
    tmp_path: Path, mode: str, killer: list[Any]
) -> None:
    model, release = silent_until(tmp_path)
    extra = ("--json",) if mode == "json" else ()
    proc = start_run(tmp_path, model, *extra, ANDON_PROGRESS_INTERVAL="0.1")
    killer.append(proc)
    # Its one line of output counts ("last output"), and the line comes again an interval later.
    first = wait_for_line(proc, "andon: c1-1-1 still running:")
    second = wait_for_line(proc, "andon: c1-1-1 still running:")
    assert ", last output " in first and second.rstrip().endswith(" ago")
    release.touch()
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    if mode == "json":
        lines = [json.loads(line) for line in out.splitlines()]
        progress = [e for e in lines if e["type"] == "run/progress"]
        assert any(e.get("call_id") == "c1-1-1" and "silent" in e for e in progress)
        result = next(i for i, e in enumerate(lines) if e["type"] == "tool/result")
        assert all(e["type"] != "run/progress" for e in lines[result:])  # not after its end
    # Live only: the log has no such record.
    assert all(r["type"] != "run/progress" for r in records(tmp_path / "session"))


def test_the_flag_wins_and_0_turns_the_lines_off(tmp_path: Path) -> None:
    # Silent for 1 s: twenty of the variable's intervals.
    model = script(
        tmp_path / "s.json",
        [
            {"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 1; echo done"}}]},
            {"text": "Done."},
        ],
    )
    result = subprocess.run(
        [ANDON, "run", "--model", model, "--progress-interval", "0", "go"],
        cwd=tmp_path,
        env=env(ANDON_HOME=str(tmp_path / "home"), ANDON_PROGRESS_INTERVAL="0.05"),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr
    assert "done" in result.stdout
    assert "still" not in result.stderr, result.stderr


def test_a_slow_start_is_said(tmp_path: Path, killer: list[Any]) -> None:
    model, release = silent_until(tmp_path)
    release.touch()  # the tool itself is quick: only the start is watched here
    # An interval shorter than any worker start (a fork that connects and says hello, even from
    # a forkserver started ahead): the start-up line must come, from ANDON_PROGRESS_INTERVAL.
    proc = start_run(tmp_path, model, ANDON_PROGRESS_INTERVAL="0.001")
    killer.append(proc)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert re.search(
        r"^andon: still starting: \d+s \(waiting for the tool workers to start\)$", err, re.M
    ), err


def test_a_bad_interval_is_one_line_and_exit_2(tmp_path: Path) -> None:
    model, _ = silent_until(tmp_path)
    (tmp_path / "andon.toml").write_text("progress_interval = -1\n")
    bad = subprocess.run(
        [ANDON, "run", "--model", model, "go"],
        cwd=tmp_path,
        env=env(ANDON_HOME=str(tmp_path / "home")),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "andon: progress-interval must be a finite number of seconds, 0 to turn it off "
        "(got '-1') (from andon.toml)"
    ]
