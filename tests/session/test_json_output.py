"""The saved output of ``andon run --json`` read back: every log record plus live-only lines (no
``seq``: ``agent/status``, ``assistant/delta``, ``tool/output``, ``agent/error``,
``subagent/event``) and the final ``run/summary``. Readers of a file skip the live-only lines; a
line without ``seq`` of any other type is still corruption, and a session folder's own log never
holds one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from andon.base import LogCorrupted, SessionError
from andon.session import (
    check,
    fold_consumed_work,
    fold_state,
    history,
    iter_records,
    load,
    read,
    render_transcript,
)
from tests.cli.support import env, records, run, script
from tests.session.helpers import FIXTURES, copy_fixture, snapshot

LIVE = [
    {"type": "agent/status", "status": "running"},
    {
        "type": "assistant/delta",
        "turn": 1,
        "step": 1,
        "attempt": 1,
        "delta": {"type": "text", "text": "I'll"},
    },
    {"type": "tool/output", "call_id": "c1-1-1", "text": "gcc -c a.c\n"},
    {"type": "agent/error", "error": {"code": "SERVER", "message": "500 from the model API"}},
    {"type": "subagent/event", "call_id": "c1-2-1", "event": {"seq": 0, "type": "session/start"}},
]
SUMMARY = {"type": "run/summary", "session": "/tmp/s", "exit_code": 0, "turns": 3}


def _capture(tmp_path: Path, fixture: str = "complete") -> tuple[Path, list[bytes]]:
    """A fixture's log as ``andon run --json`` would print it: live lines between the records."""
    lines = (FIXTURES / fixture / "events.jsonl").read_bytes().splitlines(keepends=True)
    out: list[bytes] = []
    for i, line in enumerate(lines):
        out.append(line)
        out.append(json.dumps(LIVE[i % len(LIVE)]).encode() + b"\n")
    out.append(json.dumps(SUMMARY).encode() + b"\n")
    path = tmp_path / "run.jsonl"
    path.write_bytes(b"".join(out))
    return path, lines


def test_reading_a_file_skips_and_counts_the_live_only_lines(tmp_path: Path) -> None:
    path, lines = _capture(tmp_path)
    before = snapshot(tmp_path)
    records = read(path)
    expected = read(FIXTURES / "complete")
    assert [r.to_dict() for r in records] == [r.to_dict() for r in expected]
    assert records.skipped == len(lines) + 1 and records.torn is None
    stream = iter_records(path)
    assert [r.seq for r in stream] == [r.seq for r in expected]
    assert stream.skipped == len(lines) + 1 and stream.end_offset == path.stat().st_size
    # the folds and check over what was read, and over the lines parsed as plain dicts
    dicts = [json.loads(line) for line in path.read_bytes().splitlines()]
    for events in (records, dicts):
        assert history(events) == history(expected)
        assert check(events) == []
        assert fold_state(events) == fold_state(expected)
        assert fold_consumed_work(events) == fold_consumed_work(expected)
    assert render_transcript(records) == render_transcript(expected)
    assert snapshot(tmp_path) == before  # read only: nothing written beside the file


@pytest.mark.parametrize(
    "stray",
    [
        {"type": "turn/start", "time": 1.0, "data": {"turn": 9}},  # a record without its seq
        {"type": "agent/thinking", "status": "running"},  # not a live type of this version
        {"status": "running"},  # no type at all
    ],
    ids=["record-without-seq", "unknown-live-type", "no-type"],
)
def test_a_line_without_seq_of_another_type_is_corruption(
    tmp_path: Path, stray: dict[str, Any]
) -> None:
    path, _ = _capture(tmp_path)
    data = path.read_bytes().splitlines(keepends=True)
    data.insert(3, json.dumps(stray).encode() + b"\n")
    path.write_bytes(b"".join(data))
    with pytest.raises(LogCorrupted) as info:
        read(path)
    assert info.value.line == 4
    dicts = [json.loads(line) for line in data]
    with pytest.raises(ValueError, match="seq"):
        history(dicts)


def test_a_session_folder_never_holds_live_only_lines(tmp_path: Path) -> None:
    folder = copy_fixture("complete", tmp_path / "s")
    log = folder / "events.jsonl"
    data = log.read_bytes().splitlines(keepends=True)
    data.insert(2, json.dumps(LIVE[0]).encode() + b"\n")
    log.write_bytes(b"".join(data))
    with pytest.raises(LogCorrupted):
        read(folder)  # the folder's log: the writer never writes such a line
    with pytest.raises((LogCorrupted, SessionError)):
        load(folder)  # nor does crash repair set it aside
    assert len(read(log)) == len(data) - 1  # the same file, named as a file, is read leniently


