"""The CI recipes of docs/ci.md (Examples), run as their runners run them.

The recipes' own text is taken from the page: the GitHub Actions step's ``run:``, the GitLab job's
``script:`` line, the Kubernetes Job's container command. Only what running offline needs is
changed: ``--model`` becomes a ``script:`` model whose tool is a long bash loop, and ``--json``
is added after ``andon run`` so that the test waits on andon's events. Everything else, ``exec``
included, is the page's, so a recipe that loses its ``exec`` fails here.

The stop sequences are the runners' own, as their public sources describe them:

- GitHub Actions (actions/runner, ``ProcessInvoker.cs``; GitHub's workflow cancellation
  reference): the step's script is a file run by ``bash -e FILE``; to cancel, SIGINT to the
  step's process only, SIGTERM 7.5 s later if it still runs, a kill 2.5 s after that.
- GitLab's shell executor (gitlab-runner, ``shells/bash.go`` and ``helpers/process``): the stage
  is one script (``trap exit 1 TERM`` … ``: | eval '…'``) fed to a shell in a process group of
  its own; to cancel, SIGTERM to the group.
- Kubernetes (pod termination): SIGTERM to the container's main process, SIGKILL when
  ``terminationGracePeriodSeconds`` has passed. The container is played by a new PID namespace
  (``unshare``, root only) so that andon really is PID 1.

The waits of 7.5 s and 2.5 s are the GitHub runner's timing (how long it lets the step run after a
signal), never a way to order events: every ordering waits on andon's output or on a process's
exit.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest
import yaml

from andon import procs
from andon.procs import ProcInfo
from tests.cli.support import ANDON, STUBBORN, assert_balanced, env, long_script
from tests.support import alive_after

CI_MD = Path(__file__).resolve().parents[2] / "docs" / "ci.md"
TAG_VAR = "ANDON_CI_RECIPE"
# GitHub's runner (ProcessInvoker.cs): after SIGINT it waits 7500 ms, after SIGTERM 2500 ms.
SIGINT_WAIT = 7.5
SIGTERM_WAIT = 2.5
GONE_BOUND = 30.0  # how long processes of a stopped run may take to be gone: a bound, not a figure


# --- the page -------------------------------------------------------------------------------------


def _example_blocks() -> dict[str, str]:
    """The first ``yaml`` block under each ``###`` heading of the Examples section."""
    text = CI_MD.read_text()
    section = text.split("\n## Examples\n", 1)[1].split("\n## ", 1)[0]
    blocks: dict[str, str] = {}
    for part in section.split("\n### ")[1:]:
        heading, _, body = part.partition("\n")
        found = re.search(r"^```yaml\n(.*?)^```$", body, re.M | re.S)
        if found:
            blocks[heading.strip()] = found.group(1)
    return blocks


def _recipe(heading: str) -> Any:
    blocks = _example_blocks()
    assert heading in blocks, f"docs/ci.md has no yaml block under '### {heading}': {list(blocks)}"
    return yaml.safe_load(blocks[heading])


def _github_run() -> str:
    doc = _recipe("GitHub Actions")
    runs = [
        step["run"]
        for job in doc["jobs"].values()
        for step in job["steps"]
        if "andon run" in str(step.get("run", ""))
    ]
    assert len(runs) == 1, runs
    return str(runs[0]).strip()


def _gitlab_script() -> list[str]:
    doc = _recipe("GitLab CI")
    jobs = [job for job in doc.values() if isinstance(job, dict) and "script" in job]
    assert len(jobs) == 1, doc
    return [str(line) for line in jobs[0]["script"]]


def _k8s_job() -> dict[str, Any]:
    doc = _recipe("Kubernetes Job")
    assert isinstance(doc, dict)
    return doc


def _k8s_container(job: dict[str, Any]) -> dict[str, Any]:
    containers = job["spec"]["template"]["spec"]["containers"]
    found = [c for c in containers if "andon" in json.dumps(c.get("command", []))]
    assert len(found) == 1, containers
    container: dict[str, Any] = found[0]
    return container


