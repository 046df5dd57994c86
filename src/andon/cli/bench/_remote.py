"""Rows of ``andon bench dispatch`` and ``interrupt`` for workers that are not local forks: a
worker over tcp + CURVE (on loopback, started by a :class:`CommandLauncher`) and a container
worker (:class:`ContainerLauncher`), each beside a floor measured in the same run.

- dispatch: ``bash -c true`` through the worker, beside a raw zmq round trip over the same
  transport (a CURVE echo server on loopback tcp; ipc for the container, whose socket is the same
  kernel object bind-mounted); and for containers, a worker's start to ``hello`` and its removal,
  beside a bare ``create + start`` and ``remove(force=True)`` of a container through the same
  engine API.
- interrupt: cancel -> result of a call running ``sleep``, beside the same stop without andon
  (a process group started here, SIGINT, wait).

Container rows need an engine: ``--engine URL --image IMAGE`` (an image with andon in it, such
as the recipe's: docs/scale-out.md, Building the worker image; its own ``andon`` runs the worker),
or (as root, with podman installed) a Podman service and an image made for the run, both removed
afterwards (this machine's Python and andon bind-mounted into it: a test trick).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio

from andon.base import AbortController, GracePolicy, User
from andon.fleet import (
    CommandLauncher,
    ContainerLauncher,
    TcpListen,
    WorkerLauncher,
    WorkerPool,
    WorkerPoolConfig,
    host_mounts,
)
from andon.protocol import CurveKeys, curve_client
from andon.supervisor import ExecutionObserver, ToolCallRequest, ToolExecutor
from andon.workers import default

from ._dispatch import echo_round_trips
from ._stats import summary

__all__ = ["Engine", "engine_for_bench", "remote_dispatch_rows", "remote_interrupt_rows"]

_WORKER = (sys.executable, "-m", "andon")

_CURVE_ECHO = """
import sys, zmq
public, secret = sys.argv[2].encode(), sys.argv[3].encode()
ctx = zmq.Context(); s = ctx.socket(zmq.ROUTER)
s.curve_server = True; s.curve_secretkey = secret; s.curve_publickey = public
s.bind(sys.argv[1]); print(s.getsockopt(zmq.LAST_ENDPOINT).decode(), flush=True)
while True:
    frames = s.recv_multipart()
    if frames[-1] == b"stop":
        break
    s.send_multipart(frames)
