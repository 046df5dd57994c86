"""Tool workers in containers, through the Docker Engine API (docs/scale-out.md, Containers).

The worker is the container's **main process** (``andon worker --connect …``): the engine starts
it, and removing the container is the backstop that kills every process in it (measured: no
survivor, ``setsid`` escapees included, also when the worker inside was already dead). No tool
call is ever ``exec``'d into a container: an exec'd tree outlives its client (moby #9098).

One launcher drives Docker and Podman alike (docker-py against either's API socket; ``ssh://HOST``
reaches a remote engine). With a local engine the worker needs no network: it dials the pool's
``ipc://`` socket in the pool's private folder, bind-mounted at the same path. Every container is
named and labelled with the pool's identity, so nothing of another pool (another session, another
test run on the machine) is ever taken for this one's.

docker-py is synchronous: each engine request runs in a thread of the launcher's own (never the
event loop's shared executor, which a few blocking ``wait`` calls would fill).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import os
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, final

from andon.base import ConfigError, WorkerError
from andon.fleet._engine_words import API_VERSIONS, engine_address, engine_unreachable
from andon.fleet._launch import (
    LaunchedWorker,
    PoolSetup,
    WorkerLauncher,
    WorkerSpec,
    server_key_argument,
    worker_argv,
)
from andon.fleet._pool import HEARTBEAT_MISSES
from andon.fleet._threads import EngineThreads

__all__ = ["ContainerLauncher", "Mount"]

_log = logging.getLogger("andon.pool")

POOL_LABEL = "andon.pool"
# The worker's key pair (tcp), in a folder of the container's user: the worker can read the file
# and delete it (--forget-keys) whoever it runs as.
_KEY_FOLDER = "andon-keys"
_KEY_FILE = "andon-worker.key_secret"
_USER = re.compile(r"(\d+)(?::(\d+))?")
WORKER_LABEL = "andon.worker"
DEFAULT_WELCOME_TIMEOUT = 60.0  # a pool without heartbeats (none starts containers so)


@final
@dataclass(frozen=True)
class Mount:
    """A bind mount: ``source`` on the engine's host at ``target`` in the container."""

    source: str
    target: str
    read_only: bool = True


class _ContainerWorker(LaunchedWorker):
    def __init__(self, worker_id: str, container: Any) -> None:
        super().__init__(worker_id, pid=0)
        self.container = container
        self.removing = False

    def describe(self) -> str:
        return f"worker {self.worker_id} (container {self.container.name})"


