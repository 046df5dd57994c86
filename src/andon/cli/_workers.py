"""Where ``andon run`` starts its tool workers: ``--workers-in local`` (forks of this process's
forkserver, the default), ``--workers-in container:IMAGE`` (each worker a container's main
process, through the Docker Engine API; docs/scale-out.md) or ``--workers-in pod:IMAGE`` (each
worker a Kubernetes Pod; its settings are andon.cli._kubernetes's).

The engine and what a container gets come from the ``[containers]`` table of ``andon.toml``::

    [containers]
    engine = "unix:///run/podman/podman.sock"   # default: $DOCKER_HOST, else Docker's socket
    runtime = "runc"
    command = ["andon"]                          # how the image starts andon
    tools = "default"                            # or MODULE:NAME, imported in the container
    mounts = ["/opt/cache:/opt/cache:ro"]        # SOURCE:TARGET[:ro|rw]; the workspace is added
    ulimits = { nofile = [1024, 1024] }
    user = "1000:1000"                           # default: the invoking user; "image": its USER
    userns = "host"                              # user-namespace mode (default: the engine's)

The containers run as the invoking user unless ``user`` says otherwise (its uid and gid; ``0:0``
on a rootless engine, whose root is that user): what the tools write in the bind-mounted
workspace then belongs to whoever ran ``andon run``, and the worker may enter the pool's private
socket folder, which is theirs (docs/scale-out.md, Who the tools run as).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from andon.base import ConfigError
from andon.cli._kubernetes import KubernetesSettings, pod_launcher
from andon.cli._remote import remote_kind

if TYPE_CHECKING:
    from andon.fleet import WorkerLauncher

__all__ = [
    "CONTAINERS",
    "ContainerSettings",
    "check_workers_in",
    "invoking_user",
    "launcher_of",
    "parse_containers",
    "workers_in",
]

CONTAINERS: Final = "containers"
"""The ``andon.toml`` table of the container engine's settings."""


@dataclass(frozen=True)
class ContainerSettings:
    engine: str | None = None
    runtime: str | None = None
    command: tuple[str, ...] = ("andon",)
    tools: str = "default"
    mounts: tuple[tuple[str, str, bool], ...] = ()  # (source, target, read only)
    ulimits: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    user: str | None = None  # "UID[:GID]"; None: the invoking user's
    image_user: bool = False  # user = "image": the image's own USER
    userns: str | None = None


def workers_in(text: str) -> str:
    """``local``, ``container:IMAGE``, ``pod:IMAGE``, ``ssh:HOST`` or ``tcp:ADDRESS``, checked."""
    value = text.strip()
    if value == "local":
        return value
    kind, sep, image = value.partition(":")
    if kind in ("container", "pod") and sep and image.strip():
        return f"{kind}:{image.strip()}"
    remote = remote_kind(kind, image) if sep else None
    if remote is not None:
        return remote
    raise ConfigError(
        f"workers-in must be 'local', 'container:IMAGE', 'pod:IMAGE', 'ssh:HOST' or "
        f"'tcp:ADDRESS' (got {text!r})"
    )


def parse_containers(table: object, path: Path) -> ContainerSettings:
    """The ``[containers]`` table; every mistake names the key."""
    where = f"{path}: [{CONTAINERS}]"
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table")
    known = {"engine", "runtime", "command", "tools", "mounts", "ulimits", "user", "userns"}
    for key in table:
        if key not in known:
            raise ConfigError(f"{where}: unknown key {key!r} (known: {', '.join(sorted(known))})")
    values: dict[str, Any] = {}
    for key in ("engine", "runtime", "tools"):
        if key in table:
            if not isinstance(table[key], str) or not table[key].strip():
                raise ConfigError(f"{where}: {key} must be a non-empty string")
            values[key] = table[key].strip()
    if "command" in table:
        command = table["command"]
        if isinstance(command, str):
            command = [command]
        if not command or not all(isinstance(c, str) and c for c in command):
            raise ConfigError(f"{where}: command must be a string or a list of strings")
        values["command"] = tuple(command)
    if "mounts" in table:
        mounts = table["mounts"]
        if not isinstance(mounts, list):
            raise ConfigError(f"{where}: mounts must be a list of 'SOURCE:TARGET[:ro|rw]'")
        values["mounts"] = tuple(_mount(m, where) for m in mounts)
    if "ulimits" in table:
        values["ulimits"] = _ulimits(table["ulimits"], where)
    if "user" in table:
        user = table["user"]
        if user == "image":
            values["image_user"] = True
        elif isinstance(user, str) and re.fullmatch(r"\d+(:\d+)?", user):
            values["user"] = user
        else:
            raise ConfigError(
                f"{where}: user must be 'UID', 'UID:GID' (numeric) or 'image' (got {user!r})"
            )
    if "userns" in table:
        if table["userns"] != "host":
            raise ConfigError(
                f"{where}: userns must be 'host' (got {table['userns']!r}); leave it out for "
                f"the engine's default"
            )
        values["userns"] = "host"
    return ContainerSettings(**values)


