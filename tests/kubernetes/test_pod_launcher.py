"""Tool workers as Pods (PodLauncher) against the stand-in API server: the Pod it asks for, the
stop ladder through deletions, the watch that resumes, and the edges (a delete during start, a Pod
that cannot be scheduled, a silent worker, failed and unknown phases, API errors)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from andon.base import ConfigError, ErrorCode, WorkerError
from andon.fleet import PodLauncher, PoolSetup, TcpListen, WorkerPool, WorkerPoolConfig, WorkerSpec
from andon.protocol import CurveKeys, key_to_hex
from andon.supervisor import ToolCallRequest, ToolExecutor
from andon.testing import FakeKubernetes
from andon.workers import default
from tests.kubernetes.conftest import IMAGE, launcher_for
from tests.support import RUN_TAG_VAR
from tests.workers.support import start

pytestmark = pytest.mark.timeout(90)

FAST = 0.25  # heartbeats when a silent worker must be found
SLOW = 30.0  # heartbeats when only the watch may tell that a worker ended


def _bash(call_id: str, command: str) -> ToolCallRequest:
    return ToolCallRequest(call_id, "bash", json.dumps({"command": command}), os.getcwd())


def _pool(launcher: PodLauncher, *, size: int = 1, interval: float = FAST) -> WorkerPool:
    config = WorkerPoolConfig(
        size=size,
        heartbeat_interval=interval,
        start_timeout=60,
        tcp=TcpListen("tcp://127.0.0.1:0"),
    )
    return WorkerPool(config, default(), launcher=launcher)


async def _until(cluster: FakeKubernetes, predicate: Any, timeout: float = 20.0) -> None:
    assert await asyncio.to_thread(cluster.wait_for, predicate, timeout), (
        "the cluster never got there"
    )


def _phase(cluster: FakeKubernetes, name: str) -> str | None:
    pod = cluster.pod(name)
    return None if pod is None else pod.get("status", {}).get("phase")


def _our_pods(cluster: FakeKubernetes) -> list[dict[str, Any]]:
    return [p for p in cluster.pods() if p["metadata"]["labels"].get("andon.pool")]


def _deletes(cluster: FakeKubernetes, pod: str) -> list[int | None]:
    """The grace periods of the deletions of ``pod`` asked so far (None: the default)."""
    graces: list[int | None] = []
    for r in cluster.requests():
        if r.method == "DELETE" and r.path.endswith(f"/pods/{pod}"):
            grace = r.query.get("gracePeriodSeconds")
            if grace is None and isinstance(r.body, dict):
                grace = r.body.get("gracePeriodSeconds")
            graces.append(None if grace is None else int(grace))
    return graces


async def test_a_call_runs_in_its_pod_and_the_close_leaves_nothing(
    cluster: FakeKubernetes,
) -> None:
    launcher = launcher_for(
        cluster,
        requests={"cpu": "250m", "memory": "256Mi"},
        limits={"memory": "1Gi"},
        labels={"team": "ci"},
        environment={"PATH": os.environ["PATH"], "DEEPSEEK_API_KEY": "must-not-reach-a-worker"},
    )
    async with _pool(launcher) as pool:
        [pod] = _our_pods(cluster)
        executor = ToolExecutor(pool, pool.registry)
        task, _, _ = await start(
            executor, _bash("c1-1-1", 'echo "$ANDON_FAKE_POD ${DEEPSEEK_API_KEY:-none}"')
        )
        outcome = await asyncio.wait_for(task, 30)
        assert outcome.error is None, outcome.error
        assert outcome.content.splitlines()[0].split() == [pod["metadata"]["uid"], "none"]
        name = pod["metadata"]["name"]
    spec = pod["spec"]
    [container] = spec["containers"]
    assert spec["restartPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False
    assert container["image"] == IMAGE
    assert container["resources"] == {
        "requests": {"cpu": "250m", "memory": "256Mi"},
        "limits": {"memory": "1Gi"},
    }
    assert pod["metadata"]["labels"]["team"] == "ci"
    assert container["command"][3:5] == ["worker", "--connect"]
    # The keys come from the Pod's own Secret, mounted read-only: never in argv or environment.
    [volume] = spec["volumes"]
    assert volume["secret"]["secretName"] == f"{name}-key"
    assert volume["secret"]["defaultMode"] == 0o400
    assert all("DEEPSEEK" not in e["name"] for e in container["env"])
    assert not any("secret" in word.lower() and "=" in word for word in container["command"])
    # Closed: the Pod was deleted by andon and nothing of the pool is left in the API.
    assert _deletes(cluster, name)
    assert cluster.pods() == [] and cluster.secrets() == []
    assert cluster.processes(name) == []


async def test_a_server_key_with_dollars_reaches_the_worker_in_its_pod(
    cluster: FakeKubernetes,
) -> None:
    """Kubernetes expands ``$(VAR)`` and ``$$`` in a container's args, and Z85 has ``$``: a
    server key with ``$$`` reached the worker one character short (exit code 2, about one Pod
    start in two hundred). The launcher writes the key in hex."""
    keys = next(k for k in iter(CurveKeys.generate, None) if b"$$" in k.public)
    config = WorkerPoolConfig(
        size=1,
        heartbeat_interval=FAST,
        start_timeout=60,
        tcp=TcpListen("tcp://127.0.0.1:0", server_keys=keys),
    )
    async with WorkerPool(config, default(), launcher=launcher_for(cluster)) as pool:
        [pod] = _our_pods(cluster)
        executor = ToolExecutor(pool, pool.registry)
        task, _, _ = await start(executor, _bash("c1-1-1", "echo in-the-pod"))
        outcome = await asyncio.wait_for(task, 30)
    assert outcome.content.startswith("in-the-pod"), outcome.content
    [container] = pod["spec"]["containers"]
    assert f"--server-key={key_to_hex(keys.public)}" in container["command"]
    assert "$" not in " ".join(container["command"])


async def test_two_pools_on_one_cluster_never_touch_each_others_pods(
    cluster: FakeKubernetes,
) -> None:
    async with _pool(launcher_for(cluster)) as first:
        [ours] = _our_pods(cluster)
        async with _pool(launcher_for(cluster)):
            assert len(_our_pods(cluster)) == 2
        # The second pool's close swept only its own label.
        assert [p["metadata"]["uid"] for p in _our_pods(cluster)] == [ours["metadata"]["uid"]]
        executor = ToolExecutor(first, first.registry)
        task, _, _ = await start(executor, _bash("c1-1-1", "echo still-here"))
        outcome = await asyncio.wait_for(task, 30)
        assert outcome.content.splitlines()[0].strip() == "still-here"
    assert cluster.pods() == []


async def test_a_pod_deleted_during_its_start_is_said_and_its_start_retried(
    cluster: FakeKubernetes, caplog: pytest.LogCaptureFixture
) -> None:
    # The Pod exists but cannot start before its Secret does: it is deleted by someone else
    # right then. That attempt ends with the reason (no wait for a hello that cannot come), and
    # the start is tried again with a new Pod (docs/workers.md, Starting workers).
    caplog.set_level("INFO", logger="andon.pool")  # during the pool's own start: info
    hold = cluster.hold("POST", "secrets")
    pool = _pool(launcher_for(cluster))
    starting = asyncio.create_task(pool.start())
    try:
        await asyncio.to_thread(hold.arrived.wait, 20)
        [pod] = _our_pods(cluster)
        cluster.delete_pod(pod["metadata"]["name"], grace=0)
        hold.release()
        await asyncio.wait_for(starting, 30)
        assert "exited during start: its Pod was deleted" in caplog.text
        [second] = _our_pods(cluster)
        assert second["metadata"]["name"] != pod["metadata"]["name"]
    finally:
        hold.release()
        await pool.aclose()
    assert cluster.pods() == [] and cluster.secrets() == []


async def test_a_pool_closed_while_a_create_is_in_flight_leaves_no_pod(
    cluster: FakeKubernetes,
) -> None:
    # The create is answered only after the start was given up (a CI runner's SIGTERM during
    # the start): what the API made then is deleted, not left running.
    hold = cluster.hold("POST", "pods")
    pool = _pool(launcher_for(cluster))
    starting = asyncio.create_task(pool.start())
    await asyncio.to_thread(hold.arrived.wait, 20)
    starting.cancel()
    hold.release()
    with pytest.raises(asyncio.CancelledError):
        await starting
    await pool.aclose()
    assert await asyncio.to_thread(cluster.wait_for, lambda c: not c.pods() and not c.secrets())
    assert cluster.pods() == [] and cluster.secrets() == []


async def test_a_start_given_up_while_its_create_is_in_flight_deletes_what_was_made(
    tmp_path: Path, cluster: FakeKubernetes
) -> None:
    # The same moment, seen by the launcher alone: nothing sweeps here, so only the start's own
    # clean-up can delete the Pod the API made after its caller was gone.
    launcher = launcher_for(cluster)
    await launcher.open(_setup(tmp_path))
    try:
        hold = cluster.hold("POST", "pods")
        starting = asyncio.create_task(
            launcher.start(WorkerSpec("w1", "tcp://127.0.0.1:9", heartbeat_interval=1.0))
        )
        await asyncio.to_thread(hold.arrived.wait, 20)
        starting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await starting
        hold.release()
        await _until(cluster, lambda c: any(r.method == "POST" for r in c.requests()))
        await _until(
            cluster,
            lambda c: len(_deletes(c, f"andon-{launcher._tag}-w1")) > 0 and not c.pods(),
        )
    finally:
        await launcher.aclose()


def _setup(tmp_path: Path) -> PoolSetup:
    return PoolSetup(
        runtime_dir=tmp_path,
        registry=default(),
        hidden_env=frozenset(),
        max_message_bytes=1 << 20,
        identity=f"test-{os.getpid()}-{os.urandom(4).hex()}",
    )


async def _lost_through_the_watch(cluster: FakeKubernetes, *, expire: bool) -> str:
    """A call runs; the watch drops and cannot reconnect while the Pod is deleted by someone
    else; then it reconnects. Heartbeats are too slow to tell: only the resumed watch can."""
    async with _pool(launcher_for(cluster), interval=SLOW) as pool:
        [pod] = _our_pods(cluster)
        name = pod["metadata"]["name"]
        executor = ToolExecutor(pool, pool.registry)
        task, recorder, _ = await start(executor, _bash("c1-1-1", "echo ready; sleep 60"))
        await asyncio.wait_for(recorder.wait_output(b"ready"), 30)
        watches = cluster.watch_count()
        cluster.pause_watches()
        cluster.drop_watches()
        # Silenced first: a kubelet gives even a grace-0 deletion SIGTERM and a short grace, and
        # a worker that heard it would say so itself; only the watch may tell here.
        os.kill(_worker_pid(cluster, name), signal.SIGSTOP)
        cluster.delete_pod(name, grace=0)
        await _until(cluster, lambda c: c.pod(name) is None and not c.processes(name))
        if expire:
            cluster.expire_history()
        cluster.resume_watches()
        outcome = await asyncio.wait_for(task, 30)
        assert cluster.watch_count() > watches
        assert outcome.error is not None and outcome.error.code == ErrorCode.WORKER_LOST
        return outcome.error.message


async def test_a_watch_that_drops_is_resumed_and_sees_what_happened_meanwhile(
    cluster: FakeKubernetes,
) -> None:
    message = await _lost_through_the_watch(cluster, expire=False)
    assert "its Pod was deleted" in message
    resumed = [
        r
        for r in cluster.requests()
        if r.query.get("watch") in ("true", "True", "1") and r.query.get("resourceVersion")
    ]
    assert len(resumed) >= 2  # the first watch, and the one resumed where it stopped


async def test_a_watch_whose_history_is_gone_lists_the_pods_again(
    cluster: FakeKubernetes,
) -> None:
    message = await _lost_through_the_watch(cluster, expire=True)
    assert "its Pod is gone" in message


async def test_a_pod_that_cannot_be_scheduled_fails_the_start_with_the_reason(
    cluster: FakeKubernetes,
) -> None:
    cluster.schedulable = False
    pool = _pool(launcher_for(cluster, requests={"cpu": "64"}))
    try:
        with pytest.raises(WorkerError) as raised:
            await asyncio.wait_for(pool.start(), 30)  # the start deadline is 60 s: no wait
    finally:
        await pool.aclose()
    assert "its Pod cannot be scheduled: 0/1 nodes are available: 1 Insufficient cpu" in str(
        raised.value
    )
    assert cluster.pods() == [] and cluster.secrets() == []


async def test_with_wait_for_nodes_an_unschedulable_pod_waits_for_a_node(
    cluster: FakeKubernetes,
) -> None:
    cluster.schedulable = False
    pool = _pool(launcher_for(cluster, wait_for_nodes=True))
    starting = asyncio.create_task(pool.start())
    try:
        await _until(cluster, lambda c: any(_unschedulable(p) for p in c.pods()))
        assert not starting.done()
        cluster.schedule_pending()
        await asyncio.wait_for(starting, 30)
        executor = ToolExecutor(pool, pool.registry)
        task, _, _ = await start(executor, _bash("c1-1-1", "echo scheduled"))
        assert (await asyncio.wait_for(task, 30)).content.splitlines()[0].strip() == "scheduled"
    finally:
        await pool.aclose()


def _unschedulable(pod: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "PodScheduled" and c.get("reason") == "Unschedulable"
        for c in pod.get("status", {}).get("conditions", [])
    )


async def test_an_image_that_cannot_be_pulled_fails_the_start_with_the_reason(
    tmp_path: Path, cluster: FakeKubernetes
) -> None:
    cluster.images = {"some/other:image"}
    pool = _pool(launcher_for(cluster))
    try:
        with pytest.raises(
            WorkerError, match=r"its container cannot start: (ErrImagePull|ImagePullBackOff)"
        ):
            await asyncio.wait_for(pool.start(), 30)
    finally:
        await pool.aclose()
    assert cluster.pods() == []


def _worker_pid(cluster: FakeKubernetes, pod: str) -> int:
    found = _find_worker(cluster, pod)
    if found is None:
        raise AssertionError(f"no worker process in {pod}")
    return found


def _find_worker(cluster: FakeKubernetes, pod: str) -> int | None:
    for pid in cluster.processes(pod):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        # The worker, not the program that started the Pod's pid namespace with its argv.
        if b"--connect" in argv and not argv[0].endswith(b"unshare"):
            return pid
    return None


async def test_a_silent_worker_is_lost_and_its_pod_deleted_at_once(
    cluster: FakeKubernetes,
) -> None:
    async with _pool(launcher_for(cluster), interval=FAST) as pool:
        [pod] = _our_pods(cluster)
        name = pod["metadata"]["name"]
        executor = ToolExecutor(pool, pool.registry)
        task, recorder, _ = await start(executor, _bash("c1-1-1", "echo ready; sleep 60"))
        await asyncio.wait_for(recorder.wait_output(b"ready"), 30)
        os.kill(_worker_pid(cluster, name), signal.SIGSTOP)  # alive, and silent
        outcome = await asyncio.wait_for(task, 30)
        assert outcome.error is not None and outcome.error.code == ErrorCode.WORKER_LOST
        assert "deleting its Pod kills the call's processes" in outcome.error.message
        # The backstop: a deletion with grace 0, and nothing of the Pod runs any more.
        await _until(cluster, lambda c: 0 in _deletes(c, name))
        await _until(cluster, lambda c: c.pod(name) is None and not c.processes(name))


async def test_a_failed_pod_ends_its_call_with_the_clusters_reason(
    cluster: FakeKubernetes,
) -> None:
    async with _pool(launcher_for(cluster), interval=SLOW) as pool:
        [pod] = _our_pods(cluster)
        executor = ToolExecutor(pool, pool.registry)
        task, recorder, _ = await start(executor, _bash("c1-1-1", "echo ready; sleep 60"))
        await asyncio.wait_for(recorder.wait_output(b"ready"), 30)
        cluster.fail_pod(
            pod["metadata"]["name"], "Evicted", "The node was low on resource: memory."
        )
        outcome = await asyncio.wait_for(task, 30)
    assert outcome.error is not None and outcome.error.code == ErrorCode.WORKER_LOST
    assert "its Pod failed (Evicted; The node was low on resource: memory." in outcome.error.message


class _Heard(logging.Handler):
    """Sets ``heard`` when a record whose message holds ``words`` is logged (from any thread)."""

    def __init__(self, words: str) -> None:
        super().__init__()
        self.words = words
        self.heard = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.words in record.getMessage():
            self.heard.set()


async def test_a_pod_evicted_from_a_lost_node_is_not_taken_for_ended(tmp_path: Path) -> None:
    # A lost node: its kubelet can neither report nor kill. After the toleration of the
    # unreachable taint the cluster deletes the Pod, which stays Terminating: the worker may run
    # on, so the launcher says why and leaves the end to the heartbeats, asking no deletion.
    heard = _Heard("DeletionByTaintManager")
    logging.getLogger("andon.pool").addHandler(heard)
    try:
        with FakeKubernetes(
            tmp_path / "cluster",
            extra_env={RUN_TAG_VAR: os.environ[RUN_TAG_VAR]},
            manual_clock=True,
        ) as cluster:
            # A short grace: the close's sweep waits that long for the kill it can only assume.
            launcher = launcher_for(cluster, termination_grace=2)
            async with _pool(launcher, interval=SLOW) as pool:
                [pod] = _our_pods(cluster)
                name = pod["metadata"]["name"]
                cluster.lose_node()
                cluster.advance(300)  # the toleration every Pod gets by default
                await _until(cluster, lambda c: _terminating(c, name))
                assert await asyncio.to_thread(heard.heard.wait, 20), "the launcher said nothing"
                executor = ToolExecutor(pool, pool.registry)
                task, _, _ = await start(executor, _bash("c1-1-1", "echo still-working"))
                outcome = await asyncio.wait_for(task, 30)
                assert outcome.content.splitlines()[0].strip() == "still-working"
                assert _deletes(cluster, name) == []
            # Closed: the sweep force-deleted what the lost node's kubelet could not end.
            assert cluster.pods() == [] and cluster.secrets() == []
    finally:
        logging.getLogger("andon.pool").removeHandler(heard)


def _terminating(cluster: FakeKubernetes, name: str) -> bool:
    pod = cluster.pod(name)
    return pod is not None and bool(pod["metadata"].get("deletionTimestamp"))


async def test_a_pod_force_deleted_while_running_ends_when_its_kubelet_kills_it(
    tmp_path: Path, cluster: FakeKubernetes
) -> None:
    # A grace-0 deletion takes the Pod out of the API at once, but its kubelet still gives the
    # container SIGTERM and a grace of its own: the worker has not ended before that is over.
    launcher = launcher_for(cluster)
    await launcher.open(_setup(tmp_path))
    try:
        # With keys, the worker waits for a welcome nobody sends (without, it exits at once).
        keys = CurveKeys.generate()
        spec = WorkerSpec(
            "w1",
            "tcp://127.0.0.1:9",
            heartbeat_interval=1.0,
            server_key=CurveKeys.generate().public,
            worker_keys=keys,
        )
        worker = await launcher.start(spec)
        name = f"andon-{launcher._tag}-w1"
        # The worker's exec is nothing the fake's store sees: looked for every 20 ms, bounded.
        for _ in range(1500):
            if _find_worker(cluster, name) is not None:
                break
            await asyncio.sleep(0.02)  # sleep-ok: a poll for an exec, bounded by the loop
        os.kill(_worker_pid(cluster, name), signal.SIGSTOP)  # only the SIGKILL can end it
        loop = asyncio.get_running_loop()
        asked = loop.time()
        launcher.kill(worker)
        await asyncio.wait_for(launcher.exited(worker), 30)
        assert loop.time() - asked >= 2.0  # the kubelet's floor, and the launcher's default
        assert cluster.pod(name) is None
        await _until(cluster, lambda c: not c.processes(name))
    finally:
        await launcher.aclose()


async def test_a_conflict_on_create_is_a_clear_error(cluster: FakeKubernetes) -> None:
    cluster.fail_next("POST", "pods", 409, "AlreadyExists", 'pods "andon-x-w1" already exists')
    pool = _pool(launcher_for(cluster))
    try:
        with pytest.raises(
            WorkerError, match="Kubernetes would not create the Pod: 409 AlreadyExists"
        ):
            await asyncio.wait_for(pool.start(), 30)
    finally:
        await pool.aclose()
    assert cluster.pods() == []


async def test_a_stop_deletes_the_pod_with_a_grace_period(
    tmp_path: Path, cluster: FakeKubernetes
) -> None:
    launcher = launcher_for(cluster)
    await launcher.open(_setup(tmp_path))
    try:
        # Nobody listens at this endpoint: the worker waits for a welcome, as a real one would.
        worker = await launcher.start(WorkerSpec("w1", "tcp://127.0.0.1:9", heartbeat_interval=1.0))
        name = f"andon-{launcher._tag}-w1"
        await _until(cluster, lambda c: _phase(c, name) == "Running")
        await asyncio.wait_for(launcher.stop(worker, 2.5), 30)
        assert worker.has_exited()
        assert _deletes(cluster, name)[0] == 3  # the stop's timeout, rounded up
        await _until(cluster, lambda c: c.pod(name) is None and not c.processes(name))
    finally:
        await launcher.aclose()
    assert cluster.pods() == []


async def test_without_the_kubernetes_package_the_error_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "kubernetes", None)
    launcher = PodLauncher(IMAGE)
    setup = PoolSetup(tmp_path, default(), frozenset(), 1 << 20, "x")
    with pytest.raises(ConfigError, match=r"pip install 'andon\[kubernetes\]'"):
        await launcher.open(setup)


async def test_an_unreachable_api_is_a_clear_error(tmp_path: Path) -> None:
    import kubernetes

    configuration = kubernetes.client.Configuration()
    configuration.host = "http://127.0.0.1:9"  # nothing listens on the discard port
    launcher = PodLauncher(IMAGE, configuration=configuration, engine_timeout=5)
    setup = PoolSetup(tmp_path, default(), frozenset(), 1 << 20, "x")
    with pytest.raises(WorkerError, match="cannot reach the Kubernetes API"):
        await launcher.open(setup)
    await launcher.aclose()


async def test_an_api_gone_after_the_open_fails_a_start_clearly(
    tmp_path: Path, cluster: FakeKubernetes
) -> None:
    launcher = launcher_for(cluster, engine_timeout=5.0)
    await launcher.open(_setup(tmp_path))
    try:
        cluster.close()  # the API server is gone: connections are refused
        with pytest.raises(WorkerError, match="w1 cannot start: cannot reach the Kubernetes API"):
            await launcher.start(WorkerSpec("w1", "tcp://127.0.0.1:9", heartbeat_interval=1.0))
    finally:
        await launcher.aclose()
