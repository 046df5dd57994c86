"""The data of the tool records: ``tool/call``, ``tool/started``, ``tool/signal``, ``tool/result``.

Written by the executor (and ``tool/result`` also by crash repair); their JSON:
docs/log-format.md, Tool calls.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from andon.base import CONTAINMENTS, ENDED_BY, SIGNAL_STAGES, Containment, EndedBy, SignalStage
from andon.session._values import (
    ExitStatus,
    Fields,
    ToolErrorInfo,
    extra_field,
    with_extra,
)

__all__ = ["ToolCall", "ToolResult", "ToolSignal", "ToolStarted"]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """``tool/call``: the executor is about to start the call (or is skipping it)."""

    turn: int
    step: int
    call_id: str
    name: str
    arguments: str
    extra: Mapping[str, Any] = extra_field()
    record_type: ClassVar[str] = "tool/call"

    def to_json(self) -> dict[str, Any]:
        return with_extra(
            {
                "turn": self.turn,
                "step": self.step,
                "call_id": self.call_id,
                "name": self.name,
                "arguments": self.arguments,
            },
            self.extra,
        )

    @classmethod
    def from_json(cls, f: Fields) -> ToolCall:
        turn, step, call = f.req_int("turn"), f.req_int("step"), f.req_str("call_id")
        return cls(turn, step, call, f.req_str("name"), f.req_str("arguments"), f.extra())


@dataclass(frozen=True, slots=True)
class ToolStarted:
    """``tool/started``: the worker reports the tool's process running.

    ``pid`` + ``create_time`` identify the leader even if the pid is reused later; ``pgid`` is its
    process group; ``cgroup`` the call's own cgroup where there is one. Crash repair uses them to
    find leftovers.
    """

    turn: int
    step: int
    call_id: str
    worker: str
    host: str
    pid: int
    pgid: int
    create_time: float
    containment: Containment | None = None
    cgroup: str | None = None
    extra: Mapping[str, Any] = extra_field()
    record_type: ClassVar[str] = "tool/started"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "turn": self.turn,
            "step": self.step,
            "call_id": self.call_id,
            "worker": self.worker,
            "host": self.host,
            "pid": self.pid,
            "pgid": self.pgid,
            "create_time": self.create_time,
        }
        if self.containment is not None:
            out["containment"] = self.containment
        if self.cgroup is not None:
            out["cgroup"] = self.cgroup
        return with_extra(out, self.extra)

    @classmethod
    def from_json(cls, f: Fields) -> ToolStarted:
        turn, step, call = f.req_int("turn"), f.req_int("step"), f.req_str("call_id")
        worker, host = f.req_str("worker"), f.req_str("host")
        pid, pgid, created = f.req_int("pid"), f.req_int("pgid"), f.req_num("create_time")
        containment: Any = f.opt_choice("containment", CONTAINMENTS)
        cgroup = f.opt_str("cgroup")
        return cls(
            turn, step, call, worker, host, pid, pgid, created, containment, cgroup, f.extra()
        )


@dataclass(frozen=True, slots=True)
class ToolSignal:
    """``tool/signal``: a grace stage or sweep signal sent ``at`` seconds into the call."""

    turn: int
    step: int
    call_id: str
    stage: SignalStage
    at: float
    targets: int
    extra: Mapping[str, Any] = extra_field()
    record_type: ClassVar[str] = "tool/signal"

    def to_json(self) -> dict[str, Any]:
        return with_extra(
            {
                "turn": self.turn,
                "step": self.step,
                "call_id": self.call_id,
                "stage": self.stage,
                "at": self.at,
                "targets": self.targets,
            },
            self.extra,
        )

    @classmethod
    def from_json(cls, f: Fields) -> ToolSignal:
        turn, step, call = f.req_int("turn"), f.req_int("step"), f.req_str("call_id")
        stage: Any = f.req_choice("stage", SIGNAL_STAGES)
        return cls(turn, step, call, stage, f.req_num("at"), f.req_int("targets"), f.extra())


@dataclass(frozen=True, slots=True)
class ToolResult:
    """``tool/result``: the one result of a call. ``content`` is what the model sees.

    ``error`` is present only for andon errors (docs/log-format.md, Error codes);
    ``exit`` only when a process ran; ``output_file`` (relative to the session folder) when the
    output was spilled.
    """

    turn: int
    step: int
    call_id: str
    content: str
    is_error: bool
    duration: float
    error: ToolErrorInfo | None = None
    exit: ExitStatus | None = None
    ended_by: EndedBy | None = None
    strays_killed: int | None = None
    output_bytes: int | None = None
    output_file: str | None = None
    extra: Mapping[str, Any] = extra_field()
    record_type: ClassVar[str] = "tool/result"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "turn": self.turn,
            "step": self.step,
            "call_id": self.call_id,
            "content": self.content,
            "is_error": self.is_error,
        }
        if self.error is not None:
            out["error"] = self.error.to_json()
        if self.exit is not None:
            out["exit"] = self.exit.to_json()
        if self.ended_by is not None:
            out["ended_by"] = self.ended_by
        if self.strays_killed is not None:
            out["strays_killed"] = self.strays_killed
        if self.output_bytes is not None:
            out["output_bytes"] = self.output_bytes
        if self.output_file is not None:
            out["output_file"] = self.output_file
        out["duration"] = self.duration
        return with_extra(out, self.extra)

    @classmethod
    def from_json(cls, f: Fields) -> ToolResult:
        turn, step, call = f.req_int("turn"), f.req_int("step"), f.req_str("call_id")
        content, is_error = f.req_str("content"), f.req_bool("is_error")
        error_obj, exit_obj = f.opt_obj("error"), f.opt_obj("exit")
        error = (
            None if error_obj is None else ToolErrorInfo.from_json(error_obj, f"{f.where}.error")
        )
        exit_ = None if exit_obj is None else ExitStatus.from_json(exit_obj, f"{f.where}.exit")
        ended_by: Any = f.opt_choice("ended_by", ENDED_BY)
        strays, out_bytes = f.opt_int("strays_killed"), f.opt_int("output_bytes")
        output_file = f.opt_str("output_file")
        duration = f.req_num("duration")
        return cls(
            turn,
            step,
            call,
            content,
            is_error,
            duration,
            error,
            exit_,
            ended_by,
            strays,
            out_bytes,
            output_file,
            f.extra(),
        )
