"""``andon trace`` and the end of ``andon run``: a session's log sent as an OpenTelemetry trace
(docs/traces.md).

The spans come from the log (``andon.session.trace_of``), never from the running process, so a
live run and a later ``andon trace`` of the same folder send the same trace. The official SDK's
OTLP/HTTP exporter sends them and reads its own configuration (``OTEL_EXPORTER_OTLP_ENDPOINT``,
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, ``OTEL_EXPORTER_OTLP_HEADERS``, ``OTEL_SERVICE_NAME`` …).
The SDK is the optional extra ``otel``: it is imported only here, only when a trace is sent.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from andon import __version__
from andon.base import ConfigError

if TYPE_CHECKING:
    from andon.session import Record, Trace

__all__ = ["RUN_EXPORT_TIMEOUT", "export_after_run", "export_trace", "session_trace", "wanted"]

RUN_EXPORT_TIMEOUT = 2.0
"""Seconds the export at the end of ``andon run`` may take (the exporter's own timeout; its
retries stop there too): a collector that is down costs a run at most this much."""

_ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


class ExportFailed(Exception):
    """The trace was not sent; the message says why, in one line."""


def wanted() -> bool:
    """Whether ``andon run`` sends its trace: an OTLP endpoint is configured."""
    return any(os.environ.get(name, "").strip() for name in _ENDPOINT_VARIABLES)


def _endpoint() -> str:
    traces = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if traces:
        return traces
    base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip() or "http://localhost:4318"
    return base.rstrip("/") + "/v1/traces"


def session_trace(folder: Path) -> Trace:
    """The trace of the session in ``folder``: its log, plus the closers crash repair would
    append when the last run crashed (a dry run: nothing is written or killed). A live session is
    refused (``SessionLive``): its spans are not over yet."""
    from andon.session import read, repair, trace_of

    records: list[Record] = [*read(folder), *repair(folder, dry_run=True).appended]
    try:
        return trace_of(records)
    except ValueError as e:
        raise ConfigError(f"{folder}: {e}") from None


class _LastMessage(logging.Handler):
    """Keeps the SDK's last complaint: the reason of a failed export, for our one line."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.message: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING:
            self.message = record.getMessage().splitlines()[0] if record.getMessage() else None


def _otel_spans(trace: Trace) -> list[Any]:
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

    # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES are read by Resource.create; andon is the
    # name when neither gives one.
    given = os.environ.get("OTEL_SERVICE_NAME") or "service.name=" in os.environ.get(
        "OTEL_RESOURCE_ATTRIBUTES", ""
    )
    resource = Resource.create({} if given else {SERVICE_NAME: "andon"})
    scope = InstrumentationScope("andon", __version__)

    def context(span_id: int) -> SpanContext:
        return SpanContext(trace.trace_id, span_id, False, TraceFlags(TraceFlags.SAMPLED))

    def ns(seconds: float) -> int:
        return round(seconds * 1e9)

    spans = []
    for span in trace.spans:
        if span.error is None:
            status = Status(StatusCode.OK)
        else:
            status = Status(StatusCode.ERROR, span.error)
        chat = span.attributes.get("gen_ai.operation.name") == "chat"
        spans.append(
            ReadableSpan(
                name=span.name,
                context=context(span.span_id),
                parent=None if span.parent_id is None else context(span.parent_id),
                resource=resource,
                attributes=dict(span.attributes),
                events=[Event(e.name, dict(e.attributes), ns(e.time)) for e in span.events],
                kind=SpanKind.CLIENT if chat else SpanKind.INTERNAL,
                instrumentation_scope=scope,
                status=status,
                start_time=ns(span.start),
                end_time=ns(span.end),
            )
        )
    return spans


PROBE_TIMEOUT = 1.0
"""At most this long to open a connection to the collector before the export."""


