"""A Python tool's call process (docs/workers.md, Python tools run in call processes).

Each Python call runs in a process forked from the warm worker, in its own process group (and the
call's cgroup), exactly like a shell call's leader. It is not a subreaper, and it has no reaper:
the tool's own ``subprocess.run`` and asyncio subprocesses see their children's real exit
statuses. Whatever threads and asyncio tasks the tool leaves end when the process exits, right
after it has written its result; the children it leaves are the worker's to sweep.

Two pipes join it to the worker:

* worker -> call: cancels, each a length-prefixed msgpack map ``{"cause": <cause dict>}``. The
  tool's signal aborts with that cause. Bytes written before the call process reads them wait in
  the pipe, so a cancel that lands between the fork and the tool's first line is never lost: the
  call process reads the pipe before it calls the tool, and does not call it when a cancel is
  already there.
* call -> worker: the outcome, one msgpack map ``{"content", "error"}``, then EOF. The result
  text and the error message are each made valid Unicode (a tool may return or raise with any
  str, surrogate escapes of a file name included: msgpack refuses those) and capped alike at
  :data:`CONTENT_CAP`, in :func:`_encode_outcome` and nowhere else: the wire message that carries
  them has a limit, and an outcome the worker cannot read would be reported as no outcome.

SIGTERM and SIGKILL are not the call process's business: the worker sends them to its group.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import gc
import os
import signal as _signal
import struct
import sys
from dataclasses import dataclass
from typing import Any, NoReturn

import msgpack

from andon import procs
from andon.base import (
    AbortController,
    Aborted,
    Cause,
    ErrorCode,
    cause_from_dict,
    clean_text,
    cut_text,
    name_path,
)
from andon.protocol import ErrorInfo, Run
from andon.workers._registry import Tool

__all__ = ["CONTENT_CAP", "CallProcess", "Outcome", "spawn"]

CONTENT_CAP = 4 * 1024 * 1024
"""The largest result text, and the largest error message, a Python tool can return (UTF-8
bytes); beyond it the text is cut and says so."""
_READ_CAP = 2 * CONTENT_CAP + 64 * 1024
"""The most the worker reads of an outcome: both texts at their cap, and the map around them."""

_LEN = struct.Struct(">I")
_EXIT_OK = 0
_EXIT_BROKEN = 70  # EX_SOFTWARE: the call process itself failed (andon's bug, not the tool's)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the call process reported: the tool's text and, if it failed, why."""

    content: str
    error: ErrorInfo | None


class CallProcess:
    """The worker's side of one call process: its pid and the two pipe ends."""

    def __init__(self, pid: int, cancel_fd: int, result_fd: int) -> None:
        self.pid = pid
        self._cancel_fd: int | None = cancel_fd
        self._result_fd: int | None = result_fd
        self._result = bytearray()

    def cancel(self, cause: Cause) -> bool:
        """Tell the tool to stop (its signal aborts with ``cause``); False once it has gone."""
        if self._cancel_fd is None:
            return False
        frame = msgpack.packb({"cause": cause.to_dict()}, use_bin_type=True)
        try:
            # A few dozen bytes into an empty pipe: never blocks, never short.
            os.write(self._cancel_fd, _LEN.pack(len(frame)) + frame)
            return True
        except OSError:  # EPIPE: the call process has exited
            return False

    def start_reading(self, loop: asyncio.AbstractEventLoop) -> None:
        """Collect the outcome as it arrives (the pipe must not fill while the tool writes it)."""
        assert self._result_fd is not None
        os.set_blocking(self._result_fd, False)
        loop.add_reader(self._result_fd, self._read)

    def _read(self) -> None:
        fd = self._result_fd
        if fd is None:
            return
        while True:
            try:
                data = os.read(fd, 64 * 1024)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                with contextlib.suppress(ValueError, OSError, RuntimeError):
                    asyncio.get_running_loop().remove_reader(fd)
                return
            if len(self._result) <= _READ_CAP:  # beyond: dropped (cannot happen)
                self._result += data

    def take_outcome(self) -> Outcome | None:
        """The outcome, once the call process has exited (it writes the whole outcome before it
        exits, so what is not yet read is in the pipe); None if it ended without writing one (a
        stage's signal, ``os._exit``, a crash). Never waits: a stray holding the pipe open
        cannot hold the result back."""
        self._read()
        return _decode_outcome(bytes(self._result))

    def close(self) -> None:
        if self._cancel_fd is not None:
            os.close(self._cancel_fd)
            self._cancel_fd = None
        if self._result_fd is not None:
            with contextlib.suppress(ValueError, OSError, RuntimeError):
                asyncio.get_running_loop().remove_reader(self._result_fd)
            os.close(self._result_fd)
            self._result_fd = None


