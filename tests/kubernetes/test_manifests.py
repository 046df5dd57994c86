"""What andon hands to Kubernetes, checked against the schemas of a current release
(kubernetes-validate ships the JSON schemas generated from each release's OpenAPI spec; strict: a
misspelt or misplaced field is an error): the worker Pod PodLauncher creates, and the one-Job-per-
session template of docs/scale-out.md."""

from __future__ import annotations

import asyncio
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from andon.fleet import TcpListen, WorkerPool, WorkerPoolConfig
from andon.testing import FakeKubernetes
from andon.workers import default
from tests.kubernetes.conftest import launcher_for

kubernetes_validate = pytest.importorskip("kubernetes_validate")

pytestmark = pytest.mark.timeout(60)

SCHEMA_VERSION = "1.37.0"
SCALE_OUT_MD = Path(__file__).resolve().parents[2] / "docs" / "scale-out.md"


def _sent_pods(cluster: FakeKubernetes) -> list[dict[str, Any]]:
    return [
        r.body
        for r in cluster.requests()
        if r.method == "POST" and r.path.endswith("/pods") and isinstance(r.body, dict)
    ]


async def test_the_worker_pod_andon_sends_validates_and_can_be_owned(
    cluster: FakeKubernetes,
) -> None:
    # andon's own Pod, as when it runs in one (its image is never pulled here: it never runs).
    owner = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "andon-session-7"},
        "spec": {"containers": [{"name": "agent", "image": "not/pulled:here"}]},
    }
    cluster.images = {"registry.example/andon-worker:test"}
    created = await asyncio.to_thread(_create, cluster, owner)
    launcher = launcher_for(
        cluster,
        requests={"cpu": "500m", "memory": "1Gi"},
        limits={"cpu": "2", "memory": "2Gi"},
        node_selector={"kubernetes.io/arch": "amd64"},
        volumes=[{"name": "work", "persistentVolumeClaim": {"claimName": "andon-work"}}],
        volume_mounts=[{"name": "work", "mountPath": "/workspace"}],
        owner_pod="andon-session-7",
    )
    config = WorkerPoolConfig(size=1, start_timeout=60, tcp=TcpListen("tcp://127.0.0.1:0"))
    async with WorkerPool(config, default(), launcher=launcher):
        [sent] = _sent_pods(cluster)[1:]
        worker = sent["metadata"]["name"]
        [container] = sent["spec"]["containers"]
        assert {"name": "work", "mountPath": "/workspace"} in container["volumeMounts"]
        assert sent["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Pod", "name": "andon-session-7", "uid": created}
        ]
        # andon's own Pod goes (deleted, its node lost) while andon cannot clean up: the
        # cluster deletes the workers it owns.
        cluster.delete_pod("andon-session-7", grace=0)
        gone = await asyncio.to_thread(
            cluster.wait_for, lambda c: c.pod(worker) is None and not c.processes(worker)
        )
        assert gone
    kubernetes_validate.validate(sent, SCHEMA_VERSION, strict=True)


def _create(cluster: FakeKubernetes, pod: dict[str, Any]) -> str:
    import json
    import urllib.request

    request = urllib.request.Request(
        f"{cluster.url}/api/v1/namespaces/default/pods",
        data=json.dumps(pod).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return str(json.load(response)["metadata"]["uid"])


def _job_template() -> str:
    text = SCALE_OUT_MD.read_text()
    section = text.split("### One Kubernetes Job per session", 1)[1]
    found = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert found is not None, "the Job template is gone from docs/scale-out.md"
    return found.group(1)


def _job(session: str = "fix-build-1", prompt: str = "Fix the build") -> dict[str, Any]:
    text = _job_template().replace("SESSION", session).replace("PROMPT", prompt)
    doc = yaml.safe_load(text)
    assert isinstance(doc, dict)
    return doc


def test_the_job_per_session_template_validates() -> None:
    kubernetes_validate.validate(_job(), SCHEMA_VERSION, strict=True)


def test_the_job_template_keeps_what_a_clean_stop_and_a_resume_need() -> None:
    job = _job()
    pod = job["spec"]["template"]["spec"]
    [container] = pod["containers"]
    argv = container["command"]
    assert pod["restartPolicy"] == "Never" and job["spec"]["backoffLimit"] == 0
    grace = argv[argv.index("--grace") + 1].split(",")
    assert pod["terminationGracePeriodSeconds"] > sum(float(g) for g in grace)
    assert job["spec"]["activeDeadlineSeconds"] > float(argv[argv.index("--turn-budget") + 1])
    # The session folder is on the shared volume, and named after the session (a Job created
    # again with the same name resumes it).
    session = argv[argv.index("--session") + 1]
    [mount] = container["volumeMounts"]
    assert session == f"{mount['mountPath']}/fix-build-1"
    assert argv[0] == "andon" and argv[1] == "run"  # exec form: andon is PID 1, no shell
    assert job["metadata"]["name"] == "andon-fix-build-1"


def test_the_template_loop_in_the_docs_fills_both_placeholders() -> None:
    text = SCALE_OUT_MD.read_text().split("### One Kubernetes Job per session", 1)[1]
    loop = re.search(r"```sh\n(.*?)```", text, re.S)
    assert loop is not None
    words = shlex.split(loop.group(1).replace("\n", " ; "))
    assert any("s/SESSION/" in w for w in words) and any("PROMPT" in w for w in words)
