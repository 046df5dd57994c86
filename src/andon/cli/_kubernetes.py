"""``andon run --workers-in pod:IMAGE``: each tool worker a Kubernetes Pod (docs/scale-out.md,
Kubernetes), with the cluster and what a Pod gets from the ``[kubernetes]`` table of
``andon.toml``::

    [kubernetes]
    namespace = "ci"
    kubeconfig = "/etc/andon/kubeconfig"        # default: in-cluster, else $KUBECONFIG, ~/.kube
    context = "ci-cluster"
    listen = "tcp://0.0.0.0:0"                   # where the pool listens (tcp + CURVE)
    advertise = "tcp://10.1.2.3"                 # where the Pods dial it: this Pod's IP
    service_account = "andon-worker"
    owner_pod = "andon-job-x7k2p"                # andon's own Pod: the workers are owned by it
    requests = { cpu = "500m", memory = "1Gi" }
    limits = { memory = "2Gi" }
    workspace_claim = "andon-work"               # a ReadWriteMany PersistentVolumeClaim
    workspace_path = "/workspace"                # default: the tools' working directory
    command = ["andon"]                          # how the image starts andon
    tools = "default"
    env = { HTTP_PROXY = "http://proxy:3128" }
    termination_grace = 30
    wait_for_nodes = false

Every mistake is one line naming the key (a ConfigError: exit 2, before any session exists).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

from andon.base import ConfigError

if TYPE_CHECKING:
    from andon.fleet import TcpListen, WorkerLauncher

__all__ = ["KUBERNETES", "KubernetesSettings", "parse_kubernetes", "pod_launcher", "pool_tcp"]

KUBERNETES: Final = "kubernetes"
"""The ``andon.toml`` table of the cluster's and the worker Pods' settings."""


@dataclass(frozen=True)
class KubernetesSettings:
    namespace: str = "default"
    kubeconfig: str | None = None
    context: str | None = None
    listen: str = "tcp://0.0.0.0:0"
    advertise: str | None = None
    service_account: str | None = None
    owner_pod: str | None = None
    requests: Mapping[str, str] = field(default_factory=dict)
    limits: Mapping[str, str] = field(default_factory=dict)
    workspace_claim: str | None = None
    workspace_path: str | None = None  # None: the tools' working directory
    command: tuple[str, ...] = ("andon",)
    tools: str = "default"
    env: Mapping[str, str] = field(default_factory=dict)
    termination_grace: int = 30
    wait_for_nodes: bool = False


_STRINGS: Final = (
    "namespace",
    "kubeconfig",
    "context",
    "listen",
    "advertise",
    "service_account",
    "owner_pod",
    "workspace_claim",
    "workspace_path",
    "tools",
)
_KNOWN: Final = frozenset(
    {*_STRINGS, "requests", "limits", "command", "env", "termination_grace", "wait_for_nodes"}
)


def parse_kubernetes(table: object, path: Path) -> KubernetesSettings:
    """The ``[kubernetes]`` table; every mistake names the key."""
    where = f"{path}: [{KUBERNETES}]"
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table")
    for key in table:
        if key not in _KNOWN:
            raise ConfigError(f"{where}: unknown key {key!r} (known: {', '.join(sorted(_KNOWN))})")
    values: dict[str, Any] = {}
    for key in _STRINGS:
        if key in table:
            value = table[key]
            if not isinstance(value, str) or not value.strip() or value != value.strip():
                raise ConfigError(f"{where}: {key} must be a non-empty string without spaces")
            values[key] = value
    for key in ("listen", "advertise"):
        if key in values:
            _tcp_address(values[key], f"{where}: {key}")
    if "workspace_path" in values and not values["workspace_path"].startswith("/"):
        raise ConfigError(f"{where}: workspace_path must be an absolute path")
    for key in ("requests", "limits", "env"):
        if key in table:
            values[key] = _string_table(table[key], f"{where}: {key}")
    if "command" in table:
        command = table["command"]
        if isinstance(command, str):
            command = [command]
        if not isinstance(command, list) or not command:
            raise ConfigError(f"{where}: command must be a string or a list of strings")
        if not all(isinstance(c, str) and c for c in command):
            raise ConfigError(f"{where}: command must be a string or a list of strings")
        values["command"] = tuple(command)
    if "termination_grace" in table:
        grace = table["termination_grace"]
        if not isinstance(grace, int) or isinstance(grace, bool) or not 0 <= grace <= 3600:
            raise ConfigError(f"{where}: termination_grace must be whole seconds, 0 to 3600")
        values["termination_grace"] = grace
    if "wait_for_nodes" in table:
        if not isinstance(table["wait_for_nodes"], bool):
            raise ConfigError(f"{where}: wait_for_nodes must be true or false")
        values["wait_for_nodes"] = table["wait_for_nodes"]
    settings = KubernetesSettings(**values)
    _check_advertised(settings, where)
    return settings


def _check_advertised(settings: KubernetesSettings, where: str) -> None:
    from andon.protocol import is_every_address

    host = urlsplit(settings.listen).hostname or ""
    if is_every_address(host) and settings.advertise is None:
        raise ConfigError(
            f"{where}: advertise is required when listen is on every address "
            f"({settings.listen}): the address the Pods dial, such as this Pod's IP"
        )


def _tcp_address(text: str, where: str) -> None:
    parts = urlsplit(text)
    try:
        parts.port  # noqa: B018 - raises for a port that is not a number
    except ValueError:
        raise ConfigError(f"{where} has a bad port: {text!r}") from None
    if parts.scheme != "tcp" or not parts.hostname or parts.path not in ("", "/"):
        raise ConfigError(f"{where} must look like tcp://HOST or tcp://HOST:PORT, not {text!r}")


def _string_table(value: object, where: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and k and isinstance(v, str) and v for k, v in value.items()
    ):
        raise ConfigError(f'{where} must be a table of NAME = "VALUE" strings')
    return dict(value)


def pool_tcp(settings: KubernetesSettings) -> TcpListen:
    """Where the pool listens for the Pods (tcp + CURVE: each Pod gets keys of its own)."""
    from andon.fleet import TcpListen

    # Also without a [kubernetes] table: its defaults listen on every address.
    _check_advertised(settings, f"--workers-in pod: [{KUBERNETES}] in andon.toml")

    return TcpListen(settings.listen, advertise=settings.advertise)


def pod_launcher(image: str, settings: KubernetesSettings, cwd: str | None) -> WorkerLauncher:
    """The launcher of ``pod:IMAGE``. With ``workspace_claim``, the claim is mounted in every
    worker Pod at ``workspace_path`` (default: the tools' working directory, so the paths in the
    log are the paths the tools saw)."""
    from andon.fleet import PodLauncher

    workspace = settings.workspace_path or str(Path(cwd or os.getcwd()).resolve())
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    if settings.workspace_claim is not None:
        volumes.append(
            {"name": "workspace", "persistentVolumeClaim": {"claimName": settings.workspace_claim}}
        )
        mounts.append({"name": "workspace", "mountPath": workspace})
    return PodLauncher(
        image,
        namespace=settings.namespace,
        kubeconfig=settings.kubeconfig,
        context=settings.context,
        command=settings.command,
        tools=settings.tools,
        environment=settings.env,
        requests=settings.requests,
        limits=settings.limits,
        volumes=volumes,
        volume_mounts=mounts,
        service_account=settings.service_account,
        termination_grace=settings.termination_grace,
        owner_pod=settings.owner_pod,
        wait_for_nodes=settings.wait_for_nodes,
    )
