"""The mock model server itself (docs/models.md, The mock server): its wire format, the server-only
reply options, script validation, request recording, shutdown and ``andon mock-model``'s
``main``."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from andon.base import ScriptInvalid
from andon.llm import Scripted
from andon.testing import SERVER_ONLY_FIELDS, MockModelServer

BODY = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


def events_of(text: str) -> list[Any]:
    """The data payloads of an SSE body (JSON decoded, except [DONE])."""
    out: list[Any] = []
    for block in text.split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: "):
                data = line.removeprefix("data: ")
                out.append(data if data == "[DONE]" else json.loads(data))
    return out


def post(server: MockModelServer, body: Any = BODY, **kwargs: Any) -> httpx.Response:
    with httpx.Client(timeout=5.0) as client:
        return client.post(f"{server.base_url}/chat/completions", json=body, **kwargs)


def test_streams_openai_style_chunks_with_usage_on_the_finish_chunk() -> None:
    reply = {
        "reasoning": "hmm",
        "text": "Hello",
        "tool_calls": [{"name": "bash", "arguments": {"command": "ls"}, "id": "call_9"}],
        "chunk_size": 3,
        "usage": {"prompt_tokens": 7, "completion_tokens": 2},
    }
    with MockModelServer([reply]) as server:
        response = post(server, headers={"Authorization": "Bearer k"})
        (recorded,) = server.requests
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = events_of(response.text)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0]["role"] == "assistant" and all(d["role"] is None for d in deltas[1:-1])
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == "hmm"
    assert "".join(d.get("content") or "" for d in deltas) == "Hello"
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert calls[0]["id"] == "call_9" and calls[0]["function"]["name"] == "bash"
    assert "".join(c["function"]["arguments"] for c in calls) == '{"command": "ls"}'
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["usage"] == {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}
    assert recorded.body == BODY
    assert recorded.headers["authorization"] == "Bearer k"
    assert recorded.path == "/v1/chat/completions"


def test_usage_on_a_separate_empty_choices_chunk() -> None:
    reply = {"text": "hi", "usage": {"prompt_tokens": 1, "completion_tokens": 1}}
    with MockModelServer([{**reply, "usage_chunk": "separate"}]) as server:
        events = events_of(post(server).text)
    assert events[-3]["choices"][0]["finish_reason"] == "stop"
    assert events[-3]["usage"] is None
    assert events[-2]["choices"] == [] and events[-2]["usage"]["total_tokens"] == 2


def test_server_only_finish_reasons_and_keepalives() -> None:
    replies = [{"text": "x", "finish": "content_filter", "keepalive": 2}]
    with MockModelServer(replies) as server:
        response = post(server)
        assert server.keepalives_sent == 2
    assert response.text.startswith(": keep-alive\n\n: keep-alive\n\n")
    assert events_of(response.text)[-2]["choices"][0]["finish_reason"] == "content_filter"


def test_error_replies_are_http_errors_with_retry_after_and_an_openai_body() -> None:
    replies: list[dict[str, Any]] = [
        {"error": {"status": 429, "retry_after": 2, "message": "slow down"}},
        {"error": {"status": 503, "retry_after": 0.25}},
    ]
    with MockModelServer(replies) as server:
        first, second = post(server), post(server)
    assert first.status_code == 429
    assert first.headers["retry-after"] == "2"
    assert first.json() == {
        "error": {"message": "slow down", "type": "rate_limit_error", "param": None, "code": None}
    }
    assert second.status_code == 503 and second.headers["retry-after"] == "0.25"


def test_stream_faults_on_the_wire() -> None:
    replies: list[dict[str, Any]] = [
        {"text": "abcd", "chunk_size": 1, "truncate_after_chunks": 2},
        {"text": "abcd", "chunk_size": 1, "malformed_after_chunks": 1},
        {"text": "abcd", "chunk_size": 2, "error_event": {"after_chunks": 1, "code": 500}},
        {"raw_events": [": hello", {"anything": 1}, "data: [DONE]"]},
    ]
    with MockModelServer(replies) as server, httpx.Client(timeout=5.0) as client:
        url = f"{server.base_url}/chat/completions"
        truncated, malformed, error, raw = (client.post(url, json=BODY).text for _ in range(4))
        assert server.connections == 1  # every answer ended its body cleanly: one connection
    assert [e["choices"][0]["delta"]["content"] for e in events_of(truncated)] == ["a", "b"]
    assert 'data: {"choices": [{"delta": {"content": "cut \n\n' in malformed
    assert events_of(error)[-1] == {"error": {"message": "mock server error", "code": 500}}
    assert raw == ': hello\n\ndata: {"anything": 1}\n\ndata: [DONE]\n\n'


def test_requests_that_cannot_be_answered() -> None:
    with MockModelServer([]) as server:
        exhausted = post(server)
        not_streaming = post(server, body={**BODY, "stream": False})
        not_json = post(server, content=b"{oops", headers={"content-type": "application/json"})
        with httpx.Client() as client:
            wrong_path = client.get(f"{server.base_url}/models")
        recorded = server.requests
    assert exhausted.status_code == 400
    assert "no scripted reply left" in exhausted.json()["error"]["message"]
    assert not_streaming.status_code == 400
    assert "only streams" in not_streaming.json()["error"]["message"]
    assert not_json.status_code == 400
    assert wrong_path.status_code == 404
    assert [r.body for r in recorded] == [BODY, {**BODY, "stream": False}, None]
    assert recorded[2].raw_body == b"{oops"


def test_a_request_after_a_stall_is_still_served_and_waits_see_closes() -> None:
    replies: list[dict[str, Any]] = [
        {"text": "abc", "chunk_size": 1, "stall_after_chunks": 1},
        {"text": "next"},
    ]
    with MockModelServer(replies) as server:
        with (
            httpx.Client(timeout=5.0) as client,
            client.stream("POST", f"{server.base_url}/chat/completions", json=BODY) as stalled,
        ):
            lines = stalled.iter_lines()
            assert next(lines).startswith("data: ")
        # The client closed the stalled answer; the server noticed and serves the next one.
        assert events_of(post(server).text)[0]["choices"][0]["delta"]["content"] == "next"
        assert server.client_closes == 1


# --- validation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "field", "says"),
    [
        ({"text": "x", "colour": "red"}, "colour", "unknown field"),
        ({"text": "x", "keepalive": -1}, "keepalive", ">= 0"),
        ({"text": "x", "keepalive_interval": 0}, "keepalive_interval", "> 0"),
        ({"text": "x", "usage_chunk": "later"}, "usage_chunk", "finish or separate"),
        ({"text": "x", "truncate_after_chunks": "2"}, "truncate_after_chunks", "integer"),
        ({"text": "x", "error_event": {"after": 1}}, "error_event.after", "unknown field"),
        ({"text": "x", "raw_events": ["ok"]}, "text", "raw_events replaces"),
        ({"raw_events": [3]}, "raw_events[0]", "SSE block"),
        ({"stall_before_headers": True, "text": "x"}, "text", "sends no stream"),
        ({"disconnect": "yes"}, "disconnect", "true or false"),
        ({"error": {"code": "AUTH"}}, "error.status", "over HTTP"),
        ({"error": {"status": 500}, "keepalive": 1}, "keepalive", "streams nothing"),
        ({"text": "x", "finish": "done"}, "finish", "must be one of"),
    ],
)
def test_bad_replies_are_refused_naming_the_reply_and_field(
    reply: dict[str, Any], field: str, says: str
) -> None:
    with pytest.raises(ScriptInvalid, match=says) as info:
        MockModelServer([{"text": "fine"}, reply])
    assert (info.value.index, info.value.field) == (1, field)


def test_scripted_rejects_the_server_only_fields() -> None:
    for name in SERVER_ONLY_FIELDS:
        with pytest.raises(ScriptInvalid, match="unknown field"):
            Scripted([{"text": "x", name: 1}])


def test_from_file_reads_yaml_with_server_only_fields(tmp_path: Path) -> None:
    script = tmp_path / "script.yaml"
    script.write_text("replies:\n  - text: hi\n    keepalive: 1\n  - error: {status: 500}\n")
    with MockModelServer.from_file(script) as server:
        assert server.remaining == 2
    bad = tmp_path / "bad.yaml"
    bad.write_text("replies:\n  - text: hi\n    keepalive: many\n")
    with pytest.raises(ScriptInvalid, match=r"bad\.yaml"):
        MockModelServer.from_file(bad)


# --- life cycle ---------------------------------------------------------------------------------


def _server_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "andon-mock-model"]


async def test_async_use_and_stop_with_a_client_still_stalled() -> None:
    replies = [{"stall_before_headers": True}]
    async with MockModelServer(replies) as server:
        client = httpx.AsyncClient(timeout=5.0)
        request = client.build_request("POST", f"{server.base_url}/chat/completions", json=BODY)
        pending = asyncio.create_task(client.send(request))
        await server.wait_for_requests(1)
    # Stopping closed the stalled connection: the client sees it go away.
    with pytest.raises(httpx.RemoteProtocolError):
        await pending
    await client.aclose()
    assert _server_threads() == []


def test_sync_use_leaves_no_thread() -> None:
    with MockModelServer([{"text": "x"}]) as server:
        assert _server_threads()
        assert post(server).status_code == 200
    assert _server_threads() == []
    with pytest.raises(RuntimeError, match="not running"):
        _ = MockModelServer([]).base_url


def test_main_serves_until_sigterm(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"text": "from main"}]))
    code = "import sys; from andon.testing import mock_model_main; sys.exit(mock_model_main())"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "--script", str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        base_url = proc.stdout.readline().strip()  # the first line, printed once serving
        assert base_url.startswith("http://127.0.0.1:") and base_url.endswith("/v1")
        with httpx.Client(timeout=5.0) as client:
            response = client.post(f"{base_url}/chat/completions", json=BODY)
        assert events_of(response.text)[0]["choices"][0]["delta"]["content"] == "from main"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_main_refuses_a_bad_script(tmp_path: Path) -> None:
    script = tmp_path / "bad.json"
    script.write_text(json.dumps([{"text": 1}]))
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from andon.testing import mock_model_main; sys.exit(mock_model_main())",
            "--script",
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "reply 0" in result.stderr and "'text'" in result.stderr


def test_main_strict_reasoning_flag(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps([{"text": "accepted"}]))
    andon = str(Path(sys.executable).parent / "andon")  # the CLI forwards the flag
    proc = subprocess.Popen(
        [andon, "mock-model", "--script", str(script), "--strict-reasoning"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    missing: list[dict[str, Any]] = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    try:
        assert proc.stdout is not None
        base_url = proc.stdout.readline().strip()
        with httpx.Client(timeout=5.0) as client:
            refused = client.post(
                f"{base_url}/chat/completions", json={**BODY, "messages": missing}
            )
            missing[1]["reasoning_content"] = ""
            served = client.post(f"{base_url}/chat/completions", json={**BODY, "messages": missing})
        assert refused.status_code == 400
        assert refused.json()["error"]["type"] == "invalid_request_error"
        assert events_of(served.text)[0]["choices"][0]["delta"]["content"] == "accepted"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
