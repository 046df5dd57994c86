"""The container engine checked before anything is made (docs/scale-out.md, Containers).

A mistake in the engine's setup (no engine, an image never pulled, a runtime the engine does not
have, a ulimit it may not set, a command the image lacks) would otherwise show only when the
pool's first worker fails to start: after the session folder exists, as a transport error or an
OCI runtime's message, with the exit code of a failed run. :func:`check_container_engine` finds
each of them first, by asking the engine what ``andon run`` is about to ask it, and says what to
do in one line.

The only sure test of the runtime, the ulimits, the mounts and the command is a container made
and started with them: the check starts one (``--version`` appended to the command, so an andon
in it would print its version and exit), kills it at once and lets ``auto_remove`` take it away.
It costs one create and one start (~0.2 s on Podman 4.3); the engine's API version it asks
first is kept for the launcher (``API_VERSIONS``), which then asks nothing of the kind again.
"""

from __future__ import annotations

import contextlib
import re
import resource
import secrets
import threading
from typing import Any, Final

from andon.base import ConfigError
from andon.fleet._container import ContainerLauncher
from andon.fleet._engine_words import API_VERSIONS, engine_address, engine_unreachable

__all__ = ["check_container_engine"]

CHECK_LABEL: Final = "andon.check"
"""Label of the container the check starts (never one of a pool's)."""
_MIN_API: Final = "1.24"  # enough for GET /version, which every engine answers

# The names of the rlimits an OCI runtime reports by number ("error setting rlimit type 7").
_RLIMITS: Final = {
    getattr(resource, f"RLIMIT_{name.upper()}"): name
    for name in ("core", "cpu", "data", "fsize", "nofile", "nproc", "stack", "memlock", "as")
    if hasattr(resource, f"RLIMIT_{name.upper()}")
}


def check_container_engine(launcher: ContainerLauncher, *, timeout: float = 30.0) -> None:
    """Raise ``ConfigError`` (one line, with the fix) if the launcher's engine, image, runtime,
    ulimits, mounts or command would not start a worker; return quietly if a container made as
    the launcher makes them starts. Blocking (it is called before any event loop)."""
    try:
        import docker
    except ImportError:
        raise ConfigError(
            "tool workers in containers need the docker package: pip install 'andon[containers]'"
        ) from None
    address = engine_address(launcher.base_url)
    try:
        # The engine's version first (what docker-py's negotiation asks anyway): it names a
        # Podman service's runtime, which the check needs, at no extra request.
        probe = _client(docker, launcher.base_url, timeout, _MIN_API)
        try:
            version = probe.version(api_version=False)
        finally:
            probe.close()
        api = str(version.get("ApiVersion") or _MIN_API)
        client = _client(docker, launcher.base_url, timeout, api)
        API_VERSIONS[address] = api
    except Exception as e:  # a transport error of any kind: the engine is not there
        raise ConfigError(engine_unreachable(address, e)) from None
    try:
        _check_runtime(launcher.runtime, version)
        _check_image(client, launcher.image, docker)
        _trial(client, launcher, docker)
    finally:
        with contextlib.suppress(Exception):
            client.close()


def _client(docker: Any, base_url: str | None, timeout: float, version: str) -> Any:
    """A client as the launcher makes it: ``base_url``, else the environment's (``DOCKER_HOST``
    with its TLS settings)."""
    if base_url is None:
        return docker.from_env(timeout=timeout, version=version)
    return docker.DockerClient(base_url=base_url, timeout=timeout, version=version)


def _check_runtime(runtime: str | None, version: dict[str, Any]) -> None:
    """Podman's Docker API ignores a container's runtime: its containers run on the service's
    own (named in its version's components). A setting that asks for another one (gVisor's
    ``runsc`` for isolation, say) would silently not hold: refused. Docker honours the setting
    and refuses an unknown name itself (the trial container says so)."""
    components = version.get("Components") or []
    names = [c.get("Name", "") for c in components if isinstance(c, dict)]
    if runtime is None or not any(n.startswith("Podman") for n in names):
        return
    running = [n[len("OCI Runtime (") : -1] for n in names if n.startswith("OCI Runtime (")]
    if running and runtime not in running:
        raise ConfigError(
            f"the container runtime {runtime!r} is not installed or not known to this Podman "
            f"service (it runs {running[0]!r}, whatever a container asks for): start the "
            f"service with `podman --runtime {runtime} system service`, or set [containers] "
            f"runtime = {running[0]!r} in andon.toml"
        )


