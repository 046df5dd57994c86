"""The one exception tree of andon.

Every error andon raises on purpose derives from :class:`AndonError`; leaves carry the ids a caller
needs (``session``, ``seq``, ``call_id``, ``code`` ...) as attributes, not only inside the message::

    AndonError
    ├── ProtocolError                 a frame that cannot be trusted (carries .kind)
    │   ├── MessageTooLarge           over the configured size limit
    │   ├── MalformedFrame            not msgpack, wrong frame count, a field of the wrong type
    │   ├── VersionMismatch           another protocol version
    │   └── UnknownMessage            a message type this side does not know
    ├── WorkerError                   a worker misbehaved (carries .worker)
    │   └── NoWorkerStarted           a pool could not start any worker (CLI exit code 6)
    ├── SessionError                  the session folder or its log (carries .session)
    │   ├── LogCorrupted              a bad line followed by good ones (.line, .offset)
    │   ├── LogFormatUnsupported      an unknown record type or format (.seq, .record_type)
    │   ├── SessionLive               another live process holds the lock (.pid, .host)
    │   └── LogWriteFailed            an append failed (ENOSPC, EIO ...) (.errno)
    ├── ModelError                    the model API failed (carries .code, .status, .retry_after;
    │                                 a CONTEXT_OVERFLOW also .limit and .requested)
    ├── ConfigError                   a user's configuration or input is wrong (CLI exit code 2)
    │   └── ScriptInvalid             a scripted-model reply is malformed (.index, .field)
    ├── AgentClosed                   a send after disposal began
    └── Aborted                       work stopped because its signal aborted (carries .reason)

A worker lost under a call is no exception: the call ends with a result whose error code is
``WORKER_LOST`` (the log must hold one result for every call, whatever happened to its worker).

Nothing here imports any other part of andon.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Literal, final

from andon.base._codes import ErrorCode

if TYPE_CHECKING:
    from andon.base._causes import Cause

__all__ = [
    "Aborted",
    "AgentClosed",
    "AndonError",
    "ConfigError",
    "LogCorrupted",
    "LogFormatUnsupported",
    "LogWriteFailed",
    "MalformedFrame",
    "MessageTooLarge",
    "ModelError",
    "NoWorkerStarted",
    "ProtocolError",
    "ScriptInvalid",
    "SessionError",
    "SessionLive",
    "UnknownMessage",
    "VersionMismatch",
    "WorkerError",
]


class AndonError(Exception):
    """Root of every error andon raises on purpose."""


# --- wire -------------------------------------------------------------------------------------

ProtocolErrorKind = Literal["too-large", "malformed", "version", "unknown-type"]


class ProtocolError(AndonError):
    """A frame that cannot be trusted. ``kind`` says which rule it broke."""

    kind: ProtocolErrorKind = "malformed"

    def __init__(self, message: str, *, call_id: str | None = None) -> None:
        super().__init__(message)
        self.call_id = call_id


@final
class MessageTooLarge(ProtocolError):
    kind: ProtocolErrorKind = "too-large"

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"message of {size} bytes exceeds the limit of {limit} bytes")
        self.size = size
        self.limit = limit


@final
class MalformedFrame(ProtocolError):
    kind: ProtocolErrorKind = "malformed"


@final
class VersionMismatch(ProtocolError):
    kind: ProtocolErrorKind = "version"

    def __init__(self, got: object, expected: int) -> None:
        super().__init__(f"protocol version {got!r} is not supported (this side speaks {expected})")
        self.got = got
        self.expected = expected


@final
class UnknownMessage(ProtocolError):
    kind: ProtocolErrorKind = "unknown-type"

    def __init__(self, type_name: object) -> None:
        super().__init__(f"unknown message type {type_name!r}")
        self.type_name = type_name


# --- workers ----------------------------------------------------------------------------------


class WorkerError(AndonError):
    def __init__(self, message: str, *, worker: str | None = None) -> None:
        super().__init__(message)
        self.worker = worker


@final
class NoWorkerStarted(WorkerError):
    """A worker pool could not start any worker: its start gave up after bounded retries
    (docs/workers.md, Starting workers). ``andon run`` exits 6."""


# --- session ----------------------------------------------------------------------------------


class SessionError(AndonError):
    def __init__(self, message: str, *, session: str | None = None) -> None:
        super().__init__(message)
        self.session = session


@final
class LogCorrupted(SessionError):
    def __init__(self, message: str, *, session: str | None = None, line: int, offset: int) -> None:
        super().__init__(message, session=session)
        self.line = line
        self.offset = offset


@final
class LogFormatUnsupported(SessionError):
    def __init__(
        self,
        message: str,
        *,
        session: str | None = None,
        seq: int | None = None,
        record_type: str | None = None,
    ) -> None:
        super().__init__(message, session=session)
        self.seq = seq
        self.record_type = record_type


@final
class SessionLive(SessionError):
    def __init__(
        self, message: str, *, session: str | None = None, pid: int | None, host: str | None
    ) -> None:
        super().__init__(message, session=session)
        self.pid = pid
        self.host = host


@final
class LogWriteFailed(SessionError):
    code = ErrorCode.LOG_WRITE_FAILED

    def __init__(
        self, message: str, *, session: str | None = None, errno: int | None = None
    ) -> None:
        super().__init__(message, session=session)
        self.errno = errno


# --- model ------------------------------------------------------------------------------------


@final
class ModelError(AndonError):
    """The model API failed. ``code`` is one of the model codes (docs/models.md, Errors and
    retries).

    A ``CONTEXT_OVERFLOW`` carries what the server said about it, where it said so: ``limit``,
    the model's context window in tokens, and ``requested``, the tokens of the request's input as
    the server counted them (``None`` each when the server did not say; always ``None`` for
    other codes)."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
        limit: int | None = None,
        requested: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.retry_after = retry_after
        self.limit = limit
        self.requested = requested

    def __repr__(self) -> str:
        return f"ModelError({self.code.value}, {self.message!r}, status={self.status!r})"


