"""One HTTP attempt of a model request: a reader task, a watchdog timer and a queue between them
and the consumer.

Why a task and a timer: a model that stalls sends nothing, so nothing in the consumer's own
``await`` would ever notice a cancel or a timeout "at the next chunk". Instead:

* the **reader** task sends the request, reads the event stream, and puts chunks on a queue;
* the **watchdog** is a :meth:`~andon.base.Clock.call_at` timer at the current deadline (first
  content, idle between data events, total); when it fires it cancels the reader. Keep-alive
  comments never reach the reader as events, so they can never move the deadline;
* the abort signal's **callback** cancels the reader synchronously, inside ``abort()``, and wakes
  the consumer. Cancelling the reader unwinds its ``finally``, which awaits ``response.aclose()``:
  the connection is closed by the time the consumer raises :class:`~andon.base.Aborted`.

Why the reader is a bare task and not a task group's: the attempt lives inside the adapter's
``stream`` async generator and must keep reading while that generator is suspended at a ``yield``
(the consumer may be busy elsewhere when an abort must close the socket). A ``TaskGroup`` cannot
span ``yield`` s of an async generator: its cancel scope would hit whatever code the consumer runs
between chunks, and its exit may run in another task (a finaliser's ``aclose``). So the
:class:`Attempt` is the reader's owner instead, and the generator's ``finally`` always awaits
:meth:`Attempt.close`, which cancels the reader (once) and awaits it — on a finish, a failure, an
abort, a consumer that stops early (``aclose``) and a cancelled consumer alike. Agent work is
never stopped by ``Task.cancel()`` (docs/architecture.md, How a stop travels); the one task an
abort cancels is this one, the adapter's own reader, one per stream (docs/models.md,
Cancellation; attempts never overlap: each is closed before the next one starts).

Invariants: the reader is cancelled at most once (a second cancel would interrupt the
``response.aclose()`` of the first and could leave the socket open); the reader is always awaited
and the timer always cancelled in :meth:`Attempt.close` (never fire-and-forget); a marker on the
queue only wakes the consumer, which then reads the attempt's state — so duplicate wake-ups are
harmless.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from dataclasses import dataclass
from typing import Final, NoReturn

import httpx
from httpx_sse import EventSource

from andon.base import Aborted, AbortSignal, Cause, Clock, ErrorCode, ModelError, Timer
from andon.llm._failures import Context, status_error, transport_error
from andon.llm._overflow import EMPTY_STREAM
from andon.llm._retry import parse_retry_after
from andon.llm._sse import DONE, StreamParser
from andon.llm._types import Chunk, Finish

__all__ = ["Attempt", "Timeouts"]

ERROR_BODY_LIMIT: Final = 64 * 1024
"""How much of an HTTP error body is read to find the server's message."""

