"""The codec: round trips, the exact wire shape, and every way a frame can be bad."""

from __future__ import annotations

import dataclasses
import enum
import math
import types
import typing
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from andon.base import (
    ErrorCode,
    GracePolicy,
    MalformedFrame,
    MessageTooLarge,
    ProtocolError,
    UnknownMessage,
    VersionMismatch,
)
from andon.protocol import (
    DEFAULT_MAX_BYTES,
    MAX_JSON_DEPTH,
    MESSAGE_TYPES,
    PROTOCOL_VERSION,
    Ack,
    Cancel,
    ErrorInfo,
    ErrorReply,
    Heartbeat,
    Hello,
    Message,
    Output,
    Refused,
    Result,
    Run,
    Shutdown,
    Signalled,
    Started,
    Welcome,
    decode,
    encode,
)

INF = math.inf

RUN = Run(
    call_id="c1-1-1",
    tool="bash",
    tag="s-3f9a1c2b7d40-c1-1-1",
    arguments={"command": "make -j2 && echo ✓", "nested": [1, 2.5, None, True, {"k": "v"}]},
    cwd="/home/ci/build",
    timeout=INF,
    grace=GracePolicy(interrupt=False, term_after=INF, kill_after=3.0),
    output_head_bytes=16_384,
    output_tail_bytes=16_384,
    env_add={"ANDON_CALL_ID": "c1-1-1", "ANDON_SESSION": "s-3f9a1c2b7d40"},
    env_remove=("DEEPSEEK_API_KEY", "OPENAI_API_KEY", "ANDON_API_KEY"),
)

# At least one of every message type, with inf floats, bytes (incl. non-UTF-8), None optionals
# and non-ASCII text.
SAMPLES: list[Message] = [
    Hello(protocol=1, worker_id="w2", host="runner-7", pid=4301, tools=("bash", "read_file")),
    Hello(protocol=1, worker_id="w-ü", host="", pid=0, tools=()),
    Welcome(heartbeat_interval=1.0, max_message_bytes=DEFAULT_MAX_BYTES),
    Refused(reason="unknown worker key — refusé"),
    Heartbeat(time=1_764_661_200.25),
    Heartbeat(time=-INF),
    RUN,
    dataclasses.replace(RUN, call_id="c1-1-2", timeout=120.0, arguments={}, grace=GracePolicy()),
    Started(
        call_id="c1-1-1",
        pid=4301,
        pgid=4301,
        create_time=1764661201.11,
        containment="cgroup",
        cgroup="/sys/fs/cgroup/andon-4242-0f3a9c2e/call-s-3f9a1c2b7d40-c1-1-1",
    ),
    Started(call_id="c1-1-1", pid=5, pgid=5, create_time=0.0, containment="pgroup", cgroup=None),
    Output(call_id="c1-1-1", stream="stdout", data=b"gcc -c a.c\n\xff\xfe\x00", offset=0),
    Output(call_id="c1-1-1", stream="stderr", data=b"", offset=2**40),
    Cancel(call_id="c1-1-1", stage="interrupt"),
    Cancel(call_id="c1-1-1", stage="kill", cause={"kind": "hook", "reason": "budget"}, kill_in=0.0),
    Signalled(call_id="c1-1-1", stage="term", at=2.08, targets=5),
    Signalled(call_id="c1-1-1", stage="sweep-kill", at=INF, targets=0),
    Result(
        call_id="c1-1-1",
        exit_code=None,
        exit_signal=15,
        ended_by="term",
        content="gcc -c a.c\n…\n[stopped: aborted by user; SIGTERM at +2.08s]",
        error=ErrorInfo(name="Aborted", code=ErrorCode.ABORTED, message="tool call aborted"),
        output_head=b"gcc -c a.c\n",
        output_tail=b"\xe2\x80\xa6 done\n",
        output_bytes=5120,
        strays_killed=1,
        unreachable=2,
        duration=2.09,
    ),
    Result(
        call_id="c1-1-2",
        exit_code=0,
        exit_signal=None,
        ended_by="exit",
        content="",
        output_head=b"",
        output_tail=b"",
        output_bytes=0,
        duration=0.0,
    ),
    ErrorReply(reason="malformed frame", call_id="c1-1-1"),
    ErrorReply(reason="unexpected message", call_id=None),
    Shutdown(grace=INF),
    Shutdown(grace=0.5),
    Ack(call_id="c1-1-1", offset=2**40),
]