class ContainerLauncher(WorkerLauncher):
    """Workers as containers of ``image`` on the engine at ``base_url``.

    ``base_url``: ``unix:///run/podman/podman.sock``, ``unix:///var/run/docker.sock``,
    ``ssh://user@host`` (None: the environment's ``DOCKER_HOST``, else the local Docker socket).
    The image must hold Python 3.11+ with andon installed (``command`` starts it: ``andon``, or
    e.g. ``("/usr/bin/python3", "-m", "andon")``). ``mounts`` adds bind mounts (the workspace the
    tools work in, at the path the session uses); ``runtime`` and ``ulimits`` (name -> (soft,
    hard)) pass to the engine as they are; ``tools`` is what the worker imports (``default`` or
    ``MODULE:NAME``), and must offer every tool of the session.

    ``user`` (``"UID"`` or ``"UID:GID"``, numeric) is who the worker and its tools run as in the
    container, so that what they write in a bind-mounted workspace belongs to that user on the
    host (``andon run`` gives the invoking user's ids); None: the image's ``USER``. With the
    ``ipc`` transport the user must be root or the owner of the pool's private folder (it holds
    the socket, and only its owner may enter it). ``userns`` is the engine's user-namespace mode
    for the container: ``"host"`` (with a Docker daemon that remaps user ids, the container's
    ids are then the host's); None: the engine's default.

    ``transport="tcp"`` is for an engine on another host (``ssh://``), whose containers cannot
    reach a socket file of this one: the pool listens on tcp + CURVE (its config's ``tcp``), the
    container gets ``network`` (default ``host``), and the worker's key pair is copied into the
    created container before it starts (``put_archive``, mode 0400), read by the worker and
    deleted before any tool runs: never on the command line, never in the environment.

    ``welcome_timeout`` is how long a worker waits for its welcome after its hello (None: the
    pool's heartbeat deadline, so that a container whose supervisor was killed during the start
    ends as soon as a welcomed one would).
    """

    transport = "ipc"
    heartbeats = True
    local_processes = False
    lost_call_note = "removing its container kills the call's processes"
    containment = None

    def __init__(
        self,
        image: str,
        *,
        base_url: str | None = None,
        mounts: Sequence[Mount] = (),
        runtime: str | None = None,
        ulimits: Mapping[str, tuple[int, int]] | None = None,
        command: Sequence[str] = ("andon",),
        tools: str = "default",
        environment: Mapping[str, str] | None = None,
        engine_timeout: float = 60.0,
        welcome_timeout: float | None = None,
        transport: str = "ipc",
        network: str | None = None,
        user: str | None = None,
        userns: str | None = None,
    ) -> None:
        if transport not in ("ipc", "tcp"):
            raise ValueError("transport must be 'ipc' or 'tcp'")
        if user is not None and _USER.fullmatch(user) is None:
            raise ValueError(f"user must be 'UID' or 'UID:GID', numeric (got {user!r})")
        if userns not in (None, "host"):
            raise ValueError(f"userns must be 'host' or None (got {userns!r})")
        self.user = user
        self.userns = userns
        self.transport = transport  # type: ignore[assignment]
        self.network = network or ("none" if transport == "ipc" else "host")
        self.image = image
        self.base_url = base_url
        self.mounts = tuple(mounts)
        self.runtime = runtime
        self.ulimits = dict(ulimits or {})
        self.command = tuple(command)
        self.tools = tools
        self.environment = dict(environment or {})
        self.engine_timeout = engine_timeout
        self.welcome_timeout = welcome_timeout
        self._client: Any = None
        self._docker: Any = None
        self._setup: PoolSetup | None = None
        self._engine = EngineThreads("andon-engine")

    # -- the seam -----------------------------------------------------------------------------

    async def open(self, setup: PoolSetup) -> None:
        try:
            import docker
        except ImportError:
            raise ConfigError(
                "tool workers in containers need the docker package: "
                "pip install 'andon[containers]'"
            ) from None
        self._docker = docker
        self._setup = setup
        self._check_user_reaches(setup)

        # Known if the check before the run asked this engine already: no second version request.
        version = API_VERSIONS.get(engine_address(self.base_url))

        def connect() -> Any:
            if version is None:
                return _connect(docker, self.base_url, self.engine_timeout)
            if self.base_url is None:
                client = docker.from_env(timeout=self.engine_timeout, version=version)
            else:
                client = docker.DockerClient(
                    base_url=self.base_url, timeout=self.engine_timeout, version=version
                )
            client.ping()
            return client

        try:
            self._client = await self._engine.run(connect, "connect")
        except Exception as e:
            raise WorkerError(engine_unreachable(engine_address(self.base_url), e)) from None
        try:
            await self._engine.run(lambda: self._client.images.get(self.image), "image")
        except docker.errors.NotFound:  # ImageNotFound is one; podman 4.3 answers plain NotFound
            raise ConfigError(
                f"the container engine has no image {self.image!r}: andon never pulls: "
                f"`podman pull {self.image}` (or `docker pull`) or build it"
            ) from None

    def _check_user_reaches(self, setup: PoolSetup) -> None:
        """The worker dials the socket in the pool's private folder (0700): as a user who may
        not enter it, it would never say hello, and the pool would wait its welcome timeout for
        nothing. Said at once instead (the ids seen by a rootful engine: a rootless one maps
        them, docs/scale-out.md, Who the tools run as)."""
        uid = self._uid()
        if self.transport != "ipc" or uid is None or uid == 0:
            return
        owner = os.stat(setup.runtime_dir).st_uid
        if uid != owner:
            raise ConfigError(
                f"the containers' user {self.user} cannot reach the pool's socket: its folder "
                f"{setup.runtime_dir} is private to uid {owner} (run the containers as uid "
                f"{owner}, the default, or as root)"
            )

    def _uid(self) -> int | None:
        match = None if self.user is None else _USER.fullmatch(self.user)
        return None if match is None else int(match.group(1))

    async def start(self, spec: WorkerSpec) -> LaunchedWorker:
        setup = self._setup
        docker = self._docker
        assert setup is not None and docker is not None, "open() first"
        mounts = [
            docker.types.Mount(m.target, m.source, type="bind", read_only=m.read_only)
            for m in self.mounts
        ]
        if self.transport == "ipc":
            # The pool's private folder (its ipc socket) at the same path, so the endpoint the
            # pool gives is the one the worker dials.
            runtime = str(setup.runtime_dir)
            mounts.append(docker.types.Mount(runtime, runtime, type="bind", read_only=False))
        ulimits = [
            docker.types.Ulimit(name=name, soft=soft, hard=hard)
            for name, (soft, hard) in self.ulimits.items()
        ]
        command = [*self.command, *worker_argv(spec, self.tools, self._welcome_timeout(spec))]
        keys = None
        if spec.worker_keys is not None and spec.server_key is not None:
            keys = _key_archive(spec.worker_keys.certificate(), self.user)
            command.append(server_key_argument(spec.server_key))
            command += ["--keys", f"/{_KEY_FOLDER}/{_KEY_FILE}", "--forget-keys"]
        name = f"andon-{setup.identity}-{spec.worker_id}"
        # Another user's HOME (the image's USER's too) is the engine's choice, from the image.
        home = {"HOME": "/root"} if self._uid() == 0 else {}
        environment = {"PATH": "/usr/local/bin:/usr/bin:/bin", **home, **self.environment}
        for hidden in setup.hidden_env:
            environment.pop(hidden, None)  # no model key in a worker, even one passed on purpose

        # Set when the start is given up (the pool closed, a signal): a create the engine answers
        # after that is removed at once, never started.
        given_up = threading.Event()

        def create_and_start() -> Any:
            container = self._client.containers.create(
                self.image,
                command=command,
                name=name,
                labels={POOL_LABEL: setup.identity, WORKER_LABEL: spec.worker_id},
                mounts=mounts,
                network_mode=self.network,
                runtime=self.runtime,
                ulimits=ulimits or None,
                environment=environment,
                user=self.user or "",
                userns_mode=self.userns,
                auto_remove=True,  # gone with its main process, even if this supervisor is gone
                stop_signal="SIGTERM",
                init=False,  # the worker is PID 1: it reaps, and it handles SIGTERM itself
            )
            try:
                if given_up.is_set():
                    raise _GivenUp
                if keys is not None:
                    container.put_archive("/", keys)
                container.start()
            except BaseException:
                with contextlib.suppress(Exception):
                    container.remove(force=True)
                raise
            return container

        starting = self._engine.run(
            create_and_start, f"start-{spec.worker_id}", orphan=_remove_quietly
        )
        starting.add_done_callback(lambda f: given_up.set() if f.cancelled() else None)
        try:
            container = await starting
        except docker.errors.DockerException as e:
            raise WorkerError(
                f"the engine could not start worker {spec.worker_id}: {e}", worker=spec.worker_id
            ) from None
        worker = _ContainerWorker(spec.worker_id, container)
        self._watch(worker)
        return worker

    def _welcome_timeout(self, spec: WorkerSpec) -> float:
        """How long the worker waits for its welcome after its hello: by default the heartbeat
        deadline, the same silence after which a welcomed worker gives its supervisor up. A
        supervisor killed (-9) during the start never welcomes it, and nothing else would end
        the container before this (docs/scale-out.md, Containers)."""
        if self.welcome_timeout is not None:
            return self.welcome_timeout
        if spec.heartbeat_interval > 0:
            return spec.heartbeat_interval * HEARTBEAT_MISSES
        return DEFAULT_WELCOME_TIMEOUT

    def _watch(self, worker: _ContainerWorker) -> None:
        """Resolve the worker's ``exit`` when its container stops (or can no longer be found:
        an auto-removed container may be gone before the wait reaches the engine)."""

        def wait() -> None:
            with contextlib.suppress(Exception):
                worker.container.wait(timeout=None)

        def settled(future: asyncio.Future[None]) -> None:
            if not future.cancelled():
                future.exception()  # retrieved: an engine error also means "gone"
            worker._set_exited()

        self._engine.run(wait, f"wait-{worker.worker_id}").add_done_callback(settled)

    def kill(self, worker: LaunchedWorker) -> None:
        assert isinstance(worker, _ContainerWorker)
        if worker.removing:
            return
        worker.removing = True
        self._remove(worker)

    def _remove(self, worker: _ContainerWorker) -> None:
        docker = self._docker

        def remove() -> bool:
            """Whether the container is gone (force: SIGKILL, no stop timeout to wait for)."""
            try:
                worker.container.remove(force=True)
            except docker.errors.NotFound:
                pass  # already gone
            except docker.errors.APIError as e:
                if e.status_code != 409:  # 409: its removal is already under way
                    _log.warning("could not remove %s: %s", worker.describe(), e)
                return False
            return True

        def removed(future: asyncio.Future[bool]) -> None:
            # Gone is exited: the pool's stop waits for this, not for the engine's answer to the
            # watch's ``wait`` (which a slow engine, or one over ssh, may give much later).
            if not future.cancelled() and future.exception() is None and future.result():
                worker._set_exited()

        self._engine.run(remove, f"remove-{worker.worker_id}").add_done_callback(removed)

    def release(self, worker: LaunchedWorker) -> None:
        # auto_remove takes an exited container away; a worker written off while its container
        # still runs (an engine that answered late) is removed here.
        assert isinstance(worker, _ContainerWorker)
        if not worker.has_exited():
            self.kill(worker)

    async def aclose(self) -> None:
        """Remove whatever is left with this pool's label, then wait (bounded) for the engine
        calls still running."""
        client, setup = self._client, self._setup
        if client is not None and setup is not None:
            # First at once: a container created but still starting is removed now, so that its
            # start fails fast instead of being waited for. Then the starts still in flight are
            # waited for (a create only the engine's answer can settle; a start whose caller is
            # gone removes what it made itself, never starting it), and swept again.
            await self._sweep(client, setup.identity)
            await asyncio.to_thread(self._engine.join_starts, self.engine_timeout)
            await self._sweep(client, setup.identity)
        else:
            await asyncio.to_thread(self._engine.join_starts, self.engine_timeout)
        # Not the watches (``wait``): a removed container's is answered when the engine gets to
        # it, and nothing waits for it any more.
        await asyncio.to_thread(self._engine.join, self.engine_timeout, "wait-")
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()
            self._client = None

    async def _sweep(self, client: Any, identity: str) -> None:
        """Remove every container with this pool's label."""

        def sweep() -> None:
            # sparse: no inspection of each container found. A container removed between the
            # list and its inspection (its own start's clean-up) would fail the whole list, and
            # the rest of the pool's containers would stay.
            found = client.containers.list(
                all=True, filters={"label": f"{POOL_LABEL}={identity}"}, sparse=True
            )
            for container in found:
                with contextlib.suppress(Exception):
                    container.remove(force=True)

        try:
            await asyncio.wait_for(self._engine.run(sweep, "sweep"), self.engine_timeout)
        except Exception as e:
            _log.warning("could not sweep this pool's containers: %s", e)


