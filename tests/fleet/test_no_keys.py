"""No process andon starts holds a model API key (docs/workers.md, Tools).

A tool can read its own ``/proc/self/environ`` and that of every ancestor andon started: its worker,
the forkserver the worker was forked from (and, for a Python tool, its call process is itself a
fork). So the keys must be out of the environment each of them was *exec'd* with, not only out of
the tool's. The supervisor keeps its own key: its model needs it.

The agent runs in a subprocess (its environment holds fake keys, random values); its bash tool and
a Python tool copy the environment of every process from themselves up to the supervisor (whose pid
the driver puts in the command) into files, which the test reads.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

import andon
import andon.tools
from andon.base import WorkerError
from andon.fleet import WorkerPool, WorkerPoolConfig
from andon.llm import OpenAICompatible, Scripted
from andon.testing import MockModelServer

ROOT = Path(__file__).resolve().parents[2]

BASH_PROBE = """p=$$; n=0
while [ "$p" != "{stop}" ] && [ "$p" -gt 1 ]; do
  cat /proc/$p/environ > {out}/bash-$n-$p || exit 3
  n=$((n+1))
  p=$(sed 's/.*) //' /proc/$p/stat | cut -d' ' -f2)
done
echo $p > {out}/bash-end"""


@andon.tools.tool
def copy_ancestor_environments(out: str, stop_at: int) -> str:
    """Copies /proc/<pid>/environ of this process and each ancestor below ``stop_at``."""
    pid, n = os.getpid(), 0
    while pid not in (stop_at, 0, 1):
        Path(out, f"py-{n}-{pid}").write_bytes(Path(f"/proc/{pid}/environ").read_bytes())
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        pid, n = int(fields[1]), n + 1
    Path(out, "py-end").write_text(str(pid))
    return f"copied {n}"


async def _drive(session: str, out: str, key_env: str) -> None:
    supervisor = os.getpid()
    replies: list[dict[str, Any]] = [
        {
            "text": "Probing.",
            "tool_calls": [
                {
                    "name": "bash",
                    "arguments": {"command": BASH_PROBE.format(out=out, stop=supervisor)},
                },
                {
                    "name": "copy_ancestor_environments",
                    "arguments": {"out": out, "stop_at": supervisor},
                },
            ],
        },
        {"text": "Done."},
    ]
    registry = andon.tools.default()
    registry.add(copy_ancestor_environments)
    before = dict(os.environ)
    async with (
        MockModelServer(replies) as server,
        OpenAICompatible(server.base_url, "m", api_key_env=key_env) as model,
        andon.open_agent(
            session,
            model=model,
            tools=registry,
            pool=WorkerPoolConfig(size=2, containment="subreaper"),
        ) as agent,
    ):
        agent.followup("probe")
        await agent.when_idle()
    print(json.dumps({"supervisor": supervisor, "kept_env": dict(os.environ) == before}))


def drive() -> None:
    asyncio.run(_drive(*sys.argv[1:4]))


def _fake() -> str:
    return f"fake-{uuid.uuid4()}"


@pytest.mark.timeout(60)
def test_no_tool_can_read_a_key_in_any_process_andon_started(tmp_path: Path) -> None:
    out = tmp_path / "environs"
    out.mkdir()
    custom = f"ANDON_TEST_CUSTOM_KEY_{uuid.uuid4().hex[:8].upper()}"
    keys = {
        "DEEPSEEK_API_KEY": _fake(),
        "OPENAI_API_KEY": _fake(),
        "ANDON_API_KEY": _fake(),
        custom: _fake(),
    }
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    environ = {**os.environ, **keys, "PYTHONPATH": path}
    code = "from tests.fleet.test_no_keys import drive; drive()"
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "session"), str(out), custom],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=50,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["kept_env"]  # the supervisor keeps its keys: its model needs them

    for probe in ("bash", "py"):
        # The walk went all the way up to the supervisor: tool (or call process), worker,
        # forkserver, each read for real.
        assert (out / f"{probe}-end").read_text().strip() == str(report["supervisor"])
        copies = sorted(out.glob(f"{probe}-[0-9]*"))
        assert len(copies) >= 3, copies
        for copy in copies:
            block = copy.read_bytes()
            assert block, copy  # a real environment was read (it holds PATH at least)
            names = {entry.partition(b"=")[0].decode() for entry in block.split(b"\0")}
            assert not names & set(keys), (copy.name, sorted(names & set(keys)))
            for value in keys.values():
                assert value.encode() not in block, copy.name


@pytest.mark.timeout(60)
async def test_a_pool_refuses_a_forkserver_that_holds_its_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The forkserver is shared by the pools of a process: one started (for a first pool) with a
    variable a second pool must hide cannot be replaced while the first pool's workers live, so
    the second refuses; once the first is closed, a new forkserver starts without it."""
    name = f"ANDON_TEST_CUSTOM_KEY_{uuid.uuid4().hex[:8].upper()}"
    value = _fake()
    monkeypatch.setenv(name, value)
    registry = andon.tools.default()
    config = WorkerPoolConfig(size=1, containment="subreaper")
    async with WorkerPool(config, registry) as first:
        with pytest.raises(WorkerError, match=f"\\${name}") as refused:
            async with WorkerPool(config, registry, hide_env=[name]):
                pass
        assert value not in str(refused.value)
        with pytest.raises(WorkerError, match=f"\\${name}"):
            first.hide_env([name])
    async with WorkerPool(config, registry, hide_env=[name]) as second:
        for pid in second.workers.values():
            assert f"{name}=".encode() not in Path(f"/proc/{pid}/environ").read_bytes()
    assert os.environ[name] == value  # this process keeps it


@pytest.mark.timeout(60)
async def test_a_passed_key_reaches_the_tool_but_not_its_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    value = _fake()
    monkeypatch.setenv("ANDON_API_KEY", value)
    # Passed on purpose: the tool has it, its worker (the tool's parent) does not.
    command = (
        'echo "tool:$ANDON_API_KEY"; '
        'tr "\\0" "\\n" < /proc/$PPID/environ | grep -c "^ANDON_API_KEY=" || true'
    )
    model = Scripted(
        [
            {"text": "Probe.", "tool_calls": [{"name": "bash", "arguments": {"command": command}}]},
            {"text": "Done."},
        ]
    )
    async with andon.open_agent(
        tmp_path / "session",
        model=model,
        pool=WorkerPoolConfig(size=1, containment="subreaper"),
        pass_env=["ANDON_API_KEY"],
    ) as agent:
        agent.followup("probe")
        await agent.when_idle()
    results = [
        json.loads(line)
        for line in (tmp_path / "session" / "events.jsonl").read_text().splitlines()
        if '"tool/result"' in line
    ]
    assert len(results) == 1
    lines = results[0]["data"]["content"].splitlines()
    assert lines[:2] == [f"tool:{value}", "0"], lines  # the tool has it; its worker does not