def _id(msg: Message) -> str:
    return msg.type


def frames_of(
    msg: Message,
    *,
    header: Callable[[dict[str, Any]], object] | None = None,
    payload: Callable[[dict[str, Any]], object] | None = None,
) -> list[bytes]:
    """``msg`` encoded, then its header and/or payload replaced by a function of the original."""
    head, body = encode(msg)
    if header is not None:
        head = msgpack.packb(header(msgpack.unpackb(head)))
    if payload is not None:
        body = msgpack.packb(payload(msgpack.unpackb(body)))
    return [head, body]


def changed(mapping: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**mapping, **changes}


# --- round trips and wire shape ---------------------------------------------------------------


def test_samples_cover_every_message_type() -> None:
    assert {msg.type for msg in SAMPLES} == set(MESSAGE_TYPES)


@pytest.mark.parametrize("msg", SAMPLES, ids=_id)
def test_round_trip(msg: Message) -> None:
    frames = encode(msg)
    assert len(frames) == 2
    assert all(type(f) is bytes for f in frames)
    back = decode(frames)
    assert back == msg
    assert type(back) is type(msg)


@pytest.mark.parametrize("msg", SAMPLES, ids=_id)
def test_round_trip_accepts_any_bytes_like_frames(msg: Message) -> None:
    head, body = encode(msg)
    assert decode((bytearray(head), memoryview(body))) == msg


@pytest.mark.parametrize("msg", SAMPLES, ids=_id)
def test_header_shape(msg: Message) -> None:
    header = msgpack.unpackb(encode(msg)[0])
    expected: dict[str, object] = {"v": PROTOCOL_VERSION, "type": msg.type}
    call_id = getattr(msg, "call_id", None)
    if call_id is not None:
        expected["call_id"] = call_id
    assert header == expected


def test_payload_shape() -> None:
    payload = msgpack.unpackb(encode(RUN)[1])
    assert list(payload) == [f.name for f in dataclasses.fields(Run)]
    assert payload["grace"] == RUN.grace.to_dict()
    assert payload["env_remove"] == list(RUN.env_remove)  # a tuple travels as an array
    assert payload["timeout"] == INF
    output = msgpack.unpackb(encode(SAMPLES[10])[1], raw=False)
    assert type(output["data"]) is bytes  # msgpack bin, not str, even with raw=False
    result = msgpack.unpackb(encode(SAMPLES[16])[1])
    assert result["error"] == {"name": "Aborted", "code": "ABORTED", "message": "tool call aborted"}


def test_decoded_fields_have_the_declared_types() -> None:
    run = decode(encode(RUN))
    assert isinstance(run, Run)
    assert type(run.env_remove) is tuple
    assert type(run.grace) is GracePolicy
    result = decode(encode(SAMPLES[16]))
    assert isinstance(result, Result)
    assert result.error is not None
    assert result.error.code is ErrorCode.ABORTED


def test_an_int_is_accepted_where_a_float_is_expected() -> None:
    frames = frames_of(
        RUN, payload=lambda p: changed(p, timeout=5, grace={**p["grace"], "kill_after": 1})
    )
    run = decode(frames)
    assert isinstance(run, Run)
    assert type(run.timeout) is float
    assert run.timeout == 5.0
    assert type(run.grace.kill_after) is float


# --- malformed frames -------------------------------------------------------------------------

GOOD_HEAD, GOOD_BODY = encode(RUN)


@pytest.mark.parametrize(
    "frames",
    [
        [],
        [GOOD_HEAD],
        [GOOD_HEAD, GOOD_BODY, GOOD_BODY],
        [b"w1", GOOD_HEAD, GOOD_BODY],  # a routed message handed to the DEALER-side decode
    ],
    ids=["zero", "one", "three", "with-identity"],
)
def test_wrong_frame_count(frames: list[bytes]) -> None:
    with pytest.raises(MalformedFrame, match="2 frames"):
        decode(frames)


