"""What a model adapter speaks: typed stream chunks, the request, the model's identity and the
:class:`Model` protocol that every adapter (HTTP or scripted) implements.

A stream is a sequence of chunks of one reply, in the order the model produced them::

    ReasoningDelta* TextDelta* ToolCallDelta* Usage? Finish

(a real provider may interleave the deltas; consumers must not rely on that order). A stream that
ends without :class:`Finish` has been aborted or failed: it raises instead of ending quietly.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Literal, Protocol, TypeAlias, final, runtime_checkable

from andon.base import AbortSignal, FinishReason, ModelError

__all__ = [
    "SUMMARY_MARKER",
    "Chunk",
    "Finish",
    "FinishReason",
    "Model",
    "ModelIdentity",
    "ModelRequest",
    "OnAttempt",
    "ReasoningDelta",
    "ResponseSchema",
    "RetryDecider",
    "TextDelta",
    "ToolCallDelta",
    "Usage",
]

"""Why a reply ended normally. Provider finishes that are failures (``content_filter`` ...) are
raised as :class:`~andon.base.ModelError`, never delivered as a :class:`Finish`."""


@final
@dataclass(frozen=True, slots=True)
class TextDelta:
    """A fragment of the visible answer."""

    text: str
    type: ClassVar[Literal["text"]] = "text"

    def to_dict(self) -> dict[str, Any]:
        """The delta as an ``assistant/chunk`` record carries it."""
        return {"type": self.type, "text": self.text}


@final
@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """A fragment of the model's reasoning (DeepSeek ``reasoning_content``)."""

    text: str
    type: ClassVar[Literal["reasoning"]] = "reasoning"

    def to_dict(self) -> dict[str, Any]:
        """The delta as an ``assistant/chunk`` record carries it."""
        return {"type": self.type, "text": self.text}


@final
@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A fragment of tool call number ``index`` (0-based, in model order).

    Fragments of one call share ``index``; ``arguments`` fragments concatenate to the call's
    argument string, which is passed on untouched (it may be invalid JSON; the executor judges).
    ``provider_id`` and ``name`` are usually present only on a call's first fragment.
    """

    index: int
    provider_id: str | None
    name: str | None
    arguments: str
    type: ClassVar[Literal["tool_call"]] = "tool_call"

    def to_dict(self) -> dict[str, Any]:
        """The delta as an ``assistant/chunk`` record carries it (absent fields omitted)."""
        out: dict[str, Any] = {"type": self.type, "index": self.index}
        if self.provider_id is not None:
            out["provider_id"] = self.provider_id
        if self.name is not None:
            out["name"] = self.name
        out["arguments"] = self.arguments
        return out


@final
@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts of the request, as the provider reported them.

    The optional counts are ``None`` where the provider does not report them (never guessed as
    0): ``cached_prompt_tokens`` and ``uncached_prompt_tokens`` split ``prompt_tokens`` into the
    part served from the provider's prompt cache and the rest (DeepSeek bills them at different
    prices); ``reasoning_tokens`` is the part of ``completion_tokens`` spent on reasoning.
    """

    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int | None = None
    uncached_prompt_tokens: int | None = None
    reasoning_tokens: int | None = None
    type: ClassVar[Literal["usage"]] = "usage"

    def to_dict(self) -> dict[str, int]:
        """The ``usage`` field of an ``assistant/message`` record: the two base counts always,
        each optional count only when it is known."""
        out = {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens}
        for name in ("cached_prompt_tokens", "uncached_prompt_tokens", "reasoning_tokens"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out


@final
@dataclass(frozen=True, slots=True)
class Finish:
    """The reply is complete; always the last chunk of a stream that completed."""

    reason: FinishReason
    type: ClassVar[Literal["finish"]] = "finish"


Chunk: TypeAlias = TextDelta | ReasoningDelta | ToolCallDelta | Usage | Finish
"""One item of a model stream."""


@final
@dataclass(frozen=True, slots=True)
class ResponseSchema:
    """The JSON Schema the model's final answer must match (``andon run --output-schema``).

    ``name`` is what OpenAI's ``json_schema`` response format calls it (``[A-Za-z0-9_-]``, at
    most 64 characters); ``schema`` is the schema itself. Which providers receive it, and how,
    is the request builder's business (docs/models.md, Structured output).
    """

    name: str
    schema: Mapping[str, Any]


@final
@dataclass(frozen=True, slots=True)
class ModelRequest:
    """One request to the model: the conversation and the tools it may call.

    ``messages`` are OpenAI chat messages (plain dicts, as ``andon.session.history`` returns them);
    ``tools`` are OpenAI tool schemas (``{"type": "function", "function": {...}}``). Lists are
    turned into tuples so the request cannot grow behind an adapter's back. ``response_schema``
    asks for a final answer in JSON matching a schema, where the provider has a parameter for it
    that does not stop tool calls (see :class:`ResponseSchema`); ``None``: no such parameter.
    """

    messages: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...] = ()
    max_tokens: int | None = None
    response_schema: ResponseSchema | None = None

    def __post_init__(self) -> None:
        # Frozen, so assignment goes through object.__setattr__; callers often hold lists.
        object.__setattr__(self, "messages", tuple(self.messages))
        object.__setattr__(self, "tools", tuple(self.tools))


