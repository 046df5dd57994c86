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
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from andon.base import ConfigError
from andon.cli._kubernetes import KubernetesSettings, pod_launcher

if TYPE_CHECKING:
    from andon.fleet import WorkerLauncher

__all__ = ["CONTAINERS", "ContainerSettings", "launcher_of", "parse_containers", "workers_in"]

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


def workers_in(text: str) -> str:
    """``local``, ``container:IMAGE`` or ``pod:IMAGE``, checked."""
    value = text.strip()
    if value == "local":
        return value
    kind, sep, image = value.partition(":")
    if kind in ("container", "pod") and sep and image.strip():
        return f"{kind}:{image.strip()}"
    raise ConfigError(
        f"workers-in must be 'local' or 'container:IMAGE', or 'pod:IMAGE' (got {text!r})"
    )


def parse_containers(table: object, path: Path) -> ContainerSettings:
    """The ``[containers]`` table; every mistake names the key."""
    where = f"{path}: [{CONTAINERS}]"
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table")
    known = {"engine", "runtime", "command", "tools", "mounts", "ulimits"}
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
    from andon.fleet import ContainerLauncher, Mount

    image = where.partition(":")[2]
    workspace = str(Path(cwd or os.getcwd()).resolve())
    mounts = [Mount(s, t, ro) for s, t, ro in containers.mounts]
    if not any(m.target == workspace for m in mounts):
        mounts.append(Mount(workspace, workspace, read_only=False))
    return ContainerLauncher(
        image,
        base_url=containers.engine,
        mounts=mounts,
        runtime=containers.runtime,
        ulimits=containers.ulimits,
        command=containers.command,
        tools=containers.tools,
    )