s.close(0); ctx.term()
"""


@dataclass(frozen=True)
class Engine:
    url: str
    image: str
    mounts: tuple[str, ...]  # host paths bind-mounted read-only (the host's Python and andon)
    ulimits: dict[str, tuple[int, int]]
    command: tuple[str, ...]  # how the image starts andon


@contextlib.contextmanager
def engine_for_bench(url: str | None, image: str | None) -> Iterator[Engine | str]:
    """The engine the container rows use, or why there is none. With ``url`` and ``image``,
    those (the image must hold Python >= 3.11 with andon); else a Podman service and an image
    of this run's, removed on the way out. A user's image runs its own ``andon`` (on its PATH,
    as ``andon run --workers-in container:IMAGE`` starts it): this machine's interpreter path
    means nothing inside it. The image made here has nothing of its own: it runs this machine's
    interpreter, bind-mounted."""
    from andon.testing import host_mount_paths, worker_ulimits

    if url is not None and image is not None:
        yield Engine(url, image, (), worker_ulimits(), ("andon",))
        return
    from andon.testing import PodmanService, make_worker_image, remove_image, why_no_engine

    reason = why_no_engine()
    if reason is not None:
        yield reason
        return
    import secrets

    import docker

    with PodmanService() as service:
        client = docker.DockerClient(base_url=service.base_url)
        ref = make_worker_image(client, f"localhost/andon-bench-{secrets.token_hex(6)}:1")
        try:
            mounts = tuple(host_mount_paths())
            yield Engine(service.base_url, ref, mounts, worker_ulimits(), _WORKER)
        finally:
            remove_image(client, ref)
            client.close()


def _container_launcher(engine: Engine, workspace: str) -> ContainerLauncher:
    """As ``andon run --workers-in container:IMAGE`` makes it: the invoking user's ids (the
    workspace and the pool's socket folder are theirs), the image's own ``andon``."""
    from andon.cli._workers import invoking_user

    mounts = host_mounts(engine.mounts) + host_mounts([workspace], read_only=False)
    return ContainerLauncher(
        engine.image,
        base_url=engine.url,
        mounts=mounts,
        runtime="runc",
        ulimits=engine.ulimits,
        command=engine.command,
        user=invoking_user(engine.url),
    )


def _tcp_pool_parts() -> tuple[WorkerPoolConfig, WorkerLauncher]:
    config = WorkerPoolConfig(size=1, tcp=TcpListen("tcp://127.0.0.1:0"))
    return config, CommandLauncher([], worker_command=_WORKER, same_machine=True)


@contextlib.asynccontextmanager
async def _pool(config: WorkerPoolConfig, launcher: WorkerLauncher) -> AsyncIterator[WorkerPool]:
    async with WorkerPool(config, default(), launcher=launcher) as pool:
        yield pool


async def _curve_round_trips(n: int) -> list[float]:
    server_keys, client_keys = CurveKeys.generate(), CurveKeys.generate()
    server = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _CURVE_ECHO,
            "tcp://127.0.0.1:0",
            server_keys.public.decode(),
            server_keys.secret.decode(),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None
    endpoint = server.stdout.readline().strip()
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.DEALER)
    curve_client(sock, client_keys, server_keys.public)
    sock.connect(endpoint)
    times = await echo_round_trips(sock, n)
    sock.close(0)
    ctx.term()
    server.wait()
    server.stdout.close()
    return times


async def _bash_true(pool: WorkerPool, n: int, tmp: str, prefix: str) -> list[float]:
    executor = ToolExecutor(pool, pool.registry, session_dir=Path(tmp))
    times = []
    for i in range(n + 2):
        request = ToolCallRequest(f"{prefix}-1-{i + 1}", "bash", '{"command": "true"}', tmp)
        t = time.perf_counter()
        await executor.execute(request, AbortController().signal)
        if i >= 2:
            times.append(time.perf_counter() - t)
    return times


def _bare_container(engine: Engine, n: int) -> tuple[list[float], list[float]]:
    """create + start of a container whose process is ``true``, and remove(force=True): the
    engine's own cost, which every andon container worker pays."""
    import docker
    from docker.types import Mount, Ulimit

    client = docker.DockerClient(base_url=engine.url)
    mounts = [Mount(p, p, type="bind", read_only=True) for p in engine.mounts]
    limits = [Ulimit(name=k, soft=s, hard=h) for k, (s, h) in engine.ulimits.items()]
    starts, removes = [], []
    try:
        for _ in range(n):
            t = time.perf_counter()
            container = client.containers.create(
                engine.image,
                command=["/bin/sleep", "1000"],
                mounts=mounts,
                network_mode="none",
                ulimits=limits,
            )
            container.start()
            starts.append(time.perf_counter() - t)
            t = time.perf_counter()
            container.remove(force=True)
            removes.append(time.perf_counter() - t)
    finally:
        client.close()
    return starts, removes


async def _worker_lifecycle(engine: Engine, n: int, tmp: str) -> tuple[list[float], list[float]]:
    """A pool of one container worker: its start (to the worker's ``hello``) and its close
    (the worker killed and its container removed)."""
    starts, closes = [], []
    for _ in range(n):
        pool = WorkerPool(
            WorkerPoolConfig(size=1), default(), launcher=_container_launcher(engine, tmp)
        )
        t = time.perf_counter()
        await pool.start()
        starts.append(time.perf_counter() - t)
        t = time.perf_counter()
        await pool.aclose()
        closes.append(time.perf_counter() - t)
    return starts, closes


