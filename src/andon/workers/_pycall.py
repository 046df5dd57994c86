"""A Python tool's call process (docs/workers.md, Python tools run in call processes).

Each Python call runs in a process forked from the warm worker, in its own process group (and the
call's cgroup), exactly like a shell call's leader. Most are forked ahead, while the worker is
idle (:class:`Spare`), and handed their call when it comes; one that cannot be handed over (its
arguments do not fit the pipe) is forked for its call (:func:`spawn`). It is not a subreaper,
and it has no reaper: the tool's own ``subprocess.run`` and asyncio subprocesses see their
children's real exit statuses. Whatever threads and asyncio tasks the tool leaves end when the
process exits, right after it has written its result; the children it leaves are the worker's
to sweep.

Two pipes join it to the worker:

* worker -> call: for a spare, first the call itself (a length-prefixed msgpack list: the tool's
  name, its checked arguments, and the ``run`` fields the process needs); then cancels, each a
  length-prefixed msgpack map ``{"cause": <cause dict>}``. The tool's signal aborts with that
  cause. Bytes written before the call process reads them wait in the pipe, so a cancel that
  lands between the fork (or the handover) and the tool's first line is never lost: the call
  process reads the pipe before it calls the tool, and does not call it when a cancel is already
  there.
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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, NoReturn

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
from andon.workers._registry import Tool, ToolRegistry

__all__ = ["CONTENT_CAP", "CallProcess", "Outcome", "Spare", "spawn"]

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
        # A few dozen bytes into an empty pipe: never blocks, never short.
        return _write_to_call(self._cancel_fd, _LEN.pack(len(frame)) + frame)

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


_CANCEL_ROOM = 4096
"""Room the handover leaves in that pipe for the cancels written before the spare reads it (a
few dozen bytes each, at most one per stage): no write to the pipe ever blocks."""


class Spare:
    """A call process forked ahead, while its worker is idle, waiting for its call
    (docs/workers.md, Spare call processes). From the fork on it is in its own process group;
    it reads one frame, the call, and then serves it like a call process forked for it. The end
    of that pipe (the worker closed it, or died) ends it unused."""

    def __init__(self, pid: int, cancel_fd: int, result_fd: int, room: int) -> None:
        self.pid = pid
        self._cancel_fd: int | None = cancel_fd
        self._result_fd: int | None = result_fd
        self._room = room
        info = procs.stat(pid)  # our unreaped child: its line is there even if it has exited
        self.create_time = info.key.create_time if info is not None else 0.0

    @classmethod
    def fork(cls, registry: ToolRegistry) -> Spare:
        """Fork a spare from this (idle) worker; only the worker returns."""
        pid, to_call, from_call = _fork_call_process(
            lambda r, w, held: _spare(registry, r, w, held)
        )
        # The pipe keeps its own size (64 KiB, or a page for a user over the system's pipe
        # limit), not a bigger one: a spare holds its pipe for as long as the worker is idle, and
        # the buffers are counted against the user's limit, which every pipe of theirs shares.
        # A call with bigger arguments gets a call process forked for it.
        try:
            room = fcntl.fcntl(to_call, fcntl.F_GETPIPE_SZ)
        except OSError:
            room = 4096
        return cls(pid, to_call, from_call, room - _CANCEL_ROOM)

    def handover(self, run: Run, arguments: dict[str, Any]) -> bytes | None:
        """The frame that hands ``run`` over, or None if it cannot go through the pipe (more than
        the pipe holds; or a value msgpack refuses, which the ``run`` itself, msgpack on the
        wire, cannot carry): that call gets a call process forked for it instead."""
        try:
            frame: bytes = msgpack.packb(
                [
                    run.tool,
                    arguments,
                    run.call_id,
                    run.tag,
                    run.cwd,
                    list(run.env_remove),
                    dict(run.env_add),
                ],
                use_bin_type=True,
            )
        except Exception:
            return None
        if _LEN.size + len(frame) > self._room:
            return None
        return _LEN.pack(len(frame)) + frame

    def hand_over(self, frame: bytes) -> CallProcess | None:
        """Give the spare its call: from here on it is that call's process. None if the spare
        has gone (it is then closed). The pipe is empty and the frame fits it: never blocks."""
        assert self._cancel_fd is not None and self._result_fd is not None
        if not _write_to_call(self._cancel_fd, frame):
            self.close()
            return None
        child = CallProcess(self.pid, self._cancel_fd, self._result_fd)
        self._cancel_fd = self._result_fd = None
        return child

    def close(self) -> None:
        """Let go of it unused: it reads the end of its pipe and exits."""
        for fd in (self._cancel_fd, self._result_fd):
            if fd is not None:
                os.close(fd)
        self._cancel_fd = self._result_fd = None


def _write_to_call(fd: int, data: bytes) -> bool:
    """Write ``data`` into the pipe to a call process; False if it has exited (EPIPE).

    The worker runs with SIGPIPE at its default action (what its tools inherit), which would end
    the worker itself on a write to a call process that has just exited and is not reaped yet.
    The signal is blocked around the write and, if the write raised it, taken before unblocking:
    a broken pipe is then only the error it means."""
    old = _signal.pthread_sigmask(_signal.SIG_BLOCK, {_signal.SIGPIPE})
    try:
        os.write(fd, data)
        return True
    except BrokenPipeError:
        if _signal.SIGPIPE not in old:
            _signal.sigtimedwait({_signal.SIGPIPE}, 0)  # this thread's, raised by the write
        return False
    except OSError:
        return False
    finally:
        if _signal.SIGPIPE not in old:
            _signal.pthread_sigmask(_signal.SIG_SETMASK, old)


def spawn(run: Run, tool: Tool, arguments: dict[str, Any]) -> CallProcess:
    """Fork the call process (the caller puts the worker into the call's cgroup around this, so
    the call process is inside from its first instruction). Only the worker returns."""
    pid, to_call, from_call = _fork_call_process(
        lambda r, w, held: _child(run, tool, arguments, r, w, held)
    )
    return CallProcess(pid, to_call, from_call)


def _fork_call_process(
    life: Callable[[int, int, set[int | _signal.Signals]], NoReturn],
) -> tuple[int, int, int]:
    """Fork a call process joined to the worker by two pipes (worker -> call: a spare's call,
    then cancels; call -> worker: the outcome). The child runs ``life(its read end, its write
    end, the signal mask to restore)`` and never returns; the worker gets (pid, its write end,
    its read end)."""
    to_call_r, to_call_w = os.pipe2(os.O_CLOEXEC)
    from_call_r, from_call_w = os.pipe2(os.O_CLOEXEC)
    try:
        pid, held = _fork()
    except BaseException:
        for fd in (to_call_r, to_call_w, from_call_r, from_call_w):
            os.close(fd)
        raise
    if pid == 0:
        os.close(to_call_w)
        os.close(from_call_r)
        life(to_call_r, from_call_w, held)
    # Both sides make the group: whichever runs first, it exists before either goes on, so a
    # stage sent the moment after the fork reaches the whole call.
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)
    os.close(to_call_r)
    os.close(from_call_w)
    return pid, to_call_w, from_call_r


# -- the call process ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Call:
    """What the call process needs of its call (a ``Run``'s fields, as the wire spells them)."""

    tool: Tool | None
    arguments: dict[str, Any]
    call_id: str
    tag: str
    cwd: str
    env_remove: list[str]
    env_add: dict[str, str]


def _child(
    run: Run,
    tool: Tool,
    arguments: dict[str, Any],
    cancel_fd: int,
    out_fd: int,
    held: set[int | _signal.Signals],
) -> NoReturn:
    """The life of a call process forked for its call; it never returns into the worker's code."""
    call = _Call(
        tool, arguments, run.call_id, run.tag, run.cwd, list(run.env_remove), dict(run.env_add)
    )
    _life(lambda: (_CancelReader(cancel_fd, blocking=False), call, procs.tag_slot()), out_fd, held)


def _spare(
    registry: ToolRegistry, cancel_fd: int, out_fd: int, held: set[int | _signal.Signals]
) -> NoReturn:
    """The life of a spare: made ready while the worker is idle, then its call (or nothing)."""

    def wait_for_call() -> tuple[_CancelReader, _Call | None, int | None]:
        slot = procs.tag_slot()  # found now, written in place once the call has come
        reader = _CancelReader(cancel_fd, blocking=True)
        handed = reader.first_frame()
        if handed is None:
            return reader, None, slot  # the worker let go of it (or died): nothing to do
        name, arguments, call_id, tag, cwd, env_remove, env_add = handed
        call = _Call(registry.get(name), arguments, call_id, tag, cwd, env_remove, env_add)
        return reader, call, slot

    _life(wait_for_call, out_fd, held)


def _life(
    get_call: Callable[[], tuple[_CancelReader, _Call | None, int | None]],
    out_fd: int,
    held: set[int | _signal.Signals],
) -> NoReturn:
    status = _EXIT_BROKEN
    try:
        # The worker's objects are not the tool's garbage: a collection that walked them would
        # copy every page of the worker's heap into this process (copy-on-write).
        gc.freeze()
        os.setpgid(0, 0)
        _forget_the_worker()
        # Only now may a stage's signal act: with the worker's handlers gone, by its default.
        _signal.pthread_sigmask(_signal.SIG_SETMASK, held)
        reader, call, slot = get_call()
        if call is not None:
            # Every process of a call carries its tag, this one too (and so every fork of it).
            procs.stamp_tag(call.tag, slot)
            _apply_environment(call)
            os.chdir(name_path(call.cwd))
            outcome = _run_tool(call, reader)
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


def _apply_environment(call: _Call) -> None:
    """Make ``os.environ`` the tool's environment: the worker's (which this process has, as
    forked), less ``env_remove``, plus ``env_add`` and the call's id and tag. Only the names the
    call changes are touched (each is a putenv; rebuilding the whole environment cost a
    millisecond)."""
    environ = os.environ
    for name in call.env_remove:
        if name in environ:
            del environ[name]
    for name, value in call.env_add.items():
        environ[name_path(name)] = name_path(value)
    environ["ANDON_CALL_ID"] = call.call_id
    environ[procs.TAG_VAR] = call.tag


_FORK_BLOCKED: Final = frozenset({_signal.SIGCHLD, _signal.SIGTERM, _signal.SIGINT})
"""What a call process must not receive before it has dropped the worker's handlers."""


def _fork() -> tuple[int, set[int | _signal.Signals]]:
    """``os.fork`` with the signals the worker handles blocked across it: the child starts with
    them blocked and unblocks them (:func:`_life`) once it has dropped the worker's handlers and
    wakeup fd. Without that, a stage's SIGTERM that reaches a call process before its first
    instruction (under load a child may wait milliseconds to run) would be caught by the
    worker's handler in the child, which writes to the wakeup pipe it shares with the worker:
    the tool runs on, and the worker thinks it was told to drain. Returns the pid and the mask
    to restore."""
    held = _signal.pthread_sigmask(_signal.SIG_BLOCK, _FORK_BLOCKED)
    try:
        pid = os.fork()
    except BaseException:
        _signal.pthread_sigmask(_signal.SIG_SETMASK, held)
        raise
    if pid != 0:
        _signal.pthread_sigmask(_signal.SIG_SETMASK, held)
    return pid, held


def _forget_the_worker() -> None:
    """Drop what the fork copied of the worker's event loop: its signal handlers and wakeup fd
    (the worker set every disposition to the default at its start; its loop then handles
    SIGCHLD for the reaper and, as a program, SIGTERM and SIGINT for its drain: kept, they would
    make a tool deaf to the TERM stage) and the note that a loop is running in this thread."""
    with contextlib.suppress(ValueError, OSError):
        _signal.set_wakeup_fd(-1)
    for sig in (_signal.SIGCHLD, _signal.SIGTERM, _signal.SIGINT):
        _signal.signal(sig, _signal.SIG_DFL)
    # Python 3.11 keeps the forking thread's running loop across fork; a new loop refuses to run
    # while it is set.
    asyncio.events._set_running_loop(None)


def _run_tool(handed: _Call, reader: _CancelReader) -> Outcome:
    tool = handed.tool
    if tool is None or tool.fn is None:  # the worker checked the name: cannot happen
        raise RuntimeError("the tool handed over is not in this worker's registry")
    controller = reader.controller
    cancel_fd = reader.fd
    kwargs = dict(handed.arguments)
    if tool.takes_signal:
        kwargs["signal"] = controller.signal
    fn = tool.fn
    try:
        if tool.is_async:
            # A cancel sent before the fork (or the handover) or during it is already in the pipe.
            reader.drain()
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
    def __init__(self, fd: int, *, blocking: bool) -> None:
        self.fd = fd
        self.controller = AbortController()
        self.buffer = bytearray()
        if not blocking:
            os.set_blocking(fd, False)

    def first_frame(self) -> Any:
        """A spare's call: the first frame on the (blocking) pipe, decoded; None at its end.
        What follows it (cancels written before this read) stays in the buffer for
        :meth:`drain`, and the pipe is non-blocking from here on."""
        while True:
            if len(self.buffer) >= _LEN.size:
                (size,) = _LEN.unpack_from(self.buffer)
                if len(self.buffer) >= _LEN.size + size:
                    frame = bytes(self.buffer[_LEN.size : _LEN.size + size])
                    del self.buffer[: _LEN.size + size]
                    os.set_blocking(self.fd, False)
                    return msgpack.unpackb(frame, raw=False)
            data = os.read(self.fd, 64 * 1024)  # the pipe's size: the call is in one or two reads
            if not data:
                return None
            self.buffer += data

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
