"""`andon log`, `andon check` and `andon repair` run as the real executable on golden fixtures."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[1] / "data" / "sessions"


def andon(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "andon", *args], capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def crashed(tmp_path: Path) -> Path:
    dest = tmp_path / "session"
    shutil.copytree(FIXTURES / "crashed-mid-tool", dest)
    return dest


def test_check_clean_session_exits_0(tmp_path: Path) -> None:
    dest = tmp_path / "s"
    shutil.copytree(FIXTURES / "complete", dest)
    result = andon("check", str(dest))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("ok:")


def test_check_crashed_session_exits_1_and_lists_violations(crashed: Path) -> None:
    result = andon("check", str(crashed))
    assert result.returncode == 1
    assert "never ends" in result.stdout


def test_check_corrupt_log_exits_2_and_changes_nothing(tmp_path: Path) -> None:
    dest = tmp_path / "s"
    shutil.copytree(FIXTURES / "corrupt-middle", dest)
    before = (dest / "events.jsonl").read_bytes()
    result = andon("check", str(dest))
    assert result.returncode == 2
    assert "line" in result.stderr and "Traceback" not in result.stderr
    assert (dest / "events.jsonl").read_bytes() == before


def test_repair_dry_run_writes_nothing_then_repair_balances(crashed: Path) -> None:
    before = (crashed / "events.jsonl").read_bytes()
    dry = andon("repair", "--dry-run", str(crashed))
    assert dry.returncode == 0
    assert "would append" in dry.stdout and "TOOL_OUTCOME_UNKNOWN" in dry.stdout
    assert (crashed / "events.jsonl").read_bytes() == before
    real = andon("repair", str(crashed))
    assert real.returncode == 0 and "appended" in real.stdout
    assert andon("check", str(crashed)).returncode == 0
    again = andon("repair", str(crashed))
    assert "nothing to repair" in again.stdout


def test_log_shows_the_transcript_and_json(crashed: Path) -> None:
    human = andon("log", str(crashed))
    assert human.returncode == 0
    assert "turn 1" in human.stdout and "c1-1-1" in human.stdout
    machine = andon("log", "--json", str(crashed))
    lines = [json.loads(line) for line in machine.stdout.splitlines()]
    assert lines[0]["type"] == "session/start"
    assert [r["seq"] for r in lines] == list(range(len(lines)))


@pytest.mark.parametrize(
    "args",
    [("check", "/nonexistent/andon-session"), ("frobnicate",), ("log",), ("check", "--nope", ".")],
)
def test_user_mistakes_get_one_line_and_exit_2(args: tuple[str, ...]) -> None:
    result = andon(*args)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("andon: ")
    assert "Traceback" not in result.stderr
