"""The context window: what a request may hold, and compaction when it would hold more
(docs/agent-loop.md, Compaction).

Before every model request of a turn (at the step boundary, under the turn's own signal), and as
a maintenance job between turns, :meth:`ContextKeeper.fit` compares the request's estimated prompt
tokens with the window's budget. Over it, two tiers, each a record of its own so that
:func:`~andon.session.history` rebuilds exactly what the model was sent, on resume too:

1. ``context/trimmed``, no model call: tool results older than the last few steps, and longer
   than a stub, are shown as a one-line stub naming the file that holds the full output.
2. ``context/compacted``, when that is not enough: a model call summarises the history before a
   cut at a ``step/start``; the session's first user message and every step from the cut on are
   kept as they are. The record is written only once the summary is complete: a cancel or a
   crash during the call leaves no record and the history as it was.

A cut is only ever at a ``step/start``: a step holds a reply and every result it asked for, so
no call is separated from its result, and the DeepSeek V4 reasoning rule (docs/models.md, What
is sent) holds for a compacted history as for any other, because the request builder derives
what reasoning to send back from the messages it is given.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Protocol

from andon.base import AbortSignal, ErrorCode, ModelError, clean_text
from andon.llm import (
    SUMMARY_MARKER,
    Finish,
    Model,
    ModelRequest,
    TextDelta,
    Usage,
    is_empty_stream,
    overflow_figures,
)
from andon.session import (
    AssistantMessage,
    ContextCompacted,
    ContextTrimmed,
    EventData,
    Record,
    StepStart,
    UserMessageEntered,
    history_entries,
)

__all__ = [
    "ContextKeeper",
    "Estimator",
    "budget_for",
]

KEEP_STEPS: Final = 1
"""Steps before the current one whose tool results the first tier never stubs: the newest
results are what the model is working from."""
STUB_MIN_CHARS: Final = 1024
"""A result this short is kept: its stub would save next to nothing."""
TRIM_TARGET: Final = 0.6
"""The first tier stubs old results until the request is at most this share of the budget."""
SUMMARY_AT: Final = 0.8
"""A summary is made when, stubs and all, the request is still over this share of the budget."""
KEEP_SHARE: Final = 0.35
"""At most this share of the budget is kept verbatim after a summary (the rest is the summary and
room to grow), so that the next compaction is many steps away."""
RECALLED_REPLIES: Final = 3
"""How many of a resumed session's last replies calibrate its estimate."""
_ENTRY_CAPS: Final = (4000, 2000, 1000, 500, 250)
"""Characters of each message a summary request shows, tried in turn until the request fits."""

SUMMARY_SYSTEM: Final = (
    "You compact the history of an AI agent's working session so that the agent can go on "
    "within its model's context window. You are given the conversation between the user's first "
    "message and now. Write a summary the agent can continue from: the user's goal and every "
    "instruction still in force; what was done, with the files, commands and results that "
    "matter (exact paths, names and error messages); decisions taken and why; anything that was "
    "stopped, failed or is unknown; and what remains to be done. Be concise and factual; write "
    "the summary only, with no preamble."
)


class Estimator(Protocol):
    """Prompt tokens of a request, without a tokenizer (``andon.llm.TokenEstimator``)."""

    @property
    def bytes_per_token(self) -> float: ...

    def estimate(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] = ()
    ) -> int: ...

    def observe(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        prompt_tokens: int,
    ) -> None: ...

    def force_at_least(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]],
        tokens: int,
    ) -> None: ...