def spawn(run: Run, tool: Tool, arguments: dict[str, Any], env: dict[str, str]) -> CallProcess:
    """Fork the call process (the caller puts the worker into the call's cgroup around this, so
    the call process is inside from its first instruction). Only the worker returns."""
    to_call_r, to_call_w = os.pipe2(os.O_CLOEXEC)
    from_call_r, from_call_w = os.pipe2(os.O_CLOEXEC)
    try:
        pid = os.fork()
    except BaseException:
        for fd in (to_call_r, to_call_w, from_call_r, from_call_w):
            os.close(fd)
        raise
    if pid == 0:
        os.close(to_call_w)
        os.close(from_call_r)
        _child(run, tool, arguments, env, to_call_r, from_call_w)
    # Both sides make the group: whichever runs first, it exists before either goes on, so a
    # stage sent the moment after the fork reaches the whole call.
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)
    os.close(to_call_r)
    os.close(from_call_w)
    return CallProcess(pid, to_call_w, from_call_r)


# -- the call process ------------------------------------------------------------------------


def _child(
    run: Run,
    tool: Tool,
    arguments: dict[str, Any],
    env: dict[str, str],
    cancel_fd: int,
    out_fd: int,
) -> NoReturn:
    """The call process's whole life; it never returns into the worker's code."""
    status = _EXIT_BROKEN
    try:
        # The worker's objects are not the tool's garbage: a collection that walked them would
        # copy every page of the worker's heap into this process (copy-on-write).
        gc.freeze()
        os.setpgid(0, 0)
        _forget_the_worker()
        # Every process of a call carries its tag, this one too (and so every fork of it).
        procs.stamp_tag(run.tag)
        _set_environment(env)
        os.chdir(name_path(run.cwd))
        outcome = _run_tool(tool, arguments, cancel_fd, run)
        _write_all(out_fd, _encode_outcome(outcome))
        status = _EXIT_OK
    except BaseException as e:  # andon's own failure here must still say something
        with contextlib.suppress(BaseException):
            message = f"internal error in the call process: {type(e).__name__}: {e}"
            error = ErrorInfo(name="InternalError", code=ErrorCode.INTERNAL, message=message)
            _write_all(out_fd, _encode_outcome(Outcome(f"Error: {message}", error)))
    finally:
        with contextlib.suppress(BaseException):
            sys.stdout.flush()
            sys.stderr.flush()
        # Threads and tasks the tool left end here, with the process: nothing outlives its call.
        os._exit(status)


def _set_environment(env: dict[str, str]) -> None:
    """Make ``os.environ`` exactly ``env``, touching only what differs (each change is a
    putenv; clearing and refilling the whole environment cost a millisecond)."""
    for name in [name for name in os.environ if name not in env]:
        del os.environ[name]
    for name, value in env.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


def _forget_the_worker() -> None:
    """Drop what the fork copied of the worker's event loop: its SIGCHLD handler and wakeup fd
    (the worker set every other disposition to the default at its start, and only its reaper
    installs one) and the note that a loop is running in this thread."""
    with contextlib.suppress(ValueError, OSError):
        _signal.set_wakeup_fd(-1)
    _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)
    # Python 3.11 keeps the forking thread's running loop across fork; a new loop refuses to run
    # while it is set.
    asyncio.events._set_running_loop(None)