@pytest.mark.parametrize(
    "frames", [b"abc", "text", None, [b"ok", "not bytes"], [GOOD_HEAD, 42]], ids=repr
)
def test_frames_that_are_not_bytes(frames: Any) -> None:
    with pytest.raises(MalformedFrame):
        decode(frames)


@pytest.mark.parametrize("bad", [b"", b"\xc1", b"\x81", b"\xa3ab", b"\x82\xa1v\x01"], ids=repr)
def test_header_not_msgpack(bad: bytes) -> None:
    with pytest.raises(MalformedFrame, match="header frame is not valid msgpack"):
        decode([bad, GOOD_BODY])


def test_payload_not_msgpack_still_names_the_call() -> None:
    with pytest.raises(MalformedFrame, match="'run' payload frame is not valid msgpack") as info:
        decode([GOOD_HEAD, b"\xc1"])
    assert info.value.call_id == "c1-1-1"


def test_trailing_bytes_after_the_payload_are_malformed() -> None:
    with pytest.raises(MalformedFrame):
        decode([GOOD_HEAD, GOOD_BODY + b"\x00"])


@pytest.mark.parametrize("header", [[1, "run"], "run", 1, None, b"\x01"], ids=repr)
def test_header_not_a_map(header: object) -> None:
    with pytest.raises(MalformedFrame, match="header is not a map"):
        decode([msgpack.packb(header), GOOD_BODY])


@pytest.mark.parametrize(
    ("header", "match"),
    [
        ({"type": "run", "call_id": "c1-1-1"}, "no 'v'"),
        ({"v": PROTOCOL_VERSION, "call_id": "c1-1-1"}, "no 'type'"),
        ({"v": PROTOCOL_VERSION, "type": 7}, "'type' is not a string"),
        ({"v": PROTOCOL_VERSION, "type": b"run"}, "'type' is not a string"),
        ({"v": PROTOCOL_VERSION, "type": "run", "call_id": 3}, "'call_id' is not a string"),
        ({"v": PROTOCOL_VERSION, "type": "run", "call_id": None}, "'call_id' is not a string"),
        (
            {"v": PROTOCOL_VERSION, "type": "run", "call_id": "c1-1-1", "extra": 1},
            "unexpected key extra",
        ),
        ({"v": PROTOCOL_VERSION, "type": "run"}, "does not match"),
        ({"v": PROTOCOL_VERSION, "type": "run", "call_id": "c9-9-9"}, "does not match"),
    ],
)
def test_bad_headers(header: dict[str, object], match: str) -> None:
    with pytest.raises(MalformedFrame, match=match):
        decode([msgpack.packb(header), GOOD_BODY])


def test_a_call_id_in_the_header_of_a_message_without_one() -> None:
    head, body = encode(Heartbeat(time=1.0))
    header = {**msgpack.unpackb(head), "call_id": "c1-1-1"}
    with pytest.raises(MalformedFrame, match="does not match"):
        decode([msgpack.packb(header), body])


@pytest.mark.parametrize("payload", [[], "x", None, 1, b"map"], ids=repr)
def test_payload_not_a_map(payload: object) -> None:
    with pytest.raises(MalformedFrame, match=r"'run' message: payload: expected a map"):
        decode([GOOD_HEAD, msgpack.packb(payload)])


def _field_cases() -> list[Any]:
    cases = []
    for msg in SAMPLES:
        for f in dataclasses.fields(msg):
            cases.append(pytest.param(msg, f.name, id=f"{msg.type}.{f.name}"))
    return cases


@pytest.mark.parametrize(("msg", "name"), _field_cases())
def test_missing_field_is_named(msg: Message, name: str) -> None:
    frames = frames_of(msg, payload=lambda p: {k: v for k, v in p.items() if k != name})
    with pytest.raises(MalformedFrame) as info:
        decode(frames)
    assert str(info.value).startswith(f"malformed {msg.type!r} message: field {name!r}: missing")


