"""A slow container engine for tests: a unix-socket proxy in front of the real one that holds the
answer to every ``wait`` request (the launcher's watch of a container) for ``hold`` seconds, as a
loaded engine, or one at the end of an ssh tunnel, may. Everything else passes through as it is.

docker-py sends one request at a time on a connection, so holding the bytes of a connection from
the ``POST …/wait`` on holds that request only.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
from pathlib import Path
from types import TracebackType

_WAIT = re.compile(rb"^POST /[^ ]*/containers/[^/ ]+/wait[ ?]")


class SlowWaitEngine:
    """Listens on ``path`` (use ``url``); forwards to the engine socket at ``upstream``."""

    def __init__(self, path: Path, upstream: str, hold: float) -> None:
        self.url = f"unix://{path}"
        self._upstream = upstream.removeprefix("unix://")
        self._hold = hold
        self._closed = threading.Event()
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(path))
        self._server.listen(64)
        self._threads: list[threading.Thread] = []
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._spawn(self._accept)

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                upstream.connect(self._upstream)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._socks += [client, upstream]
            self._spawn(self._pipe, client, upstream, True)
            self._spawn(self._pipe, upstream, client, False)

    def _pipe(self, src: socket.socket, dst: socket.socket, requests: bool) -> None:
        with contextlib.suppress(OSError):
            while True:
                chunk = src.recv(65536)
                if not chunk:
                    break
                if requests and _WAIT.match(chunk):
                    self._closed.wait(self._hold)  # the slow engine: held, not a race's order
                dst.sendall(chunk)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()
        with self._lock:
            socks, threads = list(self._socks), list(self._threads)
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for thread in threads:
            thread.join(10)

    def __enter__(self) -> SlowWaitEngine:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