def _offline(line: str, model: str) -> str:
    """The recipe's command line, run offline: ``--model`` is the script, ``--json`` is added."""
    assert re.search(r"--model\s+\S+", line), line
    line = re.sub(r"--model\s+\S+", lambda _: f"--model {shlex.quote(model)}", line, count=1)
    return line.replace("andon run", "andon run --json", 1)


def _grace(argv: list[str]) -> tuple[float, float]:
    term, kill = argv[argv.index("--grace") + 1].split(",")
    return float(term), float(kill)


# --- running --------------------------------------------------------------------------------------


@dataclass
class Step:
    """A runner's process (the step, the stage's shell, the container) and its andon run."""

    proc: subprocess.Popen[str]
    entry: bytes  # the tag every process of this run carries

    def tagged(self) -> list[ProcInfo]:
        return procs.tagged(self.entry)

    def events_until(self, pred: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
        """andon's --json lines (other lines, a shell's echo, skipped) until one matches; the
        test's timeout bounds the wait."""
        assert self.proc.stdout is not None
        return _read_until(self.proc.stdout, pred)

    def rest(self) -> tuple[list[dict[str, Any]], str]:
        out, err = self.proc.communicate(timeout=GONE_BOUND)
        return [json.loads(x) for x in out.splitlines() if x.startswith("{")], err


def _read_until(stream: IO[str], pred: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    for line in stream:
        if not line.startswith("{"):
            continue
        event = json.loads(line)
        seen.append(event)
        if pred(event):
            return seen
    raise AssertionError(f"andon's output ended before the awaited event; last: {seen[-3:]}")


def _is_tool_output(event: dict[str, Any]) -> bool:
    return event.get("type") == "tool/output"


def _is_summary(event: dict[str, Any]) -> bool:
    return event.get("type") == "run/summary"


@pytest.fixture
def steps() -> Iterator[list[Step]]:
    """Every started step is taken down at the end, whatever the test did: its group SIGKILLed,
    then whatever still carries its tag (andon's workers have sessions of their own)."""
    started: list[Step] = []
    yield started
    for step in started:
        if step.proc.poll() is None:
            os.killpg(step.proc.pid, signal.SIGKILL)
        procs.signal_tagged(step.entry, signal.SIGKILL, wait=5.0)
        step.proc.communicate(timeout=GONE_BOUND)


def _environ(tmp_path: Path, tag: str, **extra: str) -> dict[str, str]:
    """The runner's environment: andon on PATH (the recipes say ``andon``), ANDON_HOME in the
    test's folder, the run's tag."""
    path = f"{Path(ANDON).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return env(ANDON_HOME=str(tmp_path / "home"), PATH=path, **{TAG_VAR: tag}, **extra)


def _start(
    argv: list[str],
    tmp_path: Path,
    steps: list[Step],
    stdin: str | None = None,
    **extra: str,
) -> Step:
    tag = secrets.token_hex(8)
    proc = subprocess.Popen(
        argv,
        cwd=tmp_path,
        env=_environ(tmp_path, tag, **extra),
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a process group of its own, as the runners start it
    )
    step = Step(proc, f"{TAG_VAR}={tag}".encode())
    steps.append(step)
    if stdin is not None:
        assert proc.stdin is not None
        proc.stdin.write(stdin)
        proc.stdin.close()
        proc.stdin = None  # written and closed: communicate() must not touch it again
    return step


def _andon_of(step: Step, parent: int) -> ProcInfo:
    """The andon process among the run's processes: the child of ``parent``."""
    found = [p for p in step.tagged() if p.ppid == parent]
    assert len(found) == 1, found
    return found[0]


def _cancel_like_github(proc: subprocess.Popen[str]) -> str:
    """GitHub's runner cancelling a step: SIGINT to the step's process; SIGTERM if it still runs
    7.5 s later; 2.5 s after that, a kill (here the whole group, the harshest reading of "kills
    the process tree"). Returns the signal that ended the step."""
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


def _github_step_file(tmp_path: Path, contents: str) -> Path:
    """The runner writes a ``run:`` to ``$RUNNER_TEMP/<guid>.sh`` as it is (no bash prologue)."""
    temp = tmp_path / "_temp"
    temp.mkdir(exist_ok=True)
    path = temp / f"{uuid.uuid4()}.sh"
    path.write_text(contents + "\n")
    return path


def _assert_nothing_left(step: Step, found: list[ProcInfo]) -> None:
    assert alive_after(found, GONE_BOUND) == [], found
    assert alive_after(step.tagged(), GONE_BOUND) == []


def _assert_stopped(step: Step, found: list[ProcInfo], code: int, cause: str) -> None:
    """The run ended by the runner's signal: ``run/summary`` says ``code`` and the cause, no
    traceback, nothing of it left, and its log passes ``andon check``."""
    events, err = step.rest()
    summary = events[-1]
    assert _is_summary(summary) and summary["exit_code"] == code, err
    assert summary["ended"] == {"kind": "aborted", "reason": {"kind": cause}}
    assert "Traceback" not in err
    _assert_nothing_left(step, found)
    assert_balanced(Path(summary["session"]))


# --- GitHub Actions -------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_github_step_is_andon_and_the_cancel_sigint_stops_it(
    tmp_path: Path, steps: list[Step]
) -> None:
    line = _github_run()
    assert line.startswith("exec andon run "), f"the GitHub step must exec andon: {line!r}"
    script = _github_step_file(tmp_path, _offline(line, long_script(tmp_path)))
    step = _start(["bash", "-e", str(script)], tmp_path, steps)
    step.events_until(_is_tool_output)
    found = step.tagged()
    assert any(p.pid == step.proc.pid for p in found)  # exec: the step's pid is andon's

    ended_by = _cancel_like_github(step.proc)

    assert (ended_by, step.proc.returncode) == ("SIGINT", 130)  # never needed SIGTERM or a kill
    _assert_stopped(step, found, 130, "user")


@pytest.mark.timeout(120)
def test_github_step_without_exec_keeps_the_signals_from_andon(
    tmp_path: Path, steps: list[Step]
) -> None:
    """The control: the page's step with ``exec`` removed and a command after andon. The runner's
    SIGINT reaches bash only, which waits for andon; the SIGTERM 7.5 s later kills bash; the step
    is over and andon still runs its build, unsupervised."""
    line = _offline(_github_run(), long_script(tmp_path)).removeprefix("exec ")
    script = _github_step_file(tmp_path, f"{line}; echo after")
    step = _start(["bash", "-e", str(script)], tmp_path, steps)
    step.events_until(_is_tool_output)
    andon = _andon_of(step, step.proc.pid)
    found = step.tagged()

    os.kill(step.proc.pid, signal.SIGINT)
    with pytest.raises(subprocess.TimeoutExpired):
        step.proc.wait(timeout=SIGINT_WAIT)  # the runner's wait runs out: bash holds the SIGINT
    assert alive_after([andon], 0) == [andon]
    os.kill(step.proc.pid, signal.SIGTERM)
    assert step.proc.wait(timeout=SIGTERM_WAIT) == -signal.SIGTERM  # bash died of it

    # The step has ended; andon has had no signal and still runs the tool.
    seen = step.events_until(_is_tool_output)
    assert not [e for e in seen if e.get("type") in ("tool/signal", "turn/end", "run/summary")]
    assert alive_after([andon], 0) == [andon]
    orphan = next(p for p in step.tagged() if p.pid == andon.pid)
    assert orphan.ppid != step.proc.pid  # re-parented away from the step

    # Clean up: the SIGINT the runner meant for andon, sent to andon's own pid.
    fd = procs.Pidfd.open(andon.key)
    assert fd is not None
    try:
        assert fd.send(signal.SIGINT)
    finally:
        fd.close()
    summary = step.events_until(_is_summary)[-1]
    assert summary["exit_code"] == 130
    _assert_nothing_left(step, found)
    step.rest()
    assert_balanced(Path(summary["session"]))


# --- GitLab CI ------------------------------------------------------------------------------------


def _ansi_c(text: str) -> str:
    """``$'…'`` quoting, as gitlab-runner's bash writer quotes the stage's body."""
    out = text.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n")
    return f"$'{out}'"


def _gitlab_stage(lines: list[str], project: Path) -> str:
    """The stage script gitlab-runner's bash writer generates (``BashWriter.Finish``): the TERM
    trap, errexit, and the stage's lines inside ``: | eval '…'``, each echoed before it runs."""
    body = f"cd {shlex.quote(str(project))}\n"
    for line in lines:
        body += f"echo {_ansi_c('$ ' + line)}\n{line}\n"
    return (
        "trap exit 1 TERM\n\n"
        "if set -o | grep pipefail > /dev/null; then set -o pipefail; fi; set -o errexit\n"
        "set +o noclobber\n"
        f": | eval {_ansi_c(body)}\n"
        "exit 0\n"
    )


def test_gitlab_script_execs_andon_as_its_last_line() -> None:
    lines = _gitlab_script()
    andon = [line for line in lines if "andon run" in line]
    assert andon == [lines[-1]], lines  # exec ends the script: nothing may come after it
    assert lines[-1].startswith("exec andon run "), lines[-1]


@pytest.mark.timeout(120)
def test_gitlab_shell_executor_sigterm_to_the_group_waits_for_andon(
    tmp_path: Path, steps: list[Step]
) -> None:
    """The stage's shell in its own group, SIGTERM to the group (the runner's Terminate): andon
    replaced the eval's subshell, so the shell waits for andon and exits with its code."""
    lines = [_offline(line, long_script(tmp_path)) for line in _gitlab_script()]
    step = _start(["bash"], tmp_path, steps, stdin=_gitlab_stage(lines, tmp_path))
    step.events_until(_is_tool_output)
    andon = _andon_of(step, step.proc.pid)
    found = step.tagged()

    os.killpg(step.proc.pid, signal.SIGTERM)

    assert step.proc.wait(timeout=GONE_BOUND) == 143  # the trap's `exit` takes andon's status
    assert alive_after([andon], 0) == []  # the shell outlived andon: the job ended with it
    _assert_stopped(step, found, 143, "disposed")


@pytest.mark.timeout(120)
def test_gitlab_shell_executor_without_exec_ends_the_job_before_andon(
    tmp_path: Path, steps: list[Step]
) -> None:
    """The control: the same stage without ``exec``. The eval's subshell dies of the group's
    SIGTERM, the shell's trap exits, and the job is over while andon is still stopping its tool.
    The tool ignores SIGINT and SIGTERM, so andon's stop lasts until its SIGKILL (TERM+KILL of the
    recipe's --grace): andon cannot be gone when the shell is."""
    lines = [
        _offline(line, long_script(tmp_path, STUBBORN)).removeprefix("exec ")
        for line in _gitlab_script()
    ]
    step = _start(["bash"], tmp_path, steps, stdin=_gitlab_stage(lines, tmp_path))
    step.events_until(_is_tool_output)
    subshell = next(p for p in step.tagged() if p.ppid == step.proc.pid)
    andon = _andon_of(step, subshell.pid)
    found = step.tagged()

    os.killpg(step.proc.pid, signal.SIGTERM)

    assert step.proc.wait(timeout=GONE_BOUND) == 143  # the subshell's death by SIGTERM
    assert alive_after([andon], 0) == [andon]  # the job is over; andon is still stopping
    summary = step.events_until(_is_summary)[-1]  # andon finishes on its own
    assert summary["exit_code"] == 143
    _assert_nothing_left(step, found)
    step.rest()
    assert_balanced(Path(summary["session"]))


# --- Kubernetes -----------------------------------------------------------------------------------


def _k8s_andon_argv(container: dict[str, Any]) -> list[str]:
    """andon's own argv from the container: the command itself, or the ``exec`` of a shell's."""
    argv = [str(x) for x in [*container.get("command", []), *container.get("args", [])]]
    if argv[0] == "andon":
        return argv
    assert argv[:2] in (["sh", "-c"], ["bash", "-c"]), argv
    last = argv[2].split("&&")[-1].split(";")[-1].strip()
    assert last.startswith("exec andon "), f"the shell must exec andon: {argv[2]!r}"
    return shlex.split(last)[1:]


def test_k8s_job_lets_andon_finish_its_grace() -> None:
    job = _k8s_job()
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert job["spec"]["backoffLimit"] == 0
    argv = _k8s_andon_argv(_k8s_container(job))
    assert argv[:2] == ["andon", "run"]
    term, kill = _grace(argv)
    assert pod["terminationGracePeriodSeconds"] >= term + kill + 5
    budget = float(argv[argv.index("--turn-budget") + 1])
    assert job["spec"]["activeDeadlineSeconds"] > budget + term + kill
    container = _k8s_container(job)
    env_vars = {e["name"]: e for e in container["env"]}
    home = env_vars["ANDON_HOME"]["value"]
    assert any(m["mountPath"] == home for m in container["volumeMounts"])  # on a volume
    assert "secretKeyRef" in env_vars["DEEPSEEK_API_KEY"]["valueFrom"]


K8S_SCHEMA_VERSION = "1.37.0"
"""The Kubernetes release whose OpenAPI-derived JSON schemas (shipped by kubernetes-validate) the
Job recipe must satisfy; strict: a misspelt or misplaced field is an error, not ignored."""


def test_k8s_job_validates_against_the_kubernetes_schema() -> None:
    import kubernetes_validate

    job = _k8s_job()
    kubernetes_validate.validate(job, K8S_SCHEMA_VERSION, strict=True)


def test_the_schema_check_sees_a_misplaced_field() -> None:
    import kubernetes_validate

    job = json.loads(json.dumps(_k8s_job()))
    pod = job["spec"]["template"]["spec"]
    pod["terminationGracePeriod"] = pod.pop("terminationGracePeriodSeconds")  # a common slip
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, K8S_SCHEMA_VERSION, strict=True)


