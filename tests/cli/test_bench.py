"""`andon bench` runs end to end, once per scenario, so the benchmark cannot rot.

No timing is asserted here (shared machines are noisy; the figures live in benchmarks/README.md).
What is asserted is what must hold on any machine: every scenario runs and reports, no andon
scenario leaves a process or writes after its stop, and the naive reference shows what it leaves.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from andon.cli.bench import register, run
from andon.cli.bench._interrupt import SCENARIOS
from andon.testing import why_no_engine


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="andon")
    register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["bench", *argv])


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> Any:
    assert run(parse(*argv, "--json")) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_every_interrupt_scenario_runs_once(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, "interrupt", "--runs", "1", "--remote", "off")
    assert list(data["scenarios"]) == list(SCENARIOS)
    for name, result in data["scenarios"].items():
        assert result["latency"]["n"] == 1, name
        # CPU beside wall: a stop costs andon and its worker some, never more than it took
        # on two cores (a generous bound: the figure is a sum over threads and processes)
        if not result["reference"]:
            assert 0 < result["cpu"]["p50"] <= 2 * result["latency"]["max"] + 0.05, name
        if name == "naive":
            # terminate() ends bash only: its jobs, the escapee and the daemon live on
            assert result["reference"] and result["survivors_max"] > 0
        else:
            assert result["survivors_max"] == 0, name
            assert result["bytes_after_max"] == 0, name
    for name in ("stream", "stall", "coop-tool", "shell", "trap-int", "stubborn", "tree"):
        assert data["scenarios"][name]["floor"]["n"] == 1, name
    assert data["scenarios"]["tree"]["floor_leaves_max"] > 0  # bare killpg leaves the escapees
    assert data["scenarios"]["trap-int"]["ended_by"] == {"term": 1}
    assert data["scenarios"]["stubborn"]["ended_by"] == {"kill": 1}
    assert data["scenarios"]["parallel"]["ended_by"] == {"interrupt": 8}


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_dispatch_runs_with_tcp_and_container_rows(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, "dispatch", "--runs", "1")
    assert data["noop_ratio_p50"] > 0
    assert set(data["calls_per_second"]) == {"1", "2", "4"}
    # CPU time beside wall time, for every path and floor, and for each pool size.
    assert all(row["cpu"] > 0 for row in data["round_trip"].values()), data["round_trip"]
    noop = data["round_trip"]["no-op Python tool through the pool"]
    assert data["noop_cpu_per_call"] == noop["cpu"]
    assert set(data["cpu_per_call_by_workers"]) == {"1", "2", "4"}
    assert all(cpu > 0 for cpu in data["cpu_per_call_by_workers"].values())
    # An MCP call beside the server's own round trip (the test extra installs the SDK).
    assert data["mcp"] == "measured"
    assert data["round_trip"]["MCP echo call through andon"]["n"] >= 5
    assert data["round_trip"]["MCP echo: the server's own round trip (floor)"]["n"] >= 5
    remote = data["remote"]
    assert remote["raw zmq round trip, tcp + CURVE loopback (floor)"]["n"] >= 5
    assert remote["bash -c true through a tcp + CURVE worker"]["n"] >= 5
    if why_no_engine() is None:  # else the text says why the container rows are missing
        assert remote["bash -c true through a container worker"]["n"] >= 5
        assert remote["bare container create + start (floor)"]["n"] >= 3


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_interrupt_gains_rows_by_where_the_worker_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = run_json(capsys, "interrupt", "--runs", "1", "--scenario", "shell")
    remote = data["remote"]
    for row in (
        "bare: SIGINT to a sleeping process + wait (floor)",
        "cancel -> result, local worker",
        "cancel -> result, tcp + CURVE worker",
    ):
        assert remote[row]["n"] >= 5, row
    if why_no_engine() is None:
        assert remote["cancel -> result, container worker"]["n"] >= 5


def test_engine_and_image_go_together() -> None:
    assert run(parse("dispatch", "--engine", "unix:///nowhere.sock")) == 2


def test_a_users_image_runs_its_own_andon_as_the_invoking_user(tmp_path: Path) -> None:
    """--engine URL --image IMAGE: the image's own ``andon`` (this machine's interpreter path
    means nothing inside a real image), nothing of this machine mounted but the workspace, and
    the invoking user's ids (the workspace and the pool's socket folder are theirs). No engine
    is reached here: a real image built from the recipe is benchmarked by hand (docs/scale-out.md,
    Building the worker image)."""
    from andon.cli.bench._remote import _container_launcher, engine_for_bench

    with engine_for_bench("unix:///nowhere.sock", "localhost/mine:1") as engine:
        assert not isinstance(engine, str)
        launcher = _container_launcher(engine, str(tmp_path))
    assert launcher.command == ("andon",)
    assert [(m.source, m.read_only) for m in launcher.mounts] == [(str(tmp_path), False)]
    assert launcher.user == f"{os.getuid()}:{os.getgid()}"  # no socket there: not rootless


def test_recovery_runs(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, "recovery", "--max-events", "1000")
    assert [row["events"] for row in data["recovery"]] == [1000]
    assert [row["durability"] for row in data["append"]] == ["none", "barrier", "every-record"]


def test_table_through_python_m() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "andon",
            "bench",
            "interrupt",
            "--runs",
            "1",
            "--scenario",
            "shell",
            "--remote",
            "off",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "scenario" in out.stdout and "shell" in out.stdout
    # stderr is a pipe here: no progress bar, no carriage return, no escape code, but plain lines
    assert "\r" not in out.stderr and "\033" not in out.stderr, repr(out.stderr[:200])
    assert "andon bench: interrupt: shell: 1 of 1\n" in out.stderr
    assert "andon bench: interrupt: shell floor: 1 of 1\n" in out.stderr


def test_plain_progress_says_what_and_how_far_at_a_bounded_rate() -> None:
    import io

    from andon.cli.bench._command import Progress

    now = [0.0]
    stream = io.StringIO()
    progress = Progress(stream, every=10.0, clock=lambda: now[0])
    progress.kind = "interrupt"
    for i in range(100):  # a run a second: 100 s of the scenario
        progress("stream", i, 100)
        now[0] += 1.0
    progress.end()
    progress("stream floor", 0, 2)
    lines = stream.getvalue().splitlines()
    assert lines[0] == "andon bench: interrupt: stream: 1 of 100"
    assert "andon bench: interrupt: stream: 11 of 100" in lines
    assert lines[-2:] == [
        "andon bench: interrupt: stream: 100 of 100",
        "andon bench: interrupt: stream floor: 1 of 2",  # a new measurement shows at once
    ]
    assert len(lines) == 12  # the first, one each 10 s, the last, the next's first
    assert "\r" not in stream.getvalue() and "\033" not in stream.getvalue()


def test_plot_without_matplotlib_says_what_to_install(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # makes `import matplotlib` fail
    assert run(parse("interrupt", "--plot", "x.png")) == 2
    assert "pip install andon[plot]" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv", [("--scenario", "nope"), ("--grace", "1"), ("--runs", "0")], ids=str
)
def test_usage_errors_exit_2(argv: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    assert run(parse("interrupt", *argv)) == 2
    assert "andon bench:" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_exit_runs_andon_beside_the_bare_baseline(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, "exit", "--runs", "2")
    assert data["andon"]["latency"]["n"] == 2 and data["baseline"]["latency"]["n"] == 2
    assert data["andon"]["exit_codes"] == [130] and data["andon"]["survivors_max"] == 0
    # The baseline stops only its child's group: the escapee and the daemon live on (and are
    # then killed by their tag), which is what sets it apart from a complete stop.
    assert data["baseline"]["survivors_max"] > 0
    assert isinstance(data["goal_met"], bool)
    # CPU beside wall: the whole run of each (an interpreter at least: tens of milliseconds)
    assert data["andon"]["cpu"]["p50"] > 0.01 and data["baseline"]["cpu"]["p50"] > 0.01
    assert 0 < data["andon"]["to_turn_end"]["p50"] < data["andon"]["latency"]["max"]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_startup_times_the_first_tool_and_counts_the_whole_jobs_cpu(
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = run_json(capsys, "startup", "--runs", "2")
    andon = data["andon"]
    assert andon["exit_codes"] == [0] and andon["first_tool"]["n"] == 2
    # The tool runs before the run ends, and after at least an interpreter's start.
    assert 0 < andon["first_tool"]["p50"] <= andon["wall"]["max"]
    floors = data["floors"]
    assert list(floors) == ["python -c pass", "import andon.cli", "import andon.workers"]
    assert floors["python -c pass"]["exit_codes"] == [0]
    # The whole job's CPU counts the forkserver and the workers, each an interpreter that imports
    # the worker side: more than one such floor, whatever the machine's speed.
    assert andon["cpu"]["p50"] > floors["import andon.workers"]["cpu"]["p50"]
    assert isinstance(data["cpu_goal_met"], bool) and isinstance(data["first_tool_goal_met"], bool)


@pytest.mark.timeout(180)  # its own wait is 120 s: a loaded runner takes ~40 s
def test_progress_shows_on_a_terminal() -> None:
    import pexpect

    child = pexpect.spawn(
        sys.executable,
        ["-m", "andon", "bench", "recovery", "--max-events", "1000"],
        timeout=120,
        encoding="utf-8",
    )
    try:
        child.expect(r"recovery\s+\[#")  # the bar, drawn in place on the terminal
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0


def test_exit_waits_for_the_tool_s_ready_line_not_for_the_command_text() -> None:
    """andon's tool/call and assistant/chunk lines hold the command (``echo ready``) before the
    tool runs: a SIGINT sent then would measure a stop at the wrong moment."""
    import io

    from andon.cli.bench._exit import _until_ready

    call = {"type": "tool/call", "data": {"arguments": '{"command": "echo ready"}'}}
    output = {"type": "tool/output", "call_id": "c1-1-1", "text": "ready\n"}
    lines = [json.dumps(call).encode() + b"\n", json.dumps(output).encode() + b"\n", b"after\n"]
    stream = io.BytesIO(b"".join(lines))
    _until_ready(stream)
    assert stream.read() == b"after\n"  # it stopped at the tool's own line, not before
    with pytest.raises(RuntimeError):
        _until_ready(io.BytesIO(lines[0]))


SMALL_JOB = ("--steps", "30", "--output-bytes", "4096", "--window", "6000")


@pytest.mark.slow
@pytest.mark.timeout(240)  # ~7 s on an idle 2-core machine: two runs of 31 requests
def test_context_keeps_every_request_within_the_window(capsys: pytest.CaptureFixture[str]) -> None:
    data = run_json(capsys, "context", *SMALL_JOB)
    with_, without, floor = data["with"], data["without"], data["floor"]
    assert with_["step_requests"] == without["step_requests"] == 31  # 30 steps and the answer
    # With compaction every request fits the window; the job without it outgrows it many times.
    assert with_["requests_over_window"] == 0 and with_["refused"] == 0
    assert with_["prompt_tokens_per_step"]["max"] <= 6000
    assert without["prompt_tokens_per_step"]["max"] > 4 * with_["prompt_tokens_per_step"]["max"]
    assert without["requests_over_window"] > 0 and without["summary_calls"] == 0
    assert with_["summary_calls"] >= 1 and with_["summary_prompt_tokens"] > 0
    assert data["ratio_without_with"] > 2
    assert (
        without["prompt_tokens_total"] > with_["prompt_tokens_total"] > floor["prompt_tokens_total"]
    )
    assert floor["prompt_tokens_per_step"]["max"] < with_["prompt_tokens_per_step"]["max"]
    assert 0 < with_["usd"] < without["usd"]


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_context_table_through_python_m() -> None:
    # Smaller still: the table's rows and the progress lines, with one compaction in it.
    job = ("--steps", "12", "--output-bytes", "4096", "--window", "4000")
    out = subprocess.run(
        [sys.executable, "-m", "andon", "bench", "context", *job],
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert out.returncode == 0, out.stderr
    rows = {line.split("  ")[0].strip(): line.split() for line in out.stdout.splitlines()}
    assert {"with compaction", "without", "floor"} <= set(rows)
    assert rows["with compaction"][-1] == "0"  # over the window
    largest = {
        name: int(rows[name][-9].replace(",", "")) for name in ("with compaction", "without")
    }
    assert largest["with compaction"] <= 4000 < largest["without"]
    assert "without / with, total prompt tokens:" in out.stdout
    assert "andon bench: context: with compaction: 12 of 12\n" in out.stderr
    assert "andon bench: context: without: 12 of 12\n" in out.stderr


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (("--steps", "0"), "--steps must be at least 1"),
        (("--output-bytes", "0"), "--output-bytes must be 1 to"),
        (("--output-bytes", "16385"), "--output-bytes must be 1 to 16,384"),
        (("--window", "100"), "--window must be at least 2048"),
    ],
    ids=str,
)
def test_context_usage_errors_exit_2(
    argv: tuple[str, ...], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(parse("context", *argv)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"andon bench: {said}") and err.count("\n") == 1, err


def test_the_context_floor_is_the_system_prompt_the_task_and_the_newest_step() -> None:
    from andon.cli.bench._context import _floor
    from andon.testing import mock_prompt_tokens

    def step(n: int) -> list[dict[str, Any]]:
        call = {"id": f"c{n}", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
        return [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{n}", "content": str(n) * 5000},
        ]

    head = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "print"}]
    tools = [{"type": "function", "function": {"name": "bash"}}]
    body = {"messages": [*head, *step(1), *step(2), *step(3)], "tools": tools}
    assert _floor(body) == mock_prompt_tokens({"messages": [*head, *step(3)], "tools": tools})
    assert _floor({"messages": head, "tools": tools}) == mock_prompt_tokens(
        {"messages": head, "tools": tools}
    )


def test_library_warnings_carry_the_andon_prefix() -> None:
    # A warning of andon's own loggers while bench runs (as the pool logs a lost or killed
    # worker) is an "andon: ..." line like every other command's, not a bare one.
    code = (
        "import logging, sys\n"
        "from andon.cli._main import main\n"
        "code = main(['bench', 'interrupt', '--runs', '1', '--scenario', 'shell', "
        "'--remote', 'off'])\n"
        "logging.getLogger('andon.pool').warning('worker w9 is lost: probe')\n"
        "sys.exit(code)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "andon: worker w9 is lost: probe\n" in out.stderr, out.stderr
    assert not any(line.startswith("worker w9") for line in out.stderr.splitlines())
