"""Framing over real ZeroMQ sockets (ipc://): a DEALER worker and a ROUTER supervisor.

Every exchange is ordered by the messages themselves (each side waits to receive what the other
sent), never by sleeps. Every socket and context is closed, and the ipc folder removed.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import msgpack
import pytest
import zmq
import zmq.asyncio

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
    PROTOCOL_VERSION,
    ErrorInfo,
    ErrorReply,
    Hello,
    Result,
    Routed,
    Run,
    Welcome,
    encode,
    recv_message,
    recv_message_sync,
    recv_routed,
    recv_routed_sync,
    send_message,
    send_message_sync,
    send_routed,
    send_routed_sync,
)

WORKER = b"w1"
TIMEOUT_MS = 5_000  # a receive that waits this long means the test is broken, not slow

HELLO = Hello(protocol=1, worker_id="w1", host="runner-7", pid=4301, tools=("bash",))
RUN = Run(
    call_id="c1-1-1",
    tool="bash",
    tag="s-0-c1-1-1",
    arguments={"command": "printf 'héllo'"},
    cwd="/tmp",
    timeout=float("inf"),
    grace=GracePolicy(term_after=0.2, kill_after=0.3),
    output_head_bytes=1024,
    output_tail_bytes=1024,
    env_add={"ANDON_CALL_ID": "c1-1-1"},
    env_remove=("OPENAI_API_KEY",),
)
RESULT = Result(
    call_id="c1-1-1",
    exit_code=None,
    exit_signal=9,
    ended_by="kill",
    content="héllo\n[stopped: aborted by user]",
    error=ErrorInfo(name="Aborted", code=ErrorCode.ABORTED, message="tool call aborted"),
    output_head=b"h\xc3\xa9llo",
    output_tail=b"",
    output_bytes=6,
    duration=0.51,
)


@pytest.fixture
def endpoint() -> Iterator[str]:
    """An ipc endpoint in a private, short folder under /tmp (ipc paths must stay < 107 bytes)."""
    folder = tempfile.mkdtemp(prefix="andon-", dir="/tmp")
    try:
        path = Path(folder) / "sup.sock"
        assert len(str(path).encode()) < 107
        yield f"ipc://{path}"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _configure(router: zmq.Socket[object], dealer: zmq.Socket[object]) -> None:
    router.setsockopt(zmq.ROUTER_MANDATORY, 1)
    dealer.setsockopt(zmq.IDENTITY, WORKER)
    for sock in (router, dealer):
        sock.setsockopt(zmq.RCVTIMEO, TIMEOUT_MS)
        sock.setsockopt(zmq.SNDTIMEO, TIMEOUT_MS)


@asynccontextmanager
async def async_pair(endpoint: str) -> AsyncIterator[tuple[zmq.asyncio.Socket, zmq.asyncio.Socket]]:
    ctx = zmq.asyncio.Context()
    router = ctx.socket(zmq.ROUTER)
    dealer = ctx.socket(zmq.DEALER)
    try:
        _configure(router, dealer)
        router.bind(endpoint)
        dealer.connect(endpoint)
        yield router, dealer
    finally:
        dealer.close(linger=0)
        router.close(linger=0)
        ctx.term()


@contextmanager
def sync_pair(endpoint: str) -> Iterator[tuple[zmq.Socket[bytes], zmq.Socket[bytes]]]:
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    dealer = ctx.socket(zmq.DEALER)
    try:
        _configure(router, dealer)
        router.bind(endpoint)
        dealer.connect(endpoint)
        yield router, dealer
    finally:
        dealer.close(linger=0)
        router.close(linger=0)
        ctx.term()


async def test_dealer_router_exchange(endpoint: str) -> None:
    async with async_pair(endpoint) as (router, dealer):
        # The worker speaks first: the ROUTER learns its identity from the hello.
        await send_message(dealer, HELLO)
        identity, hello, _ = await recv_routed(router)
        assert (identity, hello) == (WORKER, HELLO)

        await send_routed(
            router, identity, Welcome(heartbeat_interval=1.0, max_message_bytes=1 << 24)
        )
        assert await recv_message(dealer) == Welcome(
            heartbeat_interval=1.0, max_message_bytes=1 << 24
        )

        await send_routed(router, identity, RUN)
        run = await recv_message(dealer)
        assert run == RUN

        await send_message(dealer, RESULT)
        routed = await recv_routed(router)
        assert isinstance(routed, Routed)
        assert routed == Routed(WORKER, RESULT)


async def test_garbage_on_the_router_keeps_the_sender_identity(endpoint: str) -> None:
    async with async_pair(endpoint) as (router, dealer):
        await dealer.send_multipart([b"garbage"])
        identity, error, _ = await recv_routed(router)
        assert identity == WORKER
        assert isinstance(error, MalformedFrame)

        # The supervisor can answer that worker, and the worker decodes the answer.
        await send_routed(router, identity, ErrorReply(reason=str(error)))
        reply = await recv_message(dealer)
        assert isinstance(reply, ErrorReply)
        assert reply.call_id is None

        # The socket is still usable: the next good message goes through.
        await send_message(dealer, RESULT)
        assert await recv_routed(router) == (WORKER, RESULT, None)


async def test_every_kind_of_bad_frame_on_the_router(endpoint: str) -> None:
    head, body = encode(RESULT)
    wrong_version = msgpack.packb({"v": 99, "type": "result", "call_id": "c1-1-1"})
    unknown = msgpack.packb({"v": PROTOCOL_VERSION, "type": "teleport", "call_id": "c1-1-1"})
    cases: list[tuple[list[bytes], type[ProtocolError], str | None]] = [
        ([head, body[:-1]], MalformedFrame, "c1-1-1"),
        ([head], MalformedFrame, None),
        ([wrong_version, body], VersionMismatch, None),
        ([unknown, body], UnknownMessage, "c1-1-1"),
    ]
    async with async_pair(endpoint) as (router, dealer):
        for frames, expected, call_id in cases:
            await dealer.send_multipart(frames)
            identity, error, _ = await recv_routed(router)
            assert identity == WORKER
            assert isinstance(error, expected)
            assert error.call_id == call_id
        # The size limit applies to what the peer sent, not to the identity frame ZeroMQ added.
        size = len(head) + len(body)
        await send_message(dealer, RESULT)
        assert await recv_routed(router, size) == (WORKER, RESULT, None)
        await send_message(dealer, RESULT)
        identity, error, _ = await recv_routed(router, size - 1)
        assert identity == WORKER
        assert isinstance(error, MessageTooLarge)


async def test_garbage_to_the_dealer_raises_and_does_not_break_it(endpoint: str) -> None:
    async with async_pair(endpoint) as (router, dealer):
        await send_message(dealer, HELLO)
        identity, _, _ = await recv_routed(router)

        await router.send_multipart([identity, b"\xc1", b"\xc1"])
        with pytest.raises(MalformedFrame):
            await recv_message(dealer)

        await send_routed(router, identity, RUN)
        assert await recv_message(dealer) == RUN


async def test_send_refuses_an_oversized_message(endpoint: str) -> None:
    async with async_pair(endpoint) as (router, dealer):
        with pytest.raises(MessageTooLarge):
            await send_message(dealer, RESULT, max_bytes=10)
        with pytest.raises(MessageTooLarge):
            await send_routed(router, WORKER, RUN, max_bytes=10)


def test_sync_exchange(endpoint: str) -> None:
    with sync_pair(endpoint) as (router, dealer):
        send_message_sync(dealer, HELLO)
        identity, hello, _ = recv_routed_sync(router)
        assert (identity, hello) == (WORKER, HELLO)

        send_routed_sync(router, identity, RUN)
        assert recv_message_sync(dealer) == RUN

        send_message_sync(dealer, RESULT)
        assert recv_routed_sync(router) == (WORKER, RESULT, None)

        dealer.send_multipart([b"\x92", b"x"])
        identity, error, _ = recv_routed_sync(router)
        assert identity == WORKER
        assert isinstance(error, MalformedFrame)

        router.send_multipart([identity, b"not", b"msgpack\xc1"])
        with pytest.raises(MalformedFrame):
            recv_message_sync(dealer)


async def test_a_router_sends_frames_already_encoded(endpoint: str) -> None:
    # A caller that must know a message fits encodes it first, then sends those frames as they are.
    async with async_pair(endpoint) as (router, dealer):
        await send_message(dealer, HELLO)
        identity, _, _ = await recv_routed(router)
        await send_routed(router, identity, encode(RUN))
        assert await recv_message(dealer) == RUN


async def test_reading_the_user_id_without_zap_gives_none(endpoint: str) -> None:
    # The copy=False receive that reads connection metadata decodes exactly what the plain one
    # does; a connection with no ZAP handler simply has no user id.
    async with async_pair(endpoint) as (router, dealer):
        await send_message(dealer, RESULT)
        assert await recv_routed(router, read_user_id=True) == (WORKER, RESULT, None)
        await dealer.send_multipart([b"garbage"])
        identity, error, user_id = await recv_routed(router, read_user_id=True)
        assert (identity, user_id) == (WORKER, None)
        assert isinstance(error, MalformedFrame)
    with sync_pair(endpoint) as (router_sync, dealer_sync):
        send_message_sync(dealer_sync, RESULT)
        assert recv_routed_sync(router_sync, read_user_id=True) == (WORKER, RESULT, None)