@pytest.mark.parametrize(("msg", "name"), _field_cases())
def test_wrong_type_is_named(msg: Message, name: str) -> None:
    # bytes fit no field but the bytes fields, and a str fits none of those.
    wrong = "text" if isinstance(getattr(msg, name), bytes) else b"\x00"
    frames = frames_of(msg, payload=lambda p: changed(p, **{name: wrong}))
    with pytest.raises(MalformedFrame) as info:
        decode(frames)
    assert str(info.value).startswith(f"malformed {msg.type!r} message: field {name!r}: ")


@pytest.mark.parametrize("msg", SAMPLES, ids=_id)
def test_unexpected_field_is_named(msg: Message) -> None:
    frames = frames_of(msg, payload=lambda p: changed(p, surprise=1))
    with pytest.raises(
        MalformedFrame, match=rf"'{msg.type}' message: field 'surprise': unexpected"
    ):
        decode(frames)


@pytest.mark.parametrize(
    ("msg", "changes", "field", "problem"),
    [
        (RUN, {"output_head_bytes": True}, "output_head_bytes", "expected an int, got bool"),
        (SAMPLES[10], {"offset": False}, "offset", "expected an int, got bool"),
        (SAMPLES[8], {"pid": 1.0}, "pid", "expected an int, got float"),
        (RUN, {"timeout": True}, "timeout", "expected a float, got bool"),
        (RUN, {"timeout": math.nan}, "timeout", "NaN"),
        (RUN, {"timeout": "5"}, "timeout", "expected a float, got str"),
        (RUN, {"call_id": 7}, "call_id", "expected a str, got int"),
        (RUN, {"env_remove": "OPENAI_API_KEY"}, "env_remove", "expected an array"),
        (RUN, {"env_remove": ["A", 3]}, "env_remove[1]", "expected a str, got int"),
        (RUN, {"env_add": {"A": b"x"}}, "env_add['A']", "expected a str, got bytes"),
        (RUN, {"env_add": {b"A": "x"}}, "env_add", "a map key is bytes"),
        (RUN, {"env_add": ["A=x"]}, "env_add", "expected a map"),
        (RUN, {"arguments": {"a": [1, {"b": b"x"}]}}, "arguments['a'][1]['b']", "JSON value"),
        (RUN, {"arguments": {"a": {b"k": 1}}}, "arguments['a']", "a map key is bytes"),
        (RUN, {"arguments": [1]}, "arguments", "expected a map"),
        (
            RUN,
            {"grace": {"interrupt": 1, "term_after": 2.0, "kill_after": 3.0}},
            "grace.interrupt",
            "expected a bool",
        ),
        (
            RUN,
            {"grace": {"interrupt": True, "term_after": "2", "kill_after": 3.0}},
            "grace.term_after",
            "expected a float",
        ),
        (RUN, {"grace": {"interrupt": True, "term_after": 2.0}}, "grace.kill_after", "missing"),
        (
            RUN,
            {"grace": {"interrupt": True, "term_after": 2.0, "kill_after": 3.0, "x": 1}},
            "grace.x",
            "unexpected",
        ),
        (
            RUN,
            {"grace": {"interrupt": True, "term_after": -1.0, "kill_after": 3.0}},
            "grace",
            "invalid: GracePolicy.term_after must be >= 0",
        ),
        (RUN, {"grace": None}, "grace", "expected a map, got nil"),
        (
            SAMPLES[10],
            {"stream": "stdin"},
            "stream",
            "expected one of 'stdout', 'stderr', got 'stdin'",
        ),
        (SAMPLES[8], {"containment": "docker"}, "containment", "expected one of"),
        (SAMPLES[8], {"cgroup": 0}, "cgroup", "expected a str, got int"),
        (SAMPLES[12], {"stage": "sweep-term"}, "stage", "expected one of"),
        (SAMPLES[14], {"stage": "TERM"}, "stage", "expected one of"),
        (SAMPLES[16], {"ended_by": "timeout"}, "ended_by", "expected one of"),
        (
            SAMPLES[16],
            {"error": {"name": "X", "code": "NOPE", "message": ""}},
            "error.code",
            "expected a ErrorCode value, got 'NOPE'",
        ),
        (SAMPLES[16], {"error": "ABORTED"}, "error", "expected a map, got str"),
        (SAMPLES[16], {"exit_signal": "15"}, "exit_signal", "expected an int, got str"),
        (SAMPLES[0], {"tools": [["bash"]]}, "tools[0]", "expected a str, got array"),
    ],
)
def test_field_problems_are_named(
    msg: Message, changes: dict[str, object], field: str, problem: str
) -> None:
    frames = frames_of(msg, payload=lambda p: changed(p, **changes))
    with pytest.raises(MalformedFrame) as info:
        decode(frames)
    text = str(info.value)
    assert text.startswith(f"malformed {msg.type!r} message: field {field!r}: "), text
    assert problem in text
    assert info.value.call_id == getattr(msg, "call_id", None)


