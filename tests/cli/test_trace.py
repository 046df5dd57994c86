"""A session's log as an OpenTelemetry trace (docs/traces.md), received by a real OTLP/HTTP
receiver on loopback: ``andon run`` sends its trace when an endpoint is set, ``andon trace DIR``
sends a finished or crashed session's, and a collector that is down changes nothing of a run."""

from __future__ import annotations

import os
import signal
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

from andon.session import read, trace_of
from tests.cli.support import (
    env,
    is_tool_output,
    long_script,
    read_until,
    records,
    run,
    script,
    signal_and_wait,
    start,
)


class Receiver:
    """An OTLP/HTTP trace receiver: every POST to /v1/traces is decoded and kept."""

    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        kept = self.requests

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                kept.append(request)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def spans(self) -> list[Span]:
        return [
            span
            for request in self.requests
            for resource in request.resource_spans
            for scope in resource.scope_spans
            for span in scope.spans
        ]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    thread = threading.Thread(target=r.server.serve_forever, daemon=True)
    thread.start()
    yield r
    r.server.shutdown()
    r.server.server_close()
    thread.join(10)


def _otel_env(endpoint: str) -> dict[str, str]:
    return env(OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_SERVICE_NAME="andon-test")


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def _attrs(span: Span) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in span.attributes:
        which = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, which) if which else None
    return out


@pytest.mark.slow
def test_a_stopped_run_sends_its_trace(tmp_path: Path, receiver: Receiver) -> None:
    session = tmp_path / "s"
    proc = start(
        *("run", "--json", "--grace", "1,1", "--model", long_script(tmp_path)),
        *("--session", str(session), "build"),
        cwd=tmp_path,
        environ=_otel_env(receiver.endpoint),
    )
    read_until(proc, is_tool_output)
    _, err, _ = signal_and_wait(proc, signal.SIGINT, timeout=40)
    assert proc.returncode == 128 + signal.SIGINT, err
    assert "trace export" not in err

    spans = receiver.spans()
    trace_ids = {span.trace_id for span in spans}
    assert len(trace_ids) == 1
    expected = trace_of(read(session))
    assert trace_ids == {expected.trace_id.to_bytes(16, "big")}
    assert len(spans) == len(expected.spans)
    by_id = {span.span_id: span for span in spans}
    (root,) = [span for span in spans if not span.parent_span_id]
    assert root.name == "andon session"
    assert _attrs(root)["gen_ai.conversation.id"] == expected.session_id

    def parents(span: Span) -> list[str]:
        chain = []
        while span.parent_span_id:
            span = by_id[span.parent_span_id]
            chain.append(span.name)
        return chain

    (tool,) = [span for span in spans if span.name == "execute_tool bash"]
    assert parents(tool) == ["step 1.1", "turn 1", "andon session"]
    chats = [span for span in spans if span.name.startswith("chat ")]
    assert chats and parents(chats[0]) == ["step 1.1", "turn 1", "andon session"]
    assert _attrs(chats[0])["gen_ai.operation.name"] == "chat"

    logged = records(session)
    call = next(r for r in logged if r["type"] == "tool/call")
    result = next(r for r in logged if r["type"] == "tool/result")
    stages = [r for r in logged if r["type"] == "tool/signal"]
    assert stages and stages[0]["data"]["stage"] == "interrupt"
    assert tool.start_time_unix_nano == _ns(call["time"])
    assert tool.end_time_unix_nano == _ns(result["time"])
    stops = [e for e in tool.events if e.name != "started"]
    assert [e.name for e in stops] == [r["data"]["stage"] for r in stages]
    assert [e.time_unix_nano for e in stops] == [_ns(r["time"]) for r in stages]
    assert {kv.key for kv in stops[0].attributes} == {"andon.signal.at", "andon.signal.targets"}

    attrs = _attrs(tool)
    assert attrs["gen_ai.tool.name"] == "bash"
    assert attrs["gen_ai.tool.call.id"] == "c1-1-1"
    assert attrs["andon.ended_by"] == result["data"]["ended_by"]
    assert tool.status.code == Status.STATUS_CODE_ERROR
    assert tool.status.message.startswith("ABORTED")
    (turn,) = [span for span in spans if span.name == "turn 1"]
    assert _attrs(turn)["andon.turn.ended"] == "aborted"
    assert turn.status.code == Status.STATUS_CODE_ERROR

    # The same log sent again is the same trace: ids come from the session and the seqs.
    again = run("trace", str(session), cwd=tmp_path, environ=_otel_env(receiver.endpoint))
    assert again.returncode == 0, again.stderr
    assert f"trace {expected.trace_id:032x}: {len(expected.spans)} spans" in again.stdout
    resent = receiver.spans()[len(spans) :]
    assert sorted(s.span_id for s in resent) == sorted(s.span_id for s in spans)


@pytest.mark.slow
async def test_a_crashed_session_is_traced_with_every_span_ended(
    tmp_path: Path, receiver: Receiver, killer: list[Any]
) -> None:
    session = tmp_path / "s"
    proc = start(
        *("run", "--json", "--model", long_script(tmp_path), "--session", str(session), "go"),
        cwd=tmp_path,
    )
    killer.append(proc)
    read_until(proc, is_tool_output)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    try:
        traced = run("trace", str(session), cwd=tmp_path, environ=_otel_env(receiver.endpoint))
        assert traced.returncode == 0, traced.stderr
        spans = receiver.spans()
        assert f": {len(spans)} spans" in traced.stdout
        assert {span.name for span in spans} >= {"turn 1", "step 1.1", "execute_tool bash"}
        for span in spans:
            assert span.end_time_unix_nano >= span.start_time_unix_nano > 0, span.name
        (tool,) = [span for span in spans if span.name == "execute_tool bash"]
        assert tool.status.code == Status.STATUS_CODE_ERROR
        assert "TOOL_OUTCOME_UNKNOWN" in tool.status.message
        # andon trace only reads: the log is as the crash left it.
        assert not any(r["type"] == "session/repaired" for r in records(session))
    finally:
        # The crashed run's tool is still running: repair ends it.
        repaired = run("repair", str(session), cwd=tmp_path)
        assert repaired.returncode == 0, repaired.stderr


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_a_collector_that_is_down_changes_nothing(tmp_path: Path) -> None:
    model = script(tmp_path / "m.json", [{"text": "Done."}])
    environ = _otel_env(f"http://127.0.0.1:{_closed_port()}")
    result = run("run", "--model", model, "--session", str(tmp_path / "s"), "hi", cwd=tmp_path)
    down = run(
        "run",
        "--model",
        model,
        "--session",
        str(tmp_path / "d"),
        "hi",
        cwd=tmp_path,
        environ=environ,
    )
    assert down.returncode == result.returncode == 0, down.stderr
    assert "Done." in down.stdout
    warnings = [line for line in down.stderr.splitlines() if "trace export" in line]
    assert len(warnings) == 1 and warnings[0].startswith("andon: warning: trace export to ")
    assert "Traceback" not in down.stderr
    # andon trace leaves the timeout to the SDK, which reads it from its variable.
    environ["OTEL_EXPORTER_OTLP_TIMEOUT"] = "1"
    failed = run("trace", str(tmp_path / "d"), cwd=tmp_path, environ=environ)
    assert failed.returncode == 1
    assert failed.stderr.count("\n") == 1 and "trace export to" in failed.stderr
