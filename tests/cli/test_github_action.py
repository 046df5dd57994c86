"""The repository's GitHub Action (``action.yml``, docs/ci.md, GitHub Actions), run as the runner
runs a composite action's steps.

The steps' scripts are taken from ``action.yml`` as they are: each ``run:`` is written to a file
and run with the command the runner uses for its ``shell:`` (``bash`` is ``bash --noprofile
--norc -eo pipefail FILE``), in a process group of its own, with the environment the step
declares: its ``env:`` with the ``${{ inputs.* }}`` and ``${{ steps.*.outputs.* }}`` expressions
filled in (inputs from the test, defaults from ``action.yml``, outputs from the ``GITHUB_OUTPUT``
file of the steps before), plus the runner's own variables (``RUNNER_TEMP``, ``GITHUB_OUTPUT``,
``GITHUB_ACTION_PATH`` …). Only the model is offline: a ``script:`` model. The steps that use
other actions (actions/setup-python, actions/upload-artifact) are not run; the test checks what
the upload step would upload.

The cancel is the runner's (actions/runner, ``ProcessInvoker.cs``): SIGINT to the step's process,
SIGTERM 7.5 s later if it still runs, a kill 2.5 s after that. Those waits are the runner's
timing, never a way to order events: the test waits on andon's output and on processes' exits.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from andon import procs
from tests.cli.support import ANDON, assert_balanced, env, long_script, records, script
from tests.support import alive_after

ACTION = Path(__file__).resolve().parents[2] / "action.yml"
TAG_VAR = "ANDON_GITHUB_ACTION"
SIGINT_WAIT = 7.5  # the runner's wait after SIGINT (ProcessInvoker.cs: 7500 ms)
SIGTERM_WAIT = 2.5  # and after SIGTERM, before its kill
GONE_BOUND = 30.0  # how long a stopped run's processes may take to be gone: a bound, not a figure
TOOL_BOUND = 40.0  # how long the tool may take to start under load: a bound
# The runner's command for each `shell:` a composite run step may name (the workflow syntax's
# table of shells).
SHELLS = {"bash": ["bash", "--noprofile", "--norc", "-eo", "pipefail"]}
_EXPR = re.compile(r"^\$\{\{\s*(.*?)\s*\}\}$")


def _action() -> dict[str, Any]:
    doc = yaml.safe_load(ACTION.read_text())
    assert isinstance(doc, dict)
    return doc


def _step(step_id: str) -> dict[str, Any]:
    found = [s for s in _action()["runs"]["steps"] if s.get("id") == step_id]
    assert len(found) == 1, f"action.yml has no single step with id {step_id!r}"
    step: dict[str, Any] = found[0]
    return step


def _outputs(path: Path) -> dict[str, str]:
    """A ``GITHUB_OUTPUT`` file as the runner reads it: ``name=value`` lines and
    ``name<<DELIMITER`` … ``DELIMITER`` blocks."""
    out: dict[str, str] = {}
    lines = path.read_text().split("\n") if path.exists() else []
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            name, mark = line.split("<<", 1)
            end = lines.index(mark, i)
            out[name] = "\n".join(lines[i:end])
            i = end + 1
        elif "=" in line:
            name, value = line.split("=", 1)
            out[name] = value
    return out


@dataclass
class Runner:
    """One job's worth of the runner: the inputs of the action, its temp folder, the outputs of
    the steps run so far, and the tag every process it starts carries."""

    tmp_path: Path
    inputs: Mapping[str, str]
    tag: str = field(default_factory=lambda: secrets.token_hex(8))
    started: list[subprocess.Popen[str]] = field(default_factory=list)
    step_outputs: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def entry(self) -> bytes:
        return f"{TAG_VAR}={self.tag}".encode()

    @property
    def temp(self) -> Path:
        path = self.tmp_path / "_temp"
        path.mkdir(exist_ok=True)
        return path

    def _value(self, text: str) -> str:
        """A step's ``env:`` value: a literal, or one ``${{ inputs.X }}`` or
        ``${{ steps.ID.outputs.X }}`` (all the action uses; anything else fails the test)."""
        found = _EXPR.match(text)
        if found is None:
            assert "${{" not in text, f"an expression the test cannot evaluate: {text!r}"
            return text
        expr = found.group(1)
        if expr.startswith("inputs."):
            name = expr.removeprefix("inputs.")
            spec = _action()["inputs"][name]
            return str(self.inputs.get(name, spec.get("default", "")))
        parts = expr.split(".")
        assert len(parts) == 4 and parts[0] == "steps" and parts[2] == "outputs", expr
        return self.step_outputs.get(parts[1], {}).get(parts[3], "")

    def start(self, step_id: str) -> tuple[subprocess.Popen[str], Path]:
        """The step's script, started as the runner starts it; returns it and its output file."""
        step = _step(step_id)
        argv = SHELLS[step["shell"]]
        path = self.temp / f"{secrets.token_hex(8)}.sh"
        path.write_text(step["run"])
        output = self.temp / f"output_{secrets.token_hex(8)}"
        output.touch()
        cwd = self.tmp_path / self._value(step.get("working-directory", "."))
        bindir = Path(ANDON).parent
        environ = env(
            PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
            ANDON_HOME=str(self.tmp_path / "home"),
            RUNNER_TEMP=str(self.temp),
            GITHUB_OUTPUT=str(output),
            GITHUB_ACTION_PATH=str(ACTION.parent),
            GITHUB_ACTION="__andon_action",
            GITHUB_RUN_ID="4242",
            GITHUB_RUN_ATTEMPT="1",
            **{TAG_VAR: self.tag},
            **{k: self._value(str(v)) for k, v in step.get("env", {}).items()},
        )
        proc = subprocess.Popen(
            [*argv, str(path)],
            cwd=cwd,
            env=environ,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # a process group of its own
        )
        self.started.append(proc)
        return proc, output

    def finish(self, step_id: str, proc: subprocess.Popen[str], output: Path) -> tuple[int, str]:
        """Wait for the step; record its outputs as the runner does (whatever its result)."""
        _, err = proc.communicate(timeout=GONE_BOUND)
        self.step_outputs[step_id] = _outputs(output)
        return proc.returncode, err

    def run(self, step_id: str) -> tuple[int, str]:
        proc, output = self.start(step_id)
        return self.finish(step_id, proc, output)


