"""Hostile inputs to the real ``andon`` executable: a broken ``andon.toml``, a log line nested
100 000 deep, a ``tool/started`` whose pid no kernel hands out. Each is one ``andon:`` line on
stderr naming the file (and line), exit 2 - never a traceback, a RecursionError or a hang.

The logs start from a real session, made once by ``andon run`` with a scripted model.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.cli.support import env, run, script

DEEP = 100_000


@pytest.fixture(scope="module")
def real_session(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real session that ran one bash call to the end (so its log holds a tool/started)."""
    root = tmp_path_factory.mktemp("real")
    model = script(
        root / "model.json",
        [
            {
                "text": "Running.",
                "tool_calls": [{"name": "bash", "arguments": {"command": "true"}}],
            },
            {"text": "Done."},
        ],
    )
    session = root / "s"
    environ = env(ANDON_HOME=str(root / "home"))
    result = run(
        "run", "--session", str(session), "--model", model, "go", cwd=root, environ=environ
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return session


def _lines(session: Path) -> list[bytes]:
    return (session / "events.jsonl").read_bytes().splitlines(keepends=True)


def _copy(real: Path, tmp_path: Path, lines: list[bytes]) -> Path:
    """A copy of the real session folder whose log is ``lines``."""
    folder = tmp_path / "s"
    shutil.copytree(real, folder, ignore=shutil.ignore_patterns("lock"))
    (folder / "events.jsonl").write_bytes(b"".join(lines))
    return folder


def _andon(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run(*args, cwd=cwd, environ=env(ANDON_HOME=str(cwd / "home")))


def _one_line(result: subprocess.CompletedProcess[str], *words: str) -> str:
    """The single ``andon:`` line a refused command printed (asserting exit 2)."""
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and "RecursionError" not in result.stderr
    assert result.stderr.startswith("andon: ") and result.stderr.count("\n") == 1, result.stderr
    for word in words:
        assert word in result.stderr, result.stderr
    return result.stderr


# --- andon.toml ---------------------------------------------------------------------------------


def _binary(path: Path) -> str:
    path.write_bytes(b"\xbf" + bytes(range(256)) * 2)
    return "not UTF-8 text (byte 0xbf at offset 0, line 1)"


def _binary_on_line_2(path: Path) -> str:
    path.write_bytes(b'model = "x"\n\xff\n')
    return "not UTF-8 text (byte 0xff at offset 12, line 2)"


def _syntax(path: Path) -> str:
    path.write_text("workers = 1\nmodel = \n")
    return "not valid TOML: Invalid value (at line 2, column 9)"


def _folder(path: Path) -> str:
    path.mkdir()
    return "is a folder, not a settings file"


def _fifo(path: Path) -> str:
    os.mkfifo(path)  # a read would wait for a writer for ever
    return "is not a regular file"


def _nested(path: Path) -> str:
    path.write_text("a = " + "[" * DEEP + "]" * DEEP + "\n")
    return "not valid TOML: arrays or tables nested too deeply"


def _long_number(path: Path) -> str:
    path.write_text("max_steps = " + "1" * 5000 + "\n")
    return "not valid TOML: a number it cannot read (Exceeds the limit"


def _huge(path: Path) -> str:
    path.write_bytes(b"#" * (2 << 20))
    return "larger than 1048576 bytes"


TOML_MISTAKES = {
    f.__name__.strip("_"): f
    for f in (_binary, _binary_on_line_2, _syntax, _folder, _fifo, _nested, _long_number, _huge)
}


@pytest.mark.parametrize("case", sorted(TOML_MISTAKES))
def test_a_broken_andon_toml_is_one_line_and_exit_2(tmp_path: Path, case: str) -> None:
    path = tmp_path / "andon.toml"
    expected = TOML_MISTAKES[case](path)
    result = _andon("run", "--model", "script:x", "hi", cwd=tmp_path)
    _one_line(result, f"{path}: {expected}")
    assert not (tmp_path / "home").exists()  # refused before any session


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_an_unreadable_andon_toml_is_one_line_and_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "andon.toml"
    path.write_text('model = "x"\n')
    path.chmod(0)
    result = _andon("run", "--model", "script:x", "hi", cwd=tmp_path)
    _one_line(result, f"{path}: cannot read it: Permission denied")


# --- a line nested 100 000 deep ------------------------------------------------------------------

COMMANDS: dict[str, tuple[str, ...]] = {
    "check": ("check",),
    "log": ("log",),
    "log-json": ("log", "--json"),
    "repair": ("repair",),
    "repair-dry-run": ("repair", "--dry-run"),
    "resume": ("resume",),
}


def _args(command: str, folder: Path) -> list[str]:
    args = [*COMMANDS[command], str(folder)]
    return [*args, "x"] if command == "resume" else args


def _deep_line(seq: int) -> bytes:
    head = f'{{"seq":{seq},"time":1,"type":"user/message-entered","data":'.encode()
    return head + b"[" * DEEP + b"]" * DEEP + b"}\n"


@pytest.mark.parametrize("where", ["last", "middle"])
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_line_nested_100000_deep_is_one_line_for_every_command(
    real_session: Path, tmp_path: Path, command: str, where: str
) -> None:
    real = _lines(real_session)
    lines = [real[0], _deep_line(1)] + (real[2:] if where == "middle" else [])
    folder = _copy(real_session, tmp_path, lines)
    before = (folder / "events.jsonl").read_bytes()
    result = _andon(*_args(command, folder), cwd=tmp_path)
    where_text = f"events.jsonl: line 2 (byte offset {len(real[0])}) is nested too deeply"
    _one_line(result, where_text)
    assert (folder / "events.jsonl").read_bytes() == before


def test_sessions_lists_a_deeply_nested_log_with_its_error(
    real_session: Path, tmp_path: Path
) -> None:
    sessions = tmp_path / "home" / "sessions"
    sessions.mkdir(parents=True)
    shutil.copytree(real_session, sessions / "good")
    bad = _copy(real_session, sessions, [_lines(real_session)[0], _deep_line(1)])
    bad.rename(sessions / "deep")
    listing = _andon("sessions", "--json", cwd=tmp_path)
    assert listing.returncode == 0 and listing.stderr == "", listing.stderr
    entries = {Path(e["path"]).name: e for e in map(json.loads, listing.stdout.splitlines())}
    assert "error" not in entries["good"]
    assert "line 2 (byte offset" in entries["deep"]["error"]
    assert "nested too deeply" in entries["deep"]["error"]
    human = _andon("sessions", cwd=tmp_path)
    assert human.returncode == 0 and "unreadable" in human.stdout, human.stdout + human.stderr


# --- identity fields of tool/started -------------------------------------------------------------


def _crashed_with(real_session: Path, tmp_path: Path, field: str, raw: bytes) -> tuple[Path, int]:
    """The real log cut after its tool/started (a crash mid-call), with ``field`` set to the raw
    JSON ``raw``; and that record's seq."""
    lines = _lines(real_session)
    at = next(i for i, line in enumerate(lines) if b'"type":"tool/started"' in line)
    record: dict[str, Any] = json.loads(lines[at])
    record["data"][field] = "@"
    line = json.dumps(record, separators=(",", ":")).encode().replace(b'"@"', raw) + b"\n"
    return _copy(real_session, tmp_path, [*lines[:at], line]), record["seq"]


BAD_IDS = [
    ("pid", b"-5", "must be a process id from 1 to 4194303, not -5"),
    ("pid", b"0", "must be a process id from 1 to 4194303, not 0"),
    ("pid", b"true", "must be an integer, not a boolean"),
    ("pid", b"4194304", "must be a process id from 1 to 4194303, not 4194304"),
    ("pid", str(2**70).encode(), "must be a process id from 1 to 4194303"),
    ("pgid", b"-1", "must be a process id from 1 to 4194303, not -1"),
    ("create_time", b"-1.5", "must be a number of seconds from 0 to 253402300799, not -1.5"),
]


@pytest.mark.parametrize(("field", "raw", "message"), BAD_IDS)
def test_a_tool_started_with_a_bad_identity_is_refused_by_every_command(
    real_session: Path, tmp_path: Path, field: str, raw: bytes, message: str
) -> None:
    folder, seq = _crashed_with(real_session, tmp_path, field, raw)
    before = (folder / "events.jsonl").read_bytes()
    for command in COMMANDS:
        result = _andon(*_args(command, folder), cwd=tmp_path)
        _one_line(result, f"record {seq} (tool/started) data.{field} {message}")
        assert (folder / "events.jsonl").read_bytes() == before, command


def test_a_float_too_large_for_python_is_refused_by_every_command(
    real_session: Path, tmp_path: Path
) -> None:
    # 1e400 is valid JSON that Python reads as infinity (the start of an OverflowError later).
    folder, _ = _crashed_with(real_session, tmp_path, "create_time", b"1e400")
    for command in COMMANDS:
        _one_line(_andon(*_args(command, folder), cwd=tmp_path), "holds the number 1e400")