DRAIN_SECONDS: Final = 0.25
"""After the finish has been delivered, how long the reader may keep reading up to the end of the
body (``[DONE]`` and the last HTTP chunk) so the connection can be reused. Real time, not the
clock: it bounds a courtesy, not a behaviour a test observes."""


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Seconds, or ``None`` for no limit (docs/models.md, Errors and retries: connect 10, first
    content 300, idle 120)."""

    connect: float | None = 10.0
    first_content: float | None = 300.0
    idle: float | None = 120.0
    total: float | None = None

    def __post_init__(self) -> None:
        for name in ("connect", "first_content", "idle", "total"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} timeout must be a finite number > 0 or None: {value!r}")

    @property
    def watched(self) -> bool:
        return any(t is not None for t in (self.first_content, self.idle, self.total))


class _Marker:
    __slots__ = ()


_WAKE: Final = _Marker()


class Attempt:
    """One request/response; :meth:`next` yields its chunks in order, ending with a Finish."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        request: httpx.Request,
        *,
        signal: AbortSignal,
        clock: Clock,
        timeouts: Timeouts,
        context: Context,
    ) -> None:
        self._client = client
        self._request = request
        self._signal = signal
        self._clock = clock
        self._timeouts = timeouts
        self._context = context
        self._parser = StreamParser(context.secret)
        self._queue: asyncio.Queue[Chunk | _Marker] = asyncio.Queue()
        self._started = clock.monotonic()
        self._last_data: float | None = None  # clock time of the latest data event
        self.data_events = 0
        """Data events received and understood (keep-alive comments are not events)."""
        self.delivered = 0
        """Chunks handed to the queue; while 0, a retry cannot duplicate anything the caller saw."""
        self.finished = False
        """The Finish chunk has been queued: the reply is complete."""
        self._done = False  # [DONE] seen or EOF reached: later events are only drained
        self._timeout: ModelError | None = None
        self._reader_cancelled = False
        # Not in a task group: see the module docstring. Always awaited in close().
        self._reader = asyncio.create_task(self._read())
        self._reader.add_done_callback(self._wake)
        self._watchdog: Timer | None = None
        self._start_watchdog()
        # Registered last: if the signal has already fired, the callback runs right here.
        self._handle = signal.add_callback(self._on_abort)

    # --- the consumer's side --------------------------------------------------------------------

    async def next(self) -> Chunk:
        """The next chunk; raises ModelError, or Aborted once the signal has fired."""
        signal = self._signal
        queue = self._queue
        while True:
            if queue.empty():
                if signal.aborted:
                    await self._abort()
                item = await queue.get()
            else:
                item = queue.get_nowait()
            # Checked after the wait too: an abort beats chunks that were already queued.
            if signal.aborted:
                await self._abort()
            if not isinstance(item, _Marker):
                return item
            await self._settle()

    async def close(self, *, drain: bool = False) -> None:
        """Stop the reader and the watchdog and wait for the reader; the response is closed when
        this returns.

        ``drain`` (after a delivered Finish) first lets the reader read to the end of the body,
        for at most :data:`DRAIN_SECONDS`, so the connection goes back to the pool.
        """
        try:
            if drain and not self._reader.done() and not self._signal.aborted:
                await asyncio.wait({self._reader}, timeout=DRAIN_SECONDS)
        finally:
            self._handle.remove()
            self._cancel_reader()
            self._stop_watchdog()
            reader = self._reader
            if not reader.done():  # no await at all when it has ended: one loop turn saved
                await asyncio.wait({reader})
            # The reader's ModelError was already raised to the consumer (or is superseded by an
            # abort); retrieving it keeps asyncio from reporting it as never retrieved.
            if not reader.cancelled():
                reader.exception()

    async def _abort(self) -> NoReturn:
        await self.close()
        reason = self._signal.reason
        assert reason is not None
        raise Aborted(reason)

    async def _settle(self) -> None:
        """A wake-up: raise the attempt's failure, if it has one by now."""
        if self._timeout is not None:
            await self.close()
            raise self._timeout
        reader = self._reader
        if not reader.done():
            return  # a stale wake-up
        error = None if reader.cancelled() else reader.exception()
        await self.close()
        if error is not None:
            raise error
        # The reader only ends quietly after queueing Finish, which the consumer stops at.
        raise ModelError(ErrorCode.STREAM_TRUNCATED, "the model stream ended without a finish")

    # --- wake-ups -------------------------------------------------------------------------------

    def _wake(self, _task: object = None) -> None:
        self._queue.put_nowait(_WAKE)

    def _cancel_reader(self) -> None:
        if not self._reader_cancelled:
            self._reader_cancelled = True
            self._reader.cancel()

    def _on_abort(self, _cause: Cause) -> None:
        # Runs synchronously inside controller.abort(): the close starts now, not at a chunk.
        self._cancel_reader()
        self._stop_watchdog()
        self._wake()

    # --- the reader -----------------------------------------------------------------------------

    async def _read(self) -> None:
        try:
            response = await self._client.send(self._request, stream=True)
        except httpx.HTTPError as exc:
            raise self._transport_error(exc) from None
        try:
            if not 200 <= response.status_code < 300:
                raise await self._status_error(response)
            content_type = response.headers.get("content-type", "")
            if "text/event-stream" not in content_type.lower():
                raise ModelError(
                    ErrorCode.MALFORMED_STREAM,
                    f"expected an event stream from {self._context.url}, got "
                    f"{content_type or 'no content type'}; is this an OpenAI-compatible "
                    "chat-completions endpoint that supports stream: true?",
                )
            async with contextlib.aclosing(EventSource(response).aiter_sse()) as events:
                async for event in events:
                    data = event.data
                    if self._done or not data:
                        continue  # draining after [DONE], or an event without data
                    if self._last_data is None:
                        self._last_data = self._clock.monotonic()
                        self._start_watchdog()  # the idle deadline may be nearer
                    else:
                        self._last_data = self._clock.monotonic()
                    if data == DONE:
                        self._end()
                        continue
                    chunks = self._parser.feed(data)
                    self.data_events += 1
                    for chunk in chunks:
                        self._put(chunk)
                    if self._parser.finish is not None and self._parser.usage is not None:
                        self._deliver_finish()  # DeepSeek: usage rides on the finish chunk
            if not self._done:
                self._end()
        except httpx.HTTPError as exc:
            raise self._transport_error(exc) from None
        finally:
            await response.aclose()

    def _put(self, chunk: Chunk) -> None:
        self.delivered += 1
        self._queue.put_nowait(chunk)

    def _deliver_finish(self) -> None:
        finish = self._parser.finish
        if self.finished or finish is None:
            return
        self.finished = True
        if self._parser.usage is not None:
            self._put(self._parser.usage)
        self._put(Finish(finish))

    def _end(self) -> None:
        """``[DONE]`` or the end of the body: the reply must have finished by now."""
        self._done = True
        if self._parser.finish is None:
            raise ModelError(
                ErrorCode.STREAM_TRUNCATED,
                EMPTY_STREAM
                if self.data_events == 0
                else f"the model stream ended without a finish reason after {self.data_events} "
                "data event(s); the reply is incomplete",
            )
        self._deliver_finish()

    async def _status_error(self, response: httpx.Response) -> ModelError:
        body = bytearray()
        async for piece in response.aiter_bytes():
            body += piece
            if len(body) >= ERROR_BODY_LIMIT:
                break
        header = response.headers.get("retry-after")
        retry_after = parse_retry_after(header, now=self._clock.time()) if header else None
        return status_error(response.status_code, bytes(body), retry_after, self._context)

    def _transport_error(self, exc: httpx.HTTPError) -> ModelError:
        return transport_error(
            exc,
            data_started=self.data_events > 0,
            connect_timeout=self._timeouts.connect,
            context=self._context,
        )

    # --- the watchdog ---------------------------------------------------------------------------

    def _deadline(self) -> tuple[float, str]:
        t = self._timeouts
        if self._last_data is None:
            limit, kind = t.first_content, "first-content"
            deadline = self._started + limit if limit is not None else math.inf
        else:
            limit, kind = t.idle, "idle"
            deadline = self._last_data + limit if limit is not None else math.inf
        if t.total is not None and self._started + t.total < deadline:
            deadline, kind = self._started + t.total, "total"
        return deadline, kind

    def _start_watchdog(self) -> None:
        """(Re)arm the watchdog: at the start, and once more at the first data event, the only
        moment the deadline can move nearer (first-content -> idle)."""
        if not self._timeouts.watched:
            return
        self._stop_watchdog()
        self._arm_watchdog()

    def _arm_watchdog(self) -> None:
        deadline, _ = self._deadline()
        if math.isinf(deadline):
            return  # e.g. no first-content limit before data: nothing to wait for yet
        self._watchdog = self._clock.call_at(deadline, self._on_deadline)

    def _stop_watchdog(self) -> None:
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            watchdog.cancel()  # synchronous and idempotent: nothing left to await

    def _on_deadline(self) -> None:
        """The watchdog's timer fired (on the loop, never inside another callback)."""
        self._watchdog = None
        # Later data events only move _last_data later and never re-arm the timer, so the
        # per-chunk cost of the timeouts is one clock read; the timer re-checks when it fires.
        deadline, kind = self._deadline()
        if deadline > self._clock.monotonic():
            self._arm_watchdog()
            return
        if self._reader.done():
            return
        if self._parser.finish is not None:
            # The reply is complete and only the optional usage chunk or [DONE] is missing:
            # deliver what there is rather than fail a finished reply.
            self._deliver_finish()
            self._cancel_reader()
            return
        self._timeout = ModelError(ErrorCode.TIMEOUT, self._timeout_message(kind))
        self._cancel_reader()
        self._wake()

    def _timeout_message(self, kind: str) -> str:
        t = self._timeouts
        match kind:
            case "first-content":
                return (
                    f"no data from the model API within {t.first_content:g} s "
                    "(first-content timeout); the server may be overloaded"
                )
            case "idle":
                return (
                    f"the model stream sent no data for {t.idle:g} s after it had started "
                    "(idle timeout; keep-alive comments do not count)"
                )
            case _:
                return f"the model request took longer than {t.total:g} s (total timeout)"
