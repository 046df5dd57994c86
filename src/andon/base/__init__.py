"""The bottom layer: errors, cancel causes, abort signals, the clock, ids and the grace value.

Imports nothing else of andon.
"""

from andon.base._abort import AbortController, AbortSignal, CallbackHandle, LinkedSignal, any_signal
from andon.base._causes import Cause, Disposed, Hook, Parent, Timeout, User, cause_from_dict
from andon.base._clock import Clock, ManualClock, SystemClock, Timer
from andon.base._codes import MODEL_ERROR_CODES, ErrorCode
from andon.base._errors import (
    Aborted,
    AgentClosed,
    AndonError,
    ConfigError,
    LogCorrupted,
    LogFormatUnsupported,
    LogWriteFailed,
    MalformedFrame,
    MessageTooLarge,
    ModelError,
    ProtocolError,
    ScriptInvalid,
    SessionError,
    SessionLive,
    UnknownMessage,
    VersionMismatch,
    WorkerError,
    WorkerLost,
)
from andon.base._grace import GracePolicy
from andon.base._ids import (
    call_id,
    call_tag,
    executor_id,
    is_call_id,
    is_message_id,
    message_id,
    parse_call_id,
    session_id,
)

__all__ = [
    "MODEL_ERROR_CODES",
    "AbortController",
    "AbortSignal",
    "Aborted",
    "AgentClosed",
    "AndonError",
    "CallbackHandle",
    "Cause",
    "Clock",
    "ConfigError",
    "Disposed",
    "ErrorCode",
    "GracePolicy",
    "Hook",
    "LinkedSignal",
    "LogCorrupted",
    "LogFormatUnsupported",
    "LogWriteFailed",
    "MalformedFrame",
    "ManualClock",
    "MessageTooLarge",
    "ModelError",
    "Parent",
    "ProtocolError",
    "ScriptInvalid",
    "SessionError",
    "SessionLive",
    "SystemClock",
    "Timeout",
    "Timer",
    "UnknownMessage",
    "User",
    "VersionMismatch",
    "WorkerError",
    "WorkerLost",
    "any_signal",
    "call_id",
    "call_tag",
    "cause_from_dict",
    "executor_id",
    "is_call_id",
    "is_message_id",
    "message_id",
    "parse_call_id",
    "session_id",
]
