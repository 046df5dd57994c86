"""`andon chat` in a real pseudo-terminal (pexpect): real workers, real keys.

What the tests wait for is the chat's permanent lines (``▶`` when a tool call starts, ``queued
follow-up``, ``■ turn N ended``, the stopping status lines), never a sleep. The live area (spinner,
tails) is redrawn by prompt_toolkit as a diff of the screen, so a marker in it is only awaited
when it is a word printed once (``STARTED``, ``ARMED``). :func:`screen` replays the pty's bytes on
a small screen model to get what a person would see (docs/terminal.md holds one such capture).
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest

from tests.cli.support import assert_balanced, env, records, script

PYTHON = sys.executable
STUBBORN = "trap '' INT TERM; echo AR\\MED; for i in $(seq 1 600); do echo tick $i; sleep 0.1; done"
# Both print a word their command line does not contain (bash drops the backslash): the tool runs.
LONG = "echo STAR\\TED; for i in $(seq 1 600); do echo step $i; sleep 0.1; done"
TIMEOUT = 20


def spawn(tmp_path: Path, model: str, *extra: str) -> pexpect.spawn[str]:
    child: pexpect.spawn[str] = pexpect.spawn(
        PYTHON,
        [
            *("-m", "andon", "chat", "--model", model, "--session", str(tmp_path / "s")),
            *("--workers", "1", *extra),
        ],
        cwd=str(tmp_path),
        env=env(PROMPT_TOOLKIT_NO_CPR="1", COLUMNS="100", LINES="30"),
        dimensions=(30, 100),
        encoding="utf-8",
        timeout=TIMEOUT,
    )
    child.logfile_read = _Capture()
    child.expect("›")
    return child


class _Capture:
    """Everything the pty printed (pexpect's logfile_read protocol)."""

    def __init__(self) -> None:
        self.parts: list[str] = []

    def write(self, text: str) -> None:
        self.parts.append(text)

    def flush(self) -> None:
        pass

    def text(self) -> str:
        return "".join(self.parts)


def printed(child: pexpect.spawn[str]) -> str:
    """What ``child`` printed so far (its logfile_read is a :class:`_Capture`)."""
    capture = child.logfile_read
    assert isinstance(capture, _Capture)
    return capture.text()


@pytest.fixture
def children() -> Iterator[list[pexpect.spawn[str]]]:
    """Chats are closed (SIGKILL to their process, their workers follow) if a test fails."""
    started: list[pexpect.spawn[str]] = []
    yield started
    for child in started:
        if child.isalive():
            child.close(force=True)


def quit_chat(child: pexpect.spawn[str]) -> str:
    child.sendcontrol("d")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, screen(printed(child))
    return screen(printed(child))


def expect_screen(child: pexpect.spawn[str], pattern: str) -> None:
    """Wait until what a person sees matches ``pattern``: the prompt is redrawn as a diff of
    the screen, so a changed status line is not one run of bytes in what the pty printed."""
    regex = re.compile(pattern)
    deadline = time.monotonic() + TIMEOUT
    while not regex.search(screen(printed(child))):
        left = deadline - time.monotonic()
        if left <= 0:
            raise AssertionError(f"never on the screen: {pattern}\n{screen(printed(child))}")
        with contextlib.suppress(pexpect.TIMEOUT):
            child.read_nonblocking(65536, timeout=min(left, 1.0))  # into the capture


def two_turns(tmp_path: Path, command: str = LONG) -> str:
    return script(
        tmp_path / "script.json",
        [
            {
                "text": "Building.",
                "tool_calls": [{"name": "bash", "arguments": {"command": command}}],
            },
            {"text": "Built it."},
            {"text": "Second answer.", "chunk_delay": 0.02},
            {"text": "Third answer."},
        ],
    )


def user_messages(session: Path) -> list[tuple[int, str]]:
    out = []
    for r in records(session):
        if r["type"] == "user/message":
            out.append((r["data"]["turn"], r["data"]["message"]["content"]))
    return out


def test_typing_while_the_agent_works_queues_a_followup_that_runs_next(
    tmp_path: Path, children: list[pexpect.spawn[str]]
) -> None:
    model = two_turns(tmp_path, "echo compiling; sleep 1.5; echo compiled")
    child = spawn(tmp_path, model)
    children.append(child)
    child.send("build it\r")
    child.expect("▶ c1-1-1 bash")
    child.send("and then test it\r")
    child.expect("queued follow-up: and then test it")
    child.expect("turn 1 ended: completed")
    child.expect("Second answer.")
    child.expect("turn 2 ended: completed")
    shown = quit_chat(child)
    assert "compiled" in shown
    assert user_messages(tmp_path / "s") == [(1, "build it"), (2, "and then test it")]
    assert "2 turns, 1 tool call" in shown


def test_ctrl_c_cancels_the_turn_and_the_prompt_comes_back(
    tmp_path: Path, children: list[pexpect.spawn[str]]
) -> None:
    child = spawn(tmp_path, two_turns(tmp_path))
    children.append(child)
    child.sendcontrol("c")  # idle: only clears the line
    child.send("build it\r")
    child.expect("STARTED")
    child.sendcontrol("c")
    child.expect(r"stopping \(Ctrl-C\)")
    child.expect(r"turn 1 ended \[stopped\]: aborted \(user\)")
    child.send("next\r")  # the prompt works again: a new turn runs
    child.expect("Built it.")
    child.expect("turn 2 ended: completed")
    shown = quit_chat(child)
    assert "◀ c1-1-1 [stopped: aborted by user; SIGINT" in shown, shown
    assert_balanced(tmp_path / "s")


def test_cancel_keep_keeps_the_queue(tmp_path: Path, children: list[pexpect.spawn[str]]) -> None:
    child = spawn(tmp_path, two_turns(tmp_path))
    children.append(child)
    child.send("build it\r")
    child.expect("▶ c1-1-1 bash")
    child.send("queued one\r")
    child.expect("queued follow-up: queued one")
    child.send("/cancel keep\r")
    child.expect(r"canceled; 1 queued item\(s\) kept")
    child.expect(r"turn 1 ended \[stopped\]")
    # The queue is visible: the status line under the printed lines says so.
    expect_screen(child, r"\[idle · queued: 1 follow-up\(s\)\]")
    child.send("\r")  # Enter on an empty line runs the parked work
    child.expect("running the queued work")
    child.expect("turn 2 ended: completed")
    quit_chat(child)
    session = tmp_path / "s"
    assert user_messages(session) == [(1, "build it"), (2, "queued one")]
    splices = [r for r in records(session) if r["type"] == "agent/inbox/spliced"]
    assert not [r for r in splices if r["data"].get("outcome") == "canceled"]


def test_quitting_discards_a_kept_queue_on_record(
    tmp_path: Path, children: list[pexpect.spawn[str]]
) -> None:
    # /cancel keep parks the queue for this chat; quitting disposes the agent, and disposal is
    # cancel(Disposed()), which clears the inbox durably: a later chat never runs it unasked.
    child = spawn(tmp_path, two_turns(tmp_path))
    children.append(child)
    child.send("build it\r")
    child.expect("▶ c1-1-1 bash")
    child.send("queued one\r")
    child.expect("queued follow-up: queued one")
    child.send("/cancel keep\r")
    child.expect(r"turn 1 ended \[stopped\]")
    quit_chat(child)
    canceled = [
        r
        for r in records(tmp_path / "s")
        if r["type"] == "agent/inbox/spliced" and r["data"].get("outcome") == "canceled"
    ]
    assert len(canceled) == 1
    model = script(tmp_path / "again.json", [{"text": "A new answer."}])
    again = spawn(tmp_path, model)  # resumes the session folder
    children.append(again)
    again.send("something new\r")
    again.expect("A new answer.")
    again.expect("turn 2 ended: completed")
    quit_chat(again)
    assert "parked" not in screen(printed(again))
    assert user_messages(tmp_path / "s") == [(1, "build it"), (2, "something new")]


def test_plain_cancel_drops_the_queue(tmp_path: Path, children: list[pexpect.spawn[str]]) -> None:
    child = spawn(tmp_path, two_turns(tmp_path))
    children.append(child)
    child.send("build it\r")
    child.expect("▶ c1-1-1 bash")
    child.send("queued one\r")
    child.expect("queued follow-up: queued one")
    child.sendcontrol("c")
    child.expect(r"turn 1 ended \[stopped\]")
    shown = quit_chat(child)
    # The screen says what the log says: the follow-up was dropped, not run.
    assert "dropped 1 queued follow-up (/cancel keep cancels and keeps the queue)" in shown, shown
    session = tmp_path / "s"
    assert user_messages(session) == [(1, "build it")]
    canceled = [
        r
        for r in records(session)
        if r["type"] == "agent/inbox/spliced" and r["data"].get("outcome") == "canceled"
    ]
    assert len(canceled) == 1


def test_steer_enters_the_running_turn(tmp_path: Path, children: list[pexpect.spawn[str]]) -> None:
    child = spawn(tmp_path, two_turns(tmp_path, "echo compiling; sleep 1; echo compiled"))
    children.append(child)
    child.send("build it\r")
    child.expect("▶ c1-1-1 bash")
    child.send("/steer use -j4\r")
    child.expect("steer: use -j4")
    child.expect("turn 1 ended: completed")
    child.send("go on\r")
    child.expect("Second answer.")  # streamed with a chunk delay
    child.expect("turn 2 ended")
    child.send("again\r")
    child.expect("Third answer.")
    child.expect("turn 3 ended")
    quit_chat(child)
    assert user_messages(tmp_path / "s") == [
        (1, "build it"),
        (1, "use -j4"),  # the step after the tool result
        (2, "go on"),
        (3, "again"),
    ]


def test_escape_cancels_the_turn(tmp_path: Path, children: list[pexpect.spawn[str]]) -> None:
    child = spawn(tmp_path, two_turns(tmp_path))
    children.append(child)
    child.send("build it\r")
    child.expect("STARTED")
    child.send("\x1b")
    child.expect(r"stopping \(Esc\)")
    child.expect(r"turn 1 ended \[stopped\]: aborted \(user\)")
    quit_chat(child)


def test_ctrl_d_while_a_tool_runs_quits_and_leaves_no_process(
    tmp_path: Path, children: list[pexpect.spawn[str]]
) -> None:
    child = spawn(tmp_path, two_turns(tmp_path))
    children.append(child)
    child.send("build it\r")
    child.expect("▶ c1-1-1 bash")
    shown = quit_chat(child)  # the conftest fails the test if a worker or the tool survived
    assert "quitting: stopping the running turn" in shown
    assert "aborted (disposed)" in shown
    assert_balanced(tmp_path / "s")


def test_the_screen_shows_the_stopping_status_while_a_stubborn_tool_drains(
    tmp_path: Path, children: list[pexpect.spawn[str]]
) -> None:
    child = spawn(tmp_path, two_turns(tmp_path, STUBBORN), "--grace", "0.5,1")
    children.append(child)
    child.send("build it\r")
    child.expect("▶ c1-1-1 bash")
    child.expect("ARMED")  # the trap is set
    child.sendcontrol("c")
    child.expect(r"stopping \(Ctrl-C\): canceling 1 tool call")
    child.expect(r"stopping: SIGINT sent to \d+ process(es)?, SIGTERM in 0.5 s")
    child.expect(r"stopping: SIGTERM sent to \d+ process(es)?, SIGKILL in 1 s")
    child.expect(r"◀ c1-1-1 \[.*SIGKILL")
    child.expect(r"turn 1 ended \[stopped\]")
    quit_chat(child)
    assert_balanced(tmp_path / "s")


def test_a_sigint_from_outside_cancels_the_turn_like_ctrl_c(
    tmp_path: Path, children: list[pexpect.spawn[str]]
) -> None:
    # A CI's timeout sends SIGINT to the process, not a key. It lands while the second prompt
    # runs (the line that started the turn ended the first one).
    child = spawn(tmp_path, two_turns(tmp_path))
    children.append(child)
    child.send("build it\r")
    child.expect("STARTED")
    child.kill(signal.SIGINT)
    child.expect(r"stopping \(SIGINT\): canceling 1 tool call")
    child.expect(r"turn 1 ended \[stopped\]: aborted \(user\)")
    child.send("next\r")
    child.expect("Built it.")
    child.expect("turn 2 ended: completed")
    quit_chat(child)


def test_a_second_ctrl_c_kills_now(tmp_path: Path, children: list[pexpect.spawn[str]]) -> None:
    child = spawn(tmp_path, two_turns(tmp_path, STUBBORN), "--grace", "30,30")
    children.append(child)
    child.send("build it\r")
    child.expect("ARMED")
    child.sendcontrol("c")
    child.expect(r"stopping: SIGINT sent to \d+ process")
    child.sendcontrol("c")
    child.expect("Ctrl-C again: killing 1 tool process group now")
    child.expect(r"turn 1 ended \[stopped\]")  # long before the 30 s grace
    shown = quit_chat(child)
    # The SIGTERM the force sends on its way announces the KILL that goes with it, no countdown.
    after = shown.split("killing 1 tool process group now", 1)[1]
    assert "SIGKILL in" not in after, shown
    assert re.search(r"SIGTERM sent to \d+ process(es)?, SIGKILL at once \(forced\)", after), shown


def test_tool_output_control_sequences_are_stripped(
    tmp_path: Path, children: list[pexpect.spawn[str]]
) -> None:
    command = r"printf '\033]0;pwned\007\033[31mred\033[0m\n50%%\r100%%\n\033[2Jdone\n'"
    child = spawn(tmp_path, two_turns(tmp_path, command))
    children.append(child)
    child.send("go\r")
    child.expect("turn 1 ended: completed")
    raw = printed(child)
    quit_chat(child)
    assert "\x1b]0;pwned" not in raw
    assert "\x1b[31mred" not in raw and "\x1b[2J" not in raw
    shown = screen(raw)
    assert "│ red" in shown and "│ 100%" in shown and "│ done" in shown


def test_andon_run_in_a_terminal_uses_the_rich_view(
    tmp_path: Path, children: list[pexpect.spawn[str]]
) -> None:
    andon = str(Path(sys.executable).parent / "andon")
    model = two_turns(tmp_path)
    child: pexpect.spawn[str] = pexpect.spawn(
        andon,
        ["run", "--model", model, "--session", str(tmp_path / "s"), "--workers", "1", "build"],
        cwd=str(tmp_path),
        env=env(COLUMNS="100", LINES="30"),
        dimensions=(30, 100),
        encoding="utf-8",
        timeout=TIMEOUT,
    )
    children.append(child)
    child.logfile_read = _Capture()
    child.expect("STARTED")  # the live tail (rich redraws whole lines)
    child.sendintr()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 130
    shown = screen(printed(child))
    assert "stopping (SIGINT): canceling 1 tool call" in shown, shown
    assert "◀ c1-1-1 [stopped: aborted by user" in shown
    assert "1 turn, 1 tool call" in shown and "exit 130" in shown


# -- a small screen model, enough for prompt_toolkit's and rich's output ------------------------

_SEQ = re.compile(r"\x1b\[([0-9;?]*)([ -/]*)([@-~])|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b.")


def screen(raw: str, rows: int = 30) -> str:
    """Replay ``raw`` (what the pty printed) on a screen with unlimited scrollback."""
    lines: list[list[str]] = [[]]
    row = col = 0
    pos = 0
    while pos < len(raw):
        m = _SEQ.match(raw, pos)
        if m:
            pos = m.end()
            final = m.group(3)
            params = (m.group(1) or "").lstrip("?")
            n = int(params.split(";")[0]) if params.split(";")[0].isdigit() else 1
            if final == "A":
                row = max(0, row - n)
            elif final == "B":
                row += n
            elif final == "C":
                col += n
            elif final == "D":
                col = max(0, col - n)
            elif final == "J":
                del lines[row][col:]
                del lines[row + 1 :]
            elif final == "K":
                del lines[row][col:]
            elif final in "Hf":
                parts = [int(p) if p else 1 for p in (m.group(1) or "1;1").split(";")]
                top = max(0, len(lines) - rows)
                row, col = top + parts[0] - 1, (parts[1] if len(parts) > 1 else 1) - 1
            while len(lines) <= row:
                lines.append([])
            continue
        ch = raw[pos]
        pos += 1
        if ch == "\r":
            col = 0
        elif ch == "\n":
            row += 1
            while len(lines) <= row:
                lines.append([])
        elif ch == "\b":
            col = max(0, col - 1)
        elif ch >= " ":
            line = lines[row]
            while len(line) < col:
                line.append(" ")
            if col < len(line):
                line[col] = ch
            else:
                line.append(ch)
            col += 1
    return "\n".join("".join(line).rstrip() for line in lines).rstrip() + "\n"


def capture_for_docs(tmp_path: Path) -> str:  # pragma: no cover - run by hand for docs
    """The screen of a session with a tool, a cancel and a summary (docs/terminal.md), and the
    bottom of the screen while the stubborn tool drains."""
    model = script(
        tmp_path / "script.json",
        [
            {
                "text": "Let me run the tests.",
                "tool_calls": [
                    {"name": "bash", "arguments": {"command": "ls; echo ok"}},
                ],
            },
            {
                "text": "Now the slow build.",
                "tool_calls": [{"name": "bash", "arguments": {"command": STUBBORN}}],
            },
            {"text": "Stopped, as you asked."},
        ],
    )
    (tmp_path / "README.md").write_text("hello\n")
    child = spawn(tmp_path, model, "--grace", "0.5,1")
    child.send("build the project\r")
    child.expect("ARMED")
    child.sendcontrol("c")
    child.expect(r"SIGTERM sent to \d+ processes, SIGKILL in 1 s")
    # sleep-ok: a docs capture, not a test: let the live countdown run a few redraws
    child.expect(pexpect.TIMEOUT, timeout=0.4)
    draining = screen(printed(child)).splitlines()[-8:]
    child.expect(r"turn 1 ended \[stopped\]")
    child.send("what happened?\r")
    child.expect("turn 2 ended")
    final = quit_chat(child)
    return final + "\n--- while the stubborn tool drains ---\n" + "\n".join(draining) + "\n"


if __name__ == "__main__":  # pragma: no cover
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        sys.stdout.write(capture_for_docs(Path(d)))


def test_chat_adds_the_project_instructions_and_reads_them_again_on_resume(
    tmp_path: Path, children: list[pexpect.spawn[str]]
) -> None:
    """docs/agent-loop.md, Project instructions: chat opens like run, and a chat on an existing
    session reads the files again instead of keeping (or doubling) the old ones."""
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(repo)], check=True, timeout=30)
    (repo / "AGENTS.md").write_text("ROOT-RULE one.\n")
    model = script(tmp_path / "script.json", [{"text": "Done."}])
    for _ in range(2):
        child = spawn(tmp_path, model, "--cwd", str(repo / "pkg"))
        children.append(child)
        quit_chat(child)
        (repo / "AGENTS.md").write_text("ROOT-RULE two.\n")
    opened = [r["data"] for r in records(tmp_path / "s") if r["type"].startswith("session/")]
    assert [d["project_instructions"]["files"][0]["path"] for d in opened] == ["AGENTS.md"] * 2
    first, again = (d["system_prompt"] for d in opened)
    assert first.endswith("--- AGENTS.md ---\nROOT-RULE one.\n")
    assert again.endswith("--- AGENTS.md ---\nROOT-RULE two.\n")
    assert again.count("# Project instructions") == 1 and "ROOT-RULE one." not in again
    assert_balanced(tmp_path / "s")


def test_compact_summarises_the_history_between_turns(
    tmp_path: Path, children: list[pexpect.spawn[str]]
) -> None:
    model = script(
        tmp_path / "script.json",
        [
            {"text": "First answer."},
            {"text": "Second answer."},
            {"text": "The user said hello; andon answered."},  # the summary call's reply
            {"text": "Third answer."},
        ],
    )
    child = spawn(tmp_path, model, "--context-window", "100000")
    children.append(child)
    for text, answer in (("hello", "First answer."), ("again", "Second answer.")):
        child.send(f"{text}\r")
        child.expect(answer)
        child.expect("ended: completed")
    child.send("/compact\r")
    child.expect("history compacted")
    child.send("and now\r")
    child.expect("Third answer.")
    child.expect("turn 3 ended: completed")
    quit_chat(child)
    log = records(tmp_path / "s")
    (compacted,) = [r["data"] for r in log if r["type"] == "context/compacted"]
    assert compacted["summary"] == "The user said hello; andon answered."
    assert "turn" not in compacted  # written between turns
    assert_balanced(tmp_path / "s")