class _GivenUp(Exception):
    """The start was given up while the engine created its container."""


def _remove_quietly(container: Any) -> None:
    """A container whose start nobody waits for any more (the pool closed meanwhile)."""
    with contextlib.suppress(Exception):
        container.remove(force=True)


def host_mounts(paths: Iterable[str], read_only: bool = True) -> list[Mount]:
    """Bind mounts of ``paths`` at the same paths (nested ones dropped)."""
    chosen: list[str] = []
    for path in sorted({p.rstrip("/") or "/" for p in paths}):
        if any(path == c or path.startswith(c + "/") for c in chosen):
            continue
        chosen.append(path)
    return [Mount(p, p, read_only) for p in chosen]


def _key_archive(certificate: bytes, user: str | None) -> bytes:
    """A tar holding the worker's key certificate in a folder of its own, both the container
    user's only (``user``: ``UID[:GID]``; None: root, as the image's user is not known here)."""
    import tarfile  # only a container worker needs it: not imported with every local run

    match = None if user is None else _USER.fullmatch(user)
    uid = 0 if match is None else int(match.group(1))
    gid = 0 if match is None or match.group(2) is None else int(match.group(2))
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        folder = tarfile.TarInfo(_KEY_FOLDER)
        folder.type, folder.mode, folder.uid, folder.gid = tarfile.DIRTYPE, 0o700, uid, gid
        tar.addfile(folder)
        info = tarfile.TarInfo(f"{_KEY_FOLDER}/{_KEY_FILE}")
        info.size, info.mode, info.uid, info.gid = len(certificate), 0o400, uid, gid
        tar.addfile(info, io.BytesIO(certificate))
    return buffer.getvalue()


