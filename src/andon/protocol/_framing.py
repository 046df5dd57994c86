"""Messages over ZeroMQ: thin helpers for the supervisor's ROUTER and a worker's DEALER.

* DEALER (a worker): frames ``[header, payload]``.
* ROUTER (the supervisor): frames ``[identity, header, payload]``; ZeroMQ adds and strips the
  identity frame.

A DEALER-side receive raises the :class:`ProtocolError` (the worker answers it with ``error`` and
keeps going). A ROUTER-side receive never raises one: it returns the error *with the sender's
identity*, because the supervisor must know which worker is broken to kill it (docs/workers.md,
The protocol).

Over CURVE a ROUTER must also know *which key* sent a message, so that one worker cannot speak
under another's identity: ``recv_routed(..., read_user_id=True)`` returns the ZAP user id the
handshake proved. ZeroMQ hands that metadata only on ``zmq.Frame`` objects, which is why that
receive is ``copy=False`` (the frames are then copied out once, to the ``bytes`` the codec takes).

Socket options (``ROUTER_MANDATORY``, linger, ``MAXMSGSIZE``) are the pool's business, not set here.
Each helper comes as a coroutine (``zmq.asyncio`` sockets) and as a ``*_sync`` function (plain
blocking sockets, for tests, tools and the benchmark floors).
"""

from __future__ import annotations

import contextlib
from typing import Any, NamedTuple

import zmq
import zmq.asyncio

from andon.base import MalformedFrame, ProtocolError
from andon.protocol._codec import DEFAULT_MAX_BYTES, decode, encode
from andon.protocol._messages import Message

__all__ = [
    "Routed",
    "recv_message",
    "recv_message_sync",
    "recv_routed",
    "recv_routed_sync",
    "send_message",
    "send_message_sync",
    "send_routed",
    "send_routed_sync",
]


class Routed(NamedTuple):
    """What a ROUTER received: the sender's identity and its message, or why it was refused.

    ``user_id`` is the key the sender's CURVE handshake proved (the ZAP user id), read only when
    asked for (``read_user_id=True``); None otherwise, or when the connection has none.
    """

    identity: bytes
    message: Message | ProtocolError
    user_id: str | None = None


# --- DEALER side (worker) ---------------------------------------------------------------------


async def send_message(
    sock: zmq.asyncio.Socket, msg: Message, *, max_bytes: int | None = None
) -> None:
    """Send ``msg`` on a DEALER. ``max_bytes`` refuses an oversized message before it is sent."""
    await sock.send_multipart(encode(msg, max_bytes=max_bytes))


async def recv_message(sock: zmq.asyncio.Socket, max_bytes: int = DEFAULT_MAX_BYTES) -> Message:
    """Receive one message on a DEALER; a bad frame raises a :class:`ProtocolError` subclass."""
    # copy=True hands back bytes (not zmq.Frame), which is what the codec takes.
    frames = await sock.recv_multipart(copy=True)
    return decode(frames, max_bytes)


def send_message_sync(sock: zmq.Socket[Any], msg: Message, *, max_bytes: int | None = None) -> None:
    """Blocking :func:`send_message`."""
    sock.send_multipart(encode(msg, max_bytes=max_bytes))


def recv_message_sync(sock: zmq.Socket[Any], max_bytes: int = DEFAULT_MAX_BYTES) -> Message:
    """Blocking :func:`recv_message`."""
    frames = sock.recv_multipart(copy=True)
    return decode(frames, max_bytes)


# --- ROUTER side (supervisor) -----------------------------------------------------------------


async def send_routed(
    sock: zmq.asyncio.Socket,
    identity: bytes,
    msg: Message | list[bytes],
    *,
    max_bytes: int | None = None,
) -> None:
    """Send ``msg`` to the peer ``identity`` on a ROUTER.

    ``msg`` may be a message already encoded by :func:`encode` (then ``max_bytes`` is not
    checked again): a caller that must know a message fits before it commits to sending it
    encodes it first. An encoding failure raises before anything is sent.

    With ``ROUTER_MANDATORY`` set, a gone peer raises ``zmq.ZMQError`` (EHOSTUNREACH): the
    worker is lost. That is left to the caller, which knows what the worker was doing.
    """
    await sock.send_multipart([identity, *_frames_of(msg, max_bytes)])


async def recv_routed(
    sock: zmq.asyncio.Socket, max_bytes: int = DEFAULT_MAX_BYTES, *, read_user_id: bool = False
) -> Routed:
    """Receive one message on a ROUTER: ``(identity, message or ProtocolError, user_id)``."""
    if read_user_id:
        return _split_frames(await sock.recv_multipart(copy=False), max_bytes)
    return _split_routed(await sock.recv_multipart(copy=True), max_bytes)


def send_routed_sync(
    sock: zmq.Socket[Any],
    identity: bytes,
    msg: Message | list[bytes],
    *,
    max_bytes: int | None = None,
    flags: int = 0,
) -> None:
    """Blocking :func:`send_routed` (``flags=zmq.NOBLOCK``: at once, or raise ``zmq.Again``)."""
    sock.send_multipart([identity, *_frames_of(msg, max_bytes)], flags=flags)


def recv_routed_sync(
    sock: zmq.Socket[Any], max_bytes: int = DEFAULT_MAX_BYTES, *, read_user_id: bool = False
) -> Routed:
    """Blocking :func:`recv_routed`."""
    if read_user_id:
        return _split_frames(sock.recv_multipart(copy=False), max_bytes)
    return _split_routed(sock.recv_multipart(copy=True), max_bytes)


def _frames_of(msg: Message | list[bytes], max_bytes: int | None) -> list[bytes]:
    return msg if isinstance(msg, list) else encode(msg, max_bytes=max_bytes)


def _split_frames(raw: list[zmq.Frame], max_bytes: int) -> Routed:
    # Every frame of a message carries the connection's metadata; the first one is read. A
    # connection without ZAP has no User-Id, which ZeroMQ reports as an error (EINVAL).
    user_id: object = None
    if raw:
        with contextlib.suppress(zmq.ZMQError):
            user_id = raw[0].get("User-Id")
    frames = [frame.bytes for frame in raw]
    return _split_routed(frames, max_bytes, str(user_id) if user_id else None)


def _split_routed(frames: list[bytes], max_bytes: int, user_id: str | None = None) -> Routed:
    if not frames:  # a ROUTER always prepends the identity; guard anyway, cheaply
        return Routed(b"", MalformedFrame("a routed message without an identity frame"), user_id)
    identity = frames[0]
    try:
        # The identity frame is ZeroMQ's, not the peer's: it does not count toward the limit.
        return Routed(identity, decode(frames[1:], max_bytes), user_id)
    except ProtocolError as error:
        return Routed(identity, error, user_id)