SUMMARY_MARKER: Final = "[andon:compaction-summary-request]"
"""Opens the one user message of a compaction summary request (docs/agent-loop.md, Compaction):
a scripted or mock model can tell such a request apart from a step's
(``andon.testing.MockModelServer``'s ``summaries`` option answers it without using the script)."""


@final
@dataclass(frozen=True, slots=True)
class ModelIdentity:
    """Which model this is: the user's ``--model`` spec, the provider and the model name."""

    spec: str
    provider: str
    name: str

    def to_dict(self) -> dict[str, str]:
        """The ``model`` field of ``session/start`` and ``session/resumed``."""
        return {"spec": self.spec, "provider": self.provider, "name": self.name}


OnAttempt: TypeAlias = Callable[[int, ModelError | None, float | None], Awaitable[None]]
"""``on_attempt(n, error, delay)``, awaited by the adapter before attempt ``n`` goes out.

``error`` and ``delay`` belong to the failed attempt that caused this one and are ``None`` for
``n == 1``. The driver owns the log and writes ``llm/request`` (and ``llm/retry``) here, so the
record precedes the request."""

RetryDecider: TypeAlias = Callable[[ModelError, int], Awaitable[float | None]]
"""``decide_retry(error, attempt)``: the caller's retry decision, replacing the retry policy.

Awaited with the failure of attempt number ``attempt`` (1-based) when nothing of that attempt has
streamed yet (after data has streamed a failure is final and the decider is not asked). It returns
the seconds to wait before the next attempt, or ``None`` to give up, and the error is raised. The
decider owns the whole budget: ``max_retries`` and the retryable codes of the policy do not apply,
so it must stop by itself (it is told the attempt number). A delay that is not a finite number
``>= 0`` is raised as ``ModelError(INTERNAL)``. This is the seam of the ``OnRequestError`` hook
(docs/agent-loop.md, Hooks), defined here because the model layer cannot import the supervisor."""


@runtime_checkable
class Model(Protocol):
    """The seam between the agent loop and a model (docs/models.md).

    ``stream`` makes the request, retrying failures that the retry policy allows (or, when
    ``decide_retry`` is given, that it asks for: see :data:`RetryDecider`) while nothing has
    streamed yet, and yields the reply's chunks. It observes ``signal`` everywhere, including
    while the model sends nothing: when the signal fires the iterator raises
    :class:`~andon.base.Aborted` carrying the cause, at once. Failures raise
    :class:`~andon.base.ModelError`.
    """

    @property
    def info(self) -> ModelIdentity:
        """Identity of the model, logged in ``session/start``."""
        ...

    def stream(
        self,
        request: ModelRequest,
        signal: AbortSignal,
        on_attempt: OnAttempt,
        *,
        decide_retry: RetryDecider | None = None,
    ) -> AsyncIterator[Chunk]:
        """Stream one reply to ``request``; see the class docstring."""
        ...