def budget_for(window: int) -> int:
    """The prompt tokens a request may hold in a ``window``-token context: room is left for the
    reply (an eighth of the window, 256 to 8,192 tokens) and 5 % for the estimate's error."""
    reserve = min(max(window // 8, 256), 8192)
    return max(1, int((window - reserve) * 0.95))


@dataclasses.dataclass(frozen=True, slots=True)
class _Where:
    """Where compaction happens: inside a step (its turn and step) or between turns (neither)."""

    turn: int | None = None
    step: int | None = None


class ContextKeeper:
    """Keeps one agent's requests within its model's context window.

    ``records`` gives the agent's model-visible records as they stand (the agent's list, which
    grows as records are written); ``system`` the system prompt in force; ``write`` appends a
    record; ``on_usage`` counts the summary call's tokens in the session's totals.
    """

    def __init__(
        self,
        *,
        window: int | None,
        estimator: Estimator,
        model: Model,
        records: Callable[[], Sequence[Record]],
        system: Callable[[], str],
        write: Callable[[EventData], Record],
        on_usage: Callable[[dict[str, Any] | None], None],
        from_cut: bool = False,
    ) -> None:
        self.window = window
        # The records start at the last compaction's cut (a resumed session reads no more): the
        # request of a reply logged before that compaction cannot be rebuilt from them.
        self._from_cut = from_cut
        self.estimator = estimator
        self._model = model
        self._records = records
        self._system = system
        self._write = write
        self._on_usage = on_usage
        self._recalled = False
        self._folded: tuple[tuple[int, int, str], list[dict[str, Any]]] | None = None

    def _recall(self, tools: Sequence[Mapping[str, Any]]) -> None:
        """Calibrate the estimate from the session's own past (a resumed session's estimator
        starts blank, and an uncalibrated estimate errs high: it would compact at once what a
        moment ago fitted): what the last few replies said their requests cost."""
        self._recalled = True
        records = self._records()
        system = {"role": "system", "content": self._system()}
        found = 0
        exact_after = -1
        if self._from_cut:
            exact_after = next((r.seq for r in records if isinstance(r.data, ContextCompacted)), -1)
        for index in range(len(records) - 1, -1, -1):
            if records[index].seq < exact_after:
                break
            data = records[index].data
            if not isinstance(data, AssistantMessage) or not data.usage:
                continue
            tokens = data.usage.get("prompt_tokens")
            if not isinstance(tokens, int) or tokens <= 0:
                continue
            sent = [system, *(m for _, m in history_entries(records[:index]))]
            self.estimator.observe(sent, tools, tokens)
            found += 1
            if found == RECALLED_REPLIES:
                break

    # -- what the turn asks ----------------------------------------------------------------

    def messages(self) -> list[dict[str, Any]]:
        """The request's messages as they stand: the system prompt, then the history. The log
        only grows, so the fold is redone only when a record was added since the last call (a
        step asks twice: to decide on compaction, then to build the request)."""
        records = self._records()
        key = (len(records), records[-1].seq if records else -1, self._system())
        if self._folded is None or self._folded[0] != key:
            history = [m for _, m in history_entries(records)]
            self._folded = (key, [{"role": "system", "content": key[2]}, *history])
        return list(self._folded[1])

    def observe(self, request: ModelRequest, usage: Mapping[str, Any] | None) -> None:
        """Calibrate the estimate from what the provider said a request cost."""
        tokens = usage.get("prompt_tokens") if usage else None
        if isinstance(tokens, int) and tokens > 0:
            self.estimator.observe(request.messages, request.tools, tokens)

    def is_overflow(self, error: ModelError, request: ModelRequest) -> bool:
        """Whether ``error`` (nothing of the reply streamed) says the request was too long.

        ``CONTEXT_OVERFLOW`` says so. A stream that ended before its first event says so too
        when the request was large for the window: llama.cpp's server, streaming, answers a
        request over its window with a 200 and an empty event stream.
        """
        if error.code is ErrorCode.CONTEXT_OVERFLOW:
            return True
        if not is_empty_stream(error) or self.window is None:
            return False
        return self.estimator.estimate(request.messages, request.tools) > self.window // 2

    def as_overflow(self, error: ModelError, request: ModelRequest) -> ModelError:
        """``error`` (one :meth:`is_overflow` accepts) as the ``CONTEXT_OVERFLOW`` it stands for:
        an empty stream is llama.cpp's way of saying so, and the log says what andon took it for."""
        if error.code is ErrorCode.CONTEXT_OVERFLOW:
            return error
        tokens = self.estimator.estimate(request.messages, request.tools)
        return ModelError(
            ErrorCode.CONTEXT_OVERFLOW,
            f"the server sent an empty stream for a request of about {tokens} tokens, over half "
            f"the {self.window}-token context window: taken as too long for the window",
            status=error.status,
            limit=self.window,
        )

    def too_long(self, request: ModelRequest, cause: ModelError | None = None) -> ModelError:
        """The turn's error when a request does not fit and nothing is left to compact."""
        tokens = self.estimator.estimate(request.messages, request.tools)
        window = f"{self.window}-token" if self.window is not None else "the model's"
        detail = f" (the server said: {cause.message})" if cause is not None else ""
        return ModelError(
            ErrorCode.CONTEXT_OVERFLOW,
            f"the request is about {tokens} tokens, too long for the {window} context window, "
            "and nothing earlier in the session is left to compact: shorten the prompt or the "
            f"instructions, or use a model with a larger window{detail}",
            status=cause.status if cause is not None else None,
        )

    async def fit(
        self,
        signal: AbortSignal,
        tools: Sequence[Mapping[str, Any]],
        *,
        turn: int | None = None,
        step: int | None = None,
        overflow: ModelError | None = None,
        force: bool = False,
    ) -> bool:
        """Compact until the next request fits the budget (or nothing is left to compact);
        ``overflow`` is the error of a request the server refused as too long: compaction is then
        forced whatever the estimate says, as it is with ``force``. Returns whether anything
        changed."""
        if not self._recalled:
            self._recall(tools)
        where = _Where(turn, step)
        forced = force or overflow is not None
        if overflow is not None:
            self._learn(overflow, tools)
        window = self.window
        if window is None:
            return False
        budget = budget_for(window)
        before = self.estimator.estimate(self.messages(), tools)
        if not forced and before <= budget:
            return False
        changed = self._trim(tools, where, before, window)
        signal.throw_if_aborted()
        after = self.estimator.estimate(self.messages(), tools)
        # Stubs pile up too: once they leave little room, a summary makes room again.
        if not forced and after <= budget * SUMMARY_AT:
            return changed
        # Still over, or refused by the server whatever the estimate says: a summary.
        return await self._summarise(signal, tools, where, after, window) or changed

    def _learn(self, error: ModelError, tools: Sequence[Mapping[str, Any]]) -> None:
        """What a refusal teaches: the window it names, and that the request was larger than the
        estimate said."""
        limit, requested = overflow_figures(error)
        if limit is not None and (self.window is None or limit < self.window):
            self.window = limit
        messages = self.messages()
        estimate = self.estimator.estimate(messages, tools)
        if requested is not None and requested > estimate:
            self.estimator.force_at_least(messages, tools, requested)
        if self.window is None:
            # Refused, with no figure: the window is below this request; assume well below.
            self.window = max(1, estimate * 3 // 4)

    # -- tier 1 ----------------------------------------------------------------------------

    def _trim(
        self, tools: Sequence[Mapping[str, Any]], where: _Where, before: int, window: int
    ) -> bool:
        """Stub old tool results, oldest first, until the request is well under the budget (so
        that the next trim is some steps away and the prefix a provider caches stays put); the
        results of the last :data:`KEEP_STEPS` steps are never stubbed."""
        records = self._records()
        protect_from = _recent_steps_start(records, KEEP_STEPS + (1 if where.step else 0))
        old = [
            (m["tool_call_id"], len(m.get("content") or ""))
            for seq, m in history_entries(records)
            if m.get("role") == "tool"
            and seq < protect_from
            and len(m.get("content") or "") > STUB_MIN_CHARS
        ]
        if not old:
            return False
        # Roughly how many to stub (a stub is a short line; characters stand in for bytes here),
        # then the exact estimate of the history as it will read.
        goal = before - int(budget_for(window) * TRIM_TARGET)
        per_token = max(1.0, self.estimator.bytes_per_token)
        saved, count = 0.0, 0
        for _, size in old:
            if saved >= goal:
                break
            saved += max(0, size - 200) / per_token
            count += 1
        calls = tuple(call_id for call_id, _ in old[: max(1, count)])
        record = ContextTrimmed(calls, before, before, window, where.turn, where.step)
        system = {"role": "system", "content": self._system()}
        probe = Record(records[-1].seq + 1, 0.0, record)
        after = self.estimator.estimate(
            [system, *(m for _, m in history_entries([*records, probe]))], tools
        )
        self._write(dataclasses.replace(record, tokens_after=min(after, before)))
        return True

    # -- tier 2 ----------------------------------------------------------------------------

    async def _summarise(
        self,
        signal: AbortSignal,
        tools: Sequence[Mapping[str, Any]],
        where: _Where,
        before: int,
        window: int,
    ) -> bool:
        records = self._records()
        entries = history_entries(records)
        first_user = next((r.seq for r in records if isinstance(r.data, UserMessageEntered)), None)
        if first_user is None:
            return False
        last_cut = max((r.seq for r in records if isinstance(r.data, ContextCompacted)), default=-1)
        # The newest steps are always kept: between turns the last one; inside a step the
        # current one (its user messages are in) and the one before it, whose results the model
        # has not seen yet (a summary of them would be all it ever saw of them).
        latest = _recent_steps_start(records, KEEP_STEPS + (1 if where.step else 0))
        candidates = [
            r.seq
            for r in records
            if isinstance(r.data, StepStart)
            and max(first_user, last_cut) < r.seq
            and (latest < 0 or r.seq <= latest)
        ]
        if latest < 0 or not candidates:
            return False
        system = {"role": "system", "content": self._system()}
        keep_budget = int(budget_for(window) * KEEP_SHARE)
        cut = candidates[-1]
        for s in candidates:  # the earliest cut whose kept part fits keeps the most
            kept = [m for seq, m in entries if seq >= s]
            if self.estimator.estimate([system, *kept], tools) <= keep_budget:
                cut = s
                break
        replaced = [(seq, m) for seq, m in entries if seq < cut and seq != first_user]
        if not replaced:
            return False
        first = next((m for seq, m in entries if seq == first_user), None)
        summary, usage = await self._summary_call(signal, first, [m for _, m in replaced], window)
        signal.throw_if_aborted()
        kept_messages = [m for seq, m in entries if seq >= cut and seq != first_user]
        after = self.estimator.estimate(
            [
                system,
                *([first] if first else []),
                {"role": "user", "content": summary},
                *kept_messages,
            ],
            tools,
        )
        self._write(
            ContextCompacted(
                cut,
                summary,
                len(replaced),
                before,
                after,
                window,
                self._model.info.name,
                usage,
                where.turn,
                where.step,
            )
        )
        self._on_usage(dict(usage) if usage else None)
        return True

    async def _summary_call(
        self,
        signal: AbortSignal,
        first: Mapping[str, Any] | None,
        messages: Sequence[Mapping[str, Any]],
        window: int,
    ) -> tuple[str, Mapping[str, Any] | None]:
        """The summary of ``messages``: one model call, no tools, under ``signal``."""
        max_tokens = min(2048, max(128, window // 8))
        room = budget_for(window) - max_tokens // 2
        request = None
        for cap in _ENTRY_CAPS:
            request = _summary_request(first, messages, cap, max_tokens)
            if self.estimator.estimate(request.messages, ()) <= room:
                break
        assert request is not None
        # Still too long at the smallest cap: the oldest messages go first (the newest matter
        # most to going on), a bounded number of halvings.
        kept = list(messages)
        while self.estimator.estimate(request.messages, ()) > room and len(kept) > 1:
            kept = kept[len(kept) // 2 :]
            request = _summary_request(first, kept, _ENTRY_CAPS[-1], max_tokens)

        async def on_attempt(n: int, error: ModelError | None, delay: float | None) -> None:
            signal.throw_if_aborted()

        text: list[str] = []
        usage: Mapping[str, Any] | None = None
        async for chunk in self._model.stream(request, signal, on_attempt):
            signal.throw_if_aborted()
            match chunk:
                case TextDelta(text=piece):
                    text.append(piece)
                case Usage():
                    usage = chunk.to_dict()
                case Finish():
                    pass
                case _:
                    pass  # reasoning and (unasked-for) tool calls are not the summary
        summary = clean_text("".join(text)).strip()
        if not summary:
            raise ModelError(
                ErrorCode.MALFORMED_STREAM, "the model's compaction summary came back empty"
            )
        return summary, usage


def _recent_steps_start(records: Sequence[Record], steps: int) -> int:
    """The seq of the ``step/start`` of the ``steps``-th last step: everything from it on is
    recent. -1 when there are no more steps than that (all of them are recent)."""
    starts = [r.seq for r in records if isinstance(r.data, StepStart)]
    return starts[-steps] if len(starts) > steps else -1


def _summary_request(
    first: Mapping[str, Any] | None,
    messages: Sequence[Mapping[str, Any]],
    cap: int,
    max_tokens: int,
) -> ModelRequest:
    lines = [SUMMARY_MARKER, "Summarise this conversation of an AI agent's session."]
    if first is not None:
        lines += ["", "The user's first message (kept as it is; summarise what follows it):"]
        lines.append(_cut(str(first.get("content") or ""), cap))
    lines += ["", "<conversation>"]
    for m in messages:
        lines.append(_render(m, cap))
    lines.append("</conversation>")
    return ModelRequest(
        messages=(
            {"role": "system", "content": SUMMARY_SYSTEM},
            {"role": "user", "content": "\n".join(lines)},
        ),
        max_tokens=max_tokens,
    )


def _render(message: Mapping[str, Any], cap: int) -> str:
    role = message.get("role")
    content = str(message.get("content") or "")
    if role == "tool":
        return f"TOOL RESULT {message.get('tool_call_id')}: {_cut(content, cap)}"
    if role == "assistant":
        parts = [f"ASSISTANT: {_cut(content, cap)}"] if content else []
        for call in message.get("tool_calls") or ():
            function = call.get("function", {})
            arguments = _cut(str(function.get("arguments", "")), cap)
            parts.append(f"ASSISTANT CALLED {function.get('name')} ({call.get('id')}): {arguments}")
        return "\n".join(parts) or "ASSISTANT: (no text)"
    return f"USER: {_cut(content, cap)}"


def _cut(text: str, cap: int) -> str:
    """``text`` within ``cap`` characters: its head and its tail (a build's error is at its end)."""
    if len(text) <= cap:
        return text
    half = cap // 2
    return f"{text[:half]}\n[… {len(text) - 2 * half} characters left out …]\n{text[-half:]}"
