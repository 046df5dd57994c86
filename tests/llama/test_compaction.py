"""Compaction against the real llama.cpp server (SmolLM2-135M, a 2,048-token window): a session
that outgrows the window goes on after a summary the real model wrote, and a prompt too long for
any compaction is one clear line and exit 7, never ``STREAM_TRUNCATED`` (docs/agent-loop.md,
Compaction)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.cli.support import ANDON, env
from tests.llamaserver import LlamaServer

pytestmark = [pytest.mark.timeout(600), pytest.mark.slow]

# Prose the model reads, and a short answer it is asked for (the tiny model keeps it short).
NOTES = (
    "Build note {n}: the compiler ran over the parser, the lexer and the code generator; every "
    "unit compiled, the linker joined them, and the tests of this part passed on the runner. "
) * 6


def _andon(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ANDON, *args],
        cwd=cwd,
        env=env(ANDON_HOME=str(cwd / "home")),
        capture_output=True,
        text=True,
        timeout=500,
        stdin=subprocess.DEVNULL,
    )


def _records(session: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (session / "events.jsonl").read_text().splitlines()]


def test_a_session_that_outgrows_the_window_goes_on_after_a_summary(
    llama_server: LlamaServer, tmp_path: Path
) -> None:
    session = tmp_path / "session"
    options = ["--model", llama_server.spec, "--context-window", "2048"]
    prompts = [f"{NOTES.format(n=n)}\nReply with one word: noted." for n in range(1, 7)]
    done = _andon("run", *options, "--session", str(session), prompts[0], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    for prompt in prompts[1:]:
        again = _andon("resume", str(session), prompt, *options, cwd=tmp_path)
        assert again.returncode == 0, again.stderr
        if any(r["type"] == "context/compacted" for r in _records(session)):
            break
    log = _records(session)
    compacted = [r["data"] for r in log if r["type"] == "context/compacted"]
    assert compacted, "six notes of ~200 tokens never outgrew a 2,048-token window"
    assert compacted[0]["summary"].strip() and compacted[0]["model"] == "smol"
    ends = [r["data"]["reason"]["kind"] for r in log if r["type"] == "turn/end"]
    assert set(ends) == {"completed"}
    check = _andon("check", str(session), cwd=tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_prompt_too_long_for_the_window_is_one_line_and_exit_7(
    llama_server: LlamaServer, tmp_path: Path
) -> None:
    prompt = " ".join(NOTES.format(n=n) for n in range(12))  # ~2,700 tokens by itself
    done = _andon(
        "run", "--model", llama_server.spec, "--context-window", "2048", "--json", prompt,
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 7, done.stderr
    summary = json.loads(done.stdout.splitlines()[-1])
    assert summary["ended"]["error"]["code"] == "CONTEXT_OVERFLOW"
    assert "STREAM_TRUNCATED" not in done.stdout + done.stderr
    message = summary["ended"]["error"]["message"]
    assert "2048-token context window" in message and "\n" not in message
