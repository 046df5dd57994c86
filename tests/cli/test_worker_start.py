"""Tool workers that start on a busy runner, a pool folder deleted under the run, and a pool that
cannot start any worker (docs/ci.md, Start-up under load; docs/workers.md, Starting workers)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from andon.cli._run import EXIT_NO_WORKER
from tests.cli.support import env, script
from tests.support import tagged_processes

ONE_CALL: list[dict[str, Any]] = [
    {"text": "Checking.", "tool_calls": [{"name": "bash", "arguments": {"command": "echo hi"}}]},
    {"text": "Done."},
]


def json_lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]


def _andon(*args: str, cwd: Path, environ: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "andon", *args],
        cwd=cwd,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )


def _check(session: str, environ: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "andon", "check", session],
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.timeout(900)
def test_twenty_runs_started_at_once_all_succeed(tmp_path: Path) -> None:
    model = script(tmp_path / "one.json", ONE_CALL)
    environ = env(ANDON_HOME=str(tmp_path / "home"))
    runs = [
        _andon("run", "--json", "--model", model, "go", cwd=tmp_path, environ=environ)
        for _ in range(20)
    ]
    try:
        results = [run.communicate(timeout=600) for run in runs]
    finally:
        for run in runs:
            if run.poll() is None:
                os.killpg(run.pid, 9)
                run.communicate(timeout=30)
    codes = [run.returncode for run in runs]
    assert codes == [0] * 20, [err for (_, err), c in zip(results, codes, strict=True) if c]
    for out, _err in results:
        summary = json_lines(out)[-1]
        assert summary["type"] == "run/summary" and summary["tool_calls"] == 1
        checked = _check(summary["session"], environ)
        assert checked.returncode == 0, checked.stdout + checked.stderr
    assert tagged_processes() == []


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # ipc paths are limited to ~100 bytes: a short folder, not pytest's deep one.
    path = Path(tempfile.mkdtemp(prefix="andon-t-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.timeout(180)
def test_a_tool_that_deletes_the_runtime_folders_and_kills_the_workers(
    tmp_path: Path, short_dir: Path
) -> None:
    # The tool wipes $TMPDIR and $XDG_RUNTIME_DIR (the pool's socket
    # and worker logs), then kills every worker of the pool (its own too: that call is lost).
    # The next call must be answered (run, here: the pool re-makes its folder) within the start
    # deadline, with no traceback on stderr.
    wipe = 'rm -rf "$TMPDIR" "$XDG_RUNTIME_DIR"; pkill -9 -P "$(ps -o ppid= -p $PPID)"'
    model = script(
        tmp_path / "wipe.json",
        [
            {"text": "Wiping.", "tool_calls": [{"name": "bash", "arguments": {"command": wipe}}]},
            {
                "text": "Again.",
                "tool_calls": [{"name": "bash", "arguments": {"command": "echo answered"}}],
            },
            {"text": "Done."},
        ],
    )
    (short_dir / "xdg").mkdir(mode=0o700)
    (short_dir / "tmp").mkdir()
    environ = env(
        ANDON_HOME=str(tmp_path / "home"),
        XDG_RUNTIME_DIR=str(short_dir / "xdg"),
        TMPDIR=str(short_dir / "tmp"),
    )
    deadline = 60
    began = time.monotonic()
    run = _andon(
        "run", "--json", "--workers", "2", "--worker-start-timeout", str(deadline),
        "--model", model, "go",
        cwd=tmp_path, environ=environ,
    )  # fmt: skip
    try:
        out, err = run.communicate(timeout=150)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, 9)
            run.communicate(timeout=30)
    took = time.monotonic() - began
    assert "Traceback" not in err, err
    lines = json_lines(out)
    results = {
        r["data"]["call_id"]: r["data"]
        for r in lines
        if r.get("type") == "tool/result" and "call_id" in r.get("data", {})
    }
    assert run.returncode == 0, err
    answered = results["c1-2-1"]
    assert not answered["is_error"] or answered["error"]["code"] == "WORKER_LOST", results
    assert took < deadline + 30, took  # answered, never retried for ever
    summary = lines[-1]
    assert summary["exit_code"] == 0 and summary["tool_calls"] == 2
    checked = _check(summary["session"], environ)
    assert checked.returncode == 0, checked.stdout


def test_a_pool_that_cannot_start_any_worker_exits_6_with_a_summary(tmp_path: Path) -> None:
    # Every forkserver dies as it starts (a broken interpreter set-up on the runner): no worker
    # can ever start. One line on stderr, a run/summary saying why, exit 6.
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os, sys\n"
        "if any('andon.workers._forkserver' in a for a in sys.orig_argv):\n"
        "    os._exit(1)\n"
    )
    model = script(tmp_path / "one.json", ONE_CALL)
    environ = env(ANDON_HOME=str(tmp_path / "home"), PYTHONPATH=str(site))
    run = _andon("run", "--json", "--model", model, "go", cwd=tmp_path, environ=environ)
    try:
        out, err = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, 9)
            run.communicate(timeout=30)
    assert run.returncode == EXIT_NO_WORKER == 6, err
    assert "Traceback" not in err
    said = [line for line in err.splitlines() if "session" not in line]
    assert len(said) == 1 and "no tool worker could be started" in said[0], err
    assert "forkserver ended as it started, twice (exit status 1)" in said[0], err
    summary = json_lines(out)[-1]
    assert summary["type"] == "run/summary" and summary["exit_code"] == 6
    assert "no tool worker could be started" in summary["failure"]
    assert summary["ended"] is None and summary["tool_calls"] == 0
    checked = _check(summary["session"], env(ANDON_HOME=str(tmp_path / "home")))
    assert checked.returncode == 0, checked.stdout


def test_the_start_deadline_is_a_setting_and_a_flag_wins(tmp_path: Path) -> None:
    from andon.cli._settings import resolve

    (tmp_path / "andon.toml").write_text("worker_start_timeout = 90\n")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert resolve({}, env={}).worker_start_timeout == 90
        environ = {"ANDON_WORKER_START_TIMEOUT": "120"}
        assert resolve({}, env=environ).worker_start_timeout == 120
        flags = {"worker_start_timeout": "30"}
        assert resolve(flags, env=environ).worker_start_timeout == 30
    finally:
        os.chdir(cwd)
    bad = subprocess.run(
        [*(sys.executable, "-m", "andon", "run"), "--worker-start-timeout", "soon", "go"],
        cwd=tmp_path,
        env=env(ANDON_HOME=str(tmp_path / "home")),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2
    assert "worker-start-timeout takes a number of seconds" in bad.stderr