def _run_tool(tool: Tool, arguments: dict[str, Any], cancel_fd: int, run: Run) -> Outcome:
    controller = AbortController()
    reader = _CancelReader(cancel_fd, controller)
    kwargs = dict(arguments)
    if tool.takes_signal:
        kwargs["signal"] = controller.signal
    assert tool.fn is not None
    fn = tool.fn
    try:
        if tool.is_async:
            reader.drain()  # a cancel sent before the fork or during it is already in the pipe
            if controller.signal.aborted:
                return _aborted()
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)

            async def call() -> Any:
                loop.add_reader(cancel_fd, reader.drain)
                return await fn(**kwargs)

            # No asyncio.run: its clean-up would wait for tasks and threads the tool left.
            value = loop.run_until_complete(call())
        else:
            # A sync tool runs on this (the main) thread, with no loop: a cancel arrives as
            # SIGIO, whose handler runs between the tool's bytecodes and aborts its signal.
            if tool.takes_signal:
                reader.deliver_by_sigio()
            reader.drain()
            if controller.signal.aborted:
                return _aborted()
            value = fn(**kwargs)
        text = "" if value is None else str(value)
    except Aborted:
        return _aborted()
    except SystemExit as e:  # the tool called sys.exit(): its failure, not the call process's
        return _tool_error(f"the tool called sys.exit({e.code!r})")
    except Exception as e:  # a tool's own failure is a result
        return _tool_error(f"{type(e).__name__}: {_said(e)}")
    return Outcome(text, None)


def _tool_error(message: str) -> Outcome:
    return Outcome(
        f"Error: {message}", ErrorInfo(name="ToolError", code=ErrorCode.TOOL_ERROR, message=message)
    )


def _said(e: BaseException) -> str:
    """What the exception says; a ``__str__`` that itself raises is the tool's bug, not ours."""
    try:
        return str(e)
    except Exception as inner:
        return f"<its message could not be made: {type(inner).__name__}>"


def _aborted() -> Outcome:
    # The cause is named once, by the supervisor's status line; the tool's text does not repeat it.
    message = "tool call aborted"
    return Outcome(
        f"Error: {message}", ErrorInfo(name="Aborted", code=ErrorCode.ABORTED, message=message)
    )


class _CancelReader:
    def __init__(self, fd: int, controller: AbortController) -> None:
        self.fd = fd
        self.controller = controller
        self.buffer = bytearray()
        os.set_blocking(fd, False)

    def deliver_by_sigio(self) -> None:
        """Have the kernel signal this process when a cancel arrives (the handler first: SIGIO's
        default is to terminate). Set before the first drain, so nothing falls in between."""
        _signal.signal(_signal.SIGIO, lambda _sig, _frame: self.drain())
        fcntl.fcntl(self.fd, fcntl.F_SETOWN, os.getpid())
        flags = fcntl.fcntl(self.fd, fcntl.F_GETFL)
        fcntl.fcntl(self.fd, fcntl.F_SETFL, flags | os.O_ASYNC)

    def drain(self) -> None:
        while True:
            try:
                data = os.read(self.fd, 4096)
            except BlockingIOError:
                break
            if not data:
                # The worker is gone (or the call is over): stop watching the pipe.
                with contextlib.suppress(ValueError, RuntimeError, OSError):
                    asyncio.get_running_loop().remove_reader(self.fd)
                break
            self.buffer += data
        while len(self.buffer) >= _LEN.size:
            (size,) = _LEN.unpack_from(self.buffer)
            if len(self.buffer) < _LEN.size + size:
                return
            frame = bytes(self.buffer[_LEN.size : _LEN.size + size])
            del self.buffer[: _LEN.size + size]
            try:
                cause = cause_from_dict(msgpack.unpackb(frame, raw=False).get("cause"))
            except (ValueError, AttributeError, msgpack.UnpackException):
                continue  # the worker wrote it; a bad frame is a bug, not a reason to crash here
            self.controller.abort(cause)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _encode_outcome(outcome: Outcome) -> bytes:
    error = outcome.error
    wired = None
    if error is not None:
        message = cut_text(clean_text(error.message), CONTENT_CAP, "the tool's error message")
        wired = [clean_text(error.name), error.code.value, message]
    content = cut_text(clean_text(outcome.content), CONTENT_CAP, "the tool's result")
    packed: bytes = msgpack.packb({"content": content, "error": wired}, use_bin_type=True)
    return packed


def _decode_outcome(data: bytes) -> Outcome | None:
    if not data:
        return None
    try:
        raw = msgpack.unpackb(data, raw=False)
        content = raw["content"]
        error = raw["error"]
        info = (
            None
            if error is None
            else ErrorInfo(name=error[0], code=ErrorCode(error[1]), message=error[2])
        )
    except Exception:  # a half-written outcome (killed mid-write): as good as none
        return None
    if not isinstance(content, str):
        return None
    return Outcome(content, info)
