"""A prompt is any bytes (docs/log-format.md, Text): invalid UTF-8, CESU-8 surrogates and a
UTF-16 BOM, on argv and on stdin, run to exit 0 with U+FFFD where the bytes were invalid, and the
log passes ``andon check``. Real ``python -m andon`` processes throughout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from andon.testing import MockModelServer
from tests.cli.support import assert_balanced, env, records, script

PROMPTS = {
    "latin-1 byte": (b"fix caf\xe9 \xff now", "fix caf\ufffd \ufffd now"),
    # CESU-8 spells U+D83D U+DE00 as two three-byte sequences: not UTF-8 (surrogates).
    "cesu-8 surrogates": (b"smile \xed\xa0\xbd\xed\xb8\x80!", "smile " + "\ufffd" * 6 + "!"),
    "utf-16 bom": (b"\xff\xfeh\x00i\x00", "\ufffd\ufffdh\x00i\x00"),
}


def _andon(
    tmp_path: Path, model: str, prompt: bytes, *, on: str
) -> subprocess.CompletedProcess[bytes]:
    session = tmp_path / "session"
    argv = [sys.executable, "-m", "andon", "run", "--json", "--model", model, "--session"]
    argv.append(str(session))
    if on == "argv":
        argv.append(os.fsdecode(prompt))  # the bytes themselves reach the process's argv
    return subprocess.run(
        argv,
        cwd=tmp_path,
        env=env(ANDON_HOME=str(tmp_path / "home")),
        input=prompt if on == "stdin" else None,
        stdin=None if on == "stdin" else subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
    )


@pytest.mark.parametrize("on", ["argv", "stdin"])
@pytest.mark.parametrize("case", sorted(PROMPTS))
def test_a_prompt_of_any_bytes_runs_with_u_fffd_where_they_were_invalid(
    tmp_path: Path, case: str, on: str
) -> None:
    raw, seen = PROMPTS[case]
    if on == "argv" and b"\x00" in raw:
        raw, seen = raw.replace(b"\x00", b""), seen.replace("\x00", "")  # argv holds no NUL
    model = script(tmp_path / "s.json", [{"text": "Done."}])
    done = _andon(tmp_path, model, raw, on=on)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert b"Traceback" not in done.stderr
    messages = [r for r in records(tmp_path / "session") if r["type"] == "user/message"]
    assert [m["data"]["message"]["content"] for m in messages] == [seen]
    assert_balanced(tmp_path / "session")


@pytest.mark.parametrize("on", ["argv", "stdin"])
def test_the_model_receives_the_replacement_characters(tmp_path: Path, on: str) -> None:
    raw, seen = PROMPTS["latin-1 byte"]
    with MockModelServer([{"text": "Done."}]) as server:
        done = _andon(tmp_path, f"{server.base_url}#mock", raw, on=on)
        bodies = [r.body for r in server.requests if r.path.endswith("/chat/completions")]
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    users = [m["content"] for m in bodies[0]["messages"] if m["role"] == "user"]
    assert users == [seen]
    summary = json.loads(done.stdout.splitlines()[-1])
    assert summary["type"] == "run/summary" and summary["exit_code"] == 0


def test_a_system_prompt_file_of_any_bytes_is_read_with_u_fffd(tmp_path: Path) -> None:
    (tmp_path / "system.txt").write_bytes(b"You fix builds. Caf\xe9.")
    with MockModelServer([{"text": "Done."}]) as server:
        argv = [sys.executable, "-m", "andon", "run", "--model", f"{server.base_url}#mock"]
        argv += ["--system", str(tmp_path / "system.txt"), "--session", str(tmp_path / "s")]
        done = subprocess.run(
            [*argv, "go"],
            cwd=tmp_path,
            env=env(ANDON_HOME=str(tmp_path / "home")),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=60,
        )
        bodies = [r.body for r in server.requests if r.path.endswith("/chat/completions")]
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    systems = [m["content"] for m in bodies[0]["messages"] if m["role"] == "system"]
    assert systems == ["You fix builds. Caf\ufffd."]
    assert_balanced(tmp_path / "s")


def test_a_workspace_path_of_any_bytes_runs_and_resumes_there(tmp_path: Path) -> None:
    """The session's cwd is a file name: recorded with the file tools' escape, and mapped back on
    resume, so the tools run in the real folder both times."""
    workspace = os.fsencode(tmp_path) + b"/ws\xe9"
    os.mkdir(workspace)
    probe = {"name": "bash", "arguments": {"command": "pwd | od -An -tx1 | tr -d ' \\n'"}}
    model = script(
        tmp_path / "s.json", [{"text": "Where?", "tool_calls": [probe]}, {"text": "Ok."}]
    )
    session = tmp_path / "session"
    argv = [sys.executable, "-m", "andon", "run", "--model", model, "--session", str(session)]
    for cwd in (workspace, os.fsencode(tmp_path)):  # the first run, then a resume from elsewhere
        done = subprocess.run(
            [*argv, "go"],
            cwd=cwd,
            env=env(ANDON_HOME=str(tmp_path / "home")),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr.decode(errors="replace")
    recs = records(session)
    assert recs[0]["data"]["cwd"] == os.fsdecode(os.fsencode(tmp_path)) + "/ws\\xe9"
    results = [r["data"]["content"] for r in recs if r["type"] == "tool/result"]
    where = (workspace + b"\n").hex()
    assert [r.splitlines()[0] for r in results] == [where, where]
    assert_balanced(session)