# --- configuration ----------------------------------------------------------------------------


class ConfigError(AndonError):
    """The user's configuration or input is wrong; the message says what and where."""


@final
class ScriptInvalid(ConfigError):
    def __init__(self, message: str, *, index: int | None, field: str | None) -> None:
        where = []
        if index is not None:
            where.append(f"reply {index}")
        if field is not None:
            where.append(f"field {field!r}")
        prefix = f"{', '.join(where)}: " if where else ""
        super().__init__(f"invalid script: {prefix}{message}")
        self.index = index
        self.field = field


# --- agent ------------------------------------------------------------------------------------


@final
class AgentClosed(AndonError):
    def __init__(self, message: str = "the agent is closed; nothing was sent") -> None:
        super().__init__(message)


@final
class Aborted(AndonError):
    """Raised by ``signal.throw_if_aborted()``: the work's signal aborted with ``reason``."""

    def __init__(self, reason: Cause) -> None:
        super().__init__(f"aborted: {reason.describe()}")
        self.reason = reason


# --- operating-system errors ------------------------------------------------------------------


@contextlib.contextmanager
def naming_file(path: str | os.PathLike[str]) -> Iterator[None]:
    """An ``OSError`` raised inside without a file name (``os.write``, ``fsync``, ``ftruncate``
    take a descriptor, so a full disk says only "No space left on device") is raised again as the
    same kind of error naming ``path``; one that names its file already passes unchanged. For the
    writes of the session folder (log, lock, spill and torn files), so that every such message
    says which file (docs/log-format.md, When the disk fails)."""
    try:
        yield
    except OSError as exc:
        if exc.filename is not None or exc.errno is None:
            raise
        raise type(exc)(exc.errno, exc.strerror or os.strerror(exc.errno), os.fspath(path)) from exc


def describe_error(error: BaseException, *, typed: bool = True) -> str:
    """One line about ``error`` for a person: a group of one error is that error, an OS error
    names its file, and ``typed`` puts the error's type first (for a failure andon did not
    expect; a user's mistake reads better as its message alone)."""
    while isinstance(error, BaseExceptionGroup) and len(error.exceptions) == 1:
        error = error.exceptions[0]
    if isinstance(error, OSError) and error.filename:
        text = f"{error.strerror or error}: {error.filename}"
    else:
        text = str(error)
    if not typed:
        return text or type(error).__name__
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
