"""Messages over ZeroMQ: thin helpers for the supervisor's ROUTER and a worker's DEALER.

* DEALER (a worker): frames ``[header, payload]``.
* ROUTER (the supervisor): frames ``[identity, header, payload]``; ZeroMQ adds and strips the
  identity frame.

A DEALER-side receive raises the :class:`ProtocolError` (the worker answers it with ``error`` and
keeps going). A ROUTER-side receive never raises one: it returns the error *with the sender's
identity*, because the supervisor must know which worker is broken to kill it (workers.md).

Socket options (``ROUTER_MANDATORY``, linger, ``MAXMSGSIZE``) are the pool's business, not set here.
Each helper comes as a coroutine (``zmq.asyncio`` sockets) and as a ``*_sync`` function (plain
blocking sockets, for tests, tools and the benchmark floors).
"""

from __future__ import annotations

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
    """What a ROUTER received: the sender's identity and its message, or why it was refused."""

    identity: bytes
    message: Message | ProtocolError


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
    sock: zmq.asyncio.Socket, identity: bytes, msg: Message, *, max_bytes: int | None = None
) -> None:
    """Send ``msg`` to the peer ``identity`` on a ROUTER.

    With ``ROUTER_MANDATORY`` set, a gone peer raises ``zmq.ZMQError`` (EHOSTUNREACH): the
    worker is lost. That is left to the caller, which knows what the worker was doing.
    """
    await sock.send_multipart([identity, *encode(msg, max_bytes=max_bytes)])


async def recv_routed(sock: zmq.asyncio.Socket, max_bytes: int = DEFAULT_MAX_BYTES) -> Routed:
    """Receive one message on a ROUTER: ``(identity, message or ProtocolError)``."""
    frames = await sock.recv_multipart(copy=True)
    return _split_routed(frames, max_bytes)


def send_routed_sync(
    sock: zmq.Socket[Any], identity: bytes, msg: Message, *, max_bytes: int | None = None
) -> None:
    """Blocking :func:`send_routed`."""
    sock.send_multipart([identity, *encode(msg, max_bytes=max_bytes)])


def recv_routed_sync(sock: zmq.Socket[Any], max_bytes: int = DEFAULT_MAX_BYTES) -> Routed:
    """Blocking :func:`recv_routed`."""
    frames = sock.recv_multipart(copy=True)
    return _split_routed(frames, max_bytes)


def _split_routed(frames: list[bytes], max_bytes: int) -> Routed:
    if not frames:  # a ROUTER always prepends the identity; guard anyway, cheaply
        return Routed(b"", MalformedFrame("a routed message without an identity frame"))
    identity = frames[0]
    try:
        # The identity frame is ZeroMQ's, not the peer's: it does not count toward the limit.
        return Routed(identity, decode(frames[1:], max_bytes))
    except ProtocolError as error:
        return Routed(identity, error)
