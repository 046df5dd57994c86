"""Error codes (docs/log-format.md, Error codes): a closed set the log and the tools depend on."""

from __future__ import annotations

from enum import StrEnum

__all__ = ["MODEL_ERROR_CODES", "ErrorCode"]


class ErrorCode(StrEnum):
    # tool results
    ABORTED_BEFORE_DISPATCH = "ABORTED_BEFORE_DISPATCH"
    ABORTED = "ABORTED"
    TOOL_TIMEOUT = "TOOL_TIMEOUT"
    WORKER_LOST = "WORKER_LOST"
    INVALID_ARGUMENTS = "INVALID_ARGUMENTS"
    UNKNOWN_TOOL = "UNKNOWN_TOOL"
    DENIED = "DENIED"
    TOOL_ERROR = "TOOL_ERROR"
    INTERNAL = "INTERNAL"
    # crash repair
    TOOL_OUTCOME_UNKNOWN = "TOOL_OUTCOME_UNKNOWN"
    TOOL_NOT_STARTED = "TOOL_NOT_STARTED"
    # model
    AUTH = "AUTH"
    INSUFFICIENT_BALANCE = "INSUFFICIENT_BALANCE"
    BAD_REQUEST = "BAD_REQUEST"
    CONTEXT_OVERFLOW = "CONTEXT_OVERFLOW"
    RATE_LIMITED = "RATE_LIMITED"
    SERVER = "SERVER"
    OVERLOADED = "OVERLOADED"
    CONNECTION = "CONNECTION"
    TIMEOUT = "TIMEOUT"
    STREAM_TRUNCATED = "STREAM_TRUNCATED"
    MALFORMED_STREAM = "MALFORMED_STREAM"
    CONTENT_FILTER = "CONTENT_FILTER"
    SCRIPT_EXHAUSTED = "SCRIPT_EXHAUSTED"
    # log
    LOG_WRITE_FAILED = "LOG_WRITE_FAILED"


MODEL_ERROR_CODES = frozenset(
    {
        ErrorCode.AUTH,
        ErrorCode.INSUFFICIENT_BALANCE,
        ErrorCode.BAD_REQUEST,
        ErrorCode.CONTEXT_OVERFLOW,
        ErrorCode.RATE_LIMITED,
        ErrorCode.SERVER,
        ErrorCode.OVERLOADED,
        ErrorCode.CONNECTION,
        ErrorCode.TIMEOUT,
        ErrorCode.STREAM_TRUNCATED,
        ErrorCode.MALFORMED_STREAM,
        ErrorCode.CONTENT_FILTER,
        ErrorCode.SCRIPT_EXHAUSTED,
    }
)
