"""``--output-schema`` and ``--output-last-message`` (docs/ci.md, Structured output).

Real runs of the real executable against ``andon.testing.MockModelServer`` (which records every
request, so the prompt and the request parameters can be read back), real workers, real files;
one in-process agent on an OpenAI-provider model to see the parameter on every step.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

import andon
from andon.base import GracePolicy, message_id
from andon.cli._structured import (
    Answer,
    Mismatch,
    SchemaModel,
    check_answer,
    load_output_schema,
)
from andon.llm import OpenAICompatible, Scripted
from andon.session import InboxSpliced, SessionLog, UserMessage
from andon.testing import MockModelServer
from tests.cli.support import (
    LONG,
    env,
    finish,
    is_tool_output,
    read_until,
    records,
    run,
    start,
)
from tests.cli.test_json_schema import assert_every_line_valid

VERDICT = {
    "type": "object",
    "properties": {
        "verdict": {"enum": ["pass", "fail"]},
        "failures": {"type": "integer", "minimum": 0},
    },
    "required": ["verdict", "failures"],
}
TOOL_STEP: dict[str, Any] = {
    "text": "Running the tests.",
    "tool_calls": [{"name": "bash", "arguments": {"command": "echo 3 passed"}}],
}


def home(tmp_path: Path) -> dict[str, str]:
    return env(ANDON_HOME=str(tmp_path / "home"))


def schema_file(tmp_path: Path, schema: Any = VERDICT, name: str = "verdict.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(schema))
    return path


def sessions(tmp_path: Path) -> list[Path]:
    root = tmp_path / "home" / "sessions"
    return sorted(root.iterdir()) if root.is_dir() else []


def user_messages(session: Path) -> list[dict[str, Any]]:
    return [r["data"]["message"] for r in records(session) if r["type"] == "user/message"]


def job(tmp_path: Path, server: MockModelServer, *flags: str) -> Any:
    return run(
        "run", "--json", "--model", f"{server.base_url}#mock", *flags, "Run the tests.",
        cwd=tmp_path, environ=home(tmp_path),
    )  # fmt: skip


# --- the retry -----------------------------------------------------------------------------------


def test_an_answer_that_does_not_match_gets_one_retry_and_the_value_reaches_the_summary(
    tmp_path: Path,
) -> None:
    schema = schema_file(tmp_path)
    replies = [
        TOOL_STEP,
        {"text": "All 3 tests pass."},  # prose, not JSON
        {"text": '```json\n{"verdict": "pass", "failures": 0}\n```'},
    ]
    with MockModelServer(replies) as server:
        result = job(tmp_path, server, "--output-schema", str(schema))
        bodies = [r.body for r in server.requests]
    assert result.returncode == 0, result.stderr
    summary = assert_every_line_valid(result.stdout)[-1]
    assert summary["output"] == {"verdict": "pass", "failures": 0}
    assert summary["turns"] == 2
    # The prompt carries the schema and asks for only the JSON; a generic server gets no
    # response_format (it could force JSON on the tool step), so the tool call went through.
    first = bodies[0]["messages"][-1]["content"]
    assert first.startswith("Run the tests.")
    assert json.dumps(VERDICT) in first and "Answer with only the JSON" in first
    assert all("response_format" not in body for body in bodies)
    assert summary["tool_calls"] == 1
    # The retry is a turn of its own whose user message says who wrote it and what was wrong.
    (session,) = sessions(tmp_path)
    retry = user_messages(session)[-1]
    assert retry["source"] == "output-schema"
    assert "not JSON" in retry["content"]
    assert bodies[-1]["messages"][-1]["content"] == retry["content"]
    assert run("check", str(session), cwd=tmp_path).returncode == 0


def test_the_retry_names_where_the_value_is_wrong(tmp_path: Path) -> None:
    schema = schema_file(tmp_path)
    replies = [
        {"text": '{"verdict": "maybe", "failures": 0}'},
        {"text": '{"verdict": "fail", "failures": 2}'},
    ]
    with MockModelServer(replies) as server:
        result = job(tmp_path, server, "--output-schema", str(schema))
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.splitlines()[-1])
    assert summary["output"] == {"verdict": "fail", "failures": 2}
    (session,) = sessions(tmp_path)
    retry = user_messages(session)[-1]["content"]
    assert "at $.verdict:" in retry and "'maybe' is not one of ['pass', 'fail']" in retry


def test_an_answer_that_does_not_match_twice_exits_8_with_one_line(tmp_path: Path) -> None:
    schema = schema_file(tmp_path)
    out = tmp_path / "answer.json"
    out.write_text("old\n")
    replies = [{"text": "All pass."}, {"text": '{"verdict": "pass"}'}]
    with MockModelServer(replies) as server:
        result = job(tmp_path, server, "--output-schema", str(schema), "-o", str(out))
    assert result.returncode == 8, result.stderr
    line = (
        f"andon: the final answer did not match --output-schema {schema} after one retry: "
        "at $: 'failures' is a required property"
    )
    assert line in result.stderr.splitlines(), result.stderr
    summary = assert_every_line_valid(result.stdout)[-1]
    assert summary["exit_code"] == 8
    assert "output" not in summary
    assert summary["failure"] == line.removeprefix("andon: ")
    assert out.read_text() == "old\n"  # not written: the run did not exit 0


# --- the provider parameter ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("provider", "sent"), [("openai", True), ("openai-compatible", False), ("deepseek", False)]
)
async def test_openai_gets_the_schema_on_every_step_and_still_calls_tools(
    tmp_path: Path, provider: str, sent: bool
) -> None:
    schema = load_output_schema(str(schema_file(tmp_path)))
    replies = [TOOL_STEP, {"text": '{"verdict": "pass", "failures": 0}'}]
    with MockModelServer(replies) as server:
        async with OpenAICompatible(
            server.base_url, "gpt-test", api_key_env=None, provider=provider
        ) as inner:
            model = SchemaModel(inner, schema.response_schema)
            async with andon.open_agent(
                tmp_path / "session",
                model=model,
                pool=andon.WorkerPoolConfig(size=1, containment="subreaper"),
                grace=GracePolicy(term_after=1.0, kill_after=1.0),
            ) as agent:
                agent.followup("Run the tests.")
                await agent.when_idle()
        bodies = [r.body for r in server.requests]
    assert len(bodies) == 2
    kinds = [r["type"] for r in records(tmp_path / "session")]
    assert "tool/result" in kinds  # the parameter did not stop the tool step
    for body in bodies:
        assert body["tools"]
        if sent:
            assert body["response_format"] == {
                "type": "json_schema",
                "json_schema": {"name": "verdict", "schema": VERDICT, "strict": False},
            }
        else:
            assert "response_format" not in body


# --- --output-last-message -----------------------------------------------------------------------


def test_the_final_text_is_written_to_the_file(tmp_path: Path) -> None:
    out = tmp_path / "last.txt"
    with MockModelServer([TOOL_STEP, {"text": "All 3 tests pass."}]) as server:
        result = job(tmp_path, server, "--output-last-message", str(out))
    assert result.returncode == 0, result.stderr
    assert out.read_text() == "All 3 tests pass.\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".last.txt")] == []


def test_with_a_schema_the_file_holds_the_json_without_its_fence(tmp_path: Path) -> None:
    out = tmp_path / "answer.json"
    schema = schema_file(tmp_path)
    with MockModelServer([{"text": '```json\n{"verdict": "pass", "failures": 0}\n```'}]) as server:
        result = job(tmp_path, server, "--output-schema", str(schema), "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_text()) == {"verdict": "pass", "failures": 0}


def test_a_stopped_turn_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    out = tmp_path / "last.txt"
    out.write_text("from an earlier run\n")
    with MockModelServer([TOOL_STEP, {"text": "All 3 tests pass."}]) as server:
        result = job(tmp_path, server, "--max-steps", "1", "-o", str(out))
    assert result.returncode == 5, result.stderr  # stopped by --max-steps after the tool step
    assert out.read_text() == "from an earlier run\n"


# --- refused before anything starts --------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "cannot read it: No such file or directory"),
        ("{not json", "not valid JSON: Expecting property name enclosed in double quotes"),
        ("[1, 2]", "not a JSON Schema: the file holds a JSON array, not an object"),
        ('{"type": 12}', "not a valid JSON Schema: at $.type: 12 is not valid under any"),
        ('{"$ref": "https://example.invalid/s.json"}', "cannot apply the schema"),
    ],
)
def test_a_bad_schema_file_is_one_line_and_exit_2_before_anything_starts(
    tmp_path: Path, content: str | None, problem: str
) -> None:
    path = tmp_path / "schema.json"
    if content is not None:
        path.write_text(content)
    with MockModelServer([{"text": "{}"}]) as server:
        result = job(tmp_path, server, "--output-schema", str(path))
        asked = len(server.requests)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"andon: --output-schema {path}: {problem}"), line
    assert asked == 0 and sessions(tmp_path) == []


@pytest.mark.parametrize("case", ["no-folder", "a-folder", "cannot-create"])
def test_an_output_file_that_cannot_be_written_is_refused_before_anything_starts(
    tmp_path: Path, case: str
) -> None:
    if case == "no-folder":
        target, problem = tmp_path / "missing" / "out.txt", "the folder"
    elif case == "a-folder":
        target, problem = tmp_path, "is a folder, not a file"
    else:  # sysfs refuses to create a file, to root too
        target, problem = Path("/sys/andon-out.txt"), "cannot write a file in /sys: "
    with MockModelServer([{"text": "done"}]) as server:
        result = job(tmp_path, server, "-o", str(target))
        asked = len(server.requests)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"andon: --output-last-message {target}: "), line
    assert problem in line
    assert asked == 0 and sessions(tmp_path) == []


# --- reading the answer --------------------------------------------------------------------------


def test_only_a_json_fence_is_forgiven(tmp_path: Path) -> None:
    schema = load_output_schema(str(schema_file(tmp_path)))
    value = '{"verdict": "pass", "failures": 0}'
    assert isinstance(check_answer(schema, f"  {value}\n"), Answer)
    assert isinstance(check_answer(schema, f"```json\n{value}\n```"), Answer)
    assert isinstance(check_answer(schema, f"```\n{value}\n```"), Answer)
    for text in (f"Here it is: {value}", f"```json\n{value}\n```\nDone.", "", None):
        assert isinstance(check_answer(schema, text), Mismatch), text
    nan = check_answer(schema, '{"verdict": "pass", "failures": NaN}')
    assert isinstance(nan, Mismatch) and "NaN is not a JSON value" in nan.problem


def test_resume_asks_for_the_json_answer_too_and_the_log_shows_who_asked(tmp_path: Path) -> None:
    schema = schema_file(tmp_path)
    out = tmp_path / "answer.json"
    replies = [
        {"text": "The tests pass."},  # the first run: no schema
        {"text": "They pass."},  # the resume: not JSON
        {"text": '{"verdict": "pass", "failures": 0}'},
    ]
    with MockModelServer(replies) as server:
        first = job(tmp_path, server)
        assert first.returncode == 0, first.stderr
        (session,) = sessions(tmp_path)
        result = run(
            "resume", "--json", "--output-schema", str(schema), "-o", str(out), str(session),
            "Give the verdict.", cwd=tmp_path, environ=home(tmp_path),
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1])["output"] == {
        "verdict": "pass",
        "failures": 0,
    }
    assert json.loads(out.read_text()) == {"verdict": "pass", "failures": 0}
    sources = [m["source"] for m in user_messages(session)]
    assert sources == ["user", "user", "output-schema"]
    transcript = run("log", str(session), cwd=tmp_path).stdout
    assert "user (output-schema): Your final answer did not match" in transcript


async def test_a_resume_without_a_prompt_asks_for_the_json_in_a_turn_of_its_own(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "session"
    async with andon.open_agent(
        folder,
        model=Scripted([]),
        pool=andon.WorkerPoolConfig(size=1, containment="subreaper"),
    ):
        pass
    with SessionLog.open(folder) as log:  # a follow-up queued, never run: the resume wakes it
        queued = UserMessage(message_id(), "Run the tests.")
        log.append(InboxSpliced(target="next-turn", start=0, inserted=(queued,)))
    schema = schema_file(tmp_path)
    replies = [{"text": "They pass."}, {"text": '{"verdict": "pass", "failures": 0}'}]
    with MockModelServer(replies) as server:
        result = await asyncio.to_thread(
            run, "resume", "--json", "--model", f"{server.base_url}#mock", "--output-schema",
            str(schema), str(folder), cwd=tmp_path, environ=home(tmp_path),
        )  # fmt: skip
        bodies = [r.body for r in server.requests]
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1])["output"] == {
        "verdict": "pass",
        "failures": 0,
    }
    assert [(m["source"], m["content"][:14]) for m in user_messages(folder)] == [
        ("user", "Run the tests."),
        ("output-schema", "Output format:"),
    ]
    assert json.dumps(VERDICT) in bodies[-1]["messages"][-1]["content"]


def test_a_sigint_during_the_retry_turn_exits_130_and_writes_nothing(tmp_path: Path) -> None:
    schema = schema_file(tmp_path)
    out = tmp_path / "answer.json"
    long_step: dict[str, Any] = {
        "text": "Checking again.",
        "tool_calls": [{"name": "bash", "arguments": {"command": LONG}}],
    }
    replies = [{"text": "All pass."}, long_step, {"text": "Stopped."}]
    with MockModelServer(replies) as server:
        proc = start(
            "run", "--json", "--model", f"{server.base_url}#mock", "--output-schema", str(schema),
            "-o", str(out), "Run the tests.", cwd=tmp_path, environ=home(tmp_path),
        )  # fmt: skip
        read_until(proc, is_tool_output)  # the retry turn's tool runs
        os.killpg(proc.pid, signal.SIGINT)
        code, events, err = finish(proc)
    assert code == 130, err
    summary = events[-1]
    assert summary["turns"] == 2 and summary["ended"]["kind"] == "aborted"
    assert "output" not in summary and "failure" not in summary
    assert "did not match" not in err
    assert not out.exists()


def test_an_output_file_that_cannot_be_written_at_the_end_is_one_line_and_exit_1(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "results"
    folder.mkdir()
    out = folder / "last.txt"
    remove: dict[str, Any] = {
        "text": "Cleaning.",
        "tool_calls": [{"name": "bash", "arguments": {"command": f"rm -r {folder}"}}],
    }
    with MockModelServer([remove, {"text": "Clean."}]) as server:
        result = job(tmp_path, server, "-o", str(out))
    assert result.returncode == 1, result.stderr
    line = f"andon: cannot write --output-last-message {out}: No such file or directory"
    assert line in result.stderr.splitlines(), result.stderr
    summary = json.loads(result.stdout.splitlines()[-1])
    assert summary["exit_code"] == 1 and summary["failure"] == line.removeprefix("andon: ")
    assert summary["final_text"] == "Clean."