def _connect(docker: Any, base_url: str | None, timeout: float) -> Any:
    """A docker-py client for the engine at ``base_url`` (None: ``DOCKER_HOST`` and the rest of
    the environment, as ``docker.from_env``), speaking the API version that ``/_ping`` names in
    its ``API-Version`` header (capped at docker-py's own); the ping also proves the engine
    answers. docker-py's own negotiation asks ``GET /version`` instead, which Podman answers only
    after asking its runtime and conmon for theirs: about 0.4 s of every pool's start
    (docs/benchmarks.md, Container workers). An engine whose ping names no version gets
    docker-py's negotiation."""
    options = docker.utils.kwargs_from_env() if base_url is None else {"base_url": base_url}
    url = str(options.get("base_url") or docker.constants.DEFAULT_UNIX_SOCKET)
    if url.startswith(("unix://", "http+unix://")):
        # Connect once first: docker-py leaks (ResourceWarning) the socket of a unix connection
        # that fails, and a missing socket is the usual way this one fails.
        import socket

        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as first:
            first.settimeout(timeout)
            first.connect(url.partition("unix://")[2])
    least = docker.constants.MINIMUM_DOCKER_API_VERSION
    probe = docker.APIClient(version=least, timeout=timeout, **options)
    try:
        response = probe.get(f"{probe.base_url}/_ping")
        try:
            response.raise_for_status()
            spoken = response.headers.get("API-Version", "")
        finally:
            response.close()
    finally:
        probe.close()
    if re.fullmatch(r"\d+\.\d+", spoken) is None:
        return docker.DockerClient(version="auto", timeout=timeout, **options)
    most = docker.constants.DEFAULT_DOCKER_API_VERSION
    version = min(spoken, most, key=lambda v: tuple(int(part) for part in v.split(".")))
    return docker.DockerClient(version=version, timeout=timeout, **options)