def _check_image(client: Any, image: str, docker: Any) -> None:
    try:
        client.images.get(image)
    except docker.errors.NotFound:  # ImageNotFound is one; podman 4.3 answers plain NotFound
        raise ConfigError(
            f"the container engine has no image {image!r}: andon never pulls: "
            f"`podman pull {image}` (or `docker pull`) or build it"
        ) from None
    except docker.errors.DockerException as e:
        raise ConfigError(f"the container engine could not look up image {image!r}: {e}") from None


def _trial(client: Any, launcher: ContainerLauncher, docker: Any) -> None:
    """Create and start one container as the launcher would (without the pool's socket folder,
    which does not exist yet); kill it at once. What the engine refuses becomes one line."""
    mounts = [
        docker.types.Mount(m.target, m.source, type="bind", read_only=m.read_only)
        for m in launcher.mounts
    ]
    ulimits = [
        docker.types.Ulimit(name=name, soft=soft, hard=hard)
        for name, (soft, hard) in launcher.ulimits.items()
    ]
    token = secrets.token_hex(6)
    container = None
    started = False
    try:
        container = client.containers.create(
            launcher.image,
            command=[*launcher.command, "--version"],
            name=f"andon-check-{token}",
            labels={CHECK_LABEL: token},
            mounts=mounts,
            network_mode=launcher.network,
            runtime=launcher.runtime,
            ulimits=ulimits or None,
            environment={"PATH": "/usr/local/bin:/usr/bin:/bin"},
            auto_remove=True,
            init=False,
            # As the workers run: a user the image cannot start the command as fails here too.
            user=launcher.user or "",
            userns_mode=launcher.userns,
        )
        container.start()
        started = True
    except docker.errors.DockerException as e:
        raise ConfigError(_refusal(client, launcher, e)) from None
    finally:
        if started:
            # Killed (not stopped: no stop timeout), in the background: nothing waits for it,
            # and ``auto_remove`` takes it away once it is dead (as it does if this process
            # is gone first: its command, given ``--version``, ends by itself).
            threading.Thread(target=_kill_quietly, args=(container,), daemon=True).start()
        elif container is not None:
            # Made, never started (the engine refused, or a signal landed in between): no
            # process to end, so ``auto_remove`` never comes; removed now.
            with contextlib.suppress(Exception):
                container.remove(force=True)


def _kill_quietly(container: Any) -> None:
    with contextlib.suppress(Exception):
        container.kill()


def _refusal(client: Any, launcher: ContainerLauncher, error: Exception) -> str:
    """One line for what the engine said when it made or started the check's container."""
    said = _first_line(getattr(error, "explanation", None) or str(error))
    lowered = said.lower()
    limit = re.search(r"rlimit type (\d+)", said)
    if limit is not None or "ulimit" in lowered or "rlimit" in lowered:
        name = _RLIMITS.get(int(limit.group(1)), f"type {limit.group(1)}") if limit else "a limit"
        asked = launcher.ulimits.get(name) if limit else None
        what = f"ulimit {name}" + (f" = {list(asked)}" if asked is not None else "")
        return (
            f"the container engine may not set {what} for the workers' containers ({said}): "
            f"set [containers] ulimits in andon.toml at most the engine's own limits, e.g. "
            f"{name if limit else 'nofile'} = [1024, 1024]"
        )
    if "executable file not found" in lowered or "attempted to invoke a command" in lowered:
        return (
            f"the image {launcher.image!r} has no {launcher.command[0]!r} ({said}): set "
            f"[containers] command in andon.toml to how the image starts andon"
        )
    if "runtime" in lowered and any(w in lowered for w in ("not found", "unknown", "invalid")):
        runtime = launcher.runtime or _default_runtime(client) or "(the engine's default)"
        return (
            f"the container runtime {runtime!r} is not installed or not known to the engine "
            f"({said}): install it, or set [containers] runtime in andon.toml to one the engine "
            f"has (and for Podman, start its service with `podman --runtime NAME system service`)"
        )
    return f"the container engine would not start a worker's container: {said}"


def _default_runtime(client: Any) -> str | None:
    with contextlib.suppress(Exception):
        name = client.info().get("DefaultRuntime")
        return name if isinstance(name, str) else None
    return None


def _first_line(text: str) -> str:
    line = " ".join(text.split())
    return line[:400]
