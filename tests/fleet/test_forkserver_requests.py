"""What a worker's start takes to the forkserver, and what it leaves out (docs/workers.md,
Starting workers): a tool defined in a user's script reaches the worker without an import path
(pickled by value, with dill, then only), a tool of an importable module goes by its name, and a
pool of importable tools loads neither dill nor ``multiprocess`` (andon has its own forkserver,
and no resource tracker)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import asyncio, json, os, sys
import andon.tools
from andon.fleet import WorkerPool, WorkerPoolConfig
from andon.supervisor import ToolCallRequest, ToolExecutor
from tests.workers.support import start

def shout(text: str) -> str:
    # Found by its name in this script: by reference it would name the worker's __main__.
    import os  # the worker's __main__ is not this script: its globals are not there
    return text.upper() + "!!! from " + str(os.getpid())

async def main(which: str) -> None:
    registry = andon.tools.default()
    if which == "own":
        registry = andon.tools.ToolRegistry([*registry, andon.tools.tool(shout)])
        request = ToolCallRequest("c1-1-1", "shout", json.dumps({"text": "hi"}), os.getcwd())
    elif which == "module":
        from tests.workers.pytools import env_probe  # @tool at module level
        registry = andon.tools.ToolRegistry([*registry, env_probe])
        arguments = json.dumps({"name": "ANDON_PROBE"})
        request = ToolCallRequest("c1-1-1", "env_probe", arguments, os.getcwd())
    else:
        request = ToolCallRequest("c1-1-1", "bash", json.dumps({"command": "echo hi"}), os.getcwd())
    async with WorkerPool(WorkerPoolConfig(size=1), registry) as pool:
        executor = ToolExecutor(pool, registry)
        task, _, _ = await start(executor, request)
        outcome = await asyncio.wait_for(task, 30)
    loaded = sorted({"dill", "multiprocess"} & set(sys.modules))
    print(json.dumps({"content": outcome.content, "error": outcome.error is not None,
                      "loaded": loaded, "me": os.getpid()}))

asyncio.run(main(sys.argv[1]))
"""


def _run(tmp_path: Path, which: str) -> dict[str, object]:
    script = tmp_path / "user_script.py"  # not importable by any worker: it is their __main__
    script.write_text(SCRIPT)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, str(script), which],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": path, "ANDON_PROBE": "probed"},
        capture_output=True,
        text=True,
        timeout=50,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.timeout(60)
def test_a_tool_defined_in_the_users_script_runs_in_a_worker(tmp_path: Path) -> None:
    result = _run(tmp_path, "own")
    assert result["error"] is False, result
    content = str(result["content"])
    assert content.startswith("HI!!! from "), content
    assert content.removeprefix("HI!!! from ").split()[0] != str(result["me"])  # in a worker
    assert result["loaded"] == ["dill"]  # by value, so dill; never multiprocess


@pytest.mark.timeout(60)
def test_importable_tools_load_neither_dill_nor_multiprocess(tmp_path: Path) -> None:
    result = _run(tmp_path, "default")
    assert result["error"] is False, result
    assert str(result["content"]).startswith("hi"), result
    assert result["loaded"] == []


@pytest.mark.timeout(60)
def test_a_tool_of_an_importable_module_goes_by_name(tmp_path: Path) -> None:
    """``@tool`` at a module's top level: the worker imports the module and takes that tool, so
    no function is pickled by value and dill is not loaded."""
    result = _run(tmp_path, "module")
    assert result["error"] is False, result
    assert result["content"] == "probed", result
    assert result["loaded"] == []