def test_json_arguments_nesting_is_bounded() -> None:
    ok: object = "leaf"
    for _ in range(MAX_JSON_DEPTH - 1):
        ok = [ok]
    assert decode(frames_of(RUN, payload=lambda p: changed(p, arguments={"a": ok})))
    too_deep = [ok]
    with pytest.raises(MalformedFrame, match=f"nests deeper than {MAX_JSON_DEPTH}"):
        decode(frames_of(RUN, payload=lambda p: changed(p, arguments={"a": too_deep})))


def test_msgpack_extension_types_are_refused() -> None:
    payload = msgpack.packb({"time": msgpack.ExtType(5, b"\x00\x00\x00\x01")})
    head = encode(Heartbeat(time=1.0))[0]
    with pytest.raises(MalformedFrame, match="not valid msgpack"):
        decode([head, payload])
    timestamp = msgpack.packb({"time": msgpack.Timestamp(1, 0)})
    with pytest.raises(MalformedFrame, match="not valid msgpack"):
        decode([head, timestamp])


def test_huge_strings_are_not_echoed_into_the_error() -> None:
    frames = frames_of(SAMPLES[10], payload=lambda p: changed(p, stream="x" * 100_000))
    with pytest.raises(MalformedFrame) as info:
        decode(frames)
    assert len(str(info.value)) < 500


# --- truncation, size, version, unknown type --------------------------------------------------


@pytest.mark.parametrize("msg", SAMPLES, ids=_id)
def test_truncated_frames_are_malformed(msg: Message) -> None:
    head, body = encode(msg)
    for cut in range(len(head)):
        with pytest.raises(MalformedFrame):
            decode([head[:cut], body])
    for cut in range(len(body)):
        with pytest.raises(MalformedFrame):
            decode([head, body[:cut]])


def test_size_limit_is_respected() -> None:
    head, body = encode(RUN)
    size = len(head) + len(body)
    assert decode([head, body], max_bytes=size) == RUN
    with pytest.raises(MessageTooLarge) as info:
        decode([head, body], max_bytes=size - 1)
    assert (info.value.size, info.value.limit) == (size, size - 1)


def test_default_size_limit_is_16_mib() -> None:
    assert DEFAULT_MAX_BYTES == 16 * 1024 * 1024
    big = Output(call_id="c1-1-1", stream="stdout", data=b"x" * DEFAULT_MAX_BYTES, offset=0)
    with pytest.raises(MessageTooLarge) as info:
        decode(encode(big))
    assert info.value.limit == DEFAULT_MAX_BYTES
    assert decode(encode(big), max_bytes=32 * 1024 * 1024) == big


def test_size_is_checked_before_unpacking(monkeypatch: pytest.MonkeyPatch) -> None:
    def must_not_unpack(*args: object, **kwargs: object) -> object:
        raise AssertionError("unpacked an oversized message")

    monkeypatch.setattr(msgpack, "unpackb", must_not_unpack)
    # Not even valid msgpack: the size alone decides.
    with pytest.raises(MessageTooLarge):
        decode([b"\xc1" * 10, b"\xc1" * 10], max_bytes=19)
    # Three frames are wrong too, but too large is what is reported first.
    with pytest.raises(MessageTooLarge):
        decode([b"\xc1" * 10, b"", b"\xc1" * 10], max_bytes=19)


