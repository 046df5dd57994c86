"""The writer notices its log deleted or replaced under it (a tool's ``git clean -fdx`` or
``rm -rf``): the next barrier fails with ``LogWriteFailed`` saying so, and the run fails, never
exit 0. And the default sessions root, outside the workspace, survives those commands."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from andon.base import LogWriteFailed
from andon.session import SessionLog, StepStart, TurnStart, check, read
from tests.cli.support import ANDON, env, script
from tests.session.helpers import Sim

pytestmark = pytest.mark.timeout(60)


def _opened(folder: Path) -> SessionLog:
    sim = Sim()
    sim.start()
    log = SessionLog.open(folder)
    for _, data in sim.events:
        log.append(data)
    return log


async def test_a_deleted_log_fails_the_next_barrier_and_every_append_after(tmp_path: Path) -> None:
    log = _opened(tmp_path / "s")
    try:
        await log.barrier()  # the log is where it was: fine
        (tmp_path / "s" / "events.jsonl").unlink()
        log.append(TurnStart(1))  # an append does not look (the barrier does)
        with pytest.raises(LogWriteFailed, match="was deleted while the session ran"):
            await log.barrier()
        with pytest.raises(LogWriteFailed, match="deleted"):
            log.append(StepStart(1, 1))
        assert log.failed
    finally:
        log.close()


async def test_a_replaced_log_fails_the_next_barrier(tmp_path: Path) -> None:
    folder = tmp_path / "s"
    log = _opened(folder)
    try:
        other = tmp_path / "other.jsonl"
        other.write_bytes((folder / "events.jsonl").read_bytes())  # same bytes, another file
        os.replace(other, folder / "events.jsonl")
        with pytest.raises(LogWriteFailed, match="was replaced while the session ran"):
            await log.barrier()
    finally:
        log.close()


async def test_a_removed_session_folder_fails_the_next_barrier(tmp_path: Path) -> None:
    folder = tmp_path / "s"
    log = _opened(folder)
    try:
        subprocess.run(["rm", "-rf", str(folder)], check=True, timeout=30)
        with pytest.raises(LogWriteFailed, match="deleted"):
            await log.barrier()
    finally:
        log.close()


def _bash_script(tmp_path: Path, command: str) -> str:
    return script(
        tmp_path / "tool.json",
        [
            {
                "text": "Cleaning.",
                "tool_calls": [{"name": "bash", "arguments": {"command": command}}],
            },
            {"text": "Clean."},
        ],
    )


def _andon(*args: str, cwd: Path, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ANDON, *args],
        cwd=cwd,
        env=env(ANDON_HOME=str(home)),
        capture_output=True,
        text=True,
        timeout=50,
        stdin=subprocess.DEVNULL,
    )


def test_a_run_whose_tool_removes_its_own_session_folder_fails(tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / ".andon").mkdir(parents=True)
    session = work / ".andon" / "s"
    model = _bash_script(tmp_path, f"rm -rf {session}")
    result = _andon("run", "--model", model, "--session", str(session), "clean", cwd=work,
                    home=tmp_path / "home")  # fmt: skip
    assert result.returncode != 0, result.stdout + result.stderr
    assert "was deleted while the session ran" in result.stderr
    assert "Traceback" not in result.stderr
    assert not session.exists()


def test_the_default_root_survives_git_clean_and_rm_rf_dot_andon(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    git = {"cwd": work, "check": True, "capture_output": True, "timeout": 30}
    subprocess.run(["git", "init", "-q"], **git)  # type: ignore[call-overload]
    (work / "tracked.txt").write_text("kept\n")
    (work / ".andon").mkdir()
    (work / ".andon" / "junk").write_text("x")
    (work / "untracked.o").write_text("x")
    subprocess.run(["git", "add", "tracked.txt"], **git)  # type: ignore[call-overload]
    model = _bash_script(tmp_path, "git clean -fdxq && rm -rf .andon && ls -A")
    home = tmp_path / "home"
    result = _andon("run", "--json", "--model", model, "clean", cwd=work, home=home)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.splitlines()[-1])
    session = Path(summary["session"])
    assert session.parent == home / "sessions"
    assert not (work / ".andon").exists() and not (work / "untracked.o").exists()
    records = read(session)
    assert check(records) == []  # the log is intact and balanced
    assert records[-1].type == "turn/end" and summary["ended"] == {"kind": "completed"}
