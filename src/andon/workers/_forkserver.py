"""The workers' forkserver: a fresh interpreter that imports what a worker needs once, then forks
each local worker from that state (docs/workers.md, Starting workers).

The pool's launcher (``andon.fleet``) execs it, with the model API keys left out of its
environment, and keeps one end of a socket pair; the other end is this process's only way in.
Each request carries a worker's program and options; the answer is the new worker's pid, its start
time and a pidfd of it, opened here while the worker is this process's unreaped child, so the
launcher holds exactly that process from the moment it exists, whatever becomes of the pid later.

It ends when the launcher's end closes (andon closed the pool, or died: a ``kill -9`` closes every
fd at once), and it reaps its workers as they exit. Nothing else runs in it: no thread, no helper
process, no file of its own.

The request is pickled: the program by reference (a test's faulty worker), the options with the
tool registry. A tool defined in a user's script (its ``__main__``) has no import path in a
worker, so such a registry is pickled by value, with dill (:func:`dump_request`): imported then
only, by the launcher and by the worker that loads it.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import selectors
import signal
import socket
import struct
import sys
from collections.abc import Callable
from typing import Any, Final

from andon import procs

__all__ = [
    "FORKSERVER_MODULE",
    "ForkReply",
    "dump_request",
    "read_reply",
    "serve",
    "write_request",
]

FORKSERVER_MODULE: Final = __name__
"""What the launcher runs (``-c 'from MODULE import serve; serve()'``)."""

_HEADER: Final = struct.Struct("!I")
_REPLY: Final = struct.Struct("!qQi")  # pid, start time (clock ticks), errno (0: forked)
_MAX_REQUEST: Final = 1 << 30
_PLAIN, _DILL = b"P", b"D"


class _NeedsDill(pickle.PicklingError):
    pass


class _ByReference(pickle.Pickler):
    """The standard pickler, refusing what only resolves in this process: anything of
    ``__main__`` (the forkserver's ``__main__`` is not the user's script)."""

    def reducer_override(self, obj: Any) -> Any:
        if getattr(obj, "__module__", None) == "__main__" or type(obj).__module__ == "__main__":
            raise _NeedsDill(obj)
        return NotImplemented


def dump_request(program: Callable[[Any], object], options: Any) -> bytes:
    """A request for one worker: ``program(options)`` in a fork of the forkserver, with this
    process's ``sys.path`` and working directory (as the worker would have, were it forked from
    here). Pickled by reference where everything has an import path; otherwise by value, with
    dill (which the worker then imports too)."""
    buffer = io.BytesIO()
    try:
        _ByReference(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump((program, options))
        kind, blob = _PLAIN, buffer.getvalue()
    except (pickle.PicklingError, AttributeError, TypeError):
        import dill  # type: ignore[import-untyped]

        kind, blob = _DILL, dill.dumps((program, options), protocol=pickle.HIGHEST_PROTOCOL)
    return pickle.dumps((list(sys.path), os.getcwd(), kind, blob), pickle.HIGHEST_PROTOCOL)


def write_request(sock: socket.socket, request: bytes) -> None:
    sock.sendall(_HEADER.pack(len(request)) + request)


class ForkReply:
    """The forkserver's answer: the worker's pid, its start time and a pidfd of it (``fd``,
    the receiver's to close), or the errno of a failed fork."""

    __slots__ = ("error", "fd", "pid", "start")

    def __init__(self, pid: int, start: int, error: int, fd: int | None) -> None:
        self.pid, self.start, self.error, self.fd = pid, start, error, fd


def read_reply(sock: socket.socket) -> ForkReply:
    """The answer to the request just written; ``EOFError`` if the forkserver ended first."""
    data, fds, _, _ = socket.recv_fds(sock, _REPLY.size, 1)
    while data and len(data) < _REPLY.size:  # a stream: the rest of the few bytes
        more = sock.recv(_REPLY.size - len(data))
        if not more:
            break
        data += more
    if len(data) < _REPLY.size:
        for fd in fds:
            os.close(fd)
        raise EOFError("the workers' forkserver ended before it answered")
    pid, start, error = _REPLY.unpack(data)
    return ForkReply(pid, start, error, fds[0] if fds else None)


def serve() -> None:
    """The forkserver's main: ``python -c 'from … import serve; serve()' FD MODULE…``."""
    fd = int(sys.argv[1])
    # Imported before the first request: every worker is a fork of this state. A module that
    # cannot be imported here is imported again (and fails) in the worker that needs it.
    for name in sys.argv[2:]:
        with contextlib.suppress(ImportError):
            __import__(name)
    _Server(socket.socket(fileno=fd)).run()


class _Server:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.pending = b""
        # SIGCHLD wakes the loop (a no-op handler and a wakeup fd): the exited workers are reaped
        # there, never between a fork and the pidfd opened on its child.
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        signal.signal(signal.SIGCHLD, _ignore)
        signal.set_wakeup_fd(self.wake_w)
        # The stop signals stay blocked, as the launcher's spawner thread left them (a CI
        # runner's signal to the whole group is andon's to handle, not this process's).

    def run(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self.sock, selectors.EVENT_READ, "request")
        selector.register(self.wake_r, selectors.EVENT_READ, "child")
        while True:
            for key, _ in selector.select():
                if key.data == "child":
                    self._reap()
                elif not self._read():
                    os._exit(0)  # the launcher let go (or died): nothing more to fork

    def _reap(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self.wake_r, 512):
                pass
        while True:
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return

    def _read(self) -> bool:
        """Read what arrived; serve every complete request. False at end of file."""
        try:
            data = self.sock.recv(1 << 16)
        except ConnectionError:
            return False
        if not data:
            return False
        self.pending += data
        while len(self.pending) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self.pending)
            if size > _MAX_REQUEST:
                return False
            if len(self.pending) < _HEADER.size + size:
                break
            request = self.pending[_HEADER.size : _HEADER.size + size]
            self.pending = self.pending[_HEADER.size + size :]
            self._fork(request)
        return True

    def _fork(self, request: bytes) -> None:
        try:
            pid = os.fork()
        except OSError as e:
            self._answer(_REPLY.pack(0, 0, e.errno or 1), [])
            return
        if pid == 0:
            self._child(request)  # never returns
        # The child cannot have been reaped yet (only _reap does that): the pidfd and the start
        # time are of that very process, even if it has exited by now.
        pidfd = os.pidfd_open(pid)
        info = procs.stat(pid)
        start = info.start if info is not None else 0
        try:
            self._answer(_REPLY.pack(pid, start, 0), [pidfd])
        finally:
            os.close(pidfd)

    def _answer(self, reply: bytes, fds: list[int]) -> None:
        try:
            socket.send_fds(self.sock, [reply], fds)
        except OSError:
            os._exit(0)  # the launcher is gone

    def _child(self, request: bytes) -> None:
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for fd in (self.wake_r, self.wake_w):
                os.close(fd)
            self.sock.close()
            sys_path, cwd, kind, blob = pickle.loads(request)
            sys.path[:] = sys_path
            with contextlib.suppress(OSError):
                os.chdir(cwd)
            loads: Callable[[bytes], Any] = pickle.loads
            if kind == _DILL:
                import dill

                loads = dill.loads
            program, options = loads(blob)
            program(options)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            sys.excepthook(*sys.exc_info())
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)


def _ignore(signum: int, frame: object) -> None:
    """SIGCHLD's handler: only there so that the signal reaches the wakeup fd."""