def _reachable(url: str, timeout: float | None) -> None:
    """Raise ``ExportFailed`` at once if nothing takes a connection at the collector's address:
    the SDK's exporter retries a refused connection with back-off until its whole timeout, which
    a run whose collector is down would pay at its end (about 2 s, measured) for nothing."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return  # the SDK's own error says what is wrong with it
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return
    wait = PROBE_TIMEOUT if timeout is None else min(PROBE_TIMEOUT, timeout)
    try:
        with socket.create_connection((parts.hostname, port), timeout=wait):
            pass
    except OSError as e:
        reason = e.strerror or type(e).__name__
        raise ExportFailed(
            f"nothing takes a connection at {parts.hostname}:{port} ({reason})"
        ) from None


def export_trace(trace: Trace, *, timeout: float | None = None) -> None:
    """Send ``trace`` with the OTLP/HTTP exporter (``timeout``: None for the SDK's own,
    ``OTEL_EXPORTER_OTLP_TIMEOUT`` or 10 s). ``ExportFailed`` says why it was not sent."""
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import SpanExportResult
    except ImportError:
        raise ExportFailed(
            "the OpenTelemetry SDK is not installed (pip install 'andon[otel]')"
        ) from None
    # The SDK reports a failed export through logging, with a traceback at times: kept here and
    # said in one line instead.
    logger = logging.getLogger("opentelemetry")
    kept = _LastMessage()
    propagate = logger.propagate
    logger.addHandler(kept)
    logger.propagate = False
    _reachable(_endpoint(), timeout)
    try:
        spans: Sequence[Any] = _otel_spans(trace)
        exporter = OTLPSpanExporter(timeout=timeout)
        try:
            result = exporter.export(spans)
        finally:
            exporter.shutdown()  # type: ignore[no-untyped-call]  # the SDK leaves it unannotated
    except Exception as e:  # a bad variable (OTEL_EXPORTER_OTLP_HEADERS, say) or a bug of theirs
        raise ExportFailed(f"{type(e).__name__}: {e}") from None
    finally:
        logger.removeHandler(kept)
        logger.propagate = propagate
    if result is not SpanExportResult.SUCCESS:
        raise ExportFailed(kept.message or "the collector did not accept it")


def trace_command(folder: Path) -> int:
    """``andon trace DIR``: one line with the trace id and the number of spans; exit 1 (one line)
    when the exporter fails."""
    import sys

    trace = session_trace(folder)
    try:
        export_trace(trace)
    except ExportFailed as e:
        print(f"andon: trace export to {_endpoint()} failed: {e}", file=sys.stderr)
        return 1
    print(f"trace {trace.trace_id:032x}: {len(trace.spans)} spans sent to {_endpoint()}")
    return 0


def export_after_run(folder: Path) -> None:
    """The end of ``andon run``: send the session's trace when an endpoint is configured. It never
    fails the run and never holds it up for long: the exporter's timeout is
    :data:`RUN_EXPORT_TIMEOUT`, the export runs on a daemon thread waited for a little longer
    than that, and any failure is one warning line on stderr."""
    if not wanted() or not (folder / "events.jsonl").is_file():
        return
    from andon.cli._output import say

    problem: list[str] = []

    def send() -> None:
        try:
            from andon.session import read, trace_of

            # The run has closed its log: it is read as it is (nothing to repair).
            export_trace(trace_of(read(folder)), timeout=RUN_EXPORT_TIMEOUT)
        except ExportFailed as e:
            problem.append(str(e))
        except Exception as e:  # the trace is a by-product: it never fails the run
            problem.append(f"{type(e).__name__}: {e}")

    thread = threading.Thread(target=send, name="andon-trace-export", daemon=True)
    thread.start()
    thread.join(RUN_EXPORT_TIMEOUT + 1.0)
    if thread.is_alive():
        say(f"warning: trace export to {_endpoint()} did not finish in time; not sent")
    elif problem:
        say(f"warning: trace export to {_endpoint()} failed: {problem[0]}")
