"""``andon run --workers-in pod:IMAGE``: the CLI end to end against the stand-in cluster, found the
honest way, through a kubeconfig file the test writes and ``[kubernetes]`` in andon.toml names."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from andon.testing import FakeKubernetes
from tests.cli.support import (
    env,
    finish,
    is_tool_output,
    long_script,
    read_until,
    records,
    run,
    script,
    start,
)
from tests.kubernetes.conftest import IMAGE

pytestmark = [pytest.mark.timeout(120)]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _kubeconfig(path: Path, cluster: FakeKubernetes) -> Path:
    path.write_text(
        json.dumps(  # JSON is YAML: the client reads either
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": cluster.url}}],
                "users": [{"name": "andon", "user": {"token": "not-checked"}}],
                "contexts": [
                    {
                        "name": "fake",
                        "context": {"cluster": "fake", "user": "andon", "namespace": "ci"},
                    }
                ],
                "current-context": "other",
            }
        )
    )
    return path


def _toml(kubeconfig: Path, listen: str = 'listen = "tcp://127.0.0.1:0"\n') -> str:
    command = json.dumps([sys.executable, "-m", "andon"])
    path = json.dumps(os.environ.get("PATH", "/usr/bin:/bin"))
    return (
        "[kubernetes]\n"
        f"kubeconfig = {json.dumps(str(kubeconfig))}\n"
        'context = "fake"\n'
        'namespace = "ci"\n'
        # The fake kubelet's Pods run on this machine: loopback reaches the pool.
        f"{listen}"
        f"command = {command}\n"
        f"env = {{ PATH = {path} }}\n"
        'requests = { cpu = "250m", memory = "256Mi" }\n'
        'limits = { memory = "1Gi" }\n'
        'workspace_claim = "andon-work"\n'
        'service_account = "andon-worker"\n'
    )


def _pod_names(cluster: FakeKubernetes) -> list[str]:
    return [
        r.body["metadata"]["name"]
        for r in cluster.requests()
        if r.method == "POST" and r.path.endswith("/pods") and isinstance(r.body, dict)
    ]


def _nothing_left(cluster: FakeKubernetes) -> bool:
    names = _pod_names(cluster)
    return (
        not cluster.pods("ci")
        and not cluster.secrets("ci")
        and not any(cluster.processes(n, "ci") for n in names)
    )


def test_the_main_job_runs_with_its_tools_in_pods(tmp_path: Path, cluster: FakeKubernetes) -> None:
    # The README's main job: a link makes tmp_path look like the repository's root, so the
    # scratch copy lands under tmp_path/.andon.
    (tmp_path / "examples").symlink_to(EXAMPLES)
    # Listening on every address, as in a Pod; the workers dial the advertised one.
    every = 'listen = "tcp://0.0.0.0:0"\nadvertise = "tcp://127.0.0.1"\n'
    (tmp_path / "andon.toml").write_text(
        _toml(_kubeconfig(tmp_path / "kubeconfig", cluster), listen=every)
    )
    result = run(
        "run",
        "--workers",
        "2",
        "--workers-in",
        f"pod:{IMAGE}",
        "--model",
        "script:examples/ci-build/script.yaml",
        "The build is red: fix it",
        cwd=tmp_path,
        environ=env(ANDON_HOME=str(tmp_path / "home")),
    )
    assert result.returncode == 0, result.stderr
    assert "[exit code 1]" in result.stdout and "2 failed" in result.stdout
    assert "3 passed, 0 failed" in result.stdout
    assert result.stdout.rstrip().endswith("ended: completed")
    # The fixed file is in the workspace: the Pods worked on it at the path the session uses.
    fixed = (tmp_path / ".andon" / "ci-build" / "stats.py").read_text()
    assert "sum(values) / len(values)" in fixed and "len(values) + 1" not in fixed
    sent = [
        r.body
        for r in cluster.requests()
        if r.method == "POST"
        and r.path == "/api/v1/namespaces/ci/pods"
        and isinstance(r.body, dict)
    ]
    assert sent  # the pool starts what the calls need, up to --workers
    spec = sent[0]["spec"]
    [container] = spec["containers"]
    assert container["image"] == IMAGE
    connect = container["command"][container["command"].index("--connect") + 1]
    assert connect.startswith("tcp://127.0.0.1:") and not connect.endswith(":0")
    assert container["resources"] == {
        "requests": {"cpu": "250m", "memory": "256Mi"},
        "limits": {"memory": "1Gi"},
    }
    assert spec["serviceAccountName"] == "andon-worker"
    assert {"name": "workspace", "persistentVolumeClaim": {"claimName": "andon-work"}} in spec[
        "volumes"
    ]
    assert {"name": "workspace", "mountPath": str(tmp_path.resolve())} in container["volumeMounts"]
    assert cluster.wait_for(_nothing_left)


def test_sigint_during_a_call_in_a_pod_exits_130_and_leaves_nothing(
    tmp_path: Path, cluster: FakeKubernetes, killer: list[Any]
) -> None:
    (tmp_path / "andon.toml").write_text(_toml(_kubeconfig(tmp_path / "kubeconfig", cluster)))
    session = tmp_path / "s"
    proc = start(
        "run",
        "--json",
        "--grace",
        "2,2",
        "--workers",
        "1",
        "--workers-in",
        f"pod:{IMAGE}",
        "--model",
        long_script(tmp_path),
        "--session",
        str(session),
        "go",
        cwd=tmp_path,
        environ=env(ANDON_HOME=str(tmp_path / "home")),
    )
    killer.append(proc)
    read_until(proc, is_tool_output)
    assert cluster.pods("ci"), "the call runs in a Pod"
    os.kill(proc.pid, signal.SIGINT)
    code, events, err = finish(proc)
    assert code == 130, err
    assert "Traceback" not in err
    assert events[-1]["type"] == "run/summary" and events[-1]["exit_code"] == 130
    end = [r for r in records(session) if r["type"] == "turn/end"][-1]
    assert end["data"]["reason"] == {"kind": "aborted", "reason": {"kind": "user"}}
    # When andon has exited, nothing of it is left in the cluster: no Pod, no Secret, and no
    # process of any Pod it made.
    assert _nothing_left(cluster), (cluster.pods("ci"), cluster.secrets("ci"))


@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        ("[kubernetes]\nwhat = 1\n", "[kubernetes]: unknown key 'what'"),
        ("kubernetes = 3\n", "[kubernetes] must be a table"),
        ('[kubernetes]\nnamespace = ""\n', "[kubernetes]: namespace must be a non-empty string"),
        ("[kubernetes]\nrequests = { cpu = 1 }\n", "[kubernetes]: requests must be a table"),
        ('[kubernetes]\nlimits = "1Gi"\n', "[kubernetes]: limits must be a table"),
        ('[kubernetes]\nenv = ["A"]\n', "[kubernetes]: env must be a table"),
        ('[kubernetes]\nlisten = "http://x:1"\n', "[kubernetes]: listen must look like tcp://"),
        (
            '[kubernetes]\nlisten = "tcp://127.0.0.1:0"\nadvertise = "tcp://h:port"\n',
            "[kubernetes]: advertise has a bad port",
        ),
        ('[kubernetes]\nnamespace = "ci"\n', "[kubernetes]: advertise is required"),
        (
            '[kubernetes]\nlisten = "tcp://127.0.0.1:0"\nworkspace_path = "work"\n',
            "[kubernetes]: workspace_path must be an absolute path",
        ),
        (
            '[kubernetes]\nlisten = "tcp://127.0.0.1:0"\ntermination_grace = -1\n',
            "[kubernetes]: termination_grace must be whole seconds",
        ),
        (
            '[kubernetes]\nlisten = "tcp://127.0.0.1:0"\nwait_for_nodes = "yes"\n',
            "[kubernetes]: wait_for_nodes must be true or false",
        ),
        (
            '[kubernetes]\nlisten = "tcp://127.0.0.1:0"\ncommand = []\n',
            "[kubernetes]: command must be a string or a list of strings",
        ),
        ('workers-in = "pod:"\n', "'pod:IMAGE'"),
        # No table: its defaults listen on every address, and nothing says where to dial.
        ('workers-in = "pod:example/tools:1"\n', "advertise is required"),
    ],
)
def test_bad_kubernetes_settings_are_one_line_and_exit_2(
    tmp_path: Path, toml: str, expected: str
) -> None:
    (tmp_path / "andon.toml").write_text(toml)
    model = script(tmp_path / "s.json", [{"text": "never"}])
    home = tmp_path / "h"
    result = run("run", "--model", model, "go", cwd=tmp_path, environ=env(ANDON_HOME=str(home)))
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    sessions = home / "sessions"
    assert not sessions.exists() or not list(sessions.iterdir())


def test_a_cluster_that_cannot_be_reached_is_a_clear_error(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text("this: is: not a kubeconfig")
    (tmp_path / "andon.toml").write_text(_toml(config))
    model = script(tmp_path / "s.json", [{"text": "never"}])
    result = run(
        "run",
        "--workers-in",
        f"pod:{IMAGE}",
        "--model",
        model,
        "go",
        cwd=tmp_path,
        environ=env(ANDON_HOME=str(tmp_path / "h")),
    )
    assert result.returncode == 2, result.stderr
    assert "cannot load the Kubernetes configuration" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("held", ["pods", "secrets"])
def test_sigint_while_a_pod_is_being_created_leaves_nothing(
    tmp_path: Path, cluster: FakeKubernetes, killer: list[Any], held: str
) -> None:
    """SIGINT while the API holds the worker's Pod create (or, right after it, its key Secret's):
    the start is given up, the create answered afterwards is undone, andon exits 130, and
    nothing of it is left in the cluster."""
    (tmp_path / "andon.toml").write_text(_toml(_kubeconfig(tmp_path / "kubeconfig", cluster)))
    hold = cluster.hold("POST", held)
    proc = start(
        "run",
        "--json",
        "--grace",
        "1,1",
        "--workers",
        "1",
        "--workers-in",
        f"pod:{IMAGE}",
        "--model",
        long_script(tmp_path),
        "go",
        cwd=tmp_path,
        environ=env(ANDON_HOME=str(tmp_path / "home")),
    )
    killer.append(proc)
    try:
        assert hold.arrived.wait(60), "andon never asked for the Pod"
        os.kill(proc.pid, signal.SIGINT)
    finally:
        hold.release()  # the create is answered after the start was given up
    code, _, err = finish(proc, timeout=60)
    assert code == 130, err
    assert "Traceback" not in err
    assert _pod_names(cluster), "a Pod was asked for (and made once the hold let go)"
    assert not cluster.pods("ci") and not cluster.secrets("ci")
    # A Pod created after the start was given up is deleted at once, but a kubelet kills its
    # processes only at the end of its own grace floor (2 s), which andon cannot shorten: they
    # are gone within that floor, not necessarily at andon's exit.
    deadline = time.monotonic() + cluster.force_grace + 10.0
    while not _nothing_left(cluster) and time.monotonic() < deadline:
        time.sleep(0.1)  # sleep-ok: bounded wait for the kubelet's kill, an external process
    assert _nothing_left(cluster), (cluster.pods("ci"), cluster.secrets("ci"))
