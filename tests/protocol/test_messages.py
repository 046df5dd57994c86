"""Message definitions: tags, closed sets, dataclass shape, public surface, layering."""

from __future__ import annotations

import ast
import dataclasses
import sys
import typing
from pathlib import Path

import pytest

import andon.protocol as protocol
from andon.base import (
    CancelStage,
    Containment,
    EndedBy,
    ErrorCode,
    GracePolicy,
    SignalStage,
    Stream,
)
from andon.protocol import (
    MESSAGE_TYPES,
    PROTOCOL_VERSION,
    ErrorInfo,
    ErrorReply,
    Message,
    MessageType,
    Result,
    Run,
)
from andon.protocol._messages import MESSAGE_CLASSES

PROTOCOL_SRC = Path(protocol.__file__).parent


def test_protocol_version_is_four() -> None:
    # 3: ``cancel`` carries the cause and the time left to KILL. 4: ``run`` spells its ``cwd`` and
    # ``env_add`` as file names (any bytes as text; the worker maps them back).
    assert PROTOCOL_VERSION == 4


def test_every_message_class_is_in_the_union_and_has_a_unique_tag() -> None:
    assert set(typing.get_args(Message)) == set(MESSAGE_CLASSES)
    tags = [cls.type for cls in MESSAGE_CLASSES]
    assert len(tags) == len(set(tags))
    assert set(tags) == set(typing.get_args(MessageType))
    assert dict(MESSAGE_TYPES) == {cls.type: cls for cls in MESSAGE_CLASSES}


def test_the_tags_are_those_of_workers_md() -> None:
    assert set(MESSAGE_TYPES) == {
        "hello",
        "welcome",
        "reject",
        "heartbeat",
        "run",
        "started",
        "output",
        "ack",
        "cancel",
        "signalled",
        "result",
        "error",
        "shutdown",
    }
    assert MESSAGE_TYPES["error"] is ErrorReply


@pytest.mark.parametrize("cls", MESSAGE_CLASSES, ids=lambda cls: cls.type)
def test_messages_are_frozen_slotted_keyword_only_dataclasses(cls: type[Message]) -> None:
    assert dataclasses.is_dataclass(cls)
    params = cls.__dataclass_params__  # type: ignore[union-attr]
    assert params.frozen
    assert "__slots__" in cls.__dict__
    assert all(f.kw_only for f in dataclasses.fields(cls))
    # The tag is a class variable, not a field: it travels in the header only.
    assert "type" not in {f.name for f in dataclasses.fields(cls)}


def test_a_message_cannot_be_changed() -> None:
    msg = ErrorReply(reason="bad frame")
    with pytest.raises(dataclasses.FrozenInstanceError):
        msg.reason = "other"  # type: ignore[misc]


def test_closed_sets_match_the_log_format() -> None:
    assert typing.get_args(Containment) == ("cgroup", "subreaper", "pgroup")
    assert typing.get_args(Stream) == ("stdout", "stderr")
    assert typing.get_args(CancelStage) == ("interrupt", "term", "kill")
    assert typing.get_args(SignalStage) == ("interrupt", "term", "kill", "sweep-term", "sweep-kill")
    assert set(typing.get_args(EndedBy)) == {
        "exit",
        "interrupt",
        "term",
        "kill",
        "timeout-interrupt",
        "timeout-term",
        "timeout-kill",
        "worker-lost",
        "not-run",
    }


def test_defaults() -> None:
    run = Run(
        call_id="c1-1-1",
        tool="bash",
        tag="x-0-c1-1-1",
        arguments={"command": "true"},
        cwd="/",
        timeout=None,
        grace=GracePolicy(),
        output_head_bytes=1,
        output_tail_bytes=1,
    )
    assert run.env_add == {}
    assert run.env_remove == ()
    result = Result(
        call_id="c1-1-1",
        exit_code=0,
        exit_signal=None,
        ended_by="exit",
        content="",
        output_head=b"",
        output_tail=b"",
        output_bytes=0,
        duration=0.0,
    )
    assert (result.error, result.strays_killed, result.unreachable) == (None, 0, 0)
    assert ErrorReply(reason="x").call_id is None


def test_error_info_holds_an_error_code() -> None:
    info = ErrorInfo(name="Aborted", code=ErrorCode.ABORTED, message="tool call aborted")
    assert info.code == "ABORTED"


def test_public_surface_is_explicit() -> None:
    for name in protocol.__all__:
        assert hasattr(protocol, name), name
    for cls in MESSAGE_CLASSES:
        assert cls.__name__ in protocol.__all__
    # Implementation modules are private (_name.py); every public name is in __all__.
    assert {n for n in dir(protocol) if not n.startswith("_")} == set(protocol.__all__)


def test_protocol_imports_only_base_and_never_pickle() -> None:
    allowed_third_party = {"msgpack", "zmq"}
    for path in sorted(PROTOCOL_SRC.glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module is not None:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                assert top not in {"pickle", "cPickle", "dill", "cloudpickle"}, (path, name)
                if top == "andon":
                    assert name.startswith(("andon.base", "andon.protocol")), (path, name)
                elif top in allowed_third_party:
                    continue
                else:  # anything else must be the standard library
                    assert top in sys.stdlib_module_names or top == "__future__", (path, name)
