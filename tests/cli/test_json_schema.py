"""Every line ``andon run --json`` prints matches the published JSON Schema (docs/schema/).

Real runs of the real executable (a scripted model, real workers, a real SIGINT): a completed run
with a tool call and its resume, a run cancelled mid-tool, and a failed one (a model error after
a retried one). Every stdout line is validated, not a sample; the golden logs of
``tests/data/sessions`` are validated too, and a wrong line must be refused, so that a schema
that accepts anything fails here.
"""

from __future__ import annotations

import json
import os
import signal
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from andon.base import CONTAINMENTS, ENDED_BY, MESSAGE_SOURCES, REPLY_FINISHES, SIGNAL_STAGES
from andon.session import RECORD_TYPES, Record
from tests.cli.support import (
    env,
    finish,
    is_tool_output,
    long_script,
    read_until,
    records,
    run,
    script,
    start,
)

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "docs" / "schema" / "andon-json-line.schema.json"
FIXTURES = ROOT / "tests" / "data" / "sessions"
LIVE_TYPES = {"agent/status", "assistant/delta", "tool/output", "agent/error", "subagent/event"}


@cache
def validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def problems(line: object) -> list[str]:
    return [
        f"{'/'.join(map(str, e.absolute_path)) or '(line)'}: {e.message}"
        for e in validator().iter_errors(line)
    ]


def assert_every_line_valid(stdout: str) -> list[dict[str, Any]]:
    """Parse and validate every stdout line; the last one is the summary."""
    lines = stdout.splitlines()
    assert lines, "no output"
    events = []
    for n, text in enumerate(lines, 1):
        event = json.loads(text)
        found = problems(event)
        assert not found, f"line {n} ({event.get('type')}): {found}\n{text}"
        events.append(event)
    assert events[-1]["type"] == "run/summary"
    assert all(e["type"] != "run/summary" for e in events[:-1])
    return events


def home(tmp_path: Path) -> dict[str, str]:
    return env(ANDON_HOME=str(tmp_path / "home"))


def types(events: list[dict[str, Any]]) -> set[str]:
    return {e["type"] for e in events}


# --- real runs ------------------------------------------------------------------------------------


