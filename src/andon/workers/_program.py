"""``andon worker --connect ENDPOINT``: the worker as a program, for a container or another host.

The same worker code as a local worker, started by an engine instead of the forkserver: it dials
the supervisor's socket, offers the tools it imported by name, and then lives as the supervisor
says. It differs where it must:

- It watches the supervisor through heartbeats (no pidfd reaches across a container or a host),
  and gives up if no ``welcome`` arrives in time.
- As PID 1 of a container it handles SIGTERM and SIGINT: it drains its call on the grace timeline,
  sends the result and exits (a PID 1 ignores the signals it has no handler for).
- It keeps its stderr (the engine's log of the container) for its own diagnostics; stdout, which
  tools never reach, goes there too.
- Over tcp it needs CURVE: the supervisor's public key and keys of its own that the supervisor
  allows; plain tcp only with ``insecure``, and then only to a loopback address.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import socket
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from andon.base import ConfigError, ContainmentSetting
from andon.protocol import CurveKeys, is_loopback, load_keys
from andon.workers._builtins import default
from andon.workers._main import WorkerOptions, leave_session_and_reset_signals, worker_main
from andon.workers._registry import Tool, ToolRegistry

__all__ = [
    "KEYS_END",
    "WORKER_REFUSED",
    "WorkerProgram",
    "default_worker_id",
    "load_tools",
    "read_keys",
    "run_worker_program",
]

DEFAULT_WELCOME_TIMEOUT = 60.0


@dataclass(frozen=True)
class WorkerProgram:
    """The command line of ``andon worker``, checked."""

    endpoint: str
    worker_id: str
    tools: str = "default"
    server_key: bytes | None = None
    keys: CurveKeys | None = None
    insecure: bool = False
    containment: ContainmentSetting = "auto"
    welcome_timeout: float = DEFAULT_WELCOME_TIMEOUT
    lifeline: bool = False
    """stdin stays open for the worker's life (after the keys, if they came there): its end of
    file means the launcher let go of the worker, or died."""

    def __post_init__(self) -> None:
        parts = urlsplit(self.endpoint)
        if parts.scheme == "ipc":
            return
        if parts.scheme != "tcp" or not parts.hostname:
            raise ConfigError(
                f"--connect must be ipc://PATH or tcp://HOST:PORT, not {self.endpoint!r}"
            )
        if self.insecure:
            if not is_loopback(parts.hostname):
                raise ConfigError(
                    f"--insecure (plain tcp) is allowed only to a loopback address, not "
                    f"{parts.hostname!r}: use CURVE keys (--server-key and --keys)"
                )
            return
        if self.server_key is None or self.keys is None:
            raise ConfigError(
                "tcp needs CURVE: give --server-key (the supervisor's public key) and --keys "
                "(this worker's key file, from 'andon keys generate'), or --insecure on loopback"
            )


WORKER_REFUSED: Final = 3
"""``andon worker``'s exit code when the supervisor never took it: its key refused in the
handshake, a ``refused`` answer (protocol version, tools, an id it does not know, a full pool),
or no welcome within ``--welcome-timeout``. 0 is a worker let go (or one whose supervisor went:
it stopped its call), 2 a mistake on its own command line."""


def run_worker_program(program: WorkerProgram) -> int:
    """Run the worker until the supervisor lets it go, it loses the supervisor, or a stop signal
    drained it. Returns the exit code: 0, or :data:`WORKER_REFUSED` with one line on stderr saying
    why."""
    registry = load_tools(program.tools)
    lifeline = _keep_stdin() if program.lifeline else None
    _prepare_process()
    refusal = worker_main(
        WorkerOptions(
            endpoint=program.endpoint,
            worker_id=program.worker_id,
            registry=registry,
            supervisor_pid=None,
            containment=program.containment,
            server_key=program.server_key,
            curve=program.keys,
            welcome_timeout=program.welcome_timeout,
            drain_on_term=True,
            detach=False,
            lifeline_fd=lifeline,
        )
    )
    if refusal is not None:
        print(f"andon worker {program.worker_id}: {refusal}", file=sys.stderr, flush=True)
        return WORKER_REFUSED
    return 0


def load_tools(spec: str, *, supervisor_tools: bool = False) -> ToolRegistry:
    """The tools a program worker offers: ``default`` (andon's built-in tools), or
    ``MODULE:NAME`` naming a :class:`ToolRegistry`, an iterable of tools, a single tool, or a
    function returning one of those. Supervisor tools (a subagent) are left out, as they never
    run in a worker, unless ``supervisor_tools`` (the supervisor's own registry: ``andon run
    --tools``)."""
    registry = _load(spec)
    return registry if supervisor_tools else registry.for_workers()


def _load(spec: str) -> ToolRegistry:
    if spec == "default":
        return default()
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"--tools must be 'default' or MODULE:NAME, not {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"--tools {spec!r}: cannot import {module_name!r}: {e}") from None
    except Exception as e:  # the user's module failed as it ran: say how, no traceback
        raise ConfigError(
            f"--tools {spec!r}: importing {module_name!r} failed: {type(e).__name__}: {e}"
        ) from None
    try:
        value: Any = getattr(module, attr)
    except AttributeError:
        raise ConfigError(f"--tools {spec!r}: {module_name!r} has no {attr!r}") from None
    if callable(value) and not isinstance(value, ToolRegistry | Tool):
        try:
            value = value()
        except TypeError as e:
            raise ConfigError(
                f"--tools {spec!r} is a function that cannot be called with no arguments: {e}"
            ) from None
        except Exception as e:
            raise ConfigError(f"--tools {spec!r} failed: {type(e).__name__}: {e}") from None
    if isinstance(value, ToolRegistry):
        return value
    if isinstance(value, Tool):
        return ToolRegistry([value])
    if isinstance(value, Iterable) and not isinstance(value, str | bytes):
        items = list(value)
        strays = [type(v).__name__ for v in items if not isinstance(v, Tool) and not callable(v)]
        if strays:
            raise ConfigError(f"--tools {spec!r} holds a {strays[0]}, which is not a tool")
        try:
            return ToolRegistry(items)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"--tools {spec!r}: {e}") from None
    raise ConfigError(
        f"--tools {spec!r} is a {type(value).__name__}, not a ToolRegistry or a list of tools"
    )


KEYS_END = b"# end of keys\n"
"""The line after a key certificate handed over on stdin (the pipe stays open as a lifeline, so
end of file cannot mark the certificate's end)."""


def read_keys(path: str, *, forget: bool = False) -> CurveKeys:
    """``--keys FILE`` (a secret key file), or ``-`` for the file's text on stdin, up to a
    :data:`KEYS_END` line or end of file (a launcher hands a worker its keys that way: nothing on
    the command line, which ``ps`` shows, nothing in the environment, which tools inherit).
    ``forget`` deletes the file once read (a copy a launcher made for this worker alone)."""
    if path != "-":
        keys = load_keys(Path(path))
        if forget:
            Path(path).unlink()  # before any tool runs: no call of this worker may read it
        return keys
    lines: list[bytes] = []
    stdin = sys.stdin.buffer
    while len(lines) < 64:
        line = stdin.readline(4096)
        if not line or line == KEYS_END:
            break
        lines.append(line)
    import tempfile  # a launcher's hand-over only: no local worker pays its imports

    fd, tmp = tempfile.mkstemp(prefix="andon-keys-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(b"".join(lines))
        return load_keys(Path(tmp))
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _keep_stdin() -> int:
    """A private copy of stdin (close-on-exec: no tool inherits it) to watch as the lifeline."""
    return os.dup(0)  # os.dup makes the new fd non-inheritable


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def _prepare_process() -> None:
    """Own session where possible, default signal dispositions (tools inherit them), nothing
    on stdin, stdout onto stderr (the engine's log)."""
    leave_session_and_reset_signals()
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdout.flush()
    os.dup2(2, 1)