def _can_unshare() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "true"],
        capture_output=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )
    return probe.returncode == 0


@pytest.mark.timeout(120)
def test_k8s_container_command_is_pid_1_and_stops_on_the_kubelets_sigterm(
    tmp_path: Path, steps: list[Step]
) -> None:
    """The Job's container command as PID 1 of a PID namespace of its own: SIGTERM to it (the
    kubelet's), SIGKILL only if it still runs when terminationGracePeriodSeconds has passed."""
    if not _can_unshare():
        pytest.skip("no PID namespace here (unshare needs root)")
    job = _k8s_job()
    grace_period = float(job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"])
    container = _k8s_container(job)
    argv = _k8s_andon_argv(container)
    argv[argv.index("--model") + 1] = long_script(tmp_path)
    argv.insert(2, "--json")
    plain = {e["name"]: str(e["value"]) for e in container["env"] if "value" in e}
    plain.pop("ANDON_HOME")  # the volume is the test's folder
    step = _start(
        ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", *argv],
        tmp_path,
        steps,
        **plain,
    )
    step.events_until(_is_tool_output)
    andon = _andon_of(step, step.proc.pid)
    status = Path(f"/proc/{andon.pid}/status").read_text()
    assert re.search(r"^NSpid:\s+\d+\s+1$", status, re.M), status  # PID 1 in its namespace
    found = step.tagged()

    fd = procs.Pidfd.open(andon.key)
    assert fd is not None
    try:
        assert fd.send(signal.SIGTERM)
    finally:
        fd.close()
    try:
        step.proc.wait(timeout=grace_period)
    except subprocess.TimeoutExpired:
        os.killpg(step.proc.pid, signal.SIGKILL)
        pytest.fail(f"andon still ran {grace_period} s after SIGTERM: the kubelet would KILL it")

    assert step.proc.returncode == 143
    _assert_stopped(step, found, 143, "disposed")
