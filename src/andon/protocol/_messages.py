"""The wire messages between the supervisor and its workers (docs/workers.md, The protocol).

Every message is a frozen, slotted, keyword-only dataclass tagged with a ``type`` class variable
(the ``type`` of the frame header). The codec (``_codec``) is generic: it reads the fields and
their type hints, so a message is defined here and nowhere else. Field types are limited to what
the codec knows how to check (see ``_codec``); an unsupported annotation fails at import time.

Direction and purpose, in the order of a call's life::

    worker -> supervisor   Hello        on connect: who the worker is and which tools it offers
    supervisor -> worker   Welcome      accepted: heartbeat interval and limits
    supervisor -> worker   Refused      turned away, with a reason (then the worker exits)
    both                   Heartbeat    liveness (remote workers)
    supervisor -> worker   Run          run one tool call
    worker -> supervisor   Started      the call's process (group, cgroup) exists
    worker -> supervisor   Output       a chunk of the call's output
    supervisor -> worker   Ack          output consumed up to an offset (the worker's read window)
    supervisor -> worker   Cancel       send one stage of the grace timeline
    worker -> supervisor   Signalled    a stage (or sweep) was sent to n live processes
    worker -> supervisor   Result       the call is over and nothing it started is left
    both                   ErrorReply   the answer to a frame that could not be decoded or was
                                        unexpected (wire tag ``error``)
    supervisor -> worker   Shutdown     stop within ``grace`` seconds
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, Literal, final

from andon.base import (
    CancelStage,
    Containment,
    EndedBy,
    ErrorCode,
    GracePolicy,
    SignalStage,
    Stream,
)

__all__ = [
    "OUTPUT_WINDOW",
    "PROTOCOL_VERSION",
    "Ack",
    "Cancel",
    "ErrorInfo",
    "ErrorReply",
    "Heartbeat",
    "Hello",
    "Message",
    "MessageType",
    "Output",
    "Refused",
    "Result",
    "Run",
    "Shutdown",
    "Signalled",
    "Started",
    "Welcome",
]

PROTOCOL_VERSION: Final = 4
"""The ``v`` of every header. A peer speaking another version is broken, not negotiated with."""

MessageType = Literal[
    "hello",
    "welcome",
    "reject",
    "heartbeat",
    "run",
    "started",
    "output",
    "ack",
    "cancel",
    "signalled",
    "result",
    "error",
    "shutdown",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Hello:
    """Worker -> supervisor, first message after connecting."""

    type: ClassVar[Literal["hello"]] = "hello"

    protocol: int
    """The protocol version the worker speaks (also in every header; kept here for the log)."""
    worker_id: str
    host: str
    pid: int
    tools: tuple[str, ...]
    """Names of the tools this worker can run."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Welcome:
    """Supervisor -> worker: accepted."""

    type: ClassVar[Literal["welcome"]] = "welcome"

    heartbeat_interval: float
    """Seconds between heartbeats (remote workers; local liveness comes from pidfds)."""
    max_message_bytes: int
    """The largest message either side accepts; a worker must not send more."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Refused:
    """Supervisor -> worker: refused (the worker exits)."""

    type: ClassVar[Literal["reject"]] = "reject"

    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Heartbeat:
    """Both ways: liveness."""

    type: ClassVar[Literal["heartbeat"]] = "heartbeat"

    time: float
    """The sender's unix time, for diagnostics only (clocks of two hosts are not compared)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """Supervisor -> worker: run one tool call. The call counts as started once this is sent."""

    type: ClassVar[Literal["run"]] = "run"

    call_id: str
    tool: str
    arguments: dict[str, Any]
    """JSON-like values only (None, bool, int, float, str, lists, str-keyed maps). Read-only."""
    cwd: str
    """The working folder, spelled as the file tools spell a name (``andon.base.show_name``: any
    bytes, as text); the worker maps it back with ``name_path``."""
    timeout: float | None
    """Seconds until the call's own timeout starts the grace timeline; None for no timeout."""
    grace: GracePolicy
    output_head_bytes: int
    """How many bytes of the start of the output the result's ``output_head`` keeps."""
    output_tail_bytes: int
    """How many bytes of the end of the output the result's ``output_tail`` keeps."""
    tag: str
    """The call's unique tag (owner + call id): set as ``ANDON_CALL_TAG`` in every process of the
    call and naming its cgroup, so nothing of another session's calls is ever taken for it."""
    env_add: dict[str, str] = field(default_factory=dict)
    """Variables set for the tool (``ANDON_CALL_ID``, ``ANDON_SESSION``, ...), names and values
    spelled like ``cwd`` (mapped back to their bytes by the worker). Read-only."""
    env_remove: tuple[str, ...] = ()
    """Variables scrubbed from the tool's environment (the model API keys in use)."""


