"""``trace_of``: a log as spans (docs/traces.md, What is sent), on hand-written records."""

from __future__ import annotations

from typing import Any

import pytest

from andon.session import Record, Span, trace_of

SID = "s-3f9a1c2b7d40"
START = {
    "format": 2,
    "session_id": SID,
    "andon_version": "0.1.0",
    "created": 100.0,
    "cwd": "/w",
    "model": {"spec": "deepseek-v4-flash", "provider": "deepseek", "name": "deepseek-v4-flash"},
    "system_prompt": "You are …",
    "pid": 4242,
    "host": "h",
}
STEP = {"turn": 1, "step": 1}
CALL = {**STEP, "call_id": "c1-1-1"}
REPLY = {
    "role": "assistant",
    "content": [
        {"type": "tool_call", "call_id": "c1-1-1", "name": "bash", "arguments": "{}"},
        {"type": "tool_call", "call_id": "c1-1-2", "name": "bash", "arguments": "{}"},
    ],
}
LOG: list[tuple[float, str, dict[str, Any]]] = [
    (100.0, "session/start", START),
    (100.1, "turn/start", {"turn": 1}),
    (100.2, "step/start", STEP),
    (100.3, "llm/request", {**STEP, "attempt": 1, "model": "deepseek-v4-flash"}),
    (100.4, "llm/retry", {**STEP, "attempt": 1, "error": {"code": "RATE_LIMITED"}, "delay": 0.5}),
    (100.9, "llm/request", {**STEP, "attempt": 2, "model": "deepseek-v4-flash"}),
    (
        101.0,
        "assistant/message",
        {
            **STEP,
            "message": REPLY,
            "finish": "tool_calls",
            "usage": {"prompt_tokens": 812, "completion_tokens": 40},
        },
    ),
    (101.1, "tool/call", {**CALL, "name": "bash", "arguments": "{}"}),
    (
        101.2,
        "tool/started",
        {**CALL, "worker": "w1", "host": "h", "pid": 7, "pgid": 7, "create_time": 101.15},
    ),
    (103.2, "tool/signal", {**CALL, "stage": "interrupt", "at": 2.0, "targets": 3}),
    (104.2, "tool/signal", {**CALL, "stage": "term", "at": 3.0, "targets": 1}),
]
CLOSERS: list[tuple[float, str, dict[str, Any]]] = [
    (
        104.3,
        "tool/result",
        {
            **CALL,
            "content": "[stopped]",
            "is_error": True,
            "duration": 3.1,
            "error": {"name": "Aborted", "code": "ABORTED", "message": "tool call aborted"},
            "exit": {"code": None, "signal": 15},
            "ended_by": "term",
        },
    ),
    (
        104.4,
        "tool/result",
        {
            **STEP,
            "call_id": "c1-1-2",
            "content": "Error: tool call aborted before dispatch",
            "is_error": True,
            "duration": 0.0,
            "error": {
                "name": "Aborted",
                "code": "ABORTED_BEFORE_DISPATCH",
                "message": "tool call aborted before dispatch",
            },
            "ended_by": "not-run",
        },
    ),
    (104.5, "step/end", STEP),
    (104.5, "turn/end", {"turn": 1, "reason": {"kind": "aborted", "reason": {"kind": "user"}}}),
]


def _records(lines: list[tuple[float, str, dict[str, Any]]]) -> list[Record]:
    return [
        Record.from_dict({"seq": n, "time": t, "type": kind, "data": data})
        for n, (t, kind, data) in enumerate(lines)
    ]


def _by_name(spans: tuple[Span, ...]) -> dict[str, list[Span]]:
    out: dict[str, list[Span]] = {}
    for span in spans:
        out.setdefault(span.name, []).append(span)
    return out


def test_a_stopped_turn_is_a_tree_of_spans_with_its_stop_stages() -> None:
    trace = trace_of(_records(LOG + CLOSERS))
    assert trace.session_id == SID
    assert trace_of(_records(LOG + CLOSERS)) == trace  # the same log is the same trace
    spans = _by_name(trace.spans)
    (root,) = spans["andon session"]
    (turn,) = spans["turn 1"]
    (step,) = spans["step 1.1"]
    first, second = spans["chat deepseek-v4-flash"]
    (call,) = spans["execute_tool bash"]
    (unrun,) = spans["execute_tool"]
    assert root.parent_id is None and turn.parent_id == root.span_id
    assert step.parent_id == turn.span_id
    assert {first.parent_id, second.parent_id, call.parent_id, unrun.parent_id} == {step.span_id}
    assert len({s.span_id for s in trace.spans}) == len(trace.spans)

    assert (first.start, first.end, first.error) == (100.3, 100.4, "RATE_LIMITED")
    assert second.attributes["gen_ai.usage.input_tokens"] == 812
    assert second.attributes["gen_ai.usage.output_tokens"] == 40
    assert second.attributes["gen_ai.provider.name"] == "deepseek"
    assert (second.end, second.error) == (101.0, None)

    assert (call.start, call.end) == (101.1, 104.3)
    assert [(e.name, e.time) for e in call.events] == [
        ("started", 101.2),
        ("interrupt", 103.2),
        ("term", 104.2),
    ]
    assert call.events[1].attributes == {"andon.signal.at": 2.0, "andon.signal.targets": 3}
    assert call.error == "ABORTED: tool call aborted (ended by term)"
    assert call.attributes["andon.ended_by"] == "term"
    assert call.attributes["andon.tool.exit.signal"] == 15
    assert unrun.attributes["andon.ended_by"] == "not-run"
    assert unrun.start == unrun.end == 104.4

    assert turn.error == root.error == "aborted (user)"
    assert turn.attributes["andon.turn.ended"] == "aborted"
    assert root.end == 104.5


def test_a_log_left_open_ends_every_span_at_its_last_record() -> None:
    trace = trace_of(_records(LOG))
    open_ones = [s for s in trace.spans if s.attributes.get("andon.unfinished")]
    assert {s.name for s in open_ones} == {"turn 1", "step 1.1", "execute_tool bash"}
    assert all(s.end == 104.2 for s in [*open_ones, trace.spans[0]])


def test_a_log_without_its_session_start_is_refused() -> None:
    with pytest.raises(ValueError, match="session/start"):
        trace_of(_records(LOG[1:]))
