"""``andon bench context``: what compaction saves (docs/benchmarks.md, The context figures).

A scripted job of ``steps`` bash steps, each printing ``output_bytes`` bytes, then a final answer,
run twice through a real agent (real workers, the real OpenAI-compatible adapter over HTTP)
against :class:`~andon.testing.MockModelServer`, which answers the summary calls:

* **with compaction**: the agent is given the window (``open_agent(context_window=W)``) and the
  server refuses any request over it, so a request over the window would show as a refusal;
* **without**: neither the agent nor the server has a window, so nothing is refused and nothing
  is compacted: what the same job costs when every step resends the whole history.

Every token figure is the server's count of a request (``RecordedRequest.prompt_tokens``: the
mock's one rule, the UTF-8 bytes of the JSON of the messages and the tools divided by 4), so the
two rows and the floor are counted alike. The **floor** of a step request is that request cut to
what its step cannot do without: the system prompt, the session's first user message (the task)
and the newest step's messages (the assistant's tool call and its result), with the same tools;
it is taken from the uncompacted run's requests, so it is measured in the same run.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import resource
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from andon.llm import ModelIdentity, OpenAICompatible
from andon.session import Record, ToolResult, TurnEnd
from andon.supervisor import open_agent
from andon.testing import SUMMARY_MARKER, MockModelServer, RecordedRequest, mock_prompt_tokens

from .._prices import BUILTIN, cost
from ._stats import percentile, table

__all__ = ["MAX_OUTPUT_BYTES", "MIN_WINDOW", "PRICED_AS", "run_context"]

PRICED_AS: Final = "deepseek-v4-flash"
"""The built-in price the cost column uses (src/andon/cli/_prices.py)."""
MAX_OUTPUT_BYTES: Final = 16 * 1024
"""The largest ``--output-bytes``: a tool result keeps the head and the tail of a longer output
(8 KiB each, the executor's default), so a larger one would measure that cut, not compaction."""
MIN_WINDOW: Final = 2048
"""The smallest ``--window``: the system prompt, the tool schemas and the task take about 650 of
the mock's tokens, and a window must also hold a step and the room kept for the reply."""
TASK: Final = "Print the blocks, one bash call a step, then say you are done."
SUMMARY: Final = (
    "Summary: the task is to print blocks of text with bash, one call a step. Every block so "
    "far was printed and exited 0; nothing failed. What remains: the remaining blocks, then "
    "say done."
)
FINAL: Final = "All blocks printed."
_TOKEN_BYTES: Final = 4  # the mock's rule (andon.testing.mock_prompt_tokens), for replies too


def _command(size: int) -> str:
    return f"printf '%{size}s' | tr ' ' a"


def _replies(steps: int, size: int) -> list[dict[str, Any]]:
    call = {"tool_calls": [{"name": "bash", "arguments": {"command": _command(size)}}]}
    return [*([call] * steps), {"text": FINAL}]


def _reply_tokens(text: str) -> int:
    return math.ceil(len(text.encode()) / _TOKEN_BYTES)


def _is_summary(request: RecordedRequest) -> bool:
    messages = request.body.get("messages") if isinstance(request.body, dict) else None
    return bool(messages) and SUMMARY_MARKER in json.dumps(messages[-1])  # type: ignore[index]


def _cpu_seconds() -> float:
    """User + system CPU of this process and of every child it has reaped (the workers, and
    through them the tool processes they reaped)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


async def _job(
    name: str, steps: int, size: int, window: int | None, folder: Path, progress: Any
) -> dict[str, Any]:
    """One run of the job; returns the server's requests and what the run took."""
    workspace = folder / "workspace"
    workspace.mkdir(parents=True)
    results = 0
    ends: list[dict[str, Any]] = []
    wall = time.perf_counter()
    cpu = _cpu_seconds()
    async with (
        MockModelServer(_replies(steps, size), context_window=window, summaries=SUMMARY) as server,
        OpenAICompatible(server.base_url, "mock", api_key_env=None) as model,
    ):
        async with open_agent(
            folder / "session", model=model, cwd=workspace, context_window=window
        ) as agent:
            stream = agent.events()
            agent.followup(TASK)
            progress(name, 0, steps)
            async for item in stream:
                match item:
                    case Record(data=ToolResult()):
                        results += 1
                        if results < steps:
                            progress(name, results, steps)
                    case Record(data=TurnEnd(reason=reason)):
                        ends.append(reason.to_json())
                        break
                    case _:
                        pass
            await agent.when_idle()
        requests = server.requests
        overflows = server.overflows
    wall = time.perf_counter() - wall
    cpu = _cpu_seconds() - cpu
    return {
        "requests": requests,
        "overflows": overflows,
        "results": results,
        "end": ends[0] if ends else {"kind": "none"},
        "wall_s": wall,
        "cpu_s": cpu,
    }


def _floor(body: dict[str, Any]) -> int:
    """The floor of one step request: the system prompt, the first user message and the newest
    step's messages (from the last assistant message on; nothing at the first step), with the
    request's tools, counted by the mock's rule."""
    messages: list[dict[str, Any]] = body["messages"]
    head = messages[:2]  # the system prompt, the task
    last = max(
        (i for i, m in enumerate(messages) if i >= 2 and m.get("role") == "assistant"),
        default=len(messages),
    )
    return mock_prompt_tokens({"messages": [*head, *messages[last:]], "tools": body.get("tools")})


def _spread(values: Sequence[int]) -> dict[str, int]:
    return {
        "median": int(percentile(values, 50)),
        "p95": int(percentile(values, 95)),
        "max": max(values),
    }


def _usd(prompt: int, completion: int) -> float:
    found = cost(
        {"prompt_tokens": prompt, "completion_tokens": completion},
        ModelIdentity(PRICED_AS, "deepseek", PRICED_AS),
        {},
    )
    assert found is not None  # a built-in spec always has a price
    return float(found["usd"])


def _row(run: dict[str, Any], window: int, size: int) -> dict[str, Any]:
    requests: list[RecordedRequest] = list(run["requests"])
    summaries = [r for r in requests if _is_summary(r)]
    steps = [r for r in requests if not _is_summary(r)]
    step_tokens = [r.prompt_tokens or 0 for r in steps]
    summary_tokens = sum(r.prompt_tokens or 0 for r in summaries)
    # Replies by the same rule (bytes / 4): the tool calls' arguments, the final answer and the
    # summaries. A refused request got no reply.
    answered = len(steps) - run["overflows"]
    call_tokens = _reply_tokens(json.dumps({"command": _command(size)}))
    completion = (
        max(0, answered - 1) * call_tokens
        + _reply_tokens(FINAL)
        + len(summaries) * _reply_tokens(SUMMARY)
    )
    prompt = sum(step_tokens) + summary_tokens
    return {
        "completed": run["end"].get("kind") == "completed" and run["results"] >= 1,
        "end": run["end"],
        "step_requests": len(steps),
        "prompt_tokens_per_step": _spread(step_tokens),
        "last_step_prompt_tokens": step_tokens[-1],
        "summary_calls": len(summaries),
        "summary_prompt_tokens": summary_tokens,
        "prompt_tokens_total": prompt,
        "completion_tokens_total": completion,
        "usd": _usd(prompt, completion),
        "wall_s": round(run["wall_s"], 3),
        "cpu_s": round(run["cpu_s"], 3),
        "requests_over_window": sum(1 for r in requests if (r.prompt_tokens or 0) > window),
        "refused": run["overflows"],
    }


def _floor_row(without: dict[str, Any]) -> dict[str, Any]:
    requests: list[RecordedRequest] = list(without["requests"])
    floors = [_floor(r.body) for r in requests if not _is_summary(r)]
    return {
        "prompt_tokens_per_step": _spread(floors),
        "last_step_prompt_tokens": floors[-1],
        "prompt_tokens_total": sum(floors),
        "usd": _usd(sum(floors), 0),
    }


def _text(data: dict[str, Any]) -> str:
    rows = []
    for name, key in (("with compaction", "with"), ("without", "without")):
        r = data[key]
        per = r["prompt_tokens_per_step"]
        rows.append(
            [
                name,
                f"{per['median']:,}",
                f"{per['p95']:,}",
                f"{per['max']:,}",
                f"{r['prompt_tokens_total']:,}",
                f"{r['summary_calls']} / {r['summary_prompt_tokens']:,}",
                f"{r['usd']:.4f}",
                f"{r['wall_s']:.1f}",
                f"{r['cpu_s']:.1f}",
                r["requests_over_window"],
            ]
        )
    f = data["floor"]
    per = f["prompt_tokens_per_step"]
    rows.append(
        [
            "floor",
            f"{per['median']:,}",
            f"{per['p95']:,}",
            f"{per['max']:,}",
            f"{f['prompt_tokens_total']:,}",
            "—",
            f"{f['usd']:.4f}",
            "—",
            "—",
            "—",
        ]
    )
    headers = [
        "run",
        "median",
        "p95",
        "max",
        "total",
        "summaries / tokens",
        "USD",
        "wall s",
        "CPU s",
        "over window",
    ]
    w = data["without"]
    return "\n".join(
        [
            f"prompt tokens per step request and over the job: {data['steps']} bash steps of "
            f"{data['output_bytes']:,} bytes, then an answer; window {data['window']:,} tokens",
            "tokens: the server's count of each request (UTF-8 bytes of its messages and tools "
            "as JSON / 4); total includes the summary calls' prompts",
            f"USD: {PRICED_AS} prices, every prompt token a cache miss, replies by the same "
            "rule; CPU: this process and the processes it reaped",
            "floor: each step request cut to the system prompt, the task and that step's own "
            "call and output (from the run without)",
            table(headers, rows),
            f"without / with, total prompt tokens: {data['ratio_without_with']:.1f}×; "
            f"with / floor: {data['ratio_with_floor']:.1f}×; the last request without "
            f"compaction (the ceiling): {w['last_step_prompt_tokens']:,} tokens, "
            f"{w['last_step_prompt_tokens'] / data['window']:.0f}× the window",
        ]
    )


async def _measure(
    steps: int, output_bytes: int, window: int, progress: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="andon-bench-") as tmp:
        with_run = await _job(
            "context: with compaction", steps, output_bytes, window, Path(tmp) / "with", progress
        )
        without_run = await _job(
            "context: without", steps, output_bytes, None, Path(tmp) / "without", progress
        )
    return with_run, without_run


def run_context(
    steps: int, output_bytes: int, window: int, progress: Any
) -> tuple[dict[str, Any], str, str | None]:
    """Both runs and the floor; returns (the JSON object, the text table, None) or, when a run
    did not complete, (the JSON object, "", one line saying why)."""
    with_run, without_run = asyncio.run(_measure(steps, output_bytes, window, progress))
    with_row = _row(with_run, window, output_bytes)
    without_row = _row(without_run, window, output_bytes)
    for name, row in (("with compaction", with_row), ("without", without_row)):
        if not row["completed"]:
            end = row["end"]
            why = end.get("error", {}).get("message") or end.get("kind")
            return (
                {"with": with_row, "without": without_row},
                "",
                f"the job {name} did not complete under --window {window}: {why}",
            )
    floor = _floor_row(without_run)
    data: dict[str, Any] = {
        "steps": steps,
        "output_bytes": output_bytes,
        "window": window,
        "priced_as": PRICED_AS,
        "price_usd_per_million": {
            "prompt_cache_miss": BUILTIN[PRICED_AS].input_cache_miss,
            "output": BUILTIN[PRICED_AS].output,
        },
        "token_rule": "UTF-8 bytes of json.dumps([messages, tools]) / 4, rounded up",
        "with": with_row,
        "without": without_row,
        "floor": floor,
        "ratio_without_with": round(
            without_row["prompt_tokens_total"] / with_row["prompt_tokens_total"], 2
        ),
        "ratio_with_floor": round(
            with_row["prompt_tokens_total"] / floor["prompt_tokens_total"], 2
        ),
        "cores": os.cpu_count(),
    }
    return data, _text(data), None
