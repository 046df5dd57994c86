"""The records of compaction (docs/log-format.md, Compaction): what the model is shown of the
history changes, and the log says so, so that :func:`~andon.session.history` rebuilds exactly what
the model saw, on resume too.

Both are written whole, once the change is decided (and, for a summary, once the summary call has
returned): a cancel or a crash before that leaves no record, and the history is as it was. Inside
a turn they carry the open ``turn`` and ``step`` and come after the step's user messages, before
its ``llm/request``; written between turns (compaction as a maintenance job) they carry neither.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, final

from andon.session._values import COUNT, OMIT, RecordData

__all__ = ["ContextCompacted", "ContextTrimmed"]


@final
@dataclass(frozen=True, slots=True)
class ContextTrimmed(RecordData, record_type="context/trimmed"):
    """``context/trimmed``: the results of ``calls`` are shown to the model, from here on, as a
    one-line stub naming where the full output is (the first, cheap tier: no model call)."""

    calls: tuple[str, ...]
    tokens_before: Annotated[int, COUNT]
    """The estimated prompt tokens of the next request before the change, and after it."""
    tokens_after: Annotated[int, COUNT]
    window: Annotated[int, COUNT]
    """The context window the decision was made for."""
    turn: Annotated[int | None, OMIT] = None
    step: Annotated[int | None, OMIT] = None
    json_keys: ClassVar = ("turn", "step", "calls", "tokens_before", "tokens_after", "window")


@final
@dataclass(frozen=True, slots=True)
class ContextCompacted(RecordData, record_type="context/compacted"):
    """``context/compacted``: the model-visible history before record ``kept_from`` (a
    ``step/start``), but for the session's first user message, is replaced by ``summary`` (the
    second tier: a model call, ``model``, whose ``usage`` is counted in the session's totals).
    ``replaced`` is how many messages the summary stands for."""

    kept_from: Annotated[int, COUNT]
    summary: str
    replaced: Annotated[int, COUNT]
    tokens_before: Annotated[int, COUNT]
    tokens_after: Annotated[int, COUNT]
    window: Annotated[int, COUNT]
    model: str
    usage: Annotated[Mapping[str, Any] | None, OMIT] = None
    turn: Annotated[int | None, OMIT] = None
    step: Annotated[int | None, OMIT] = None
    json_keys: ClassVar = (
        "turn",
        "step",
        "kept_from",
        "replaced",
        "tokens_before",
        "tokens_after",
        "window",
        "model",
        "usage",
        "summary",
    )
