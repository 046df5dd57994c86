"""``andon run`` against the real llama.cpp server: a short job completes end to end."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.cli.support import ANDON, env
from tests.llamaserver import LlamaServer

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]


def test_a_short_real_run_completes(llama_server: LlamaServer, tmp_path: Path) -> None:
    home = tmp_path / "home"
    result = subprocess.run(
        [ANDON, "run", "--json", "--model", llama_server.spec, "say hi"],
        cwd=tmp_path,
        env=env(ANDON_HOME=str(home)),
        capture_output=True,
        text=True,
        # SmolLM2 answers "say hi" in a sentence (2-3 s here); the bound is for a loaded machine
        # and a model that rambles on (andon sends no max_tokens: up to the 2,048-token window).
        timeout=240,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines()]
    summary = events[-1]
    assert summary["type"] == "run/summary"
    assert summary["ended"] == {"kind": "completed"} and summary["exit_code"] == 0
    assert summary["final_text"].strip()
    request = next(e for e in events if e["type"] == "llm/request")
    assert request["data"]["model"] == "smol"
    check = subprocess.run(
        [ANDON, "check", summary["session"]],
        env=env(),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert check.returncode == 0, check.stdout + check.stderr
