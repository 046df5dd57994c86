"""A run imports only what it needs (docs/benchmarks.md, Start-up): a scripted model loads no
HTTP stack, a run without ``--output-schema`` no JSON Schema validator, a plain (not terminal) view
no rich, a JSON script no YAML parser, and no run httpx's own command line. ``andon worker`` (every
container worker's start) imports the worker side only: not the rest of the command, not the
model, session or supervisor layers (docs/benchmarks.md, Container workers).

The command runs in a child interpreter through ``andon.cli.main``'s own start (the httpx line is
set there), and reports ``sys.modules`` just before it leaves.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from andon.testing import MockModelServer
from andon.workers import WORKER_REFUSED
from tests.cli.support import env, script

_REPORT = """
import json, os, sys
import andon.cli
sys.argv = ["andon", *json.loads(sys.argv[1])]
leave = andon.cli._leave
def report(code):
    wanted = json.loads(os.environ["LEAN_WANTED"])
    here = sorted(m for m in wanted if sys.modules.get(m) is not None)  # None: blocked
    print("LEAN " + json.dumps(here), file=sys.stderr)
    leave(code)
andon.cli._leave = report
andon.cli.main()
"""

# mcp (the MCP SDK): imported only when an MCP server starts (andon.mcp), never at start-up.
HEAVY = [
    "httpx",
    "httpx._main",
    "httpx_sse",
    "jsonschema",
    "rich",
    "yaml",
    "click",
    "tarfile",
    "mcp",
]


# What an agent run needs and a worker does not.
NOT_IN_A_WORKER = [
    *HEAVY,
    "andon.cli._main",
    "andon.cli._settings",
    "andon.cli.bench",
    "andon.llm",
    "andon.session",
    "andon.supervisor",
    "andon.fleet",
    "prompt_toolkit",
    "dill",
]


def _loaded(tmp_path: Path, *args: str, wanted: list[str] = HEAVY, code: int = 0) -> list[str]:
    environ = env(LEAN_WANTED=json.dumps(wanted))
    done = subprocess.run(
        [sys.executable, "-c", _REPORT, json.dumps(list(args))],
        cwd=tmp_path,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == code, done.stderr
    line = next(x for x in done.stderr.splitlines() if x.startswith("LEAN "))
    loaded: list[str] = json.loads(line[len("LEAN ") :])
    return loaded


def test_a_scripted_plain_run_loads_no_http_schema_terminal_or_yaml_module(
    tmp_path: Path,
) -> None:
    model = script(
        tmp_path / "m.json",
        [{"tool_calls": [{"name": "bash", "arguments": {"command": "true"}}]}, {"text": "ok"}],
    )
    assert _loaded(tmp_path, "run", "--workers", "1", "--model", model, "go") == []


def test_a_yaml_script_and_a_schema_load_what_they_need_and_no_more(tmp_path: Path) -> None:
    (tmp_path / "m.yaml").write_text("replies:\n  - text: '{\"ok\": true}'\n")
    (tmp_path / "s.json").write_text('{"type": "object"}')
    args = ["run", "--model", f"script:{tmp_path / 'm.yaml'}", "--output-schema", "s.json", "go"]
    assert _loaded(tmp_path, *args) == ["jsonschema", "yaml"]


def test_a_run_on_a_model_server_loads_httpx_but_not_its_command_line(tmp_path: Path) -> None:
    with MockModelServer([{"text": "done"}]) as server:
        loaded = _loaded(tmp_path, "run", "--model", f"{server.base_url}#mock", "hi")
    assert loaded == ["httpx", "httpx_sse"]


def test_andon_worker_imports_the_worker_side_only(tmp_path: Path) -> None:
    # Nobody welcomes it: it gives up after its welcome timeout (exit 3, WORKER_REFUSED),
    # having imported all it imports to serve.
    args = ["worker", "--connect", f"ipc://{tmp_path}/nobody.sock", "--welcome-timeout", "0.3"]
    assert _loaded(tmp_path, *args, wanted=NOT_IN_A_WORKER, code=WORKER_REFUSED) == []
