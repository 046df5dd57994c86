"""Where sessions live and which sessions a command accepts: the real ``andon`` executable.

``andon check`` of a live session, ``andon resume`` of a log ``check`` rejects, the sessions root
outside the workspace (``$ANDON_HOME/sessions``), ``andon sessions``, and the bounds of the numeric
settings. Every test points ``ANDON_HOME`` at its own tmp folder: nothing is written into the real
home.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from andon import procs
from andon.base import ConfigError
from andon.cli._sessions import runtime_root, sessions_root
from tests.cli.support import ANDON, env, is_tool_output, long_script, read_until, script, start
from tests.support import alive_after

pytestmark = pytest.mark.timeout(60)


def home_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return env(ANDON_HOME=str(tmp_path / "home"), **extra)


def andon(
    *args: str, cwd: Path, environ: dict[str, str], stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ANDON, *args],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=50,
        input=stdin,
        stdin=None if stdin is not None else subprocess.DEVNULL,
    )


def start_long(tmp_path: Path, session: Path, killer: list[Any]) -> subprocess.Popen[str]:
    proc = start(
        *("run", "--json", "--grace", "1,1", "--model", long_script(tmp_path)),
        *("--session", str(session), "build"),
        cwd=tmp_path,
        environ=home_env(tmp_path),
    )
    killer.append(proc)
    read_until(proc, is_tool_output)  # the long bash tool is running: the session is live
    return proc


def stop(proc: subprocess.Popen[str]) -> int:
    os.kill(proc.pid, signal.SIGINT)
    proc.communicate(timeout=30)
    return proc.returncode


# --- 1. andon check on a live session ------------------------------------------------------------


def test_check_of_a_live_session_says_live_naming_the_pid_and_exits_2(
    tmp_path: Path, killer: list[Any]
) -> None:
    session = tmp_path / "s"
    proc = start_long(tmp_path, session, killer)
    result = andon("check", str(session), cwd=tmp_path, environ=home_env(tmp_path))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "is live" in result.stderr and f"process {proc.pid}" in result.stderr
    assert "repair" not in result.stdout + result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert stop(proc) == 130
    after = andon("check", str(session), cwd=tmp_path, environ=home_env(tmp_path))
    assert after.returncode == 0, after.stdout + after.stderr  # cold again, and balanced


# --- 2. andon resume refuses a log that andon check rejects ---------------------------------------


def one_tool_script(tmp_path: Path, command: str = "echo built-ok") -> str:
    return script(
        tmp_path / "one.json",
        [
            {
                "text": "Building.",
                "tool_calls": [{"name": "bash", "arguments": {"command": command}}],
            },
            {"text": "Done."},
        ],
    )


def done_script(tmp_path: Path) -> str:
    return script(tmp_path / "done.json", [{"text": "Resumed."}])


def lines_of(session: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (session / "events.jsonl").read_text().splitlines()]


def rewrite(session: Path, records: list[dict[str, Any]], *, renumber: bool = True) -> None:
    if renumber:
        records = [{**r, "seq": i} for i, r in enumerate(records)]
    text = "".join(json.dumps(r) + "\n" for r in records)
    (session / "events.jsonl").write_text(text)


@pytest.fixture
def finished(tmp_path: Path) -> Path:
    """A real session: one turn with one bash call, completed."""
    session = tmp_path / "s"
    result = andon(
        "run", "--model", one_tool_script(tmp_path), "--session", str(session), "build",
        cwd=tmp_path, environ=home_env(tmp_path),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return session


def _drop_tool_call(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r["type"] != "tool/call"]


def _duplicate_seq(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    at = next(i for i, r in enumerate(records) if r["type"] == "step/start")
    return [*records[: at + 1], records[at], *records[at + 1 :]]


def _turn_starts_twice(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    at = next(i for i, r in enumerate(records) if r["type"] == "turn/start")
    return [*records[: at + 1], records[at], *records[at + 1 :]]


@pytest.mark.parametrize(
    ("name", "damage", "renumber"),
    [
        ("result-without-call", _drop_tool_call, True),
        ("duplicate-seq", _duplicate_seq, False),
        ("turn-starts-twice", _turn_starts_twice, True),
    ],
)
def test_resume_refuses_a_log_check_rejects(
    tmp_path: Path, finished: Path, name: str, damage: Any, renumber: bool
) -> None:
    rewrite(finished, damage(lines_of(finished)), renumber=renumber)
    before = (finished / "events.jsonl").read_bytes()
    checked = andon("check", str(finished), cwd=tmp_path, environ=home_env(tmp_path))
    assert checked.returncode in (1, 2), checked.stdout
    for command in ("resume", "run"):
        args = [str(finished), "go on"] if command == "resume" else ["--session", str(finished)]
        result = andon(
            command, "--model", done_script(tmp_path), *args,
            *(["go on"] if command == "run" else []), cwd=tmp_path, environ=home_env(tmp_path),
        )  # fmt: skip
        assert result.returncode == 2, f"{name}: {result.stdout}{result.stderr}"
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert "seq " in result.stderr or "cannot read" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
        assert (finished / "events.jsonl").read_bytes() == before  # nothing appended


def test_resume_of_a_crash_truncated_log_still_repairs_and_continues(
    tmp_path: Path, finished: Path
) -> None:
    records = lines_of(finished)
    cut = next(i for i, r in enumerate(records) if r["type"] == "tool/started")
    rewrite(finished, records[: cut + 1], renumber=False)  # kill -9 while the tool ran
    result = andon(
        "resume", "--model", done_script(tmp_path), str(finished), "go on",
        cwd=tmp_path, environ=home_env(tmp_path),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Resumed." in result.stdout
    checked = andon("check", str(finished), cwd=tmp_path, environ=home_env(tmp_path))
    assert checked.returncode == 0, checked.stdout
    assert any(r["type"] == "session/repaired" for r in lines_of(finished))


def test_resume_with_nothing_to_run_still_repairs_a_crashed_log(
    tmp_path: Path, finished: Path
) -> None:
    records = lines_of(finished)
    cut = next(i for i, r in enumerate(records) if r["type"] == "tool/started")
    rewrite(finished, records[: cut + 1], renumber=False)  # kill -9 while the tool ran
    environ = home_env(tmp_path)
    assert andon("check", str(finished), cwd=tmp_path, environ=environ).returncode == 1
    result = andon("resume", str(finished), cwd=tmp_path, environ=environ)  # no PROMPT
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith("andon: nothing to run"), result.stderr
    assert "repaired" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    checked = andon("check", str(finished), cwd=tmp_path, environ=environ)
    assert checked.returncode == 0, checked.stdout
    assert [r["type"] for r in lines_of(finished)][-1] == "session/repaired"
    again = andon("resume", str(finished), cwd=tmp_path, environ=environ)  # balanced: no repair
    assert again.returncode == 2 and "repaired" not in again.stderr, again.stderr


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_a_full_disk_names_the_file_it_could_not_write(tmp_path: Path, finished: Path) -> None:
    # /dev/full fails every write with ENOSPC: a real full disk under one file, no root needed.
    (finished / "lock").unlink()
    (finished / "lock").symlink_to("/dev/full")
    environ = home_env(tmp_path)
    for args in (["resume", "--model", done_script(tmp_path), str(finished), "go on"],
                 ["repair", str(finished)]):  # fmt: skip
        result = andon(*args, cwd=tmp_path, environ=environ)
        assert result.returncode != 0, result.stdout
        assert "Traceback" not in result.stderr
        assert f"No space left on device: {finished / 'lock'}" in result.stderr, result.stderr


# --- 3. the sessions root outside the workspace ---------------------------------------------------


def announced(result: subprocess.CompletedProcess[str], *, json_mode: bool = False) -> Path:
    first = (result.stderr if json_mode else result.stdout).splitlines()[0]
    assert first.startswith("andon: session "), first
    return Path(first.removeprefix("andon: session "))


def test_a_new_session_goes_under_andon_home_named_by_its_session_id(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    result = andon(
        "run", "--model", one_tool_script(tmp_path), "build", cwd=work, environ=home_env(tmp_path)
    )
    assert result.returncode == 0, result.stderr
    session = announced(result)
    assert session.parent == tmp_path / "home" / "sessions"
    start = lines_of(session)[0]
    assert start["type"] == "session/start" and start["data"]["session_id"] == session.name
    assert start["data"]["cwd"] == str(work)
    assert list(work.iterdir()) == []  # nothing in the workspace
    as_json = andon(
        "run", "--json", "--model", done_script(tmp_path), "hi", cwd=work,
        environ=home_env(tmp_path),
    )  # fmt: skip
    assert as_json.returncode == 0, as_json.stderr
    summary = json.loads(as_json.stdout.splitlines()[-1])
    assert summary["session"] == str(announced(as_json, json_mode=True))


def test_without_andon_home_the_root_is_under_xdg_state_home(tmp_path: Path) -> None:
    environ = env(XDG_STATE_HOME=str(tmp_path / "state"))
    result = andon("run", "--model", done_script(tmp_path), "hi", cwd=tmp_path, environ=environ)
    assert result.returncode == 0, result.stderr
    assert announced(result).parent == tmp_path / "state" / "andon" / "sessions"


@pytest.mark.parametrize("home", ["", None, "relative/home", "/"])
def test_without_a_usable_home_the_root_is_an_error_never_slash(
    tmp_path: Path, home: str | None
) -> None:
    environ = {k: v for k, v in env().items() if k not in ("HOME", "XDG_STATE_HOME")}
    if home is not None:
        environ["HOME"] = home
    for args in (["run", "--model", done_script(tmp_path), "hi"], ["sessions"]):
        result = andon(*args, cwd=tmp_path, environ=environ)
        assert result.returncode == 2, result.stdout + result.stderr
        assert result.stderr.startswith("andon: HOME is "), result.stderr
        assert "ANDON_HOME" in result.stderr and "--session" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and result.stdout == ""
    # A run told where its session goes needs no home: the pool's folder falls back too.
    given = andon(
        "run", "--model", done_script(tmp_path), "--session", str(tmp_path / "s"), "hi",
        cwd=tmp_path, environ=environ,
    )  # fmt: skip
    assert given.returncode == 0, given.stderr
    assert sessions_root({"HOME": "/home/u", "XDG_STATE_HOME": ""}) == Path(
        "/home/u/.local/state/andon/sessions"
    )
    assert sessions_root({"HOME": "", "ANDON_HOME": str(tmp_path)}) == tmp_path / "sessions"
    assert runtime_root({"HOME": ""}) is None
    with pytest.raises(ConfigError, match="HOME is not set"):
        sessions_root({})


def test_resume_takes_a_session_id_or_a_path(tmp_path: Path) -> None:
    environ = home_env(tmp_path)
    first = andon("run", "--model", done_script(tmp_path), "hi", cwd=tmp_path, environ=environ)
    session = announced(first)
    model = script(tmp_path / "again.json", [{"text": "Again."}, {"text": "And again."}])
    by_id = andon("resume", "--model", model, session.name, "more", cwd=tmp_path, environ=environ)
    assert by_id.returncode == 0, by_id.stderr
    assert "Again." in by_id.stdout
    by_path = andon("resume", "--model", model, str(session), "more", cwd=tmp_path, environ=environ)
    assert by_path.returncode == 0, by_path.stderr
    log = andon("log", session.name, cwd=tmp_path, environ=environ)
    assert log.returncode == 0 and "Again." in log.stdout
    unknown = andon("resume", "s-000000000000", "x", cwd=tmp_path, environ=environ)
    assert unknown.returncode == 2 and len(unknown.stderr.strip().splitlines()) == 1


def test_sessions_lists_newest_first_with_how_each_ended_and_whether_live(
    tmp_path: Path, killer: list[Any]
) -> None:
    environ = home_env(tmp_path)
    empty = andon("sessions", cwd=tmp_path, environ=environ)
    assert empty.returncode == 0 and empty.stdout == ""
    done = announced(
        andon("run", "--model", done_script(tmp_path), "hi", cwd=tmp_path, environ=environ)
    )
    maxed = script(tmp_path / "max.json", [{"text": "cut sho", "finish": "length"}])
    cut = announced(andon("run", "--model", maxed, "novel", cwd=tmp_path, environ=environ))
    live_dir = tmp_path / "home" / "sessions" / "s-aaaaaaaaaaaa"
    proc = start_long(tmp_path, live_dir, killer)  # newest
    listed = andon("sessions", cwd=tmp_path, environ=environ)
    assert listed.returncode == 0, listed.stderr
    rows = listed.stdout.splitlines()
    assert [row.split()[0] for row in rows[1:]] == [cut.name, done.name]
    assert rows[0].split()[0].startswith("s-")  # the live run's own session/start id
    assert f"live (pid {proc.pid})" in rows[0] and "running" in rows[0]
    assert "max-tokens" in rows[1] and "cold" in rows[1]
    assert "completed" in rows[2] and str(tmp_path) in rows[2]
    as_json = [json.loads(line) for line in andon(
        "sessions", "--json", cwd=tmp_path, environ=environ
    ).stdout.splitlines()]  # fmt: skip
    assert [e["path"] for e in as_json] == [str(live_dir), str(cut), str(done)]
    assert as_json[0]["live"] is True and as_json[0]["pid"] == proc.pid
    assert as_json[2]["ended"] == {"kind": "completed"} and as_json[2]["live"] is False
    assert stop(proc) == 130


def test_session_dir_needs_an_existing_parent(tmp_path: Path) -> None:
    deep = tmp_path / "missing" / "deep" / "dir"
    result = andon(
        "run", "--model", done_script(tmp_path), "--session", str(deep), "hi", cwd=tmp_path,
        environ=home_env(tmp_path),
    )  # fmt: skip
    assert result.returncode == 2, result.stdout + result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "does not exist" in result.stderr
    assert not (tmp_path / "missing").exists()
    assert result.stdout == ""


# --- 5. bounds on numeric settings ----------------------------------------------------------------

BAD_NUMBERS = {
    "grace negative, read as a value": (["--grace", "-1,2"], "grace"),
    "grace infinite": (["--grace", "1,inf"], "grace"),
    "grace above the maximum": (["--grace", "2,3601"], "3600"),
    "grace nan": (["--grace", "nan,1"], "grace"),
    "workers zero": (["--workers", "0"], "workers"),
    "workers negative, read as a value": (["--workers", "-3"], "workers"),
    "workers above 4 per cpu": (["--workers", str(4 * (os.cpu_count() or 1) + 1)], "per CPU"),
    "tool timeout infinite": (["--tool-timeout", "inf"], "tool-timeout"),
    "tool timeout zero": (["--tool-timeout", "0"], "tool-timeout"),
    "turn budget infinite": (["--turn-budget", "inf"], "turn-budget"),
    "turn budget negative": (["--turn-budget", "-5"], "turn-budget"),
    "max steps zero": (["--max-steps", "0"], "max-steps"),
}


@pytest.mark.parametrize("case", sorted(BAD_NUMBERS))
def test_numeric_settings_out_of_bounds_are_one_line_and_exit_2(tmp_path: Path, case: str) -> None:
    flags, word = BAD_NUMBERS[case]
    model = done_script(tmp_path)
    result = andon("run", "--model", model, *flags, "hi", cwd=tmp_path, environ=home_env(tmp_path))
    assert result.returncode == 2, result.stdout + result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert word in result.stderr and "expected one argument" not in result.stderr
    assert result.stdout == "" and not (tmp_path / "home").exists()  # refused before any session


def test_numeric_bounds_apply_to_andon_toml_and_env_too(tmp_path: Path) -> None:
    environ = home_env(tmp_path, ANDON_GRACE="1,inf")
    result = andon("run", "--model", done_script(tmp_path), "hi", cwd=tmp_path, environ=environ)
    assert result.returncode == 2 and "ANDON_GRACE" in result.stderr, result.stderr
    (tmp_path / "andon.toml").write_text("workers = 100000\n")
    result = andon("run", "--model", done_script(tmp_path), "hi", cwd=tmp_path,
                   environ=home_env(tmp_path))  # fmt: skip
    assert result.returncode == 2 and "andon.toml" in result.stderr, result.stderr


# --- 6. a kill at any moment of the start-up ------------------------------------------------------


@pytest.mark.timeout(300)
def test_a_sigkill_at_any_moment_of_the_start_leaves_no_session_or_one_resume_accepts(
    tmp_path: Path,
) -> None:
    """A CI runner's SIGKILL lands at seeded moments from exec to the first tool call. Under the
    sessions root there is then either nothing, or a session whose log ``resume`` continues: a
    folder appears only with its first record synced."""
    environ = home_env(tmp_path)
    model = one_tool_script(tmp_path, "sleep 5")
    rng = random.Random(20261203)
    delays = sorted(rng.uniform(0.0, 1.5) for _ in range(16))

    def one(delay: float) -> list[Any]:
        tag = secrets.token_hex(8)
        proc = start(
            "run", "--json", "--model", model, "build", cwd=tmp_path,
            environ={**environ, "ANDON_KILL_CASE": tag},
        )  # fmt: skip
        try:
            time.sleep(delay)  # sleep-ok: the kill's moment is the thing under test
            os.kill(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        # The workers see their supervisor die and end their calls' processes.
        return alive_after(procs.tagged(f"ANDON_KILL_CASE={tag}".encode()), timeout=10.0)

    with ThreadPoolExecutor(max_workers=4) as pool:
        left = [p for found in pool.map(one, delays) for p in found]
    assert left == []
    root = tmp_path / "home" / "sessions"
    named = [p for p in root.iterdir() if not p.name.startswith(".")] if root.exists() else []
    resumed = script(tmp_path / "resumed.json", [{"text": "Resumed."}])
    for session in named:
        assert (session / "events.jsonl").is_file(), f"{session.name}: a folder without a log"
        again = andon("resume", "--model", resumed, session.name, "go on", cwd=tmp_path,
                      environ=environ)  # fmt: skip
        assert again.returncode == 0, f"{session.name}: {again.stderr}"
    listed = andon("sessions", "--json", cwd=tmp_path, environ=environ)
    assert listed.returncode == 0
    ids = {json.loads(line)["session_id"] for line in listed.stdout.splitlines()}
    assert ids == {p.name for p in named}  # hidden leftovers of a kill are never listed


# --- 7. the pool's socket is out of the tools' reach too ----------------------------------------


@pytest.mark.timeout(120)
def test_a_tool_that_empties_tmp_does_not_cut_the_pool_off(tmp_path: Path) -> None:
    """A CI clean-up's ``rm -rf /tmp/*`` (here: the run's own TMPDIR) in a tool, then a worker
    lost: the replacement must still reach the pool, whose socket folder lives beside the
    sessions root (or in XDG_RUNTIME_DIR), never in the temporary folder the tools share."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    model = script(
        tmp_path / "wipe.json",
        [
            {"tool_calls": [{"name": "bash", "arguments": {"command": 'rm -rf "$TMPDIR"/*'}}]},
            {"tool_calls": [{"name": "bash", "arguments": {"command": "kill -9 $PPID"}}]},
            {"tool_calls": [{"name": "bash", "arguments": {"command": "echo still-reachable"}}]},
            {"text": "Done."},
        ],
    )
    environ = {k: v for k, v in home_env(tmp_path, TMPDIR=str(tmp)).items()}
    environ.pop("XDG_RUNTIME_DIR", None)
    result = andon("run", "--json", "--workers", "1", "--model", model, "go", cwd=tmp_path,
                   environ=environ)  # fmt: skip
    assert result.returncode == 0, result.stderr
    results = [
        e["data"] for e in map(json.loads, result.stdout.splitlines()) if e["type"] == "tool/result"
    ]
    assert results[1]["error"]["code"] == "WORKER_LOST"  # the tool killed its worker
    assert results[2]["content"].startswith("still-reachable"), results[2]
    assert (tmp_path / "home" / "run").is_dir()


