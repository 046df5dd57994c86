"""The scripted model (docs/models.md, Scripted replies): plays a list of replies without a network.

It drives the offline demo, the benchmarks and most tests, so it behaves like the HTTP adapter
wherever a caller can tell: replies stream in fragments, errors are typed and retried by the same
:class:`~andon.llm.RetryPolicy` (or by the caller's ``decide_retry``, exactly as the HTTP adapter
asks it), ``on_attempt`` is awaited before every attempt, and the abort signal is observed at every
point where the stream can wait — before each chunk, during the delay between chunks and during a
stall — so cancelling a scripted turn is as immediate as cancelling a real one.

Every reply is validated when the script is loaded (:class:`~andon.llm.ScriptParser`); nothing is
checked lazily, so a broken script fails before any turn starts, naming the reply index and the
field.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any, final

from andon.base import (
    Aborted,
    AbortSignal,
    Clock,
    ErrorCode,
    ModelError,
    ScriptInvalid,
    SystemClock,
)
from andon.llm._retry import RandomSource, RetryPolicy, abortable_sleep, retry_delay
from andon.llm._script import ScriptParser, ScriptReply
from andon.llm._types import (
    Chunk,
    Finish,
    ModelIdentity,
    ModelRequest,
    OnAttempt,
    RetryDecider,
)

__all__ = ["Scripted"]


@final
class Scripted:
    """A :class:`~andon.llm.Model` that plays ``replies`` in order, one per model request.

    Each reply is a plain dict (docs/models.md, Scripted replies): ``reasoning``, ``text``,
    ``tool_calls`` (``[{name, arguments, id?}]``; mapping arguments are sent as JSON, a string as
    is),
    ``chunk_size`` (characters per streamed fragment, default 16), ``chunk_delay`` (seconds
    between chunks on ``clock``, default 0), ``finish`` (``stop`` | ``tool_calls`` | ``length``;
    default ``tool_calls`` when there are tool calls, else ``stop``), ``usage`` (a provider's
    usage object: ``{prompt_tokens, completion_tokens}`` plus, optionally, DeepSeek's cache
    counts or OpenAI's details; see :meth:`ScriptParser.usage`), ``stall_after_chunks`` (stream
    that many content fragments, then nothing — no usage, no finish — until the request is
    aborted), or ``error`` (``{status?, code?, retry_after?, message?}``: the request fails
    instead of streaming). Strings are made valid text: a lone surrogate becomes U+FFFD.

    A failed attempt whose code is retryable is retried like the HTTP adapter does: after the
    retry policy's delay, the next reply answers the next attempt, at most ``max_retries`` times.
    A ``decide_retry`` passed to :meth:`stream` replaces the policy exactly as it does for the HTTP
    adapter (error replies stream nothing, so it is asked about every one). Running out of replies
    raises ``ModelError(SCRIPT_EXHAUSTED)``, which is never retried and never offered to a
    decider: it is no answer of a model but the end of the script, and another attempt could only
    run out again.

    Every reply is validated here; a bad one raises :class:`~andon.base.ScriptInvalid` naming
    its index and field. Each instance has its own cursor. ``source`` names the script in
    ``info.spec`` (``script:<source>``) and in error messages.
    """

    def __init__(
        self,
        replies: Sequence[Mapping[str, Any]],
        *,
        max_retries: int = 3,
        clock: Clock | None = None,
        rng: RandomSource | None = None,
        source: str = "inline",
    ) -> None:
        self._replies = ScriptParser(None if source == "inline" else source).replies(replies)
        self._policy = RetryPolicy(max_retries=max_retries)
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._rng = rng
        self._cursor = 0
        self._requests: list[ModelRequest] = []
        self._info = ModelIdentity(spec=f"script:{source}", provider="script", name="scripted")

    @classmethod
    def from_file(
        cls,
        path: str | os.PathLike[str],
        *,
        max_retries: int = 3,
        clock: Clock | None = None,
        rng: RandomSource | None = None,
    ) -> Scripted:
        """Load a script from YAML or JSON (``{"replies": [...]}`` or a bare list of replies).

        A ``.json`` file is parsed as JSON, anything else as YAML. An unreadable or unparsable
        file, or a malformed reply, raises :class:`~andon.base.ScriptInvalid` naming the file.
        """
        name = os.fspath(path)
        parser = ScriptParser(name)
        file = Path(name)
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ScriptInvalid(f"cannot read {name}: {exc}", index=None, field=None) from exc
        try:
            data = _parse(file, text)
        except ValueError as exc:  # json.JSONDecodeError and _YamlError are ValueErrors
            raise ScriptInvalid(
                f"cannot parse {_where(name, exc)}: {_problem(exc)}", index=None, field=None
            ) from None
        except RecursionError:  # nesting deeper than the parser's stack: a bad file, not a bug
            raise ScriptInvalid(
                f"cannot parse {name}: it nests too deeply", index=None, field=None
            ) from None
        if isinstance(data, Mapping):
            for key in data:
                if key != "replies":
                    parser.fail(None, str(key), "unknown top-level field; expected replies")
            if "replies" not in data:
                parser.fail(None, "replies", "missing")
            data = data["replies"]
        return cls(data, max_retries=max_retries, clock=clock, rng=rng, source=name)

    @property
    def info(self) -> ModelIdentity:
        """``ModelIdentity(spec="script:<source>", provider="script", name="scripted")``."""
        return self._info

    @property
    def consumed(self) -> int:
        """How many replies have been used (one per attempt, error replies included)."""
        return self._cursor

    @property
    def remaining(self) -> int:
        """How many replies are left."""
        return len(self._replies) - self._cursor

    @property
    def requests(self) -> tuple[ModelRequest, ...]:
        """Every request passed to :meth:`stream`, in order (for tests to inspect what the
        driver sent; the scripted replies themselves never depend on it)."""
        return tuple(self._requests)

    def __repr__(self) -> str:
        return f"<Scripted {self._info.spec} reply {self._cursor}/{len(self._replies)}>"

    def _take(self) -> ScriptReply:
        if self._cursor >= len(self._replies):
            raise ModelError(
                ErrorCode.SCRIPT_EXHAUSTED,
                f"no scripted reply left for this request ({self._info.spec}: all "
                f"{len(self._replies)} replies were used); add replies to the script",
            )
        reply = self._replies[self._cursor]
        self._cursor += 1
        return reply

    async def stream(
        self,
        request: ModelRequest,
        signal: AbortSignal,
        on_attempt: OnAttempt,
        *,
        decide_retry: RetryDecider | None = None,
    ) -> AsyncIterator[Chunk]:
        """Answer ``request`` with the next reply(ies); see the class docstring."""
        self._requests.append(request)
        attempt = 1
        cause: ModelError | None = None
        delay: float | None = None
        while True:
            # An aborted request never goes out, so it consumes no reply.
            signal.throw_if_aborted()
            await on_attempt(attempt, cause, delay)
            signal.throw_if_aborted()
            reply = self._take()
            if reply.error is None:
                break
            error = reply.error.to_error()
            # Nothing has streamed for an error reply, so the policy (or the decider) decides.
            delay = await retry_delay(
                error, attempt, policy=self._policy, rng=self._rng, decide_retry=decide_retry
            )
            if delay is None:
                raise error
            await abortable_sleep(self._clock, delay, signal)
            cause = error
            attempt += 1

        chunks = reply.content()
        stall = reply.stall_after_chunks
        if stall is not None:
            chunks = chunks[:stall]  # a stalled stream never gets to usage or finish
        else:
            if reply.usage is not None:
                chunks.append(reply.usage)
            chunks.append(Finish(reply.finish))
        for n, chunk in enumerate(chunks):
            if n and reply.chunk_delay > 0:
                await abortable_sleep(self._clock, reply.chunk_delay, signal)
            # The per-chunk checkpoint: the consumer may have aborted while handling the last one.
            signal.throw_if_aborted()
            yield chunk
        if stall is not None:
            # No polling: wake exactly when the signal fires, like a silent socket being closed.
            raise Aborted(await signal.wait())


class _YamlError(ValueError):
    """PyYAML's error, carried as a ``ValueError`` so that the caller need not import yaml."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def _parse(file: Path, text: str) -> Any:
    if file.suffix.lower() == ".json":
        return json.loads(text)
    # Imported here: only a YAML script needs it, and it is a tenth of the CLI's import time.
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise _YamlError(exc) from None


def _where(name: str, exc: BaseException) -> str:
    """``file:line:column`` of a parse error, where the parser says (YAML marks, JSON's lineno)."""
    if isinstance(exc, _YamlError):
        exc = exc.error
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if mark is not None:
        return f"{name}:{mark.line + 1}:{mark.column + 1}"
    if isinstance(exc, json.JSONDecodeError):
        return f"{name}:{exc.lineno}:{exc.colno}"
    return name


def _problem(exc: BaseException) -> str:
    """The parser's own words for what is wrong, on one line (a YAML error's text is several
    lines naming ``<unicode string>``, which means nothing to the user)."""
    if isinstance(exc, _YamlError):
        exc = exc.error
        parts = [p for p in (getattr(exc, "context", None), getattr(exc, "problem", None)) if p]
        if parts:
            return "; ".join(parts)
    if isinstance(exc, json.JSONDecodeError):
        return exc.msg
    return " ".join(str(exc).split())