def test_encode_can_refuse_an_oversized_message() -> None:
    size = sum(len(f) for f in encode(RUN))
    assert encode(RUN, max_bytes=size) == encode(RUN)
    with pytest.raises(MessageTooLarge):
        encode(RUN, max_bytes=size - 1)


@pytest.mark.parametrize(
    "version", [0, 1, 2, 3, 5, -1, 2**64 - 1, "4", 4.0, True, None, [1]], ids=repr
)
def test_wrong_version(version: object) -> None:
    frames = frames_of(RUN, header=lambda h: changed(h, v=version))
    with pytest.raises(VersionMismatch) as info:
        decode(frames)
    assert info.value.expected == PROTOCOL_VERSION
    if version is not None and type(version) in (int, float, bool, str):
        assert info.value.got == version


def test_version_is_checked_before_anything_else_in_the_header() -> None:
    header = msgpack.packb({"v": 5, "type": "from-the-future", "flags": [1, 2]})
    with pytest.raises(VersionMismatch):
        decode([header, b"\xc1 not even msgpack"])


def test_unknown_type_keeps_the_call_id() -> None:
    header = msgpack.packb({"v": PROTOCOL_VERSION, "type": "teleport", "call_id": "c1-1-1"})
    with pytest.raises(UnknownMessage) as info:
        decode([header, msgpack.packb({})])
    assert info.value.type_name == "teleport"
    assert info.value.call_id == "c1-1-1"


def test_protocol_errors_have_their_kind() -> None:
    kinds = set()
    for frames in (
        [b"\xc1", b""],
        frames_of(RUN, header=lambda h: changed(h, v=9)),
        frames_of(RUN, header=lambda h: changed(h, type="nope")),
    ):
        with pytest.raises(ProtocolError) as info:
            decode(frames, max_bytes=10_000)
        kinds.add(info.value.kind)
    with pytest.raises(ProtocolError) as info:
        decode([GOOD_HEAD, GOOD_BODY], max_bytes=1)
    kinds.add(info.value.kind)
    assert kinds == {"malformed", "version", "unknown-type", "too-large"}


def test_encode_refuses_values_msgpack_cannot_carry() -> None:
    with pytest.raises(TypeError, match="'run'"):
        encode(dataclasses.replace(RUN, arguments={"s": {1, 2}}))
    with pytest.raises(TypeError, match="'output'"):
        encode(Output(call_id="c", stream="stdout", data=b"", offset=2**70))


# --- properties -------------------------------------------------------------------------------

_INTS = st.integers(min_value=-(2**63), max_value=2**64 - 1)  # msgpack's integer range
_JSON = st.recursive(
    st.none() | st.booleans() | _INTS | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)


def strategy_for(hint: Any) -> st.SearchStrategy[Any]:
    """Valid values of a field, from its type hint (mirrors what the codec supports)."""
    simple: dict[Any, st.SearchStrategy[Any]] = {
        str: st.text(max_size=30),
        int: _INTS,
        float: st.floats(allow_nan=False),
        bool: st.booleans(),
        bytes: st.binary(max_size=64),
    }
    if hint in simple:
        return simple[hint]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        (inner,) = (a for a in args if a is not type(None))
        return st.none() | strategy_for(inner)
    if origin is typing.Literal:
        return st.sampled_from(args)
    if origin is tuple:
        return st.lists(strategy_for(args[0]), max_size=4).map(tuple)
    if origin is dict:
        values = _JSON if args[1] is Any else strategy_for(args[1])
        return st.dictionaries(st.text(max_size=10), values, max_size=4)
    if hint is GracePolicy:  # its own rule: non-negative seconds
        seconds = st.floats(min_value=0.0, allow_nan=False)
        return st.builds(
            GracePolicy, interrupt=st.booleans(), term_after=seconds, kill_after=seconds
        )
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return st.sampled_from(list(hint))
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        hints = typing.get_type_hints(hint)
        fields = {f.name: strategy_for(hints[f.name]) for f in dataclasses.fields(hint)}
        return st.builds(hint, **fields)
    raise AssertionError(f"no strategy for {hint!r}")