def test_a_completed_run_with_a_tool_call_and_its_resume_match_the_schema(
    tmp_path: Path,
) -> None:
    model = script(
        tmp_path / "s.json",
        [
            {
                "reasoning": "Look first.",
                "text": "Checking.",
                "tool_calls": [{"name": "bash", "arguments": {"command": "echo built-ok"}}],
                "usage": {"prompt_tokens": 120, "completion_tokens": 12},
            },
            {
                "text": "All green.",
                "chunk_size": 3,
                "usage": {"prompt_tokens": 140, "completion_tokens": 3},
            },
        ],
    )
    result = run(
        "run", "--json", "--model", model, "build it", cwd=tmp_path, environ=home(tmp_path)
    )
    assert result.returncode == 0, result.stderr
    events = assert_every_line_valid(result.stdout)
    seen = types(events)
    assert {"session/start", "tool/call", "tool/started", "tool/result", "turn/end"} <= seen
    assert {"agent/status", "tool/output", "assistant/chunk"} <= seen
    summary = events[-1]
    session = Path(summary["session"])
    assert summary["session_id"] == session.name == records(session)[0]["data"]["session_id"]
    assert summary["final_text"] == "All green."
    assert summary["usage"] == {
        "prompt_tokens": 260,
        "completion_tokens": 15,
        "cached_prompt_tokens": 0,
    }
    assert "cost" not in summary  # a scripted model has no price

    # A resume: session/resumed, only this run's records, the id read from the log.
    again = script(tmp_path / "again.json", [{"text": "Still green."}])
    result = run(
        "resume", str(session), "and again", "--json", "--model", again,
        cwd=tmp_path, environ=home(tmp_path),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    events = assert_every_line_valid(result.stdout)
    assert "session/resumed" in types(events) and "session/start" not in types(events)
    assert events[-1]["session_id"] == summary["session_id"]
    assert events[-1]["final_text"] == "Still green." and events[-1]["turns"] == 1


def test_a_run_cancelled_mid_tool_matches_the_schema(tmp_path: Path, killer: list[Any]) -> None:
    session = tmp_path / "s"
    proc = start(
        "run", "--json", "--grace", "1,1", "--model", long_script(tmp_path),
        "--session", str(session), "go",
        cwd=tmp_path, environ=home(tmp_path),
    )  # fmt: skip
    killer.append(proc)
    seen = read_until(proc, is_tool_output)
    os.kill(proc.pid, signal.SIGINT)
    code, rest, err = finish(proc)
    assert code == 130, err
    stdout = "".join(json.dumps(e) + "\n" for e in [*seen, *rest])
    events = assert_every_line_valid(stdout)
    assert {"tool/signal", "tool/result", "turn/end"} <= types(events)
    result = next(e for e in events if e["type"] == "tool/result")
    assert result["data"]["error"]["code"] == "ABORTED"
    summary = events[-1]
    assert summary["exit_code"] == 130
    assert summary["ended"] == {"kind": "aborted", "reason": {"kind": "user"}}
    assert summary["final_text"] == "Building."  # the reply that asked for the tool
    assert summary["session_id"] == records(session)[0]["data"]["session_id"]


def test_a_failed_run_matches_the_schema(tmp_path: Path) -> None:
    model = script(
        tmp_path / "s.json",
        [
            {"error": {"status": 500, "message": "upstream hiccup", "retry_after": 0.01}},
            {"error": {"status": 400, "message": "the request is malformed"}},
        ],
    )
    result = run("run", "--json", "--model", model, "go", cwd=tmp_path, environ=home(tmp_path))
    assert result.returncode == 1, result.stderr
    events = assert_every_line_valid(result.stdout)
    assert {"llm/retry", "agent/error", "turn/end"} <= types(events)
    summary = events[-1]
    assert summary["exit_code"] == 1 and summary["final_text"] is None
    assert summary["ended"]["kind"] == "error"
    assert summary["ended"]["error"]["code"] == "BAD_REQUEST"


# --- the schema itself ----------------------------------------------------------------------------


def test_the_golden_logs_match_the_schema() -> None:
    """Every record the reader accepts in the fixtures (a torn or corrupt line is no record)."""
    checked: set[str] = set()
    for log in sorted(FIXTURES.glob("*/events.jsonl")):
        for n, text in enumerate(log.read_text(encoding="utf-8", errors="replace").splitlines()):
            try:
                record = json.loads(text)
                Record.from_dict(record)
            except ValueError:
                continue
            assert not problems(record), f"{log.parent.name} line {n + 1}: {problems(record)}"
            checked.add(record["type"])
    assert checked == RECORD_TYPES  # the fixtures hold every record type


def test_the_schema_names_every_record_type_and_closed_set_of_the_code() -> None:
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    dispatch = schema["$defs"]["event"]["allOf"]
    named = {branch["if"]["properties"]["type"]["const"] for branch in dispatch[:-1]}
    assert named == RECORD_TYPES | LIVE_TYPES
    assert set(dispatch[-1]["if"]["properties"]["type"]["enum"]) == named
    defs = schema["$defs"]

    def enum(def_name: str, *path: str) -> set[str]:
        node = defs[def_name]
        for key in path:
            node = node[key]
        return set(node["enum"])

    assert enum("assistant-message-data", "properties", "finish") == REPLY_FINISHES
    assert enum("tool-signal-data", "properties", "stage") == SIGNAL_STAGES
    assert enum("tool-result-data", "properties", "ended_by") == ENDED_BY
    assert enum("tool-started-data", "properties", "containment") == CONTAINMENTS
    assert enum("user-message-value", "properties", "source") == MESSAGE_SOURCES


def test_liveness_lines_match_the_schema(tmp_path: Path) -> None:
    """A silent tool (a tiny interval: docs/ci.md, Liveness in CI logs); a slow start is said on
    stderr only, so the first line is still the session's first record."""
    model = script(
        tmp_path / "s.json",
        [
            {"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 0.5"}}]},
            {"text": "Done."},
        ],
    )
    environ = {**home(tmp_path), "ANDON_PROGRESS_INTERVAL": "0.05"}
    result = run("run", "--json", "--model", model, "wait", cwd=tmp_path, environ=environ)
    assert result.returncode == 0, result.stderr
    events = assert_every_line_valid(result.stdout)
    assert events[0]["type"] == "session/start"
    # Only the silent tool's lines are on stdout: a start-up line (said if the start outlasts
    # the interval, which a forkserver started ahead often does not) goes to stderr alone.
    assert {e["phase"] for e in events if e["type"] == "run/progress"} == {"tool"}


