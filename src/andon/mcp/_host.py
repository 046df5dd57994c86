"""The MCP host: ``python -m andon.mcp._host SPEC``, run as the command of an ``mcp-host`` call.

It runs inside a tool worker's containment, as the call's process-group leader (its command
``exec``\\ s it), so an MCP stdio server is never the supervisor's child (docs/tools.md, MCP
servers). ``SPEC`` is the spec as JSON text, or the path of a file holding it (the supervisor
writes it in its private folder, so the server's environment never shows in a command line):
``socket`` (a unix socket path), ``token``, ``argv``, ``env`` and ``cwd``.

The host connects to the socket and sends the token line first; then spawns the server **in its
own process group** (the call's: the worker's grace ladder signals that group and must reach the
server) with an environment built from a few basics and what the spec names, never the
supervisor's (the model keys must not reach a server). It relays bytes both ways, socket to the
server's stdin and the server's stdout to the socket, until either side ends; the server's stderr
is the host's stdout, which is the call's output. It exits as the server did (the same exit code,
or killed by the same signal), or 1 with a one-line reason.

SIGINT and SIGTERM do not end the host: they reach the server through the group, and the host
waits for it, so the call's end reports what really stopped the server. (Python handlers, not
``SIG_IGN``: an ignored signal would be inherited by the server through its exec.)

Small and dependency-free on purpose: it imports nothing of andon nor of ``mcp``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from typing import Any

# What the server gets from the host's environment: a working shell's basics and andon's own
# containment marks (the call's tag finds the server in pgroup mode). Nothing else passes.
_BASICS = ("PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "USER", "LOGNAME", "SHELL", "TERM")
_MARKS = ("ANDON_CALL_TAG", "ANDON_CALL_ID")
_CHUNK = 64 * 1024


class _Refused(Exception):
    """A reason to exit 1 with one line."""


def server_environment(spec_env: dict[str, str], source: dict[str, str]) -> dict[str, str]:
    """The server's environment: the basics and andon's marks from ``source``, then the spec's."""
    env = {k: v for k, v in source.items() if k in _BASICS or k in _MARKS or k.startswith("LC_")}
    env.update(spec_env)
    return env


def _read_spec(arg: str) -> dict[str, Any]:
    try:
        if arg.lstrip().startswith("{"):
            spec = json.loads(arg)
        else:
            with open(arg, encoding="utf-8") as f:
                spec = json.load(f)
    except (OSError, ValueError) as e:
        raise _Refused(f"cannot read the spec: {e}") from None
    if not isinstance(spec, dict):
        raise _Refused("the spec is not a JSON object")
    argv = spec.get("argv")
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise _Refused("the spec's argv is not a non-empty list of strings")
    env = spec.get("env") or {}
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise _Refused("the spec's env is not an object of strings")
    for key in ("socket", "token"):
        if not isinstance(spec.get(key), str):
            raise _Refused(f"the spec has no {key}")
    return spec


def _pump_in(sock: socket.socket, stdin_fd: int) -> None:
    """Socket to the server's stdin, until the socket ends (then the server's stdin closes)."""
    try:
        while True:
            data = sock.recv(_CHUNK)
            if not data:
                break
            view = memoryview(data)
            while view:
                view = view[os.write(stdin_fd, view) :]
    except OSError:
        pass  # the server closed its stdin, or the socket broke: either way this side is over
    finally:
        with contextlib.suppress(OSError):
            os.close(stdin_fd)


def _pump_out(stdout_fd: int, sock: socket.socket) -> None:
    """The server's stdout to the socket, until the server closes it (then the socket's write
    side ends, which the supervisor reads as the server's end)."""
    try:
        while True:
            data = os.read(stdout_fd, _CHUNK)
            if not data:
                break
            sock.sendall(data)
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        raise _Refused("usage: python -m andon.mcp._host SPEC")
    spec = _read_spec(argv[0])
    # Not fatal to the host: the signals reach the server through the group, and the host waits.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda _sig, _frame: None)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(spec["socket"])
        sock.sendall(spec["token"].encode() + b"\n")
    except OSError as e:
        raise _Refused(f"cannot reach the supervisor's socket: {e.strerror or e}") from None
    env = server_environment(spec.get("env") or {}, dict(os.environ))
    try:
        server = subprocess.Popen(
            spec["argv"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=sys.stdout.fileno(),
            env=env,
            cwd=spec.get("cwd") or None,
            bufsize=0,
            close_fds=True,
        )
    except OSError as e:
        raise _Refused(
            f"cannot start the MCP server {spec['argv'][0]!r}: {e.strerror or e}"
        ) from None
    assert server.stdin is not None and server.stdout is not None
    stdin_fd = os.dup(server.stdin.fileno())
    stdout_fd = os.dup(server.stdout.fileno())
    server.stdin.close()
    server.stdout.close()
    threading.Thread(target=_pump_in, args=(sock, stdin_fd), daemon=True).start()
    out = threading.Thread(target=_pump_out, args=(stdout_fd, sock), daemon=True)
    out.start()
    code = server.wait()
    # What the server wrote last still reaches the supervisor; bounded, since a child the server
    # left may hold its stdout open (the worker's sweep ends it).
    out.join(timeout=2.0)
    sys.stdout.flush()
    if code < 0:
        # Die of the same signal, so the call's end says what ended the server. (SIGKILL and
        # SIGSTOP take no handler: setting one raises; their default is all there is.)
        died_of = -code
        if died_of not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(died_of, signal.SIG_DFL)
        signal.raise_signal(died_of)
        return 128 + died_of  # a signal whose default is to be ignored: say it as a shell would
    return code


def run() -> None:
    try:
        code = main(sys.argv[1:])
    except _Refused as e:
        print(f"andon mcp host: {e}", flush=True)
        code = 1
    os._exit(code)  # the pump threads may still block on the socket: leave without them


if __name__ == "__main__":
    run()