@final
@dataclass(frozen=True, slots=True, kw_only=True)
class Started:
    """Worker -> supervisor: the tool's process exists; what to kill if the worker is lost."""

    type: ClassVar[Literal["started"]] = "started"

    call_id: str
    pid: int
    pgid: int
    create_time: float
    """The leader's start time as unix seconds, checked before signalling it: pids are reused.
    Derived from the kernel's start time in clock ticks, it converts back exactly on this boot
    (:class:`andon.procs.ProcessKey`)."""
    containment: Containment
    cgroup: str | None = None
    """The call's cgroup path when ``containment`` is ``cgroup``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Output:
    """Worker -> supervisor: a chunk of output. The supervisor writes the spill file."""

    type: ClassVar[Literal["output"]] = "output"

    call_id: str
    stream: Stream
    data: bytes
    offset: int
    """Byte offset of ``data`` within this stream's output, so a gap or repeat is detectable."""


OUTPUT_WINDOW: Final = 4 * 1024 * 1024
"""The most output bytes a worker sends ahead of the supervisor's last ``ack``. Beyond it the worker
stops reading the tool's pipe, and the tool blocks on a full pipe: memory stays bounded on both
sides (about this much each) whatever the tool writes, and output flows at the pace the supervisor
spills it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Ack:
    """Supervisor -> worker: the call's output up to ``offset`` has been consumed (spilled)."""

    type: ClassVar[Literal["ack"]] = "ack"

    call_id: str
    offset: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Cancel:
    """Supervisor -> worker: send one stage. The sender walks the grace ladder and decides each
    stage (the executor, or a program worker's own SIGTERM drain); the worker only applies it.
    Idempotent."""

    type: ClassVar[Literal["cancel"]] = "cancel"

    call_id: str
    stage: CancelStage
    cause: dict[str, Any] | None = None
    """Why the call is being stopped (a cause's ``to_dict()``): a Python tool's signal aborts with
    it, so the tool sees the real reason (a turn budget's hook, a timeout, the user)."""
    kill_in: float = math.inf
    """Seconds from this cancel to the KILL stage on the supervisor's timeline: the worker's sweep
    never waits past it, and keeps no timeline of its own."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Signalled:
    """Worker -> supervisor: a stage or sweep was sent (logged as ``tool/signal``)."""

    type: ClassVar[Literal["signalled"]] = "signalled"

    call_id: str
    stage: SignalStage
    at: float
    """Seconds since the call started (``tool/signal``'s ``at``)."""
    targets: int
    """How many live processes were signalled."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorInfo:
    """The ``error`` of a result: present only for andon's own errors (docs/log-format.md, Error
    codes)."""

    name: str
    code: ErrorCode
    message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Result:
    """Worker -> supervisor: the call is over and nothing it started is left running."""

    type: ClassVar[Literal["result"]] = "result"

    call_id: str
    exit_code: int | None
    exit_signal: int | None
    ended_by: EndedBy
    content: str
    """The text the model sees (output head and tail plus the status line)."""
    output_head: bytes
    output_tail: bytes
    output_bytes: int
    """Total output bytes of both streams (the spill file holds all of them)."""
    duration: float
    error: ErrorInfo | None = None
    strays_killed: int = 0
    unreachable: int = 0
    """Escapees the containment mode could see but not kill (0 where it reaches everything)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorReply:
    """Both ways: the answer to a frame that could not be decoded or was unexpected.

    Its wire tag is ``error``; the class is named so as not to read like an exception.
    """

    type: ClassVar[Literal["error"]] = "error"

    reason: str
    call_id: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Shutdown:
    """Supervisor -> worker: finish or stop the current call and exit within ``grace`` seconds."""

    type: ClassVar[Literal["shutdown"]] = "shutdown"

    grace: float


Message = (
    Hello
    | Welcome
    | Refused
    | Heartbeat
    | Run
    | Started
    | Output
    | Ack
    | Cancel
    | Signalled
    | Result
    | ErrorReply
    | Shutdown
)
"""Any wire message; ``match`` on the classes and end in ``assert_never``."""

MESSAGE_CLASSES: Final[tuple[type[Message], ...]] = (
    Hello,
    Welcome,
    Refused,
    Heartbeat,
    Run,
    Started,
    Output,
    Ack,
    Cancel,
    Signalled,
    Result,
    ErrorReply,
    Shutdown,
)
