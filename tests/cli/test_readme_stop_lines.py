"""The stop lines the README and the long-build example quote are what andon prints, in each
mode: the terminal's live view (a real pseudo-terminal) and plain mode (stderr to a pipe), for
the example's own build (examples/long-build), which shrugs off SIGINT until SIGTERM ends it."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pexpect

from tests.cli.support import ANDON, env, records, start
from tests.cli.test_chat import TIMEOUT, _Capture, children, printed, screen

__all__ = ["children"]  # the fixture, imported for the terminal test

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "long-build"
MODEL = f"script:{EXAMPLE / 'script.yaml'}"


def _quoted(prefix: str) -> str:
    """The one line of a README code block that starts with ``prefix``."""
    found = [
        line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith(prefix)
    ]
    assert len(found) == 1, found
    return found[0]


def _in_example(line: str) -> None:
    """The example's README quotes the line too (wrapped: compared without the line breaks)."""
    text = " ".join((EXAMPLE / "README.md").read_text().split())
    assert line.removeprefix("andon: ") in text, line


def test_the_plain_mode_line_is_what_the_readme_quotes(tmp_path: Path) -> None:
    quoted = _quoted("andon: stopping (SIGINT")
    _in_example(quoted)
    session = tmp_path / "s"
    proc = start("run", "--model", MODEL, "--session", str(session), "build it", cwd=tmp_path)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if "compiling module 2/600" in line:
                break
        os.kill(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err
    assert quoted in err.splitlines(), err
    # The build outlived its SIGINT (so --grace 10,10 shows the stages) and SIGTERM ended it.
    assert "SIGINT: ignored, the build goes on" in out
    result = next(r for r in records(session) if r["type"] == "tool/result")
    assert result["data"]["exit"]["signal"] == signal.SIGTERM, result


def test_the_terminal_line_is_what_the_readme_quotes(
    tmp_path: Path, children: list[pexpect.spawn[str]]
) -> None:
    quoted = _quoted("stopping (SIGINT): ")
    _in_example(quoted)
    child: pexpect.spawn[str] = pexpect.spawn(
        ANDON,
        ["run", "--model", MODEL, "--session", str(tmp_path / "s"), "build it"],
        cwd=str(tmp_path),
        env=env(COLUMNS="140", LINES="30"),
        dimensions=(30, 140),
        encoding="utf-8",
        timeout=TIMEOUT,
    )
    children.append(child)
    child.logfile_read = _Capture()
    child.expect("compiling module 2/600")
    child.sendintr()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 130
    shown = screen(printed(child))
    assert quoted in shown.splitlines(), shown


def test_resume_with_the_examples_follow_up_script_runs_the_linter(tmp_path: Path) -> None:
    # The tour's resume step: a follow-up with a script of its own, not the build again.
    session = tmp_path / "s"
    proc = start("run", "--model", MODEL, "--session", str(session), "build it", cwd=tmp_path)
    assert proc.stdout is not None
    for line in proc.stdout:
        if "compiling module 1/600" in line:
            break
    os.kill(proc.pid, signal.SIGINT)
    proc.communicate(timeout=30)
    assert proc.returncode == 130
    follow = start(
        "resume",
        "--model",
        f"script:{EXAMPLE / 'resume.yaml'}",
        str(session),
        "now run the linter too",
        cwd=tmp_path,
    )
    _, err = follow.communicate(timeout=30)
    assert follow.returncode == 0, err
    calls = [r["data"] for r in records(session) if r["type"] == "tool/call"]
    assert len(calls) == 2 and "lint" in calls[1]["arguments"], calls
