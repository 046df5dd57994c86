"""Which lines of a finished tool call the views show (docs/terminal.md, What is on the screen):
a file ``read_file`` read from its top, with a note of how many lines more the model got; a
command's output from its tail (where the error and the summary are)."""

from __future__ import annotations

import sys
from pathlib import Path

import pexpect

from tests.cli.support import env, run, script
from tests.cli.test_chat import TIMEOUT, _Capture, children, printed, screen

__all__ = ["children"]  # the fixture, imported for the terminal test

FILE = "".join(f"line {n:02d}\n" for n in range(1, 31))


def _model(tmp_path: Path) -> str:
    (tmp_path / "notes.txt").write_text(FILE)
    return script(
        tmp_path / "m.json",
        [
            {
                "text": "Reading.",
                "tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}],
            },
            {
                "text": "Listing.",
                "tool_calls": [{"name": "bash", "arguments": {"command": "cat notes.txt"}}],
            },
            {"text": "Done."},
        ],
    )


def _check(shown: str, *, tail: bool) -> None:
    read, _, listed = shown.partition("▶ c1-2-1")
    assert "│ line 01" in read and "│ line 08" in read, shown
    assert "line 09" not in read and "line 30" not in read, shown
    assert "… 22 more lines" in read, shown
    assert "│ line 30" in listed, shown
    if tail:  # the terminal keeps a command's tail (the plain view streams all of it)
        assert "│ line 30" in listed and "│ line 23" in listed and "│ line 01" not in listed, shown


def test_the_plain_view_shows_a_read_file_from_its_top(tmp_path: Path) -> None:
    result = run(
        "run", "--model", _model(tmp_path), "--session", str(tmp_path / "s"), "go", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    _check(result.stdout, tail=False)


def test_the_terminal_shows_a_read_file_from_its_top(
    tmp_path: Path, children: list[pexpect.spawn[str]]
) -> None:
    andon = str(Path(sys.executable).parent / "andon")
    child: pexpect.spawn[str] = pexpect.spawn(
        andon,
        ["run", "--model", _model(tmp_path), "--session", str(tmp_path / "s"), "go"],
        cwd=str(tmp_path),
        env=env(COLUMNS="100", LINES="60"),
        dimensions=(60, 100),
        encoding="utf-8",
        timeout=TIMEOUT,
    )
    children.append(child)
    child.logfile_read = _Capture()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    _check(screen(printed(child), rows=60), tail=True)