async def remote_dispatch_rows(
    runs: int, engine: Engine | str, progress: Callable[[str, int, int], None]
) -> tuple[dict[str, Any], list[str]]:
    """Rows for the dispatch table, and notes (a skipped part and why)."""
    n = max(5, runs * 2)
    rows: dict[str, Any] = {}
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="andon-bench-") as tmp:
        progress("dispatch remote", 0, 3)
        rows["raw zmq round trip, tcp + CURVE loopback (floor)"] = summary(
            await _curve_round_trips(n)
        )
        config, launcher = _tcp_pool_parts()
        async with _pool(config, launcher) as pool:
            rows["bash -c true through a tcp + CURVE worker"] = summary(
                await _bash_true(pool, n, tmp, "c6")
            )
        progress("dispatch remote", 1, 3)
        if isinstance(engine, str):
            notes.append(f"container rows skipped: {engine}")
            return rows, notes
        config = WorkerPoolConfig(size=1)
        async with _pool(config, _container_launcher(engine, tmp)) as pool:
            rows["bash -c true through a container worker"] = summary(
                await _bash_true(pool, n, tmp, "c5")
            )
        progress("dispatch remote", 2, 3)
        m = max(3, runs)
        bare_start, bare_remove = await asyncio.to_thread(_bare_container, engine, m)
        worker_start, worker_close = await _worker_lifecycle(engine, m, tmp)
        rows["bare container create + start (floor)"] = summary(bare_start)
        # The pool's start: engine connect and image check, create + start, the worker's
        # interpreter and imports (no forkserver in a container), hello.
        rows["container worker: pool start to first hello"] = summary(worker_start)
        rows["bare container remove(force) (floor)"] = summary(bare_remove)
        rows["container worker: pool close (kill + removal)"] = summary(worker_close)
    return rows, notes


async def _cancel_sleep(pool: WorkerPool, n: int, tmp: str, grace: GracePolicy) -> list[float]:
    """cancel -> result of ``sleep`` in a shell call (SIGINT ends it at the first stage)."""
    from andon.testing import SHELL_SLEEP

    executor = ToolExecutor(pool, pool.registry, grace=grace, session_dir=Path(tmp))
    times = []
    for i in range(n):
        controller = AbortController()
        observer = _Ready()
        ready = observer.ready
        request = ToolCallRequest(
            f"c4-1-{i + 1}", "bash", json.dumps({"command": f"echo ready; {SHELL_SLEEP}"}), tmp
        )
        task = asyncio.create_task(executor.execute(request, controller.signal, observer))
        await ready.wait()
        t = time.perf_counter()
        controller.abort(User())
        await task
        times.append(time.perf_counter() - t)
    return times


class _Ready(ExecutionObserver):
    """Sets ``ready`` at the call's first output (its ``ready`` line)."""

    def __init__(self) -> None:
        self.ready = asyncio.Event()

    def on_output(self, call_id: str, data: bytes) -> None:
        self.ready.set()


# SIGINT's default action, whatever the bench was started with (a shell's background job
# ignores SIGINT, and a child inherits that: a bare ``sleep`` would never stop).
_SLEEPER = (
    "import signal, time; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "print('ready', flush=True); time.sleep(1000)"
)


def _bare_stop(n: int) -> list[float]:
    """The same stop without andon: a process in its own group, SIGINT, wait (from the moment
    it is ready, as the andon rows are timed)."""
    times = []
    for _ in range(n):
        process = subprocess.Popen(
            [sys.executable, "-c", _SLEEPER], stdout=subprocess.PIPE, start_new_session=True
        )
        assert process.stdout is not None
        process.stdout.readline()
        t = time.perf_counter()
        process.send_signal(signal.SIGINT)
        process.wait()
        times.append(time.perf_counter() - t)
        process.stdout.close()
    return times


async def remote_interrupt_rows(
    runs: int,
    grace: GracePolicy,
    engine: Engine | str,
    progress: Callable[[str, int, int], None],
) -> tuple[dict[str, Any], list[str]]:
    n = max(5, runs)
    rows: dict[str, Any] = {}
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="andon-bench-") as tmp:
        progress("interrupt remote", 0, 3)
        rows["bare: SIGINT to a sleeping process + wait (floor)"] = summary(_bare_stop(n))
        async with WorkerPool(WorkerPoolConfig(size=1), default()) as pool:
            rows["cancel -> result, local worker"] = summary(
                await _cancel_sleep(pool, n, tmp, grace)
            )
        progress("interrupt remote", 1, 3)
        config, launcher = _tcp_pool_parts()
        async with _pool(config, launcher) as pool:
            rows["cancel -> result, tcp + CURVE worker"] = summary(
                await _cancel_sleep(pool, n, tmp, grace)
            )
        progress("interrupt remote", 2, 3)
        if isinstance(engine, str):
            notes.append(f"container rows skipped: {engine}")
            return rows, notes
        async with _pool(WorkerPoolConfig(size=1), _container_launcher(engine, tmp)) as pool:
            rows["cancel -> result, container worker"] = summary(
                await _cancel_sleep(pool, n, tmp, grace)
            )
    return rows, notes
