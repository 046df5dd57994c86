"""A long job to its end from the command line (docs/agent-loop.md, Compaction): 200 steps of
8 KB tool output under ``--context-window 16000``, against a server that refuses any request over
its window in each provider's shape. No request goes over, the log checks, and ``andon resume``
goes on from the compacted history, sending the same request prefix."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from andon.llm import SUMMARY_MARKER
from andon.testing import MockModelServer
from tests.cli.support import ANDON, assert_balanced, env, records

SUMMARY = "Summary: the job printed 8 KB blocks with bash, one a step; every one exited 0."


def _job(steps: int, size: int) -> list[dict[str, Any]]:
    command = f"printf '%{size}s' | tr ' ' a"
    replies: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "bash", "arguments": {"command": command}}]} for _ in range(steps)
    ]
    return [*replies, {"text": "all blocks printed"}]


def _andon(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ANDON, *args],
        cwd=cwd,
        env=env(),
        capture_output=True,
        text=True,
        timeout=500,
        stdin=subprocess.DEVNULL,
    )


def _steps(server: MockModelServer) -> list[list[dict[str, Any]]]:
    """The messages of every step request the server answered (summary requests left out)."""
    return [
        r.body["messages"]
        for r in server.requests
        if r.path.endswith("/chat/completions")
        and SUMMARY_MARKER not in json.dumps(r.body["messages"][-1])
    ]


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "shape", ["openai", "deepseek", "vllm", "llamacpp", "llama-cpp-python", "empty-stream"]
)
def test_a_200_step_job_completes_within_the_window_and_resumes(tmp_path: Path, shape: str) -> None:
    session = tmp_path / "session"
    window = ["--context-window", "16000"]
    with MockModelServer(
        _job(200, 8192), context_window=16000, overflow_shape=shape, summaries=SUMMARY
    ) as server:
        done = _andon(
            "run", "--model", f"{server.base_url}#mock", *window, "--session", str(session),
            "print 200 blocks of 8 KB", cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        assert server.overflows == 0, f"{server.overflows} requests were over the window"
        assert server.largest_prompt_tokens <= 16000
        last = _steps(server)[-1]
    log = records(session)
    types = [r["type"] for r in log]
    assert types.count("tool/result") == 200
    assert "context/trimmed" in types and "context/compacted" in types
    assert_balanced(session)

    with MockModelServer(
        [{"text": "resumed"}], context_window=16000, overflow_shape=shape, summaries=SUMMARY
    ) as server:
        again = _andon(
            "resume", str(session), "and now?", "--model", f"{server.base_url}#mock", *window,
            cwd=tmp_path,
        )  # fmt: skip
        assert again.returncode == 0, again.stderr[-3000:]
        (first,) = _steps(server)
    # The same prefix: what the last request held, then the reply to it, then the new message.
    assert first[: len(last)] == last
    assert first[len(last)]["content"] == "all blocks printed"
    assert first[-1]["content"] == "and now?"
    assert_balanced(session)


def test_a_session_whose_last_turn_overflowed_is_compacted_before_it_goes_on(
    tmp_path: Path,
) -> None:
    session = tmp_path / "session"
    refusal = {
        "error": {
            "status": 400,
            "message": "This model's maximum context length is 6000 tokens. However, you "
            "requested 9000 tokens (9000 in the messages, None in the completion).",
        }
    }
    prose = "The step went through; the log is long and says so at length. " * 25
    steps = [
        {"text": prose, "tool_calls": [{"name": "bash", "arguments": {"command": "echo ok"}}]}
        for _ in range(3)
    ]
    # Refused, then the summary call that would make room is refused too: the turn overflows.
    with MockModelServer([*steps, refusal, refusal]) as server:
        done = _andon(
            "run", "--model", f"{server.base_url}#mock", "--session", str(session), "go",
            cwd=tmp_path,
        )  # fmt: skip
    assert done.returncode == 7, done.stderr
    assert "context/compacted" not in [r["type"] for r in records(session)]
    with MockModelServer([{"text": "went on"}], summaries=SUMMARY) as server:
        again = _andon(
            "resume", str(session), "go on", "--model", f"{server.base_url}#mock",
            "--context-window", "6000", cwd=tmp_path,
        )  # fmt: skip
        assert again.returncode == 0, again.stderr
        (first,) = _steps(server)
    log = records(session)
    types = [r["type"] for r in log]
    compacted = types.index("context/compacted")
    assert "turn" not in log[compacted]["data"]  # between the turns, before the new one
    assert types.index("turn/start", compacted) > compacted
    assert SUMMARY in json.dumps(first)
    assert_balanced(session)
