"""Shared test helpers: an agent-loop simulator that emits canonical record sequences, a validator
for OpenAI-style requests, and small file utilities.

The simulator (:class:`Sim`) follows docs/log-format.md, Typical sequences (claims, steps, tool
calls in model order, cancels). The golden-fixture generator and the property tests both use it,
so a fixture and a random log are built the same way.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from andon.base import Cause, ErrorCode, ManualClock, User
from andon.session import (
    INDEX_MIN_BYTES,
    AssistantChunk,
    AssistantMessage,
    AssistantReply,
    Completed,
    EventData,
    ExitStatus,
    InboxSpliced,
    LlmRequest,
    LlmRetry,
    McpServerEvent,
    ModelInfo,
    ReasoningBlock,
    Record,
    SessionLog,
    SessionResumed,
    SessionStart,
    StepEnd,
    StepStart,
    TextBlock,
    ToolCall,
    ToolCallBlock,
    ToolErrorInfo,
    ToolResult,
    ToolSignal,
    ToolStarted,
    TurnAborted,
    TurnEnd,
    TurnEndReason,
    TurnStart,
    UserMessage,
    UserMessageEntered,
    encode_line,
)

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "data" / "sessions"
WALL_START = 1_764_661_200.0
MODEL = ModelInfo("deepseek-v4-flash", "deepseek", "deepseek-v4-flash")
PROMPT = "You are andon's build agent. Use the tools to inspect and fix the repository."


@dataclass
class Sim:
    """Builds a session the way the agent loop writes one: ``events`` are ``(delay, data)``."""

    session_id: str = "s-3f9a1c2b7d40"
    host: str = "runner-7"
    pid: int = 4242
    t0: float = WALL_START
    """Wall time of the first event (the writer's clock must start there too)."""
    events: list[tuple[float, EventData]] = field(default_factory=list)
    turn: int = 0
    step: int = 0
    next_turn: list[UserMessage] = field(default_factory=list)
    next_step: list[UserMessage] = field(default_factory=list)
    _pids: int = 4300
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # Ids that look random but are the same on every run (the fixtures are checked in).
        self._rng = random.Random(f"{self.session_id}/{self.pid}")
        self.now = self.t0

    def emit(self, data: EventData, dt: float = 0.002) -> EventData:
        self.events.append((dt, data))
        self.now += dt
        return data

    def data(self) -> list[EventData]:
        return [d for _, d in self.events]

    def message_id(self) -> str:
        return f"m-{self._rng.getrandbits(48):012x}"

    # --- session and inbox --------------------------------------------------------------------

    def start(self, cwd: str = "/home/ci/build", format: int = 1) -> None:
        self.emit(
            SessionStart(
                format, self.session_id, "0.1.0", self.t0, cwd, MODEL, PROMPT, self.pid, self.host
            ),
            0.0,
        )

    def resumed(self, *, repaired: bool, pid: int) -> None:
        self.emit(SessionResumed(pid, self.host, "0.1.0", MODEL, PROMPT, repaired), 1.0)

    def queue(
        self,
        text: str,
        target: Literal["next-turn", "next-step"] = "next-turn",
        source: Literal["user", "steer", "inject", "hook", "tool-context"] = "user",
        dt: float = 0.002,
    ) -> UserMessage:
        message = UserMessage(self.message_id(), text, source)
        items = self.next_turn if target == "next-turn" else self.next_step
        self.emit(InboxSpliced(target, len(items), (message,)), dt)
        items.append(message)
        return message

    def cancel_inbox(self) -> None:
        """What ``cancel()`` without ``keep_inbox`` writes: next-step, then next-turn."""
        for target, items in (("next-step", self.next_step), ("next-turn", self.next_turn)):
            if items:
                self.emit(InboxSpliced(target, 0, (), len(items), "canceled"))  # type: ignore[arg-type]
                items.clear()

    def claim(self, *, first_step: bool) -> list[UserMessage]:
        claimed: list[UserMessage] = []
        if self.next_step:
            claimed.extend(self.next_step)
            self.emit(InboxSpliced("next-step", 0, (), len(self.next_step)))
            self.next_step.clear()
        if first_step and self.next_turn:
            claimed.append(self.next_turn.pop(0))
            self.emit(InboxSpliced("next-turn", 0, (), 1))
        return claimed

    # --- turns and steps ------------------------------------------------------------------------

    def begin_turn(self, dt: float = 0.002) -> int:
        self.turn += 1
        self.step = 0
        self.emit(TurnStart(self.turn), dt)
        return self.turn

    def end_turn(self, reason: TurnEndReason, dt: float = 0.002) -> None:
        self.emit(TurnEnd(self.turn, reason), dt)

    def begin_step(self, messages: Sequence[UserMessage] = ()) -> int:
        self.step += 1
        self.emit(StepStart(self.turn, self.step))
        for message in messages:
            self.emit(UserMessageEntered(self.turn, self.step, message), 0.0005)
        return self.step

    def end_step(self, dt: float = 0.001) -> None:
        self.emit(StepEnd(self.turn, self.step), dt)

    # --- the model ------------------------------------------------------------------------------

    def request(self, attempt: int = 1) -> None:
        self.emit(LlmRequest(self.turn, self.step, attempt, MODEL.name), 0.001)

    def retry(self, attempt: int, code: str, message: str, delay: float, status: int) -> None:
        error = {"code": code, "message": message, "status": status}
        self.emit(LlmRetry(self.turn, self.step, attempt, error, delay), 0.4)

    def call_id(self, n: int) -> str:
        return f"c{self.turn}-{self.step}-{n}"

    def stream(self, blocks: Sequence[Any], *, attempt: int = 1, pieces: int = 2) -> None:
        """``assistant/chunk`` records carrying ``blocks`` as deltas, ``pieces`` per block."""
        for index, block in enumerate(blocks):
            match block:
                case TextBlock(text=text) | ReasoningBlock(text=text):
                    kind = "text" if isinstance(block, TextBlock) else "reasoning"
                    size = max(1, -(-len(text) // pieces))
                    for i in range(0, len(text), size):
                        piece = {"type": kind, "text": text[i : i + size]}
                        self.emit(AssistantChunk(self.turn, self.step, attempt, (piece,)), 0.016)
                case ToolCallBlock():
                    delta: dict[str, Any] = {
                        "type": "tool_call",
                        "index": index,
                        "provider_id": block.provider_id,
                        "name": block.name,
                        "arguments": block.arguments,
                    }
                    self.emit(AssistantChunk(self.turn, self.step, attempt, (delta,)), 0.016)

    def reply(
        self,
        blocks: Sequence[Any],
        finish: Literal["stop", "tool_calls", "length", "aborted"] | None = None,
        *,
        interrupted: bool = False,
        usage: dict[str, int] | None = None,
        dropped: int | None = None,
    ) -> list[ToolCallBlock]:
        calls = [b for b in blocks if isinstance(b, ToolCallBlock)]
        if finish is None:
            finish = "aborted" if interrupted else "tool_calls" if calls else "stop"
        self.emit(
            AssistantMessage(
                self.turn,
                self.step,
                AssistantReply(tuple(blocks)),
                finish,
                usage,
                interrupted,
                dropped,
            ),
            0.003,
        )
        return calls

    # --- tools ----------------------------------------------------------------------------------

    def tool_call(self, block: ToolCallBlock, dt: float = 0.001) -> None:
        self.emit(ToolCall(self.turn, self.step, block.call_id, block.name, block.arguments), dt)

    def started(
        self, call_id: str, *, pid: int | None = None, worker: str = "w1", host: str | None = None
    ) -> int:
        if pid is None:
            self._pids += 7
            pid = self._pids
        self.emit(
            ToolStarted(
                self.turn,
                self.step,
                call_id,
                worker,
                host or self.host,
                pid,
                pid,
                round(self.now + 0.002, 2),  # psutil's start times have 1/100 s resolution
                "pgroup",
            ),
            0.004,
        )
        return pid

    def signal(self, call_id: str, stage: str, at: float, targets: int, dt: float = 0.5) -> None:
        self.emit(ToolSignal(self.turn, self.step, call_id, stage, at, targets), dt)  # type: ignore[arg-type]

    def result(
        self,
        call_id: str,
        content: str,
        *,
        exit_code: int | None = 0,
        exit_signal: int | None = None,
        error: tuple[str, ErrorCode, str] | None = None,
        ended_by: str | None = "exit",
        duration: float = 0.05,
        strays: int | None = None,
        output_bytes: int | None = None,
        output_file: str | None = None,
        dt: float | None = None,
        with_exit: bool = True,
    ) -> None:
        is_error = error is not None or (exit_code not in (0, None)) or exit_signal is not None
        self.emit(
            ToolResult(
                self.turn,
                self.step,
                call_id,
                content,
                is_error,
                duration,
                None if error is None else ToolErrorInfo(error[0], error[1].value, error[2]),
                ExitStatus(exit_code, exit_signal) if with_exit else None,
                ended_by,  # type: ignore[arg-type]
                strays,
                output_bytes,
                output_file,
            ),
            duration if dt is None else dt,
        )

    def skipped(self, block: ToolCallBlock) -> None:
        """A call the turn was cancelled before dispatching: a ``tool/call`` (written now, or
        already while it waited) and its ``ABORTED_BEFORE_DISPATCH`` result."""
        self.tool_call(block)
        self.result(
            block.call_id,
            "Error: tool call aborted before dispatch",
            error=(
                "Aborted",
                ErrorCode.ABORTED_BEFORE_DISPATCH,
                "tool call aborted before dispatch",
            ),
            ended_by="not-run",
            duration=0.0,
            with_exit=False,
        )


def aborted(cause: Cause) -> TurnEndReason:
    from andon.session import TurnAborted

    return TurnAborted(cause)


def write_session(
    folder: Path, sim: Sim, *, clock: ManualClock | None = None, close: bool = True
) -> SessionLog:
    """Write ``sim``'s events through the real writer, advancing a manual clock by each delay."""
    clock = clock or ManualClock(start=1000.0, wall_start=WALL_START)
    log = SessionLog.open(folder, clock=clock, durability="none")
    for dt, data in sim.events:
        clock.advance(dt)
        log.append(data, ignorable=isinstance(data, McpServerEvent))  # as andon writes it
    if close:
        log.close()
    return log


def lines_of(events: Iterable[EventData], start_time: float = WALL_START) -> list[bytes]:
    """Encoded log lines for ``events`` (seq from 0), without going through a writer."""
    return [
        encode_line(Record(seq, start_time + seq * 0.01, data)) for seq, data in enumerate(events)
    ]


def copy_fixture(name: str, target: Path) -> Path:
    """A private copy of a golden fixture folder (fixtures are never loaded in place)."""
    folder = target / name
    shutil.copytree(FIXTURES / name, folder)
    return folder


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file of a folder (recursively) by relative path, for byte-for-byte comparisons."""
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def validate_request(messages: list[dict[str, Any]]) -> None:
    """Assert ``messages`` form a valid OpenAI-style chat request.

    Every assistant tool call is answered by exactly one ``tool`` message before the next user or
    assistant message; no ``tool`` message answers nothing; no assistant message is empty; the
    whole thing is JSON.
    """
    json.dumps(messages, allow_nan=False)
    owed: list[str] = []
    seen_ids: set[str] = set()
    for i, message in enumerate(messages):
        role = message.get("role")
        if role == "tool":
            call = message.get("tool_call_id")
            assert call in owed, f"message {i}: tool result {call!r} answers no pending tool call"
            owed.remove(call)
            assert isinstance(message.get("content"), str), f"message {i}: content must be text"
            continue
        assert not owed, f"message {i} ({role}) comes before tool calls {owed} were answered"
        if role == "user":
            assert isinstance(message.get("content"), str), f"message {i}: user content"
            assert set(message) == {"role", "content"}, f"message {i}: unexpected keys"
        elif role == "assistant":
            content, calls = message.get("content"), message.get("tool_calls")
            assert content is None or isinstance(content, str), f"message {i}: content"
            assert content or calls, f"message {i}: an assistant message needs text or tool calls"
            assert set(message) <= {"role", "content", "tool_calls", "reasoning_content"}
            for call in calls or []:
                assert call["type"] == "function"
                assert isinstance(call["function"]["name"], str)
                assert isinstance(call["function"]["arguments"], str)
                assert call["id"] not in seen_ids, f"message {i}: tool call id reused"
                seen_ids.add(call["id"])
                owed.append(call["id"])
            if calls is not None:
                assert calls, f"message {i}: an empty tool_calls list is rejected by APIs"
        else:
            raise AssertionError(f"message {i}: unexpected role {role!r}")
    assert not owed, f"tool calls {owed} are never answered"


def write_crashed(folder: Path, sid: str, started: ToolStarted) -> None:
    """A log that ends inside call ``c1-1-1`` of session ``sid``, after its ``started``."""
    sim = Sim(session_id=sid)
    sim.start()
    sim.queue("Run it.")
    sim.begin_turn()
    sim.begin_step(sim.claim(first_step=True))
    calls = sim.reply([TextBlock("Running."), ToolCallBlock("c1-1-1", "bash", "{}")])
    sim.tool_call(calls[0])
    sim.emit(started)
    folder.mkdir()
    (folder / "events.jsonl").write_bytes(b"".join(lines_of(sim.data())))


# --- a long log (past the size that gets an index) ---------------------------------------------

OUTPUT = "".join(f"cc -O2 -Wall -c src/mod{i:02d}.c -o build/mod{i:02d}.o\n" for i in range(6))
T0 = 1_764_661_200.0


def long_turn(n: int) -> list[EventData]:
    msg = UserMessage(f"m-{n:012x}", f"task {n}: fix the build and run the tests")
    call = ToolCallBlock(f"c{n}-1-1", "bash", '{"command": "make -j2"}', "call_00_x")
    reply = AssistantReply((TextBlock("Running make."), call))
    delta = {"type": "text", "text": "Running "}
    return [
        InboxSpliced("next-turn", 0, (msg,)),
        TurnStart(n),
        InboxSpliced("next-turn", 0, (), 1),
        StepStart(n, 1),
        UserMessageEntered(n, 1, msg),
        LlmRequest(n, 1, 1, MODEL.name),
        AssistantChunk(n, 1, 1, (delta,)),
        AssistantMessage(n, 1, reply, "tool_calls"),
        ToolCall(n, 1, call.call_id, call.name, call.arguments),
        ToolStarted(n, 1, call.call_id, "w1", "test-host", 4301, 4301, 1.0, "pgroup"),
        ToolResult(n, 1, call.call_id, OUTPUT, False, 1.5, exit=ExitStatus(0, None)),
        StepEnd(n, 1),
        StepStart(n, 2),
        LlmRequest(n, 2, 1, MODEL.name),
        AssistantMessage(n, 2, AssistantReply((TextBlock("The build passes."),)), "stop"),
        StepEnd(n, 2),
        TurnEnd(n, Completed() if n % 7 else TurnAborted(User())),
    ]


def long_log(folder: Path, *, session_id: str = "s-000000index", crashed: bool = True) -> Path:
    """A log past :data:`INDEX_MIN_BYTES`; ``crashed``: it ends inside a running tool call,
    with a queued message waiting."""
    events: list[EventData] = [
        SessionStart(2, session_id, "0.1.0", T0, "/tmp", MODEL, "prompt", 1, "test-host")
    ]
    n = 0
    size = 0
    while size < INDEX_MIN_BYTES + (INDEX_MIN_BYTES >> 2):
        n += 1
        turn = long_turn(n)
        events.extend(turn)
        size += sum(len(encode_line(Record(0, T0, d))) for d in turn)
    if crashed:
        events.extend(long_turn(n + 1)[:10])  # tool/call and tool/started, no result
        events.append(InboxSpliced("next-turn", 0, (UserMessage("m-00000000beef", "and then?"),)))
    folder.mkdir(parents=True)
    with open(folder / "events.jsonl", "wb") as f:
        for seq, data in enumerate(events):
            f.write(encode_line(Record(seq, T0 + seq * 0.01, data)))
    return folder