@pytest.fixture
def runners() -> Iterator[list[Runner]]:
    """Whatever a test started is taken down at the end: each step's group SIGKILLed, then
    whatever still carries its runner's tag (andon's workers have sessions of their own)."""
    made: list[Runner] = []
    yield made
    for runner in made:
        for proc in runner.started:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=GONE_BOUND)
        procs.signal_tagged(runner.entry, signal.SIGKILL, wait=5.0)


def _runner(tmp_path: Path, runners: list[Runner], **inputs: str) -> Runner:
    (tmp_path / "work").mkdir()
    runner = Runner(tmp_path, {"working-directory": "work", **inputs})
    runners.append(runner)
    return runner


def _json_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.endswith("}")]


def _wait_for_tool_output(path: Path, proc: subprocess.Popen[str]) -> None:
    """Until andon's --json file has a ``tool/output`` line (the tool runs), bounded."""
    deadline = time.monotonic() + TOOL_BOUND
    while time.monotonic() < deadline:
        if any(e.get("type") == "tool/output" for e in _json_lines(path)):
            return
        assert proc.poll() is None, f"the step ended first: {proc.communicate()}"
        # andon appends to a plain file (the step's redirect); there is no event to wait on,
        # so the file is polled, with a bound.
        time.sleep(0.1)  # sleep-ok: polls a plain file, bounded
    raise AssertionError(f"no tool/output within {TOOL_BOUND} s: {_json_lines(path)[-3:]}")


def _cancel_like_github(proc: subprocess.Popen[str]) -> str:
    """The runner cancelling a step: SIGINT to the step's process; SIGTERM if it still runs
    7.5 s later; a kill of its group 2.5 s after that. Returns the signal that ended it."""
    os.kill(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=SIGINT_WAIT)
        return "SIGINT"
    except subprocess.TimeoutExpired:
        pass
    os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=SIGTERM_WAIT)
        return "SIGTERM"
    except subprocess.TimeoutExpired:
        pass
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=GONE_BOUND)
    return "SIGKILL"


# --- the metadata ---------------------------------------------------------------------------------


