"""Model adapters: the :class:`Model` protocol, typed stream chunks, the retry policy and the
scripted model.

Imports only ``andon.base`` (architecture.md, Layering).
"""

from andon.llm._retry import (
    RETRYABLE_CODES,
    RandomSource,
    RetryPolicy,
    abortable_sleep,
    code_for_status,
    parse_retry_after,
)
from andon.llm._scripted import Scripted
from andon.llm._types import (
    Chunk,
    Finish,
    FinishReason,
    Model,
    ModelInfo,
    ModelRequest,
    OnAttempt,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
)

__all__ = [
    "RETRYABLE_CODES",
    "Chunk",
    "Finish",
    "FinishReason",
    "Model",
    "ModelInfo",
    "ModelRequest",
    "OnAttempt",
    "RandomSource",
    "ReasoningDelta",
    "RetryPolicy",
    "Scripted",
    "TextDelta",
    "ToolCallDelta",
    "Usage",
    "abortable_sleep",
    "code_for_status",
    "parse_retry_after",
]