@pytest.mark.timeout(120)
def test_two_runs_creating_the_same_session_one_wins_and_the_other_leaves_nothing(
    tmp_path: Path,
) -> None:
    """Two ``andon run --session S`` for a new S at once: one creates and runs it; the other is
    refused with one line and exit 2 (whether it lost the creation or found S live), and leaves no
    hidden folder behind."""
    session = tmp_path / "s"
    model = one_tool_script(tmp_path, "sleep 1")
    args = ("run", "--session", str(session), "--model", model, "go")
    procs_ = [start(*args, cwd=tmp_path, environ=home_env(tmp_path)) for _ in range(2)]
    outcomes = [(p.wait(timeout=60), p.communicate(timeout=60)[1]) for p in procs_]
    codes = sorted(code for code, _ in outcomes)
    assert codes == [0, 2], outcomes
    refused = next(err for code, err in outcomes if code == 2)
    lines = [line for line in refused.splitlines() if line.strip()]
    assert len(lines) == 1, refused
    assert "another process" in lines[0] or "is live" in lines[0], refused
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    check = andon("check", str(session), cwd=tmp_path, environ=home_env(tmp_path))
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.timeout(120)
def test_a_deep_tmpdir_still_starts_workers(tmp_path: Path) -> None:
    """A CI runner's TMPDIR deep in its workspace: a socket path under it would be past
    AF_UNIX's 107 bytes ("AF_UNIX path too long"), which once failed every start. The forkserver
    is reached over a socket pair (no path), and the pool's own socket folder is a short one."""
    tmp = tmp_path / ("t" * 90)
    tmp.mkdir()
    model = script(
        tmp_path / "deep.json",
        [{"tool_calls": [{"name": "bash", "arguments": {"command": "echo ran"}}]}, {"text": "ok"}],
    )
    environ = home_env(tmp_path, TMPDIR=str(tmp))
    result = andon("run", "--json", "--workers", "1", "--model", model, "go", cwd=tmp_path,
                   environ=environ)  # fmt: skip
    assert result.returncode == 0, result.stderr
    (outcome,) = [
        e["data"] for e in map(json.loads, result.stdout.splitlines()) if e["type"] == "tool/result"
    ]
    assert outcome["content"].startswith("ran"), outcome