def _mount(item: object, where: str) -> tuple[str, str, bool]:
    if not isinstance(item, str):
        raise ConfigError(f"{where}: each mount must be a string 'SOURCE:TARGET[:ro|rw]'")
    parts = item.split(":")
    mode = "ro"
    if len(parts) == 3:
        mode = parts.pop()
    if len(parts) != 2 or mode not in ("ro", "rw") or not all(p.startswith("/") for p in parts):
        raise ConfigError(
            f"{where}: mount {item!r} must be 'SOURCE:TARGET[:ro|rw]' with absolute paths"
        )
    return parts[0], parts[1], mode == "ro"


def _ulimits(table: object, where: str) -> dict[str, tuple[int, int]]:
    if not isinstance(table, dict):
        raise ConfigError(f"{where}: ulimits must be a table of NAME = [SOFT, HARD]")
    out: dict[str, tuple[int, int]] = {}
    for name, pair in table.items():
        if (
            not isinstance(pair, list)
            or len(pair) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in pair)
            or pair[0] > pair[1]
        ):
            raise ConfigError(f"{where}: ulimits.{name} must be [SOFT, HARD], 0 <= SOFT <= HARD")
        out[name] = (pair[0], pair[1])
    return out


def launcher_of(
    where: str,
    containers: ContainerSettings,
    cwd: str | None,
    kubernetes: KubernetesSettings | None = None,
) -> WorkerLauncher | None:
    """The launcher for ``--workers-in``: None for local workers. A container gets the tools'
    working directory bind-mounted read-write at the same path (the paths in the log are the
    paths the tools saw)."""
    if where == "local":
        return None
    if where.startswith("pod:"):
        return pod_launcher(where.partition(":")[2], kubernetes or KubernetesSettings(), cwd)
    if not where.startswith("container:"):
        # ssh:HOST and tcp:ADDRESS are andon.cli._remote's (they need the pool's tcp listen).
        raise ValueError(f"launcher_of does not make the launcher of {where!r}")
    from andon.fleet import ContainerLauncher, Mount

    image = where.partition(":")[2]
    workspace = str(Path(cwd or os.getcwd()).resolve())
    mounts = [Mount(s, t, ro) for s, t, ro in containers.mounts]
    if not any(m.target == workspace for m in mounts):
        mounts.append(Mount(workspace, workspace, read_only=False))
    user = containers.user
    if user is None and not containers.image_user:
        user = invoking_user(containers.engine)
    return ContainerLauncher(
        image,
        base_url=containers.engine,
        mounts=mounts,
        runtime=containers.runtime,
        ulimits=containers.ulimits,
        command=containers.command,
        tools=containers.tools,
        user=user,
        userns=containers.userns,
    )


def check_workers_in(where: str, containers: ContainerSettings, cwd: str | None) -> None:
    """For ``container:IMAGE``: ask the engine, before anything is made, whether it would start
    the workers (``andon.fleet.check_container_engine``); raise ``ConfigError`` if not."""
    if not where.startswith("container:"):
        return
    launcher = launcher_of(where, containers, cwd)
    from andon.fleet import ContainerLauncher, check_container_engine

    assert isinstance(launcher, ContainerLauncher)
    check_container_engine(launcher)


def invoking_user(engine: str | None) -> str:
    """Who a container's tools run as by default (``UID:GID``): the ids that are this process's
    user on the host, as the engine at ``engine`` (None: ``DOCKER_HOST``, else Docker's socket)
    maps them. A rootful engine keeps ids as they are: this process's own. A rootless one
    (rootless Podman or Docker) maps its containers' root to the user who runs it, and every other
    id to a subordinate one: there ``0:0``. An engine on this machine whose socket belongs to this
    (non-root) user is taken for a rootless one: a rootful engine's socket is root's."""
    uid, gid = os.getuid(), os.getgid()
    if uid != 0 and _own_socket(engine if engine is not None else os.environ.get("DOCKER_HOST")):
        return "0:0"
    return f"{uid}:{gid}"


def _own_socket(url: str | None) -> bool:
    """Whether the engine's socket on this machine belongs to this process's user."""
    if not url:
        path = "/var/run/docker.sock"
    elif url.startswith(("unix://", "http+unix://")):
        path = url.partition("unix://")[2]
    else:
        return False  # ssh://, tcp://: no socket file here to tell
    try:
        return os.stat(path).st_uid == os.getuid()
    except OSError:
        return False