SUMMARY: dict[str, Any] = {
    "type": "run/summary",
    "session": "/s",
    "session_id": "s-0",
    "exit_code": 0,
    "turns": 1,
    "tool_calls": 0,
    "duration": 0.1,
    "final_text": None,
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "cached_prompt_tokens": 0},
    "ended": {"kind": "completed"},
}
PROGRESS: dict[str, Any] = {
    "type": "run/progress",
    "phase": "tool",
    "call_id": "c1-2-1",
    "elapsed": 150.0,
    "silent": 45.0,
}
REPLY = {"role": "assistant", "content": []}
WRONG_LINES: dict[str, dict[str, Any]] = {
    "unknown type": {"seq": 3, "time": 1.0, "type": "tool/resutl", "data": {}},
    "record without seq": {"time": 1.0, "type": "turn/start", "data": {"turn": 1}},
    "turn 0": {"seq": 3, "time": 1.0, "type": "turn/start", "data": {"turn": 0}},
    "unknown finish": {
        "seq": 3,
        "time": 1.0,
        "type": "assistant/message",
        "data": {"turn": 1, "step": 1, "finish": "done", "message": REPLY},
    },
    "live event with a seq": {"seq": 4, "type": "tool/output", "call_id": "c1-1-1", "text": "x"},
    "summary without final_text": {k: v for k, v in SUMMARY.items() if k != "final_text"},
    "summary usage without cached_prompt_tokens": {
        **SUMMARY,
        "usage": {"prompt_tokens": 1, "completion_tokens": 1},
    },
    "cost without priced_by": {**SUMMARY, "cost": {"usd": 0.1}},
    "progress of a tool without its call": {k: v for k, v in PROGRESS.items() if k != "call_id"},
    "progress of an unknown phase": {**PROGRESS, "phase": "starting"},
    "progress with a key it does not list": {**PROGRESS, "seq": 4},
}


def test_the_schema_accepts_the_summary_the_wrong_lines_are_made_from() -> None:
    assert not problems(SUMMARY)
    assert not problems(PROGRESS)
    assert not problems({**PROGRESS, "waiting": "worker", "silent": 0.0})
    assert not problems({**SUMMARY, "cost": {"usd": 0.1, "priced_by": "andon.toml"}})


@pytest.mark.parametrize("case", sorted(WRONG_LINES))
def test_the_schema_refuses_a_wrong_line(case: str) -> None:
    assert problems(WRONG_LINES[case]), f"the schema accepted: {WRONG_LINES[case]}"


def test_the_schema_keeps_what_the_log_format_keeps() -> None:
    """A newer andon's extra keys in a record, and its ignorable record types, are accepted."""
    extra = {"seq": 2, "time": 1.0, "type": "turn/start", "data": {"turn": 1, "new": 1}, "x": 0}
    ignorable = {"seq": 5, "time": 1.0, "type": "future/thing", "data": {}, "ignorable": True}
    assert not problems(extra) and not problems(ignorable)
