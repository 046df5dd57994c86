"""The session log: records, the durable writer, the reader, invariants, crash repair and folds,
and the live events that ``Agent.events()`` yields between the records (never written to the log).

A session is one folder; its log, ``events.jsonl``, is append-only and tells the truth: every turn
that starts ends with exactly one ``turn/end`` saying how, every tool call has exactly one result in
its step, and a crash never corrupts it (the next :func:`load` repairs it by appending closers).
The exact JSON of every record is in docs/log-format.md, Records.

Reading::

    records = andon.session.read(folder)        # list[Record]; no lock, no repair
    for record in andon.session.iter_records(folder): ...   # streaming
    loaded = andon.session.load(folder)         # cold load: lock, repair if needed, unlock
    andon.session.check(loaded.events)          # [] when every invariant holds
    andon.session.history(loaded.events)        # the OpenAI-style messages the model sees

Writing::

    log = andon.session.SessionLog.open(folder)  # takes the lock (SessionLive if held)
    log.append(TurnStart(1)); await log.barrier(); log.close()

Imports only ``andon.base`` and ``andon.procs`` (which finds a crashed call's leftover processes).
"""

from andon.session._check import InvariantViolation, check
from andon.session._create import is_temporary
from andon.session._events import InstructionFile, ProjectInstructions
from andon.session._folds import (
    ConsumedWork,
    SessionState,
    fold_consumed_work,
    fold_state,
    history,
    history_entries,
)
from andon.session._index import INDEX_MIN_BYTES, INDEX_NAME, LogSummary, summarize
from andon.session._leftovers import Leftover
from andon.session._live import (
    AgentError,
    AgentEvent,
    AgentStatus,
    AssistantDelta,
    LiveEvent,
    Status,
    SubagentEvent,
    ToolOutput,
    event_from_dict,
)
from andon.session._lock import LockHolder, live_holder, read_lock_holder
from andon.session._reader import Records, RecordStream, TornTail, iter_records, read
from andon.session._records import (
    FORMAT_VERSION,
    RECORD_TYPES,
    AssistantChunk,
    AssistantMessage,
    ContextCompacted,
    ContextTrimmed,
    EventData,
    InboxSpliced,
    LlmRequest,
    LlmRetry,
    McpServerEvent,
    Record,
    SessionRepaired,
    SessionResumed,
    SessionStart,
    StepEnd,
    StepStart,
    ToolCall,
    ToolResult,
    ToolSignal,
    ToolStarted,
    TurnEnd,
    TurnStart,
    Unrecognized,
    UserMessageEntered,
    encode_line,
)
from andon.session._repair import (
    REPAIR_TEXTS,
    LoadedSession,
    RepairReport,
    kill_in_flight,
    load,
    repair,
)
from andon.session._tail import ClosingTexts
from andon.session._trace import Span, SpanEvent, Trace, trace_of
from andon.session._transcript import render_transcript
from andon.session._values import (
    AssistantReply,
    Block,
    Blocked,
    Completed,
    ExitStatus,
    Interrupted,
    LogValue,
    MaxTokens,
    ModelInfo,
    ReasoningBlock,
    TextBlock,
    ToolCallBlock,
    ToolErrorInfo,
    TurnAborted,
    TurnEndReason,
    TurnFailed,
    UserMessage,
    reason_from_json,
)
from andon.session._writer import Durability, FsyncFn, SessionLog, WriteFn

__all__ = [
    "FORMAT_VERSION",
    "INDEX_MIN_BYTES",
    "INDEX_NAME",
    "RECORD_TYPES",
    "REPAIR_TEXTS",
    "AgentError",
    "AgentEvent",
    "AgentStatus",
    "AssistantChunk",
    "AssistantDelta",
    "AssistantMessage",
    "AssistantReply",
    "Block",
    "Blocked",
    "ClosingTexts",
    "Completed",
    "ConsumedWork",
    "ContextCompacted",
    "ContextTrimmed",
    "Durability",
    "EventData",
    "ExitStatus",
    "FsyncFn",
    "InboxSpliced",
    "InstructionFile",
    "Interrupted",
    "InvariantViolation",
    "Leftover",
    "LiveEvent",
    "LlmRequest",
    "LlmRetry",
    "LoadedSession",
    "LockHolder",
    "LogSummary",
    "LogValue",
    "MaxTokens",
    "McpServerEvent",
    "ModelInfo",
    "ProjectInstructions",
    "ReasoningBlock",
    "Record",
    "RecordStream",
    "Records",
    "RepairReport",
    "SessionLog",
    "SessionRepaired",
    "SessionResumed",
    "SessionStart",
    "SessionState",
    "Span",
    "SpanEvent",
    "Status",
    "StepEnd",
    "StepStart",
    "SubagentEvent",
    "TextBlock",
    "ToolCall",
    "ToolCallBlock",
    "ToolErrorInfo",
    "ToolOutput",
    "ToolResult",
    "ToolSignal",
    "ToolStarted",
    "TornTail",
    "Trace",
    "TurnAborted",
    "TurnEnd",
    "TurnEndReason",
    "TurnFailed",
    "TurnStart",
    "Unrecognized",
    "UserMessage",
    "UserMessageEntered",
    "WriteFn",
    "check",
    "encode_line",
    "event_from_dict",
    "fold_consumed_work",
    "fold_state",
    "history",
    "history_entries",
    "is_temporary",
    "iter_records",
    "kill_in_flight",
    "live_holder",
    "load",
    "read",
    "read_lock_holder",
    "reason_from_json",
    "render_transcript",
    "repair",
    "summarize",
    "trace_of",
]