# --- a real run -----------------------------------------------------------------------------------


def _json_run(tmp_path: Path) -> tuple[Path, Path, list[dict[str, Any]]]:
    model = script(
        tmp_path / "script.json",
        [
            {
                "reasoning": "Look first.",
                "text": "Listing the files. " * 40,
                "chunk_size": 3,
                "tool_calls": [{"name": "bash", "arguments": {"command": "echo built-ok"}}],
            },
            {"text": "All green."},
        ],
    )
    session = tmp_path / "s"
    environ = env(ANDON_HOME=str(tmp_path / "home"))
    result = run(
        "run", "--json", "--model", model, "--session", str(session), "build it",
        cwd=tmp_path, environ=environ,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    capture = tmp_path / "out" / "run.jsonl"
    capture.parent.mkdir()
    capture.write_text(result.stdout)
    return session, capture, [json.loads(line) for line in result.stdout.splitlines()]


def test_the_output_of_andon_run_json_reads_back_like_its_log(tmp_path: Path) -> None:
    session, capture, lines = _json_run(tmp_path)
    kinds = {line["type"] for line in lines if "seq" not in line}
    assert {"agent/status", "assistant/delta", "tool/output", "run/summary"} <= kinds
    deltas = [line for line in lines if line["type"] == "assistant/delta"]
    chunks = [line for line in lines if line["type"] == "assistant/chunk"]
    assert len(chunks) < len(deltas)  # the log coalesces what the live stream shows one by one
    assert "".join(d["delta"].get("text", "") for d in deltas if d["turn"] == 1) == "".join(
        d.get("text", "") for c in chunks if c["data"]["turn"] == 1 for d in c["data"]["deltas"]
    )
    assert [line for line in lines if "seq" in line] == records(session)
    before = snapshot(capture.parent)

    read_back = read(capture)
    assert [r.to_dict() for r in read_back] == records(session)
    assert read_back.skipped == len(lines) - len(records(session))
    assert history(read_back) == history(read(session))
    assert history(json.loads(line) for line in capture.read_text().splitlines()) == history(
        read(session)
    )
    raw = [json.loads(line) for line in capture.read_text().splitlines()]
    assert render_transcript(raw) == render_transcript(read(session))  # live lines skipped

    checked = run("check", str(capture), cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"ok: {len(records(session))} records" in checked.stdout
    assert f"{read_back.skipped} live-only line(s)" in checked.stdout

    shown = run("log", str(capture), cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == run("log", str(session), cwd=tmp_path).stdout
    as_json = run("log", "--json", str(capture), cwd=tmp_path)
    assert [json.loads(line) for line in as_json.stdout.splitlines()] == records(session)
    # read only: no lock file, no repair, nothing written beside the file
    assert snapshot(capture.parent) == before


def test_andon_check_of_a_file_names_a_stray_line_and_an_open_turn(tmp_path: Path) -> None:
    _, capture, lines = _json_run(tmp_path)
    stray = tmp_path / "stray.jsonl"
    text = capture.read_text().splitlines(keepends=True)
    text.insert(2, json.dumps({"type": "agent/thinking"}) + "\n")
    stray.write_text("".join(text))
    refused = run("check", str(stray), cwd=tmp_path)
    assert refused.returncode == 2 and "line 3" in refused.stderr, refused.stderr
    # a capture cut in the middle of a turn: checked as it is, its folder is not looked for
    cut = tmp_path / "cut.jsonl"
    first_tool = next(i for i, line in enumerate(lines) if line["type"] == "tool/call")
    cut.write_text("".join(json.dumps(line) + "\n" for line in lines[: first_tool + 1]))
    checked = run("check", str(cut), cwd=tmp_path)
    assert checked.returncode == 1
    assert "never ends" in checked.stdout and "a file is checked as it is" in checked.stdout
    assert not (tmp_path / "lock").exists()
    missing = run("check", str(tmp_path / "missing.jsonl"), cwd=tmp_path)
    assert missing.returncode == 2
    assert "no such file, session folder or session id" in missing.stderr
