"""What ``andon log`` prints of a real run (docs/log-format.md, What is derived from the log):
a command as the command, other arguments compactly, no line that was true only while the
session ran, and an honest count of what an elided output leaves out."""

from __future__ import annotations

from pathlib import Path

from andon.session import render_transcript
from tests.cli.support import records, run, script


def _session(tmp_path: Path) -> Path:
    model = script(
        tmp_path / "m.json",
        [
            {
                "text": "x",
                "tool_calls": [
                    {"name": "bash", "arguments": {"command": "seq 1 100000\necho done"}}
                ],
            },
            {
                "text": "y",
                "tool_calls": [{"name": "read_file", "arguments": {"path": "m.json", "limit": 3}}],
            },
            {"text": "ok"},
        ],
    )
    session = tmp_path / "s"
    result = run("run", "--model", model, "--session", str(session), "build it", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    return session


def test_a_finished_sessions_transcript(tmp_path: Path) -> None:
    session = _session(tmp_path)
    result = run("log", str(session), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "tool c1-1-1 bash $ seq 1 100000 …\n" in text, text
    assert "tool c1-2-1 read_file path=m.json limit=3\n" in text, text
    assert "{" not in text.split("tool c1-2-1", 1)[1].split("\n", 1)[0]
    # Past the session's life: nothing is queued or running any more.
    assert "queued (" not in text and "running: pid" not in text, text
    # The marker counts lines of the log's copy, and says how much the tool really printed.
    marker = next(line for line in text.splitlines() if "omitted" in line)
    assert "of the log's 16 KiB copy omitted (the tool printed 575 KiB)" in marker, marker


def test_a_live_sessions_transcript_shows_the_running_call(tmp_path: Path) -> None:
    session = _session(tmp_path)
    events = records(session)
    # The log as read while the first call ran: up to its tool/started record.
    started = next(n for n, r in enumerate(events) if r["type"] == "tool/started")
    text = render_transcript(events[: started + 1])
    assert "      running: pid " in text, text
    assert "is still open" in text