def _check_jsonschema(path: Path) -> subprocess.CompletedProcess[str]:
    """check-jsonschema with its own copy of the schema of action metadata (it ships the
    SchemaStore schemas it names ``vendor.*``: no network)."""
    tool = Path(sys.executable).parent / "check-jsonschema"
    return subprocess.run(
        [str(tool), "--builtin-schema", "vendor.github-actions", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


def test_action_yml_is_valid_action_metadata() -> None:
    result = _check_jsonschema(ACTION)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_schema_check_sees_a_run_step_without_a_shell(tmp_path: Path) -> None:
    """The control: a composite run step must name its shell; the check must say so."""
    doc = _action()
    for step in doc["runs"]["steps"]:
        if step.get("id") == "run":
            del step["shell"]
    bad = tmp_path / "action.yml"
    bad.write_text(yaml.safe_dump(doc))
    result = _check_jsonschema(bad)
    assert result.returncode == 1, result.stdout + result.stderr


def test_no_input_is_interpolated_into_a_script() -> None:
    """``${{ … }}`` in a ``run:`` is pasted into the script before bash reads it: a prompt with
    ``$(…)`` in it would run. Inputs reach the scripts as environment variables only."""
    for step in _action()["runs"]["steps"]:
        assert "${{" not in step.get("run", ""), step.get("name")


def test_the_run_step_ends_by_execing_andon() -> None:
    """The runner signals the step's process only: andon must be that process."""
    lines = [x for x in _step("run")["run"].strip().splitlines() if x.strip()]
    assert lines[-1].startswith("exec andon run --json "), lines[-1]
    assert not re.search(r"\bandon\s+run\b", "\n".join(lines[:-1]))  # andon runs once, last


# --- running it -----------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_a_cancel_stops_andon_and_leaves_a_session_to_upload(
    tmp_path: Path, runners: list[Runner]
) -> None:
    runner = _runner(tmp_path, runners, prompt="Fix the build", model=long_script(tmp_path))
    assert runner.run("prepare")[0] == 0
    session = Path(runner.step_outputs["prepare"]["session"])
    jsonl = Path(runner.step_outputs["prepare"]["json"])
    assert session.is_relative_to(runner.temp)  # the default: under the runner's temp folder

    proc, output = runner.start("run")
    _wait_for_tool_output(jsonl, proc)
    found = procs.tagged(runner.entry)
    assert any(p.pid == proc.pid for p in found)  # exec: the step's process is andon

    ended_by = _cancel_like_github(proc)
    code, err = runner.finish("run", proc, output)

    assert (ended_by, code) == ("SIGINT", 130), err  # never needed the SIGTERM or the kill
    assert "Traceback" not in err
    assert alive_after(found, GONE_BOUND) == []
    assert alive_after(procs.tagged(runner.entry), GONE_BOUND) == []
    summary = _json_lines(jsonl)[-1]
    assert summary["type"] == "run/summary" and summary["exit_code"] == 130
    assert summary["ended"] == {"kind": "aborted", "reason": {"kind": "user"}}
    # What the upload step uploads (its `path:` is the prepare step's output) is a sound log.
    upload = _step_by_uses("actions/upload-artifact@")
    assert runner._value(upload["with"]["path"]) == str(session)
    assert Path(summary["session"]) == session
    assert_balanced(session)

    code, err = runner.run("outputs")
    assert code == 0, err
    outputs = runner.step_outputs["outputs"]
    assert outputs["exit-code"] == "130"
    assert outputs["session-id"] == summary["session_id"]
    assert _action_output(runner, "session") == str(session)
    assert _action_output(runner, "exit-code") == "130"


@pytest.mark.timeout(90)
def test_a_run_that_completes_gives_its_outputs(tmp_path: Path, runners: list[Runner]) -> None:
    answer = '{\n  "fixed": true,\n  "files": ["a.py"]\n}'  # several lines: a heredoc output
    model = script(tmp_path / "done.json", [{"text": answer}])
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "object", "required": ["fixed"]}))
    prompt = 'Fix it; $(touch pwned) `touch pwned` "quoted" \\ -x'  # reaches andon as it is
    session = tmp_path / "chosen" / "session"
    runner = _runner(
        tmp_path,
        runners,
        prompt=prompt,
        model=model,
        flags=f"--grace 2,3 --output-schema '{schema}'",
        session=str(session),
    )
    assert runner.run("prepare")[0] == 0
    assert runner.step_outputs["prepare"]["session"] == str(session)

    code, err = runner.run("run")
    assert code == 0, err
    assert not list(tmp_path.rglob("pwned"))
    typed = [r for r in records(session) if r.get("type") == "user/message"]
    assert [r["data"]["message"]["content"].split("\n\n---\n")[0] for r in typed] == [prompt]
    assert_balanced(session)

    code, err = runner.run("outputs")
    assert code == 0, err
    assert _action_output(runner, "exit-code") == "0"
    assert _action_output(runner, "final-text") == answer
    assert json.loads(_action_output(runner, "output")) == json.loads(answer)
    assert _action_output(runner, "session") == str(session)


