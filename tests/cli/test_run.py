"""`andon run` / `andon resume` end to end: the real executable, real workers, real signals.

Each run starts in its own session (``start_new_session=True``) and gets its signals by pid, as a CI
runner sends them. Readiness is read from the child's ``--json`` lines (a ``tool/output`` event
means the long tool is running), never waited for with a sleep.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from andon.testing import MockModelServer
from tests.cli.support import (
    ANDON,
    LONG,
    STUBBORN,
    assert_balanced,
    env,
    finish,
    is_tool_output,
    long_script,
    read_until,
    records,
    run,
    script,
    start,
)


def test_completed_run_exits_0_with_the_transcript(tmp_path: Path) -> None:
    model = script(
        tmp_path / "s.json",
        [
            {
                "text": "Checking.",
                "tool_calls": [{"name": "bash", "arguments": {"command": "echo built-ok"}}],
            },
            {"text": "All green."},
        ],
    )
    home = tmp_path / "home"
    result = run(
        "run", "--model", model, "build it", cwd=tmp_path, environ=env(ANDON_HOME=str(home))
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"andon: session {home / 'sessions'}/")
    session = Path(lines[0].split()[-1])
    assert "Checking." in result.stdout and "built-ok" in result.stdout
    assert "All green." in result.stdout and "[exit code 0]" in result.stdout
    assert "ended completed, exit 0" in result.stderr and "Traceback" not in result.stderr
    log = run("log", str(session), cwd=tmp_path)
    assert "build it" in log.stdout and "All green." in log.stdout
    assert_balanced(session)


def test_json_is_one_object_per_line_ending_with_the_summary(tmp_path: Path) -> None:
    model = script(
        tmp_path / "s.json",
        [{"text": "Hi.", "usage": {"prompt_tokens": 7, "completion_tokens": 2}}],
    )
    session = tmp_path / "s"
    result = run(
        "run", "--json", "--model", model, "--session", str(session), "hello", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines()]
    assert all(isinstance(e, dict) and "type" in e for e in events)
    summary = events[-1]
    assert summary == {
        "type": "run/summary",
        "session": str(session),
        "session_id": records(session)[0]["data"]["session_id"],
        "exit_code": 0,
        "turns": 1,
        "tool_calls": 0,
        "duration": summary["duration"],
        "final_text": "Hi.",
        "usage": {"prompt_tokens": 7, "completion_tokens": 2, "cached_prompt_tokens": 0},
        "ended": {"kind": "completed"},
    }
    logged = [e for e in events if "seq" in e]
    assert logged == records(session)  # every log record, in order
    assert any(e["type"] == "agent/status" for e in events)
    assert f"session {session}" in result.stderr


def test_sigint_exits_130_within_the_grace_bound(tmp_path: Path, killer: list[Any]) -> None:
    session = tmp_path / "s"
    proc = start(
        "run",
        "--json",
        "--grace",
        "2,2",
        "--model",
        long_script(tmp_path),
        "--session",
        str(session),
        "go",
        cwd=tmp_path,
    )
    killer.append(proc)
    read_until(proc, is_tool_output)
    sent = time.monotonic()
    os.kill(proc.pid, signal.SIGINT)
    code, events, err = finish(proc)
    assert code == 130, err
    assert time.monotonic() - sent < 4 + 5  # the grace bound (2 + 2) plus slack for slow machines
    assert "stopping (SIGINT, cause user)" in err and "Traceback" not in err
    assert events[-1]["type"] == "run/summary" and events[-1]["exit_code"] == 130
    end = [r for r in records(session) if r["type"] == "turn/end"][-1]
    assert end["data"]["reason"] == {"kind": "aborted", "reason": {"kind": "user"}}
    assert_balanced(session)


def test_second_sigint_kills_at_once(tmp_path: Path, killer: list[Any]) -> None:
    session = tmp_path / "s"
    proc = start(
        "run",
        "--json",
        "--grace",
        "30,30",
        "--model",
        long_script(tmp_path, STUBBORN),
        "--session",
        str(session),
        "go",
        cwd=tmp_path,
    )
    killer.append(proc)
    read_until(proc, is_tool_output)
    os.kill(proc.pid, signal.SIGINT)
    read_until(proc, lambda e: e.get("type") == "tool/signal" and e["data"]["stage"] == "interrupt")
    sent = time.monotonic()
    os.kill(proc.pid, signal.SIGINT)
    code, _, err = finish(proc)
    assert code == 130, err
    assert time.monotonic() - sent < 10  # far inside the 30 s grace: the kill did not wait for it
    assert "SIGINT again: killing" in err
    result = next(r for r in records(session) if r["type"] == "tool/result")
    assert result["data"]["ended_by"] == "kill"
    assert_balanced(session)


def test_a_forced_stop_announces_what_it_does(tmp_path: Path, killer: list[Any]) -> None:
    # The force sends every stage left at once (docs/workers.md, The grace policy): the SIGTERM
    # it sends on the way must not announce a KILL countdown that will not run.
    session = tmp_path / "s"
    proc = start(
        "run",
        "--json",
        "--grace",
        "3,10",
        "--model",
        long_script(tmp_path, STUBBORN),
        "--session",
        str(session),
        "go",
        cwd=tmp_path,
    )
    killer.append(proc)
    read_until(proc, is_tool_output)
    os.kill(proc.pid, signal.SIGINT)
    read_until(proc, lambda e: e.get("type") == "tool/signal" and e["data"]["stage"] == "interrupt")
    os.kill(proc.pid, signal.SIGINT)
    code, _, err = finish(proc)
    assert code == 130, err
    after = err.split("SIGINT again: killing 1 tool process group now\n", 1)[1]
    assert "SIGKILL in" not in after, err
    assert re.search(
        r"stopping: SIGTERM sent to \d+ process(es)? of \S+; SIGKILL at once \(forced\)", after
    ), err
    stages = {
        r["data"]["stage"]: r["data"]["at"] for r in records(session) if r["type"] == "tool/signal"
    }
    # What the line said is what the log shows: KILL went with TERM, not 10 s after it.
    assert stages["kill"] - stages["term"] < 10, stages
    assert_balanced(session)


@pytest.mark.parametrize(("signum", "expected"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_sigterm_and_sighup_dispose_and_exit_128_plus_n(
    tmp_path: Path, killer: list[Any], signum: int, expected: int
) -> None:
    session = tmp_path / "s"
    proc = start(
        "run",
        "--json",
        "--grace",
        "1,1",
        "--model",
        long_script(tmp_path),
        "--session",
        str(session),
        "go",
        cwd=tmp_path,
    )
    killer.append(proc)
    read_until(proc, is_tool_output)
    os.kill(proc.pid, signum)
    code, events, err = finish(proc)
    assert code == expected, err
    assert events[-1]["exit_code"] == expected
    end = [r for r in records(session) if r["type"] == "turn/end"][-1]
    assert end["data"]["reason"] == {"kind": "aborted", "reason": {"kind": "disposed"}}
    assert_balanced(session)


def test_turn_budget_exits_5(tmp_path: Path) -> None:
    session = tmp_path / "s"
    result = run(
        "run",
        "--grace",
        "1,1",
        "--turn-budget",
        "1",
        "--model",
        long_script(tmp_path),
        "--session",
        str(session),
        "go",
        cwd=tmp_path,
    )
    assert result.returncode == 5, result.stderr
    assert "turn budget exceeded" in result.stdout + result.stderr
    assert_balanced(session)


async def test_resume_after_sigkill_repairs_and_continues(
    tmp_path: Path, killer: list[Any]
) -> None:
    replies: list[dict[str, Any]] = [
        {"text": "Building.", "tool_calls": [{"name": "bash", "arguments": {"command": LONG}}]},
        {"text": "Picking up after the crash."},
    ]
    session = tmp_path / "s"
    async with MockModelServer(replies) as server:
        spec = f"{server.base_url}#mock"
        proc = start(
            "run", "--json", "--model", spec, "--session", str(session), "build", cwd=tmp_path
        )
        killer.append(proc)
        read_until(proc, is_tool_output)
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate()
        result = run("resume", str(session), "carry on", cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert "Picking up after the crash." in result.stdout
        body = server.requests[-1].body
    logged = records(session)
    assert any(r["type"] == "session/repaired" for r in logged)
    starts = [r["data"]["turn"] for r in logged if r["type"] == "turn/start"]
    assert starts == [1, 2]
    messages = body["messages"]
    calls = [
        c["id"] for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or []
    ]
    answered = [m["tool_call_id"] for m in messages if m["role"] == "tool"]
    assert calls == ["c1-1-1"] and answered == calls
    assert messages[-1] == {"role": "user", "content": "carry on"}
    assert_balanced(session)


def test_closed_stdout_disposes_quietly(tmp_path: Path) -> None:
    session = tmp_path / "s"
    model = long_script(tmp_path)
    cmd = f"{ANDON} run --json --grace 1,1 --model {model} --session {session} go | head -1"
    result = subprocess.run(
        ["bash", "-c", cmd], cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0
    assert json.loads(result.stdout)["type"] == "session/start"
    assert "Traceback" not in result.stderr and "Broken pipe" not in result.stderr
    end = [r for r in records(session) if r["type"] == "turn/end"][-1]
    assert end["data"]["reason"]["reason"] == {"kind": "disposed"}
    assert_balanced(session)


def test_max_tokens_exits_4(tmp_path: Path) -> None:
    model = script(tmp_path / "s.json", [{"text": "cut sho", "finish": "length"}])
    environ = env(ANDON_HOME=str(tmp_path / "home"))
    result = run("run", "--model", model, "write a novel", cwd=tmp_path, environ=environ)
    assert result.returncode == 4, result.stderr
    assert "ended max-tokens" in result.stderr


@pytest.mark.parametrize(
    ("reason", "code"),
    [
        ({"kind": "completed"}, 0),
        ({"kind": "error", "error": {"code": "SERVER", "message": "500"}}, 1),
        ({"kind": "blocked", "by": "policy"}, 3),
        ({"kind": "max-tokens"}, 4),
        ({"kind": "aborted", "reason": {"kind": "hook", "reason": "turn budget exceeded"}}, 5),
        ({"kind": "aborted", "reason": {"kind": "user"}}, 1),  # a signal decides before this
        ({"kind": "interrupted"}, 1),
    ],
)
def test_exit_code_follows_the_last_turn_end(reason: dict[str, Any], code: int) -> None:
    from andon.cli._run import exit_code_for
    from andon.session import reason_from_json

    assert exit_code_for(reason_from_json(reason)) == code


def test_no_turn_is_a_success() -> None:
    from andon.cli._run import exit_code_for

    assert exit_code_for(None) == 0


MISTAKES = {
    "unknown flag": (["run", "--frobnicate", "x"], {}),
    "missing model": (["run", "x"], {}),
    "missing key": (["run", "--model", "deepseek-v4-flash", "x"], {}),
    "unknown model spec": (["run", "--model", "gpt-9000", "x"], {}),
    "unreadable script": (["run", "--model", "script:nope.yaml", "x"], {}),
    "invalid script": (["run", "--model", "script:bad.yaml", "x"], {}),
    "bad grace": (["run", "--model", "script:ok.yaml", "--grace", "soon", "x"], {}),
    "bad setting in env": (["run", "--model", "script:ok.yaml", "x"], {"ANDON_WORKERS": "0"}),
    "no prompt": (["run", "--model", "script:ok.yaml"], {}),
    "resume nothing to run": (["resume", "done"], {}),
    "resume no session": (["resume", "missing"], {}),
}


@pytest.mark.parametrize("case", sorted(MISTAKES))
def test_user_mistakes_are_one_line_and_exit_2(tmp_path: Path, case: str) -> None:
    args, extra = MISTAKES[case]
    (tmp_path / "bad.yaml").write_text("replies:\n  - tool_calls: 5\n")
    ok = script(tmp_path / "ok.yaml", [{"text": "ok"}])
    if case == "resume nothing to run":
        assert run("run", "--model", ok, "--session", "done", "hi", cwd=tmp_path).returncode == 0
    environ = env(ANDON_HOME=str(tmp_path / "home"), **extra)
    environ.pop("DEEPSEEK_API_KEY", None)
    result = run(*args, cwd=tmp_path, environ=environ)
    assert result.returncode == 2, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert result.stderr.startswith("andon: ") and "Traceback" not in result.stderr
    assert result.stdout == ""


def test_a_session_live_in_another_process_is_refused(tmp_path: Path, killer: list[Any]) -> None:
    session = tmp_path / "s"
    model = long_script(tmp_path)
    proc = start(
        "run",
        "--json",
        "--grace",
        "1,1",
        "--model",
        model,
        "--session",
        str(session),
        "go",
        cwd=tmp_path,
    )
    killer.append(proc)
    read_until(proc, is_tool_output)
    second = run("run", "--model", model, "--session", str(session), "me too", cwd=tmp_path)
    assert second.returncode == 2
    assert str(proc.pid) in second.stderr
    assert len(second.stderr.strip().splitlines()) == 1 and "Traceback" not in second.stderr
    os.kill(proc.pid, signal.SIGTERM)
    assert finish(proc)[0] == 143
    assert_balanced(session)


def test_settings_come_from_andon_toml_and_env_and_flags_win(tmp_path: Path) -> None:
    good = script(tmp_path / "good.json", [{"text": "from the flag"}])
    (tmp_path / "andon.toml").write_text('model = "script:nope.yaml"\nworkers = 1\n')
    home = str(tmp_path / "home")
    refused = run("run", "x", cwd=tmp_path, environ=env(ANDON_HOME=home))
    assert refused.returncode == 2  # the toml's model is used, and refused
    environ = env(ANDON_MODEL=good, ANDON_HOME=home)
    result = run("run", "x", cwd=tmp_path, environ=environ)
    assert result.returncode == 0 and "from the flag" in result.stdout
    environ = env(ANDON_MODEL="script:nope", ANDON_HOME=home)
    result = run("run", "--model", good, "x", cwd=tmp_path, environ=environ)
    assert result.returncode == 0, result.stderr


def test_the_ci_build_example_goes_red_then_green(tmp_path: Path) -> None:
    # The example works relative to the repository root; a link makes tmp_path look like one, so
    # the scratch copy lands under tmp_path/.andon and the repository is never touched.
    examples = Path(__file__).resolve().parents[2] / "examples"
    (tmp_path / "examples").symlink_to(examples)
    model = "script:examples/ci-build/script.yaml"
    environ = env(ANDON_HOME=str(tmp_path / "home"))
    result = run("run", "--model", model, "The build is red: fix it", cwd=tmp_path, environ=environ)
    assert result.returncode == 0, result.stderr
    assert "[exit code 1]" in result.stdout and "2 failed" in result.stdout
    assert result.stdout.rstrip().endswith("ended: completed")
    assert "3 passed, 0 failed" in result.stdout
    assert "5 tool calls" in result.stderr


def test_sigint_to_one_run_leaves_another_runs_same_call_id_running(
    tmp_path: Path, killer: list[Any]
) -> None:
    # Two andon processes on one machine, each with its call c1-1-1. Stopping one must leave
    # the other's tool running to its own end (it waits on a gate the test opens afterwards).
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    command = f"echo ready; read word < {gate}; echo finished $word"
    theirs = start(
        "run",
        "--json",
        "--model",
        script(
            tmp_path / "theirs.json",
            [
                {
                    "text": "Waiting.",
                    "tool_calls": [{"name": "bash", "arguments": {"command": command}}],
                },
                {"text": "Done."},
            ],
        ),
        "--session",
        str(tmp_path / "theirs"),
        "wait",
        cwd=tmp_path,
    )
    killer.append(theirs)
    read_until(theirs, is_tool_output)
    mine = start(
        "run",
        "--json",
        "--grace",
        "1,1",
        "--model",
        long_script(tmp_path, STUBBORN),  # needs the whole ladder: SIGINT, SIGTERM, SIGKILL
        "--session",
        str(tmp_path / "mine"),
        "go",
        cwd=tmp_path,
    )
    killer.append(mine)
    read_until(mine, is_tool_output)
    os.kill(mine.pid, signal.SIGINT)
    code, _, _ = finish(mine)
    assert code == 130
    assert theirs.poll() is None
    fd = os.open(gate, os.O_WRONLY)  # the other run's tool is still there to read it
    try:
        os.write(fd, b"normally\n")
    finally:
        os.close(fd)
    code, events, err = finish(theirs)
    assert code == 0, err
    (result,) = [e["data"] for e in events if e.get("type") == "tool/result"]
    assert result["exit"] == {"code": 0, "signal": None}
    assert "finished normally" in result["content"]
    assert_balanced(tmp_path / "mine")
    assert_balanced(tmp_path / "theirs")


def test_log_shows_the_head_and_the_tail_of_a_long_output(tmp_path: Path) -> None:
    command = "for i in $(seq 1 40); do echo line-$i; done; echo 'error: the build failed'; exit 1"
    model = script(
        tmp_path / "s.json",
        [{"tool_calls": [{"name": "bash", "arguments": {"command": command}}]}, {"text": "red"}],
    )
    session = tmp_path / "s"
    done = run("run", "--session", str(session), "--model", model, "go", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    shown = run("log", str(session), cwd=tmp_path).stdout
    assert "| line-1\n" in shown and "| line-4\n" in shown and "| line-5\n" not in shown
    # 41 lines and a status line: 4 + 30 + 8; the log holds the whole output, so it is counted
    assert "| … 30 lines of the output omitted …" in shown
    assert "| error: the build failed" in shown and "| [exit code 1]" in shown


@pytest.mark.timeout(180)
def test_sigterm_with_ten_thousand_queued_calls_exits_143_within_the_grace(
    tmp_path: Path,
) -> None:
    # One reply with 10,000 bash calls (exclusive: one runs, the rest are queued). A stop writes
    # the queued calls' records as one batch; it once took ~20 s, a record or two at a time.
    calls = [{"name": "bash", "arguments": {"command": "echo up; exec sleep 60"}}] * 10_000
    model = script(tmp_path / "many.json", [{"text": "All of them.", "tool_calls": calls}])
    session = tmp_path / "s"
    proc = start(
        *("run", "--json", "--workers", "2", "--grace", "1,1", "--model", model),
        *("--session", str(session), "check everything"),
        cwd=tmp_path,
    )
    try:
        read_until(proc, is_tool_output)
        began = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        code, events, err = finish(proc, timeout=120)
        took = time.monotonic() - began
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert code == 143, err
    assert events[-1]["type"] == "run/summary" and events[-1]["exit_code"] == 143
    assert_balanced(session)
    results = [r for r in records(session) if r["type"] == "tool/result"]
    assert len(results) == 10_000
    assert took < 2 + 28, took  # grace 1+1 s, and a generous margin for a loaded machine
