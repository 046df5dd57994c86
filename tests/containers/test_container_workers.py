"""Tool workers as containers, through docker-py against a real Podman service.

Each worker is a container's main process (``andon worker --connect ipc://…`` on a bind-mounted
socket folder, no network). What is asserted is what a user of ``--workers-in container:IMAGE``
relies on: calls stream and complete; a cancel leaves nothing of the tree inside; a supervisor
killed with -9 leaves no container behind; a worker killed inside is ``WORKER_LOST``, its
container removed and replaced. Processes inside are found from the host by a random marker in
their command lines (rootful podman shares the host's view of /proc; containers are found by the
pool's own label).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from andon import cancel, procs
from andon.base import AndonError, ErrorCode, GracePolicy
from andon.fleet import ContainerLauncher, TcpListen, WorkerPool, WorkerPoolConfig, host_mounts
from andon.supervisor import ToolCallRequest, ToolExecutor
from andon.testing import host_mount_paths, worker_ulimits
from andon.workers import default
from tests.support import escapee_tree, procs_with_marker
from tests.workers.support import start

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]

INTERVAL = 0.5  # heartbeats; deadline 1.5 s


def _marker() -> str:
    return str(int.from_bytes(os.urandom(4), "big"))


def _launcher(
    engine_url: str, image: str, workspace: Path, transport: str = "ipc", user: str | None = None
) -> ContainerLauncher:
    mounts = host_mounts([*host_mount_paths()])
    mounts += host_mounts([str(workspace)], read_only=False)
    return ContainerLauncher(
        image,
        base_url=engine_url,
        mounts=mounts,
        runtime="runc",
        ulimits=worker_ulimits(),
        command=(sys.executable, "-m", "andon"),
        transport=transport,
        user=user,
    )


def _bash(call_id: str, command: str, cwd: Path) -> ToolCallRequest:
    return ToolCallRequest(call_id, "bash", json.dumps({"command": command}), str(cwd))


def _ours(engine: Any, pool: WorkerPool) -> list[Any]:
    """This pool's containers, found by its label (running or not). Sparse (ids, no inspection):
    a container removed while it is listed would otherwise fail the whole listing."""
    label = {"label": f"andon.pool={pool.identity}"}
    return list(engine.containers.list(all=True, filters=label, sparse=True))


async def test_a_bash_call_streams_and_completes_in_a_container(
    engine: Any, engine_url: str, worker_image: str, tmp_path: Path
) -> None:
    config = WorkerPoolConfig(size=1, heartbeat_interval=INTERVAL, start_timeout=60)
    launcher = _launcher(engine_url, worker_image, tmp_path)
    async with WorkerPool(config, default(), launcher=launcher) as pool:
        assert len(_ours(engine, pool)) == 1
        executor = ToolExecutor(pool, pool.registry)
        command = "echo first; echo inside-pid1-is-$(cat /proc/1/comm); echo $PWD > seen"
        task, recorder, _ = await start(executor, _bash("c1-1-1", command, tmp_path))
        outcome = await asyncio.wait_for(task, 60)
        assert b"first" in recorder.output  # streamed as output events
    assert outcome.error is None and outcome.exit_code == 0
    assert "inside-pid1-is-python" in outcome.content  # the worker is the container's PID 1
    assert (tmp_path / "seen").read_text().strip() == str(tmp_path)  # the workspace, same path
    assert _ours(engine, pool) == []  # closed: nothing left


def _tree(marker: str) -> str:
    return escapee_tree(marker)


async def test_a_cancel_stops_a_tree_with_escapees_inside_with_no_survivor(
    engine: Any, engine_url: str, worker_image: str, tmp_path: Path
) -> None:
    marker = _marker()
    config = WorkerPoolConfig(size=1, heartbeat_interval=INTERVAL, start_timeout=60)
    async with WorkerPool(
        config, default(), launcher=_launcher(engine_url, worker_image, tmp_path)
    ) as pool:
        executor = ToolExecutor(pool, pool.registry, grace=GracePolicy(True, 0.3, 0.3))
        task, recorder, controller = await start(executor, _bash("c1-1-1", _tree(marker), tmp_path))
        await asyncio.wait_for(recorder.wait_output(b"ready"), 60)
        assert len(procs_with_marker(marker)) >= 2
        controller.abort(cancel.User())
        outcome = await asyncio.wait_for(task, 60)
        # The worker (not the engine) stopped it, on the grace timeline, and lives on.
        assert outcome.error is not None and outcome.error.code == ErrorCode.ABORTED
        assert recorder.stages[:2] == ["interrupt", "term"]
        assert procs_with_marker(marker, wait=5.0) == []
        assert len(_ours(engine, pool)) == 1


async def test_a_worker_killed_inside_is_worker_lost_removed_and_replaced(
    engine: Any, engine_url: str, worker_image: str, tmp_path: Path
) -> None:
    marker = _marker()
    config = WorkerPoolConfig(size=1, heartbeat_interval=INTERVAL, start_timeout=60)
    async with WorkerPool(
        config, default(), launcher=_launcher(engine_url, worker_image, tmp_path)
    ) as pool:
        executor = ToolExecutor(pool, pool.registry)
        (first,) = _ours(engine, pool)
        task, recorder, _ = await start(executor, _bash("c1-1-1", _tree(marker), tmp_path))
        await asyncio.wait_for(recorder.wait_output(b"ready"), 60)
        first.reload()
        host_pid = first.attrs["State"]["Pid"]  # the worker, PID 1 inside, as the host sees it
        info = procs.stat(host_pid)
        assert info is not None
        handle = procs.Pidfd.open(info.key)
        assert handle is not None
        handle.send(signal.SIGKILL)
        handle.close()
        outcome = await asyncio.wait_for(task, 60)
        assert outcome.error is not None and outcome.error.code == ErrorCode.WORKER_LOST
        assert "container" in (outcome.error.message or "")
        # PID 1 gone: the kernel killed its namespace, escapees included.
        assert procs_with_marker(marker, wait=5.0) == []
        # Replaced: a new container answers the next call.
        task, _, _ = await start(executor, _bash("c1-1-2", "echo replaced", tmp_path))
        again = await asyncio.wait_for(task, 60)
        assert again.content.startswith("replaced")
        ids = [c.id for c in _ours(engine, pool)]
        assert first.id not in ids and len(ids) == 1


DRIVER = textwrap.dedent(
    """
    import asyncio, json, os, sys
    from andon.base import AbortController
    from andon.fleet import ContainerLauncher, Mount
    from andon.supervisor import ToolCallRequest, ToolExecutor
    from andon.fleet import WorkerPool, WorkerPoolConfig
    from andon.workers import default

    spec = json.loads(sys.argv[1])

    async def main():
        launcher = ContainerLauncher(
            spec["image"], base_url=spec["url"], runtime="runc",
            mounts=[Mount(p, p, ro) for p, ro in spec["mounts"]],
            ulimits={k: tuple(v) for k, v in spec["ulimits"].items()},
            command=spec["command"],
        )
        config = WorkerPoolConfig(size=1, heartbeat_interval=spec["interval"], start_timeout=60)
        async with WorkerPool(config, default(), launcher=launcher) as pool:
            print(json.dumps({"pool": pool.identity}), flush=True)
            executor = ToolExecutor(pool, pool.registry)
            await executor.execute(
                ToolCallRequest("c1-1-1", "bash", json.dumps({"command": spec["command_line"]}),
                                spec["cwd"]),
                AbortController().signal,
            )

    asyncio.run(main())
    """
)


def test_kill_9_of_the_supervisor_leaves_no_container_and_nothing_inside(
    engine: Any, engine_url: str, worker_image: str, tmp_path: Path
) -> None:
    marker = _marker()
    spec = {
        "image": worker_image,
        "url": engine_url,
        "mounts": [[p, True] for p in host_mount_paths()] + [[str(tmp_path), False]],
        "ulimits": worker_ulimits(),
        "command": [sys.executable, "-m", "andon"],
        "interval": INTERVAL,
        "cwd": str(tmp_path),
        "command_line": f"{_tree(marker)}",
    }
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, json.dumps(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert driver.stdout is not None
        identity = json.loads(driver.stdout.readline())["pool"]
        label = {"label": f"andon.pool={identity}"}
        # Wait for the tree inside (its processes are visible from the host).
        deadline = 60.0
        found = _wait_for(lambda: len(procs_with_marker(marker)) >= 2, deadline)
        assert found, f"the tree never started: {_stderr_of(driver)}"
        # sparse: the list alone, without inspecting each container after it (a container that
        # goes between the two makes a full list fail with NotFound).
        assert len(engine.containers.list(all=True, filters=label, sparse=True)) == 1
        driver.kill()
        driver.wait(30)
        # The worker inside hears no heartbeat past the deadline, kills its call and exits;
        # auto-remove takes the container away.
        gone = _wait_for(
            lambda: not engine.containers.list(all=True, filters=label, sparse=True), 30
        )
        assert gone, "the container outlived its supervisor"
        assert procs_with_marker(marker, wait=5.0) == []
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(30)
        for stream in (driver.stdout, driver.stderr):
            if stream is not None:
                stream.close()


def _stderr_of(driver: subprocess.Popen[bytes]) -> str:
    if driver.poll() is None:
        driver.kill()
        driver.wait(30)
    assert driver.stderr is not None
    return driver.stderr.read().decode(errors="replace")[-2000:]


def _wait_for(predicate: Callable[[], bool], timeout: float) -> bool:
    """Poll the engine (it offers no event this test can wait on portably) until ``predicate``
    holds, for up to ``timeout`` seconds."""
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)  # sleep-ok: polling the engine's state, not ordering a race
    return predicate()


async def test_a_container_worker_over_tcp_and_curve_has_its_keys_but_no_tool_can_read_them(
    engine: Any, engine_url: str, worker_image: str, tmp_path: Path
) -> None:
    """The remote-engine shape (no shared socket folder): tcp + CURVE, the worker's keys copied
    into the container before it starts, deleted by the worker before any call."""
    config = WorkerPoolConfig(
        size=1, heartbeat_interval=INTERVAL, start_timeout=60, tcp=TcpListen("tcp://127.0.0.1:0")
    )
    launcher = _launcher(engine_url, worker_image, tmp_path, transport="tcp")
    async with WorkerPool(config, default(), launcher=launcher) as pool:
        assert pool.endpoint.startswith("tcp://127.0.0.1:")
        executor = ToolExecutor(pool, pool.registry)
        command = "ls /andon-keys/* 2>/dev/null || echo no-key-file; echo done"
        task, _, _ = await start(executor, _bash("c1-1-1", command, tmp_path))
        outcome = await asyncio.wait_for(task, 60)
    assert outcome.error is None, outcome
    assert "no-key-file" in outcome.content and "done" in outcome.content
    assert _ours(engine, pool) == []


async def test_a_worker_run_as_another_user_reads_its_keys_and_its_tools_files_are_that_users(
    engine: Any, engine_url: str, worker_image: str, tmp_path: Path
) -> None:
    """``user``: the worker and its tools run as that uid:gid in the container; a file a tool
    writes in the bind-mounted workspace belongs to that uid:gid on the host. Over tcp, whose
    keys the worker must read and delete as that user (they are copied in before it starts)."""
    uid, gid = 4321, 4322
    workspace = tmp_path / "ws"
    workspace.mkdir()
    os.chown(workspace, uid, gid)
    config = WorkerPoolConfig(
        size=1, heartbeat_interval=INTERVAL, start_timeout=60, tcp=TcpListen("tcp://127.0.0.1:0")
    )
    launcher = _launcher(engine_url, worker_image, workspace, "tcp", user=f"{uid}:{gid}")
    async with WorkerPool(config, default(), launcher=launcher) as pool:
        executor = ToolExecutor(pool, pool.registry)
        command = "id -u; id -g; echo hi > made.txt; ls -A /andon-keys; echo done"
        task, _, _ = await start(executor, _bash("c1-1-1", command, workspace))
        outcome = await asyncio.wait_for(task, 60)
    assert outcome.error is None, outcome
    # ids as asked; the keys folder is empty (read and deleted before the call)
    assert outcome.content.split()[:3] == [str(uid), str(gid), "done"], outcome.content
    made = (workspace / "made.txt").stat()
    assert (made.st_uid, made.st_gid) == (uid, gid)
    assert _ours(engine, pool) == []


async def test_the_launcher_learns_the_api_version_from_the_ping_not_from_version(
    engine_url: str, worker_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docker-py's own negotiation asks ``GET /version``, which Podman answers slowly: the
    launcher reads the version from ``/_ping``, and never asks ``/version`` (made to fail here)."""
    import docker

    def refused(*args: object, **kwargs: object) -> None:
        raise docker.errors.APIError("GET /version asked")

    monkeypatch.setattr(docker.APIClient, "version", refused)
    config = WorkerPoolConfig(size=1, heartbeat_interval=INTERVAL, start_timeout=60)
    launcher = _launcher(engine_url, worker_image, tmp_path)
    async with WorkerPool(config, default(), launcher=launcher) as pool:
        executor = ToolExecutor(pool, pool.registry)
        task, _, _ = await start(executor, _bash("c1-1-1", "echo hi", tmp_path))
        outcome = await asyncio.wait_for(task, 60)
    assert outcome.error is None and "hi" in outcome.content, outcome