MESSAGES = st.one_of([strategy_for(cls) for cls in MESSAGE_TYPES.values()])
FUZZ = settings(
    max_examples=400, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)


def decode_or_error(frames: Any) -> Message | ProtocolError:
    """Decode; a ProtocolError is an answer, anything else escapes and fails the test."""
    try:
        msg = decode(frames)
    except ProtocolError as error:
        return error
    encode(msg)  # whatever decodes must be re-encodable
    return msg


@FUZZ
@given(MESSAGES)
def test_every_valid_message_round_trips(msg: Message) -> None:
    assert decode(encode(msg)) == msg


@FUZZ
@given(st.binary(max_size=512))
def test_random_bytes_as_either_frame(data: bytes) -> None:
    assert isinstance(decode_or_error([data, data]), ProtocolError)
    assert isinstance(decode_or_error([GOOD_HEAD, data]), ProtocolError)
    decode_or_error([data, GOOD_BODY])


@FUZZ
@given(st.lists(st.binary(max_size=128), max_size=5))
def test_random_frame_lists(frames: list[bytes]) -> None:
    decode_or_error(frames)


_ANY_MSGPACK = st.recursive(
    st.none() | st.booleans() | _INTS | st.floats() | st.text(max_size=20) | st.binary(max_size=20),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(max_size=10) | st.binary(max_size=5), children, max_size=4)
    ),
    max_leaves=12,
)
_FIELD_NAMES = sorted({f.name for cls in MESSAGE_TYPES.values() for f in dataclasses.fields(cls)})


@settings(FUZZ, max_examples=200)  # structured inputs are slower to generate
@given(
    header=st.fixed_dictionaries(
        # Mostly a good version: random ones stop at the version check (tested on its own).
        {"v": st.just(1), "type": st.sampled_from(sorted(MESSAGE_TYPES)) | _ANY_MSGPACK},
        optional={"call_id": st.text(max_size=8) | _ANY_MSGPACK, "extra": _ANY_MSGPACK},
    ),
    payload=st.dictionaries(
        st.sampled_from(_FIELD_NAMES) | st.text(max_size=8), _ANY_MSGPACK, max_size=14
    )
    | _ANY_MSGPACK,
)
def test_random_msgpack_structures(header: dict[str, Any], payload: Any) -> None:
    decode_or_error([msgpack.packb(header), msgpack.packb(payload)])


@settings(FUZZ, max_examples=300)
@given(MESSAGES, st.data())
def test_corrupted_fields_of_valid_messages(msg: Message, data: st.DataObject) -> None:
    """Start from a valid payload and break one to three fields, so every checker is reached."""
    head, body = encode(msg)
    payload: dict[str, Any] = msgpack.unpackb(body)
    for _ in range(data.draw(st.integers(1, 3))):
        action = data.draw(st.sampled_from(["replace", "delete", "add"]))
        if action == "add":
            payload[data.draw(st.text(max_size=8))] = data.draw(_ANY_MSGPACK)
        elif payload:
            name = data.draw(st.sampled_from(sorted(payload)))
            if action == "delete":
                del payload[name]
            else:
                payload[name] = data.draw(_ANY_MSGPACK)
    decode_or_error([head, msgpack.packb(payload)])


@FUZZ
@given(st.sampled_from(SAMPLES), st.data())
def test_mutated_valid_frames(msg: Message, data: st.DataObject) -> None:
    frames = encode(msg)
    which = data.draw(st.integers(0, 1))
    frame = bytearray(frames[which])
    position = data.draw(st.integers(0, len(frame)))
    action = data.draw(st.sampled_from(["flip", "cut", "insert", "delete"]))
    if action == "flip" and position < len(frame):
        frame[position] ^= data.draw(st.integers(1, 255))
    elif action == "cut":
        del frame[position:]
    elif action == "insert":
        frame[position:position] = data.draw(st.binary(min_size=1, max_size=8))
    elif position < len(frame):
        del frame[position]
    frames[which] = bytes(frame)
    decode_or_error(frames)
