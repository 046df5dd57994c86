"""`andon run --tool-timeout` end to end (docs/workers.md, Tools): the real executable, real
workers, a scripted model, and the session log it writes.

``--tool-timeout`` is the default timeout of every tool call, ``bash`` included (whose own default
is 120 s), and raises bash's cap (600 s) to at least itself; a model's larger ``timeout`` argument
is clamped to the cap and its result says so. How long a timeout is, is read from the log (the
``tool/result`` a real call wrote), never from a wall-clock figure; the agent-level tests beside
this file check the timeouts above a minute on a manual clock.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tests.cli.support import assert_balanced, records, run, script


def _bash_run(tmp_path: Path, *flags: str, **arguments: Any) -> dict[str, Any]:
    """``andon run FLAGS`` with a model that makes one bash call with ``arguments``; the data of
    the call's ``tool/result``."""
    model = script(
        tmp_path / "s.json",
        [
            {"text": "Building.", "tool_calls": [{"name": "bash", "arguments": arguments}]},
            {"text": "Done."},
        ],
    )
    session = tmp_path / "s"
    result = run(
        "run", "--json", *flags, "--model", model, "--session", str(session), "go", cwd=tmp_path
    )
    # The tool's fate is the model's to read; the turn itself completes.
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert_balanced(session)
    (data,) = [r["data"] for r in records(session) if r["type"] == "tool/result"]
    assert isinstance(data, dict)
    return data


def test_tool_timeout_ends_a_long_bash_call_as_tool_timeout(tmp_path: Path) -> None:
    began = time.monotonic()
    data = _bash_run(tmp_path, "--tool-timeout", "1", "--grace", "1,1", command="sleep 30")
    elapsed = time.monotonic() - began
    assert data["error"]["code"] == "TOOL_TIMEOUT", data
    assert data["error"]["message"] == "tool call timed out after 1s"
    assert data["ended_by"].startswith("timeout-")
    assert "[timed out after 1s" in data["content"]
    # Not a latency figure: only that the 30 s command did not run to its end (bash's own
    # 120 s default did not win over --tool-timeout).
    assert elapsed < 25, elapsed


def test_a_model_timeout_over_bashs_cap_is_clamped_and_the_result_says_so(
    tmp_path: Path,
) -> None:
    data = _bash_run(tmp_path, command="echo built", timeout=900)
    assert "error" not in data and data["exit"] == {"code": 0, "signal": None}
    assert data["content"].splitlines() == [
        "built",
        "[exit code 0]",
        "[timeout: 900s asked, capped at 600s (the most bash may run here)]",
    ]


def test_tool_timeout_raises_bashs_cap_to_itself(tmp_path: Path) -> None:
    data = _bash_run(tmp_path, "--tool-timeout", "900", command="echo built", timeout=1000)
    assert data["content"].endswith(
        "[exit code 0]\n[timeout: 1000s asked, capped at 900s (the most bash may run here)]"
    ), data["content"]


def test_a_model_timeout_within_the_raised_cap_is_not_clamped(tmp_path: Path) -> None:
    # 700 s is over bash's own cap but under --tool-timeout 900: it is what the call runs with
    # (tests/supervisor/test_tool_timeouts.py sees it time out at 700 s), so nothing is said.
    data = _bash_run(tmp_path, "--tool-timeout", "900", command="echo built", timeout=700)
    assert data["content"] == "built\n[exit code 0]"