async def test_an_engine_that_is_not_there_is_one_line(tmp_path: Path, worker_image: str) -> None:
    launcher = _launcher(f"unix://{tmp_path}/no-engine.sock", worker_image, tmp_path)
    with pytest.raises(AndonError) as caught:
        async with WorkerPool(WorkerPoolConfig(size=1), default(), launcher=launcher):
            pass
    said = str(caught.value)
    assert f"no container engine answers at unix://{tmp_path}/no-engine.sock" in said, said
    assert "(no such socket)" in said and len(said.splitlines()) == 1, said


async def test_a_start_given_up_while_the_engine_creates_leaves_no_container(
    engine: Any, engine_url: str, worker_image: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pool gave the start up (a CI runner's SIGTERM during the start) while the engine was
    still creating the container: what the engine made afterwards is removed, not left to run
    until its worker's welcome timeout."""
    import threading

    from andon.fleet import PoolSetup, WorkerSpec

    identity = f"test-orphan-{os.getpid()}-{os.urandom(4).hex()}"
    launcher = _launcher(engine_url, worker_image, tmp_path)
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    await launcher.open(PoolSetup(runtime, default(), frozenset(), 1 << 20, identity))
    arrived, release = threading.Event(), threading.Event()
    from docker.models.containers import ContainerCollection

    create = ContainerCollection.create

    made: list[Any] = []

    def held_create(self: Any, *args: Any, **kwargs: Any) -> Any:
        arrived.set()
        release.wait(60)
        made.append(create(self, *args, **kwargs))
        return made[-1]

    monkeypatch.setattr(ContainerCollection, "create", held_create)
    from docker.models.containers import Container

    start_container = Container.start
    started: list[str] = []

    def recorded_start(self: Any, *args: Any, **kwargs: Any) -> Any:
        started.append(self.id)
        return start_container(self, *args, **kwargs)

    monkeypatch.setattr(Container, "start", recorded_start)
    try:
        spec = WorkerSpec("w1", f"ipc://{runtime}/nobody.sock", heartbeat_interval=1.0)
        starting = asyncio.create_task(launcher.start(spec))
        assert await asyncio.to_thread(arrived.wait, 30)
        starting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await starting
        release.set()

        def ours() -> list[Any]:
            return list(
                engine.containers.list(
                    all=True, filters={"label": f"andon.pool={identity}"}, sparse=True
                )
            )

        # Created, then removed by the start's own clean-up (nothing else sweeps here), and never
        # started: no worker ran in it for a moment.
        assert await asyncio.to_thread(_wait_for, lambda: bool(made) and not ours(), 30)
        assert started == []
    finally:
        release.set()
        await launcher.aclose()
