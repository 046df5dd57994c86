"""The msgpack codec: a message is two frames, ``[header, payload]`` (docs/workers.md, The
protocol).

* header: msgpack ``{"v": PROTOCOL_VERSION, "type": <tag>, "call_id"?: <str>}``. ``call_id`` is
  there whenever the message has a non-None one, so an error about a bad payload can still name
  the call it belongs to.
* payload: msgpack map of field name to value. Nested dataclasses are maps of their fields (a
  ``GracePolicy`` is exactly its ``to_dict()``), tuples are arrays, bytes are msgpack ``bin``,
  floats are float64 (``inf`` survives).

Decoding trusts nothing: a worker that sends a bad frame is broken and gets killed
(docs/workers.md, The protocol), and a bad frame sent *to* a worker must be answered, never crash
it. So ``decode`` raises only :class:`ProtocolError` subclasses, whatever the bytes:

* size over the limit -> ``MessageTooLarge``, checked before anything is unpacked;
* ``v`` other than ``PROTOCOL_VERSION`` -> ``VersionMismatch``;
* an unknown ``type`` -> ``UnknownMessage``;
* anything else (frame count, not msgpack, header not a map, a payload field missing, unexpected
  or of the wrong type) -> ``MalformedFrame``, naming the message type and the field.

Validation is generic: a checker is compiled once per message class from its fields' type hints
(``_checks`` lists the supported forms). Never pickle on the wire.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Final

import msgpack

from andon.base import Invalid, MalformedFrame, MessageTooLarge, UnknownMessage, VersionMismatch
from andon.protocol._checks import Checker, dataclass_checker, kind, preview
from andon.protocol._messages import MESSAGE_CLASSES, PROTOCOL_VERSION, Message

__all__ = ["DEFAULT_MAX_BYTES", "MESSAGE_TYPES", "decode", "encode"]

DEFAULT_MAX_BYTES: Final = 16 * 1024 * 1024
"""The default limit on a message's total size (all frames), in bytes."""

MESSAGE_TYPES: Final[Mapping[str, type[Message]]] = types.MappingProxyType(
    {cls.type: cls for cls in MESSAGE_CLASSES}
)
"""Wire tag -> message class."""

_HEADER_KEYS: Final = frozenset({"v", "type", "call_id"})


# --- encoding ---------------------------------------------------------------------------------


def encode(msg: Message, *, max_bytes: int | None = None) -> list[bytes]:
    """Encode ``msg`` as ``[header, payload]``.

    With ``max_bytes``, a message whose frames total more raises :class:`MessageTooLarge` here,
    so the sender learns of it instead of the receiver declaring the sender broken. Values are
    trusted to match the field types (the receiver validates); an unencodable value (a set, an
    int beyond 64 bits) raises ``TypeError`` naming the message type.
    """
    header: dict[str, object] = {"v": PROTOCOL_VERSION, "type": msg.type}
    call_id = getattr(msg, "call_id", None)
    if call_id is not None:
        header["call_id"] = call_id
    try:
        frames = [
            msgpack.packb(header, use_bin_type=True),
            msgpack.packb(_fields_of(msg), use_bin_type=True, default=_encode_default),
        ]
    except (TypeError, ValueError, OverflowError) as exc:
        raise TypeError(f"cannot encode a {msg.type!r} message: {exc}") from exc
    if max_bytes is not None:
        size = len(frames[0]) + len(frames[1])
        if size > max_bytes:
            raise MessageTooLarge(size, max_bytes)
    return frames


def _fields_of(obj: Any) -> dict[str, object]:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


def _encode_default(obj: object) -> object:
    # msgpack calls this for what it cannot pack itself: only nested dataclasses are expected.
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return _fields_of(obj)
    raise TypeError(f"{type(obj).__name__} is not a wire type")


# --- decoding ---------------------------------------------------------------------------------


def decode(
    frames: Sequence[bytes | bytearray | memoryview], max_bytes: int = DEFAULT_MAX_BYTES
) -> Message:
    """Decode ``[header, payload]`` into a message, or raise a :class:`ProtocolError` subclass.

    Each frame may be any bytes-like object. The total size is checked against ``max_bytes``
    before anything is unpacked.
    """
    if not isinstance(frames, list | tuple):
        raise MalformedFrame(f"frames must be a list of bytes, not {type(frames).__name__}")
    size = 0
    for i, frame in enumerate(frames):
        try:
            size += memoryview(frame).nbytes
        except TypeError:
            raise MalformedFrame(f"frame {i} is not bytes but {type(frame).__name__}") from None
    if size > max_bytes:
        raise MessageTooLarge(size, max_bytes)
    if len(frames) != 2:
        raise MalformedFrame(f"a message is 2 frames (header, payload), got {len(frames)}")

    header = _unpack(frames[0], "header")
    if type(header) is not dict:
        raise MalformedFrame(f"the header is not a map but {kind(header)}")
    # The version first: another version may shape everything after it differently.
    if "v" not in header:
        raise MalformedFrame("the header has no 'v' (protocol version)")
    version = header["v"]
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise VersionMismatch(preview(version), PROTOCOL_VERSION)
    extra = [k for k in header if k not in _HEADER_KEYS]
    if extra:
        raise MalformedFrame(f"the header has an unexpected key {preview(extra[0])}")
    call_id = header.get("call_id")
    if "call_id" in header and type(call_id) is not str:
        raise MalformedFrame(f"the header's 'call_id' is not a string but {kind(call_id)}")
    header_call_id = call_id if type(call_id) is str else None
    if "type" not in header:
        raise MalformedFrame("the header has no 'type'", call_id=header_call_id)
    tag = header["type"]
    if type(tag) is not str:
        raise MalformedFrame(
            f"the header's 'type' is not a string but {kind(tag)}", call_id=header_call_id
        )
    checker = _CHECKERS.get(tag)
    if checker is None:
        error = UnknownMessage(preview(tag))
        error.call_id = header_call_id
        raise error

    payload = _unpack(frames[1], f"{tag!r} payload", call_id=header_call_id)
    try:
        msg = checker(payload)
    except Invalid as exc:
        raise MalformedFrame(
            f"malformed {tag!r} message: {exc.describe()}", call_id=header_call_id
        ) from None
    payload_call_id = getattr(msg, "call_id", None)
    if payload_call_id != header_call_id:
        # The header's call_id is what errors are attributed by: it must not disagree.
        raise MalformedFrame(
            f"malformed {tag!r} message: header call_id {preview(header_call_id)!r} does not "
            f"match the payload's {preview(payload_call_id)!r}",
            call_id=header_call_id,
        )
    return typing.cast(Message, msg)


def _unpack(
    frame: bytes | bytearray | memoryview, what: str, *, call_id: str | None = None
) -> object:
    try:
        # raw=False: str stays str and bin stays bytes. strict_map_key: keys are str or bytes
        # only. The other length limits default to the frame's own length, which bounds memory
        # a lying length prefix can claim. No extension types (incl. timestamps) are valid.
        return msgpack.unpackb(frame, raw=False, strict_map_key=True, use_list=True, max_ext_len=0)
    except Exception as exc:  # msgpack raises ValueError, FormatError, StackError, UnicodeError ...
        detail = str(exc) or type(exc).__name__
        raise MalformedFrame(
            f"the {what} frame is not valid msgpack: {detail}", call_id=call_id
        ) from exc


_CHECKERS: Final[Mapping[str, Checker]] = {
    cls.type: dataclass_checker(cls) for cls in MESSAGE_CLASSES
}
