"""The context-window setting (docs/ci.md, Settings): flag over variable over andon.toml, bad
values as one line and exit 2, and how a run resolves the window (the setting, the known table,
the server) before the agent keeps it."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

import andon
from andon.base import ConfigError
from andon.cli._settings import Settings, resolve
from andon.cli._setup import context_window_for
from andon.fleet import WorkerPoolConfig
from andon.llm import Scripted, from_spec
from andon.testing import MockModelServer
from tests.cli.support import env, records, run, script
from tests.llm.loopback import Loopback, ok, serving


@contextlib.contextmanager
def inside(folder: Path) -> Iterator[None]:
    cwd = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(cwd)


def test_flag_over_variable_over_toml(tmp_path: Path) -> None:
    (tmp_path / "andon.toml").write_text("context-window = 8000\n")
    with inside(tmp_path):
        assert resolve({}, env={}).context_window == 8000
        environ = {"ANDON_CONTEXT_WINDOW": "16000"}
        assert resolve({}, env=environ).context_window == 16000
        assert resolve({"context_window": "2048"}, env=environ).context_window == 2048
    (tmp_path / "andon.toml").unlink()
    with inside(tmp_path):
        assert resolve({}, env={}).context_window is None


@pytest.mark.parametrize(
    ("where", "value", "said"),
    [
        ("flag", "0", "context-window must be at least 1 (got '0')"),
        ("flag", "lots", "context-window takes a whole number (got 'lots')"),
        ("flag", "4294967296", "context-window must be below 2147483648 tokens (got '4294967296')"),
        ("env", "-5", "context-window must be at least 1 (got '-5') (from ANDON_CONTEXT_WINDOW)"),
        ("toml", '"big"', "context-window takes a whole number (got 'big') (from andon.toml)"),
        ("toml", "2.5", "context-window takes a whole number (got '2.5') (from andon.toml)"),
    ],
)
def test_bad_values_are_one_line_and_exit_2(
    tmp_path: Path, where: str, value: str, said: str
) -> None:
    spec = script(tmp_path / "s.json", [{"text": "never"}])
    args = ["run", "--model", spec]
    environ = env(ANDON_HOME=str(tmp_path / "home"))
    if where == "flag":
        args += ["--context-window", value]
    elif where == "env":
        environ["ANDON_CONTEXT_WINDOW"] = value
    else:
        (tmp_path / "andon.toml").write_text(f"context_window = {value}\n")
    done = run(*args, "go", cwd=tmp_path, environ=environ)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [f"andon: {said}"]
    assert not (tmp_path / "home").exists() or not any((tmp_path / "home").rglob("events.jsonl"))


# --- resolving the window ------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def props_server(n_ctx: int) -> AsyncIterator[Loopback]:
    """llama.cpp's /props on loopback; everything else 404."""
    async with serving({"/props": ok({"default_generation_settings": {"n_ctx": n_ctx}})}) as s:
        yield s


async def test_the_setting_wins_then_the_table_then_the_server(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("DEEPSEEK_API_KEY", "k")
    monkeypatch.delenv("ANDON_API_KEY", raising=False)
    async with props_server(2048) as server:
        url = f"{server.url}/v1"

        def seen() -> list[str]:
            return [path for path, _ in server.seen]

        custom = from_spec(f"{url}#smol")
        assert await context_window_for(Settings(context_window=9000), custom) == 9000
        assert seen() == []  # a setting asks no server
        assert await context_window_for(Settings(), custom) == 2048
        assert "/props" in seen()
        flash = from_spec("deepseek-v4-flash")
        assert await context_window_for(Settings(), flash) == 1_048_576
        proxied = from_spec(f"deepseek+{url}#deepseek-v4-pro")
        asked = len(seen())
        assert await context_window_for(Settings(), proxied) == 1_048_576
        assert len(seen()) == asked  # known: nothing asked
    scripted = Scripted([])
    assert await context_window_for(Settings(), scripted) is None


async def test_a_server_that_says_nothing_gives_none() -> None:
    async with MockModelServer([]) as server:  # it answers 404 to anything but a POST
        model = from_spec(f"{server.base_url}#mock")
        assert await context_window_for(Settings(), model) is None


# --- the agent keeps it ---------------------------------------------------------------------


async def test_open_agent_keeps_the_window_and_refuses_a_bad_one(tmp_path: Path) -> None:
    pool = WorkerPoolConfig(size=1, containment="subreaper")
    async with andon.open_agent(
        tmp_path / "s", model=Scripted([]), pool=pool, context_window=4096
    ) as agent:
        assert agent.context_window == 4096
    async with andon.open_agent(tmp_path / "t", model=Scripted([]), pool=pool) as agent:
        assert agent.context_window is None
    for bad in (0, -1, 2.5, True, "4096"):
        with pytest.raises(ConfigError, match="context_window"):
            async with andon.open_agent(
                tmp_path / "u",
                model=Scripted([]),
                pool=pool,
                context_window=bad,  # type: ignore[arg-type]  # wrong on purpose
            ):
                pass
    assert not (tmp_path / "u").exists()  # refused before anything was opened


def test_a_run_against_a_server_that_says_nothing_still_runs(tmp_path: Path) -> None:
    replies: list[dict[str, Any]] = [{"text": "done"}]
    with MockModelServer(replies) as server:
        session = tmp_path / "session"
        done = run(
            "run", "--json", "--model", f"{server.base_url}#mock", "--session", str(session),
            "hi", cwd=tmp_path, environ=env(ANDON_HOME=str(tmp_path / "home")),
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["final_text"] == "done"
    assert [r["type"] for r in records(session)].count("turn/end") == 1
