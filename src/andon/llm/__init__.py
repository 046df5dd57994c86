"""Model adapters: the :class:`Model` protocol, typed stream chunks, the retry policy (and the
:data:`RetryDecider` seam that replaces it), the scripted model and its script format, the
streaming HTTP adapter for DeepSeek and OpenAI-compatible servers, and model specs.

Imports only ``andon.base`` (docs/architecture.md, Layers).

The HTTP stack (httpx, httpx-sse, ssl: a fifth of the command's import time) is imported with the
first HTTP adapter or discovery, not with this package: a run on a scripted model never needs it.
:class:`OpenAICompatible` and :func:`discover_context_window` are therefore looked up on first use
(the module ``__getattr__`` below).
"""

import typing as _typing

from andon.llm._estimate import TokenEstimator
from andon.llm._overflow import is_empty_stream, overflow_figures
from andon.llm._request import build_request_body, reasoning_needed
from andon.llm._retry import (
    RETRYABLE_CODES,
    RandomSource,
    RetryPolicy,
    abortable_sleep,
    code_for_status,
    parse_retry_after,
)
from andon.llm._script import ScriptFailure, ScriptParser, ScriptReply, ScriptToolCall
from andon.llm._scripted import Scripted
from andon.llm._specs import (
    API_KEY_ENV_VARS,
    DEEPSEEK_MODELS,
    SPEC_FORMS,
    api_key_env_for,
    from_spec,
)
from andon.llm._types import (
    SUMMARY_MARKER,
    Chunk,
    Finish,
    FinishReason,
    Model,
    ModelIdentity,
    ModelRequest,
    OnAttempt,
    ReasoningDelta,
    ResponseSchema,
    RetryDecider,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from andon.llm._windows import known_context_window

if _typing.TYPE_CHECKING:
    from andon.llm._openai import OpenAICompatible
    from andon.llm._windows import discover_context_window

__all__ = [
    "API_KEY_ENV_VARS",
    "DEEPSEEK_MODELS",
    "RETRYABLE_CODES",
    "SPEC_FORMS",
    "SUMMARY_MARKER",
    "Chunk",
    "Finish",
    "FinishReason",
    "Model",
    "ModelIdentity",
    "ModelRequest",
    "OnAttempt",
    "OpenAICompatible",
    "RandomSource",
    "ReasoningDelta",
    "ResponseSchema",
    "RetryDecider",
    "RetryPolicy",
    "ScriptFailure",
    "ScriptParser",
    "ScriptReply",
    "ScriptToolCall",
    "Scripted",
    "TextDelta",
    "TokenEstimator",
    "ToolCallDelta",
    "Usage",
    "abortable_sleep",
    "api_key_env_for",
    "build_request_body",
    "code_for_status",
    "discover_context_window",
    "from_spec",
    "is_empty_stream",
    "known_context_window",
    "overflow_figures",
    "parse_retry_after",
    "reasoning_needed",
]


def __getattr__(name: str) -> _typing.Any:
    if name == "OpenAICompatible":
        from andon.llm._openai import OpenAICompatible

        return OpenAICompatible
    if name == "discover_context_window":
        from andon.llm._windows import discover_context_window

        return discover_context_window
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