def test_the_outputs_step_says_when_there_is_no_summary(
    tmp_path: Path, runners: list[Runner]
) -> None:
    """andon killed before its summary (the runner's last resort): the outputs are empty, the
    step still succeeds and says why."""
    runner = _runner(tmp_path, runners, prompt="x")
    assert runner.run("prepare")[0] == 0
    code, err = runner.run("outputs")
    assert code == 0, err
    assert runner.step_outputs["outputs"]["exit-code"] == ""


def test_flags_that_do_not_split_are_a_clear_error(tmp_path: Path, runners: list[Runner]) -> None:
    runner = _runner(tmp_path, runners, prompt="x", flags="--grace '2,3")
    assert runner.run("prepare")[0] == 0
    code, err = runner.run("run")
    assert code == 2, err
    assert "::error::the action's flags input cannot be split into words" in err
    assert "Traceback" not in err
    assert not Path(runner.step_outputs["prepare"]["session"]).exists()  # andon never started


def test_each_use_of_the_action_has_a_session_of_its_own(
    tmp_path: Path, runners: list[Runner]
) -> None:
    runner = _runner(tmp_path, runners, prompt="x")
    seen = set()
    for _ in range(2):
        assert runner.run("prepare")[0] == 0
        outputs = runner.step_outputs["prepare"]
        seen.add((outputs["session"], outputs["json"]))
        assert Path(outputs["session"]).parent.is_dir()  # andon creates only the folder itself
    assert len(seen) == 2


def _step_by_uses(prefix: str) -> dict[str, Any]:
    found = [s for s in _action()["runs"]["steps"] if str(s.get("uses", "")).startswith(prefix)]
    assert len(found) == 1, prefix
    step: dict[str, Any] = found[0]
    return step


def _action_output(runner: Runner, name: str) -> str:
    """An output of the action: its ``value:`` expression over the steps' outputs."""
    return runner._value(str(_action()["outputs"][name]["value"]))


# --- the page -------------------------------------------------------------------------------------


def _doc_workflow() -> str:
    """The yaml block of docs/ci.md (GitHub Actions) that uses the action."""
    text = (ACTION.parent / "docs" / "ci.md").read_text()
    section = text.split("\n### GitHub Actions\n", 1)[1].split("\n### ", 1)[0]
    blocks = [
        b for b in re.findall(r"^```yaml\n(.*?)^```$", section, re.M | re.S) if "prompt:" in b
    ]
    assert len(blocks) == 1, "docs/ci.md, GitHub Actions shows the action once"
    return str(blocks[0])


def test_the_documented_workflow_uses_the_actions_inputs_and_outputs(tmp_path: Path) -> None:
    text = _doc_workflow()
    doc = yaml.safe_load(text)
    steps = [s for job in doc["jobs"].values() for s in job["steps"]]
    uses = [s for s in steps if "prompt" in s.get("with", {})]
    assert len(uses) == 1, steps
    inputs = _action()["inputs"]
    assert set(uses[0]["with"]) <= set(inputs)
    assert {n for n, spec in inputs.items() if spec.get("required")} <= set(uses[0]["with"])
    assert "timeout-minutes" in uses[0]
    for name in re.findall(r"steps\.\w+\.outputs\.([\w-]+)", text):
        assert name in _action()["outputs"], name
    workflow = tmp_path / "workflow.yml"
    workflow.write_text(text)
    tool = Path(sys.executable).parent / "check-jsonschema"
    result = subprocess.run(
        [str(tool), "--builtin-schema", "vendor.github-workflows", str(workflow)],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stdout + result.stderr
