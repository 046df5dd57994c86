"""The manual end-to-end check of PodLauncher against a real cluster (docs/scale-out.md, Checking
against a real cluster). Not run in CI (no cluster can run there): it skips unless
``ANDON_KUBE_E2E=1``, and needs ``ANDON_KUBE_IMAGE`` (an image with andon, loadable by the
cluster's nodes) and ``ANDON_KUBE_ADVERTISE`` (``tcp://ADDRESS``: where the Pods reach this
machine); ``ANDON_KUBE_NAMESPACE`` defaults to ``default``. The current kubeconfig context is used.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
from typing import Any

import pytest

from andon import cancel
from andon.base import ErrorCode, GracePolicy
from andon.fleet import PodLauncher, TcpListen, WorkerPool, WorkerPoolConfig
from andon.supervisor import ToolCallRequest, ToolExecutor
from andon.workers import default
from tests.workers.support import start

pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        os.environ.get("ANDON_KUBE_E2E") != "1", reason="a real cluster: set ANDON_KUBE_E2E=1"
    ),
]

NAMESPACE = os.environ.get("ANDON_KUBE_NAMESPACE", "default")

# Counts, from inside the Pod (a slim image has no ps), the processes whose command line holds a
# marker, this counting one left out: the worker's own sweep must have left none.
_COUNT = (
    "python3 -c \"import os,sys; print(sum(1 for p in os.listdir('/proc') if p.isdigit() and "
    "sys.argv[1].encode() in open('/proc/'+p+'/cmdline','rb').read()) - 1)\" {marker}"
)


def _bash(call_id: str, command: str) -> ToolCallRequest:
    return ToolCallRequest(call_id, "bash", json.dumps({"command": command}), "/")


def _pool() -> WorkerPool:
    launcher = PodLauncher(
        os.environ["ANDON_KUBE_IMAGE"],
        namespace=NAMESPACE,
        requests={"cpu": "100m", "memory": "128Mi"},
    )
    config = WorkerPoolConfig(
        size=1,
        start_timeout=180,  # a first pull of the image
        tcp=TcpListen("tcp://0.0.0.0:0", advertise=os.environ["ANDON_KUBE_ADVERTISE"]),
    )
    return WorkerPool(config, default(), launcher=launcher)


def _pods_of(pool: WorkerPool) -> list[Any]:
    import kubernetes

    kubernetes.config.load_kube_config()
    api = kubernetes.client.CoreV1Api()
    launcher = pool.launcher
    assert isinstance(launcher, PodLauncher)
    selector = f"andon.pool={launcher._tag}"
    pods = api.list_namespaced_pod(NAMESPACE, label_selector=selector).items
    secrets_left = api.list_namespaced_secret(NAMESPACE, label_selector=selector).items
    return [*pods, *secrets_left]


async def _gone(pool: WorkerPool) -> None:
    # The cluster's garbage collection runs on its own time: polled, for a bounded minute.
    for _ in range(60):
        if not await asyncio.to_thread(_pods_of, pool):
            return
        await asyncio.sleep(1)  # sleep-ok: polling a real cluster, which has no event for this
    raise AssertionError(f"left in the cluster: {await asyncio.to_thread(_pods_of, pool)}")


async def test_a_call_runs_in_a_pod_and_a_cancel_leaves_no_escapee() -> None:
    marker = f"andon-e2e-{secrets.token_hex(4)}"
    pool = _pool()
    async with pool:
        executor = ToolExecutor(pool, pool.registry, grace=GracePolicy(True, 1.0, 1.0))
        task, _, _ = await start(executor, _bash("c1-1-1", "echo $HOSTNAME"))
        outcome = await asyncio.wait_for(task, 60)
        assert outcome.content.splitlines()[0].strip().startswith("andon-")
        sleeper = f"bash -c 'exec -a {marker} sleep 300'"
        # Two escapees (a new session each, one re-parented away) and the call's own sleep.
        tree = f"setsid {sleeper} & (setsid {sleeper} &); echo ready; {sleeper}"
        task, recorder, controller = await start(executor, _bash("c1-1-2", tree))
        await asyncio.wait_for(recorder.wait_output(b"ready"), 60)
        controller.abort(cancel.User())
        outcome = await asyncio.wait_for(task, 60)
        assert outcome.error is not None and outcome.error.code == ErrorCode.ABORTED
        task, _, _ = await start(executor, _bash("c1-1-3", _COUNT.format(marker=marker)))
        assert (await asyncio.wait_for(task, 60)).content.splitlines()[0].strip() == "0"
    await _gone(pool)


async def test_a_pod_deleted_under_a_call_is_worker_lost_and_nothing_is_left() -> None:
    import kubernetes

    pool = _pool()
    async with pool:
        executor = ToolExecutor(pool, pool.registry)
        task, recorder, _ = await start(executor, _bash("c1-1-1", "echo ready; sleep 300"))
        await asyncio.wait_for(recorder.wait_output(b"ready"), 60)
        [pod] = [
            p
            for p in await asyncio.to_thread(_pods_of, pool)
            if isinstance(p, kubernetes.client.V1Pod)
        ]
        api = kubernetes.client.CoreV1Api()
        assert pod.metadata is not None and pod.metadata.name is not None  # a listed Pod has both
        await asyncio.to_thread(
            api.delete_namespaced_pod, pod.metadata.name, NAMESPACE, grace_period_seconds=0
        )
        outcome = await asyncio.wait_for(task, 120)
        assert outcome.error is not None and outcome.error.code == ErrorCode.WORKER_LOST
    await _gone(pool)
