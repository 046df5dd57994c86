"""Tool workers on other hosts from the command line (docs/scale-out.md, Other hosts from the
command line): ``--workers-in ssh:HOST`` (andon starts each worker through ssh) and
``--workers-in tcp:ADDRESS`` (andon listens, and adopts workers started by hand whose keys it
allows). Both speak tcp + CURVE; the ``[remote]`` table of ``andon.toml`` says the rest::

    [remote]
    listen = "tcp://0.0.0.0:5555"          # where the pool listens (tcp:ADDRESS overrides it)
    advertise = "tcp://10.0.0.1:5555"      # ssh: what the other host dials
    server-keys = "keys/supervisor.key_secret"   # tcp: the pool's key pair (andon keys generate)
    allowed-keys = "keys/workers"          # tcp: a folder of *.key files, a .key, or a list file
    wait = 60                              # tcp: seconds to wait for a worker to dial in
    ssh = ["ssh", "-T", "-o", "BatchMode=yes"]   # ssh: the command before HOST
    command = ["andon"]                    # ssh: how the other host starts andon
    tools = "default"                      # ssh: MODULE:NAME, importable there
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

from andon.base import ConfigError

if TYPE_CHECKING:
    from andon.fleet import TcpListen, WorkerLauncher

__all__ = [
    "REMOTE",
    "RemoteSettings",
    "parse_remote",
    "remote_kind",
    "remote_launcher",
    "remote_listen",
]

REMOTE: Final = "remote"
"""The ``andon.toml`` table of the remote workers' settings."""

DEFAULT_SSH: Final = ("ssh", "-T", "-o", "BatchMode=yes")
"""No terminal (the lifeline is the worker's stdin), and never a password prompt: a start that
cannot log in fails at once instead of waiting on a question nobody answers."""

DEFAULT_WAIT: Final = 60.0


@dataclass(frozen=True)
class RemoteSettings:
    listen: str | None = None
    advertise: str | None = None
    server_keys: str | None = None
    allowed_keys: str | None = None
    wait: float = DEFAULT_WAIT
    ssh: tuple[str, ...] = DEFAULT_SSH
    command: tuple[str, ...] = ("andon",)
    tools: str = "default"
    base: str = "."
    """The folder of the ``andon.toml`` it came from: relative key paths are read from there."""


def remote_kind(kind: str, rest: str) -> str | None:
    """``ssh:HOST`` or ``tcp:ADDRESS`` checked (None for another kind)."""
    if kind == "ssh":
        host = rest.strip()
        if not host or host.startswith("-") or any(c.isspace() for c in host):
            raise ConfigError(f"workers-in ssh:HOST needs a host name (got {rest!r})")
        return f"ssh:{host}"
    if kind == "tcp":
        address = _tcp_address(rest.strip(), "workers-in tcp:ADDRESS")
        return f"tcp:{address}"
    return None


def _tcp_address(text: str, where: str, *, port: bool = True) -> str:
    """``HOST:PORT`` or ``tcp://HOST:PORT`` as ``tcp://HOST:PORT`` (without ``port``, the port
    may be left out: an advertised address takes the bound port)."""
    value = text if text.startswith("tcp://") else f"tcp://{text.removeprefix('//')}"
    try:
        parts = urlsplit(value)
        ok = bool(parts.hostname) and parts.path in ("", "/")
        ok = ok and (parts.port is not None or not port)
    except ValueError:
        ok = False
    if not ok:
        form = "HOST:PORT or tcp://HOST:PORT" if port else "HOST[:PORT] or tcp://HOST[:PORT]"
        raise ConfigError(f"{where} must be {form} (got {text!r})")
    return value.rstrip("/")


def parse_remote(table: object, path: Path) -> RemoteSettings:
    """The ``[remote]`` table; every mistake names the key."""
    where = f"{path}: [{REMOTE}]"
    if not isinstance(table, dict):
        raise ConfigError(f"{where} must be a table")
    known = {
        "listen",
        "advertise",
        "server-keys",
        "allowed-keys",
        "wait",
        "ssh",
        "command",
        "tools",
    }
    for key in table:
        if key not in known:
            raise ConfigError(f"{where}: unknown key {key!r} (known: {', '.join(sorted(known))})")
    values: dict[str, Any] = {"base": str(path.parent)}
    for key in ("listen", "advertise"):
        if key in table:
            where_key = f"{where}: {key}"
            values[key] = _tcp_address(_text(table, key, where), where_key, port=key == "listen")
    for key in ("server-keys", "allowed-keys", "tools"):
        if key in table:
            values[key.replace("-", "_")] = _text(table, key, where)
    if "wait" in table:
        wait = table["wait"]
        if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 < wait < 1e9:
            raise ConfigError(f"{where}: wait must be a positive number of seconds")
        values["wait"] = float(wait)
    for key in ("ssh", "command"):
        if key in table:
            argv = table[key]
            if isinstance(argv, str):
                argv = [argv]
            if not argv or not all(isinstance(a, str) and a for a in argv):
                raise ConfigError(f"{where}: {key} must be a string or a list of strings")
            values[key] = tuple(argv)
    return RemoteSettings(**values)


def _text(table: dict[str, Any], key: str, where: str) -> str:
    value = table[key]
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where}: {key} must be a non-empty string")
    return value.strip()


def _path(settings: RemoteSettings, value: str) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else Path(settings.base) / path


def remote_listen(where: str, settings: RemoteSettings) -> TcpListen | None:
    """Where the pool listens for ``ssh:``/``tcp:`` workers (None for other kinds)."""
    from andon.fleet import TcpListen
    from andon.protocol import is_every_address, load_keys, load_public_keys

    kind, _, rest = where.partition(":")
    if kind == "tcp":
        if settings.server_keys is None or settings.allowed_keys is None:
            raise ConfigError(
                "workers-in tcp: adopts workers started by hand: [remote] in andon.toml needs "
                "server-keys (this side's key pair) and allowed-keys (the workers' public keys); "
                "make both with 'andon keys generate FOLDER --name NAME'"
            )
        return TcpListen(
            rest,
            server_keys=load_keys(_path(settings, settings.server_keys)),
            allowed=load_public_keys(_path(settings, settings.allowed_keys)),
        )
    if kind == "ssh":
        listen = settings.listen or "tcp://0.0.0.0:0"
        host = urlsplit(listen).hostname or ""
        if settings.advertise is None and is_every_address(host):
            raise ConfigError(
                f"workers-in ssh:{rest}: the worker there dials back; give [remote] advertise = "
                f"'tcp://ADDRESS' (an address of this machine that {rest} can reach), or listen "
                f"on that address"
            )
        return TcpListen(listen, advertise=settings.advertise)
    return None


def remote_launcher(where: str, settings: RemoteSettings, listen: TcpListen) -> WorkerLauncher:
    """The launcher of ``ssh:HOST`` (each worker started through ssh, its keys made for it and
    handed over on its stdin) or ``tcp:ADDRESS`` (workers started by hand, adopted)."""
    from andon.fleet import AdoptLauncher, CommandLauncher

    kind, _, rest = where.partition(":")
    if kind == "ssh":
        return CommandLauncher(
            [*settings.ssh, rest], worker_command=settings.command, tools=settings.tools
        )
    return AdoptLauncher(wait=settings.wait, on_waiting=_say_waiting)


def _say_waiting(how: str) -> None:
    print(f"andon: waiting for a tool worker: start one with {how}", file=sys.stderr, flush=True)
