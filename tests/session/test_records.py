"""Records: every record type of docs/log-format.md converts to and from exactly its JSON."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from andon.base import Hook, LogFormatUnsupported, User
from andon.session import (
    RECORD_TYPES,
    AssistantMessage,
    AssistantReply,
    Blocked,
    Completed,
    InboxSpliced,
    Interrupted,
    MaxTokens,
    Record,
    SessionRepaired,
    TextBlock,
    ToolCallBlock,
    ToolResult,
    TurnAborted,
    TurnEnd,
    TurnFailed,
    Unrecognized,
    UserMessage,
    encode_line,
    reason_from_json,
)
from tests.session.helpers import FIXTURES

# One example line per record type (one per record type, plus variants).
EXAMPLES = (Path(__file__).with_name("log_format_examples.jsonl")).read_text().splitlines()


@pytest.mark.parametrize("line", EXAMPLES)
def test_log_format_examples_round_trip_exactly(line: str) -> None:
    obj = json.loads(line)
    record = Record.from_dict(obj)
    assert record.type == obj["type"]
    assert record.to_dict() == obj
    # and the bytes we would write parse back to the same object
    assert json.loads(encode_line(record)) == obj


def test_the_examples_cover_every_record_type() -> None:
    assert {json.loads(line)["type"] for line in EXAMPLES} == RECORD_TYPES


def _fixture_lines() -> list[bytes]:
    lines: list[bytes] = []
    for path in sorted(FIXTURES.glob("*/events.jsonl")):
        if path.parent.name in ("corrupt-middle", "torn-tail"):
            continue
        lines.extend(path.read_bytes().splitlines(keepends=True))
    return lines


def test_fixture_lines_re_encode_byte_for_byte() -> None:
    lines = _fixture_lines()
    assert len(lines) > 200
    for line in lines:
        assert encode_line(Record.from_dict(json.loads(line))) == line


def test_writing_is_compact_utf8_without_ascii_escapes() -> None:
    message = UserMessage("m-0a1b2c3d4e5f", "Grüße, 世界 — naïve")
    line = encode_line(Record(3, 1.5, InboxSpliced("next-turn", 0, (message,))))
    assert "Grüße, 世界 — naïve".encode() in line
    assert line.startswith(b'{"seq":3,"time":1.5,"type":"agent/inbox/spliced","data":{"target":')
    assert line.endswith(b"\n") and line.count(b"\n") == 1


def test_nan_and_invalid_text_are_refused_before_writing() -> None:
    result = ToolResult(1, 1, "c1-1-1", "ok", False, math.nan)
    with pytest.raises(ValueError, match="record 7"):
        encode_line(Record(7, 1.0, result))
    bad = ToolResult(1, 1, "c1-1-1", "\udcff", False, 0.1)
    with pytest.raises(ValueError, match="not valid Unicode"):
        encode_line(Record(8, 1.0, bad))


def test_absent_optionals_are_omitted_and_markers_written_only_when_set() -> None:
    result = ToolResult(1, 1, "c1-1-1", "out", False, 0.25)
    d = Record(5, 2.0, result).to_dict()
    assert d == {
        "seq": 5,
        "time": 2.0,
        "type": "tool/result",
        "data": {
            "turn": 1,
            "step": 1,
            "call_id": "c1-1-1",
            "content": "out",
            "is_error": False,
            "duration": 0.25,
        },
    }
    marked = Record(6, 2.0, TurnEnd(1, Interrupted()), "repair", True).to_dict()
    assert marked["synthetic"] == "repair" and marked["ignorable"] is True
    message = AssistantMessage(1, 1, AssistantReply((TextBlock("hi"),)), "stop")
    assert set(Record(7, 2.0, message).to_dict()["data"]) == {"turn", "step", "message", "finish"}
    interrupted = AssistantMessage(
        1, 1, AssistantReply((TextBlock("hi"),)), "aborted", interrupted=True
    )
    assert Record(7, 2.0, interrupted).to_dict()["data"]["interrupted"] is True
    # torn_file is one of the fields the format shows as null
    repaired = Record(8, 2.0, SessionRepaired(0, None, 2, 0)).to_dict()["data"]
    assert repaired == {"torn_bytes": 0, "torn_file": None, "closers": 2, "killed_leftovers": 0}


@pytest.mark.parametrize(
    ("reason", "wire"),
    [
        (Completed(), {"kind": "completed"}),
        (MaxTokens(), {"kind": "max-tokens"}),
        (Blocked("pre_step:policy"), {"kind": "blocked", "by": "pre_step:policy"}),
        (TurnAborted(User()), {"kind": "aborted", "reason": {"kind": "user"}}),
        (
            TurnAborted(Hook("turn budget exceeded")),
            {"kind": "aborted", "reason": {"kind": "hook", "reason": "turn budget exceeded"}},
        ),
        (
            TurnFailed("disk full", "LOG_WRITE_FAILED"),
            {"kind": "error", "error": {"message": "disk full", "code": "LOG_WRITE_FAILED"}},
        ),
        (Interrupted(), {"kind": "interrupted"}),
    ],
)
def test_turn_end_reasons_are_typed_values(reason: object, wire: dict[str, object]) -> None:
    assert reason.to_json() == wire  # type: ignore[attr-defined]
    assert reason_from_json(wire) == reason


def test_unknown_type_is_refused_unless_ignorable() -> None:
    raw = {"seq": 4, "time": 1.0, "type": "ui/annotation", "data": {"note": "x"}}
    with pytest.raises(LogFormatUnsupported) as info:
        Record.from_dict(raw)
    assert (info.value.seq, info.value.record_type) == (4, "ui/annotation")
    kept = Record.from_dict({**raw, "ignorable": True})
    assert kept.data == Unrecognized("ui/annotation", {"note": "x"})
    assert kept.type == "ui/annotation" and kept.ignorable
    assert kept.to_dict() == {**raw, "ignorable": True}


def test_unknown_format_is_refused() -> None:
    start = json.loads(EXAMPLES[0])
    start["data"]["format"] = 3
    with pytest.raises(LogFormatUnsupported, match="format 3"):
        Record.from_dict(start)


def test_unknown_synthetic_marker_is_refused() -> None:
    raw = {"seq": 4, "time": 1.0, "type": "turn/start", "data": {"turn": 1}, "synthetic": "x"}
    with pytest.raises(LogFormatUnsupported, match="synthetic"):
        Record.from_dict(raw)


def test_fields_a_newer_writer_added_are_kept() -> None:
    raw = next(json.loads(line) for line in EXAMPLES if '"tool/result"' in line)
    raw["data"]["future"] = {"a": 1}
    raw["data"]["error"]["hint"] = "x"
    raw["extra_envelope"] = True
    assert Record.from_dict(raw).to_dict() == raw


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["data"].pop("turn"), "has no 'turn'"),
        (lambda d: d["data"].__setitem__("turn", "1"), "turn must be an integer"),
        (lambda d: d["data"].__setitem__("turn", True), "turn must be an integer"),
        (lambda d: d.__setitem__("seq", 1.5), "seq must be an integer"),
        (lambda d: d.__setitem__("data", []), "data must be an object"),
    ],
)
def test_malformed_fields_are_named(mutate: object, message: str) -> None:
    raw = {"seq": 2, "time": 1.0, "type": "turn/start", "data": {"turn": 1}}
    mutate(raw)  # type: ignore[operator]
    with pytest.raises(ValueError, match=message):
        Record.from_dict(raw)


def test_closed_sets_are_checked() -> None:
    raw = next(json.loads(line) for line in EXAMPLES if '"tool/signal"' in line)
    raw["data"]["stage"] = "nuke"
    with pytest.raises(ValueError, match="stage is 'nuke'"):
        Record.from_dict(raw)


def test_assistant_reply_views() -> None:
    reply = AssistantReply(
        (
            TextBlock("a"),
            ToolCallBlock("c1-1-1", "bash", "{}"),
            TextBlock("b"),
        )
    )
    assert reply.text == "ab" and reply.reasoning is None
    assert [c.call_id for c in reply.tool_calls] == ["c1-1-1"]
