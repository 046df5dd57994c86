"""The wire between the supervisor and its workers: messages, the msgpack codec, ZeroMQ framing,
and CURVE (keys and a ZAP allow-list) for workers on other hosts.

An internal face, with no stability promise (docs/architecture.md, Who the names are for): the
wire changes with the protocol version, and supervisor and worker always come from one install.

Imports only ``andon.base`` (and msgpack, zmq). See docs/workers.md, The protocol.
"""

from andon.protocol._checks import MAX_JSON_DEPTH
from andon.protocol._codec import DEFAULT_MAX_BYTES, MESSAGE_TYPES, decode, encode
from andon.protocol._curve import (
    CurveKeys,
    ZapAllowList,
    curve_client,
    curve_server,
    is_loopback,
    key_from_text,
    key_to_hex,
    load_keys,
    load_public_keys,
    write_keys,
)
from andon.protocol._framing import (
    Routed,
    recv_message,
    recv_message_sync,
    recv_routed,
    recv_routed_sync,
    send_message,
    send_message_sync,
    send_routed,
    send_routed_sync,
)
from andon.protocol._messages import (
    OUTPUT_WINDOW,
    PROTOCOL_VERSION,
    Ack,
    Cancel,
    ErrorInfo,
    ErrorReply,
    Heartbeat,
    Hello,
    Message,
    MessageType,
    Output,
    Refused,
    Result,
    Run,
    Shutdown,
    Signalled,
    Started,
    Welcome,
)

__all__ = [
    "DEFAULT_MAX_BYTES",
    "MAX_JSON_DEPTH",
    "MESSAGE_TYPES",
    "OUTPUT_WINDOW",
    "PROTOCOL_VERSION",
    "Ack",
    "Cancel",
    "CurveKeys",
    "ErrorInfo",
    "ErrorReply",
    "Heartbeat",
    "Hello",
    "Message",
    "MessageType",
    "Output",
    "Refused",
    "Result",
    "Routed",
    "Run",
    "Shutdown",
    "Signalled",
    "Started",
    "Welcome",
    "ZapAllowList",
    "curve_client",
    "curve_server",
    "decode",
    "encode",
    "is_loopback",
    "key_from_text",
    "key_to_hex",
    "load_keys",
    "load_public_keys",
    "recv_message",
    "recv_message_sync",
    "recv_routed",
    "recv_routed_sync",
    "send_message",
    "send_message_sync",
    "send_routed",
    "send_routed_sync",
    "write_keys",
]
