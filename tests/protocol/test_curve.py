"""CURVE and the ZAP allow-list over real tcp sockets on 127.0.0.1, and the key files.

Every wait is for a real event (a message received, a refusal reported through ``on_refused``, a
socket-monitor event), bounded by ``TIMEOUT`` so a broken test fails fast instead of hanging.
"Nothing arrived at the ROUTER" is proved by order: after the refusal, an allowed client's message
is the first thing the ROUTER receives, and nothing else is waiting behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import stat
from collections.abc import AsyncIterator, Awaitable, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pytest
import zmq
import zmq.asyncio
import zmq.auth
from zmq.utils.monitor import parse_monitor_message

from andon.base import ConfigError
from andon.protocol import (
    CurveKeys,
    Heartbeat,
    ZapAllowList,
    curve_client,
    curve_server,
    load_keys,
    load_public_keys,
    recv_routed,
    send_message,
    write_keys,
)

TIMEOUT = 5.0  # a wait this long means the test is broken, not slow
ZAP = "inproc://zeromq.zap.01"

T = TypeVar("T")


async def within(awaitable: Awaitable[T]) -> T:
    return await asyncio.wait_for(awaitable, TIMEOUT)


@dataclass
class Server:
    """A CURVE ROUTER on 127.0.0.1 guarded by a ZapAllowList, and the clients of one test."""

    ctx: zmq.asyncio.Context
    keys: CurveKeys
    zap: ZapAllowList
    router: zmq.asyncio.Socket
    endpoint: str
    refusals: asyncio.Queue[str]
    sockets: list[zmq.asyncio.Socket] = field(default_factory=list)

    def client(self, keys: CurveKeys | None, *, connect: bool = True) -> zmq.asyncio.Socket:
        """A DEALER for the ROUTER: a CURVE client with ``keys``, or plain with None."""
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        if keys is not None:
            curve_client(sock, keys, self.keys.public)
        self.sockets.append(sock)
        if connect:
            sock.connect(self.endpoint)
        return sock

    def monitor(self, sock: zmq.asyncio.Socket, events: int) -> zmq.asyncio.Socket:
        """Events of ``sock`` from now on: attach it before the connection it should see."""
        mon = sock.get_monitor_socket(events)
        self.sockets.append(mon)
        return mon

    def nothing_else_queued(self) -> bool:
        events = self.router.getsockopt(zmq.EVENTS)
        assert isinstance(events, int)
        return not events & zmq.POLLIN


@asynccontextmanager
async def curve_server_with(allowed: Iterable[bytes]) -> AsyncIterator[Server]:
    ctx = zmq.asyncio.Context()
    refusals: asyncio.Queue[str] = asyncio.Queue()
    zap = ZapAllowList(allowed, on_refused=refusals.put_nowait)
    await zap.start(ctx)  # before the ROUTER binds
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    keys = CurveKeys.generate()
    curve_server(router, keys)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    server = Server(ctx, keys, zap, router, f"tcp://127.0.0.1:{port}", refusals)
    try:
        yield server
    finally:
        for sock in server.sockets:
            sock.close(linger=0)
        router.close(linger=0)
        await zap.aclose()
        ctx.term()


async def next_event(mon: zmq.asyncio.Socket) -> tuple[int, int]:
    """The next monitor event of ``mon``: ``(event, value)``."""
    event = parse_monitor_message(await within(mon.recv_multipart()))
    return event["event"], event["value"]


# --- the handshake ----------------------------------------------------------------------------


async def test_an_allowed_client_talks_both_ways() -> None:
    worker = CurveKeys.generate()
    async with curve_server_with([worker.public]) as server:
        dealer = server.client(worker)
        await dealer.send(b"hello")
        identity, body = await within(server.router.recv_multipart(copy=False))
        assert body.bytes == b"hello"
        # The ZAP reply's user id travels with every message of that peer.
        assert body.get("User-Id") == worker.public.decode()

        await server.router.send_multipart([identity.bytes, b"welcome"])
        assert await within(dealer.recv()) == b"welcome"
        assert server.zap.refused == 0


async def test_a_routed_receive_reads_the_key_the_handshake_proved() -> None:
    # What the pool checks a worker's identity against (one worker never speaks as another).
    worker = CurveKeys.generate()
    async with curve_server_with([worker.public]) as server:
        dealer = server.client(worker)
        await send_message(dealer, Heartbeat(time=1.0))
        routed = await within(recv_routed(server.router, read_user_id=True))
        assert routed.message == Heartbeat(time=1.0)
        assert routed.user_id == worker.public.decode()


async def test_a_key_not_on_the_list_is_refused() -> None:
    friend, stranger = CurveKeys.generate(), CurveKeys.generate()
    async with curve_server_with([friend.public]) as server:
        outsider = server.client(stranger, connect=False)
        watch = server.monitor(outsider, zmq.EVENT_HANDSHAKE_FAILED_AUTH)
        outsider.connect(server.endpoint)
        await outsider.send(b"from the stranger")

        reason = await within(server.refusals.get())
        assert stranger.public.decode() in reason
        assert "127.0.0.1" in reason
        assert server.zap.refused == 1
        # The client is told: an ERROR command carrying ZAP's status code.
        assert await next_event(watch) == (zmq.EVENT_HANDSHAKE_FAILED_AUTH, 400)

        await server.client(friend).send(b"from the friend")
        assert (await within(server.router.recv_multipart()))[1:] == [b"from the friend"]
        assert server.nothing_else_queued()
        # libzmq does not retry a refused handshake: still one refusal.
        assert server.zap.refused == 1


async def test_a_plain_client_never_reaches_zap() -> None:
    friend = CurveKeys.generate()
    async with curve_server_with([friend.public]) as server:
        watch = server.monitor(server.router, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)
        plain = server.client(None, connect=False)
        plain_watch = server.monitor(plain, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL)
        plain.connect(server.endpoint)
        # Without blocking: the handshake may already have failed and taken the only pipe with
        # it, and a DEALER with no pipe waits for ever to send (seen once under load).
        with contextlib.suppress(zmq.Again):
            await plain.send(b"plain text", flags=zmq.NOBLOCK)

        # The greetings name different mechanisms (NULL against CURVE); the server drops the
        # connection before any ZAP request, so on_refused is not called.
        for mon in (watch, plain_watch):
            assert await next_event(mon) == (
                zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH,
            )

        await server.client(friend).send(b"from the friend")
        assert (await within(server.router.recv_multipart()))[1:] == [b"from the friend"]
        assert server.nothing_else_queued()
        assert server.zap.refused == 0
        assert server.refusals.empty()


async def test_allow_at_run_time_lets_a_refused_key_in_and_disallow_shuts_it_out() -> None:
    late = CurveKeys.generate()
    async with curve_server_with([]) as server:
        dealer = server.client(late)
        await dealer.send(b"too early")
        assert late.public.decode() in await within(server.refusals.get())

        server.zap.allow(late.public)
        assert server.zap.keys == {late.public}
        # A refused client is not retried by libzmq (and what it had queued is gone): connect anew.
        dealer.disconnect(server.endpoint)
        dealer.connect(server.endpoint)
        await dealer.send(b"second try")
        assert (await within(server.router.recv_multipart()))[1:] == [b"second try"]
        assert server.nothing_else_queued()

        server.zap.disallow(late.public)
        await server.client(late).send(b"third")
        assert late.public.decode() in await within(server.refusals.get())
        assert server.zap.refused == 2


async def test_other_mechanisms_are_refused() -> None:
    # A NULL-mechanism socket with a ZAP domain asks the handler too; only CURVE may pass.
    async with curve_server_with([]) as server:
        null_router = server.ctx.socket(zmq.ROUTER)
        server.sockets.append(null_router)
        null_router.setsockopt(zmq.ZAP_DOMAIN, b"other")
        port = null_router.bind_to_random_port("tcp://127.0.0.1")
        plain = server.ctx.socket(zmq.DEALER)
        server.sockets.append(plain)
        plain.connect(f"tcp://127.0.0.1:{port}")
        await plain.send(b"null")

        reason = await within(server.refusals.get())
        assert "NULL" in reason
        assert server.zap.refused == 1


async def test_without_a_running_handler_nobody_gets_in() -> None:
    friend = CurveKeys.generate()
    async with curve_server_with([friend.public]) as server:
        await server.zap.aclose()
        watch = server.monitor(server.router, zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
        await server.client(friend).send(b"hello")
        # ZAP_ENFORCE_DOMAIN: no handler is a failed handshake, not an open door.
        event, _ = await next_event(watch)
        assert event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
        assert server.nothing_else_queued()


async def test_malformed_zap_requests_get_500_and_the_handler_keeps_serving() -> None:
    friend = CurveKeys.generate()
    raw_friend = zmq.utils.z85.decode(friend.public)
    async with curve_server_with([friend.public]) as server:
        req = server.ctx.socket(zmq.REQ)
        server.sockets.append(req)
        req.connect(ZAP)
        cases: list[tuple[list[bytes], bytes, bytes]] = [
            ([b"garbage"], b"", b"500"),
            ([b"1.0", b"r2"], b"r2", b"500"),
            ([b"9.9", b"r3", b"andon", b"10.0.0.1", b"", b"CURVE", raw_friend], b"r3", b"500"),
            ([b"1.0", b"r4", b"andon", b"10.0.0.1", b"", b"CURVE", b"short"], b"r4", b"500"),
            ([b"1.0", b"r5", b"andon", b"10.0.0.1", b"", b"CURVE"], b"r5", b"500"),
            ([b"1.0", b"r6", b"andon", b"10.0.0.1", b"", b"PLAIN", b"u", b"p"], b"r6", b"400"),
        ]
        for frames, request_id, status in cases:
            await req.send_multipart(frames)
            reply = await within(req.recv_multipart())
            assert reply[:3] == [b"1.0", request_id, status], frames
            assert len(reply) == 6
        assert server.zap.refused == len(cases)

        # A well-formed request with an allowed key: 200, and the user id is the Z85 key.
        await req.send_multipart([b"1.0", b"r7", b"andon", b"10.0.0.1", b"", b"CURVE", raw_friend])
        assert await within(req.recv_multipart()) == [
            b"1.0",
            b"r7",
            b"200",
            b"OK",
            friend.public,
            b"",
        ]

        # And the real thing still works.
        await server.client(friend).send(b"still serving")
        assert (await within(server.router.recv_multipart()))[1:] == [b"still serving"]


async def test_a_raising_on_refused_does_not_stop_the_handler(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[str] = []

    def broken(reason: str) -> None:
        seen.append(reason)
        raise RuntimeError("observer bug")

    ctx = zmq.asyncio.Context()
    zap = ZapAllowList(on_refused=broken)
    await zap.start(ctx)
    req = ctx.socket(zmq.REQ)
    try:
        req.connect(ZAP)
        for request_id in (b"a", b"b"):
            await req.send_multipart([b"1.0", request_id, b"d", b"", b"", b"NULL"])
            assert (await within(req.recv_multipart()))[1:3] == [request_id, b"400"]
        assert len(seen) == 2
        assert zap.refused == 2
        assert "on_refused callback" in caplog.text
    finally:
        req.close(linger=0)
        await zap.aclose()
        await zap.aclose()  # idempotent
        ctx.term()


async def test_one_handler_per_context_and_one_start() -> None:
    ctx = zmq.asyncio.Context()
    first, second = ZapAllowList(), ZapAllowList()
    try:
        await first.start(ctx)
        with pytest.raises(RuntimeError, match="already started"):
            await first.start(ctx)
        with pytest.raises(zmq.ZMQError):
            await second.start(ctx)
    finally:
        await first.aclose()
        await second.aclose()
        ctx.term()


def test_allow_list_keys_are_checked() -> None:
    with pytest.raises(ValueError, match="40 Z85 characters"):
        ZapAllowList([b"short"])
    with pytest.raises(ValueError, match="40 Z85 characters"):
        ZapAllowList().allow(zmq.utils.z85.decode(CurveKeys.generate().public))


# --- keys and socket options ------------------------------------------------------------------


def test_keys_hide_the_secret() -> None:
    keys = CurveKeys.generate()
    assert len(keys.public) == len(keys.secret) == 40
    for text in (repr(keys), str(keys), f"{keys}"):
        assert keys.secret.decode() not in text
        assert keys.public.decode() in text
    with pytest.raises(ValueError, match="secret key"):
        CurveKeys(keys.public, b"not a key")
    with pytest.raises(ValueError, match="does not decode"):
        CurveKeys(b"#" * 40, keys.secret)


def test_a_certificate_hands_keys_over_without_a_file(tmp_path: Path) -> None:
    keys = CurveKeys.generate()
    text = keys.certificate()
    assert keys.secret in text
    copy = tmp_path / "copy.key_secret"
    copy.write_bytes(text)
    assert load_keys(copy) == keys
    assert zmq.auth.load_certificate(copy) == (keys.public, keys.secret)


def test_curve_client_checks_the_server_key() -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    try:
        with pytest.raises(ConfigError, match="server public key"):
            curve_client(sock, CurveKeys.generate(), b"x" * 39)
    finally:
        sock.close(linger=0)
        ctx.term()


def test_a_libzmq_without_curve_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    keys = CurveKeys.generate()
    monkeypatch.setattr(zmq, "has", lambda capability: capability != "curve")
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    try:
        for attempt in (
            CurveKeys.generate,
            lambda: curve_server(sock, keys),
            lambda: curve_client(sock, keys, keys.public),
        ):
            with pytest.raises(ConfigError, match="without CURVE"):
                attempt()
    finally:
        sock.close(linger=0)
        ctx.term()


# --- key files --------------------------------------------------------------------------------


def test_write_and_load_round_trip(tmp_path: Path) -> None:
    folder = tmp_path / "keys" / "andon"
    public_path, secret_path = write_keys(folder, "supervisor")
    assert (public_path, secret_path) == (
        folder / "supervisor.key",
        folder / "supervisor.key_secret",
    )
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(secret_path.stat().st_mode) == 0o600

    keys = load_keys(secret_path)
    assert load_public_keys(public_path) == {keys.public}
    assert keys.secret.decode() not in public_path.read_text()
    # The same format as pyzmq's certificates, so its tools read them as well.
    assert zmq.auth.load_certificate(secret_path) == (keys.public, keys.secret)
    assert zmq.auth.load_certificate(public_path) == (keys.public, None)
    # And pyzmq's files load here.
    theirs_public, theirs_secret = zmq.auth.create_certificates(tmp_path, "theirs")
    assert load_keys(Path(theirs_secret)).public in load_public_keys(Path(theirs_public))


def test_write_refuses_to_overwrite(tmp_path: Path) -> None:
    public_path, secret_path = write_keys(tmp_path, "w1")
    before = public_path.read_bytes(), secret_path.read_bytes()
    with pytest.raises(ConfigError, match=r"w1\.key already exists"):
        write_keys(tmp_path, "w1")
    assert (public_path.read_bytes(), secret_path.read_bytes()) == before

    # Only the secret half present: still refused, and no public half is written beside it.
    (tmp_path / "w2.key_secret").write_text("mine")
    with pytest.raises(ConfigError, match=r"w2\.key_secret already exists"):
        write_keys(tmp_path, "w2")
    assert not (tmp_path / "w2.key").exists()

    with pytest.raises(ConfigError, match="plain file name"):
        write_keys(tmp_path, "../escape")


def test_load_keys_errors_name_the_file(tmp_path: Path) -> None:
    public_path, secret_path = write_keys(tmp_path, "w1")
    garbage = tmp_path / "garbage.key_secret"
    garbage.write_text("hello\nworld\n")
    short = tmp_path / "short.key_secret"
    short.write_text('metadata\ncurve\n    public-key = "abc"\n')
    other = load_keys(write_keys(tmp_path, "w2")[1])
    mixed = tmp_path / "mixed.key_secret"
    mine = load_keys(secret_path)
    mixed.write_text(secret_path.read_text().replace(mine.public.decode(), other.public.decode()))
    cases = [
        (tmp_path / "missing.key_secret", "does not exist"),
        (tmp_path, "cannot read"),
        (garbage, "not a CURVE certificate"),
        (public_path, "no secret-key"),
        (short, r":3: bad public-key: a CURVE key is 40 Z85 characters, this one has 3"),
        (mixed, "is not the one of its secret-key"),
    ]
    for path, message in cases:
        with pytest.raises(ConfigError, match=message) as caught:
            load_keys(path)
        assert str(path) in str(caught.value)


def test_load_public_keys_from_a_folder_a_file_or_a_list(tmp_path: Path) -> None:
    folder = tmp_path / "workers"
    (a, _), (b, _) = write_keys(folder, "a"), write_keys(folder, "b")
    (folder / "README").write_text("not a key\n")
    expected = load_public_keys(a) | load_public_keys(b)
    assert len(expected) == 2
    # The folder: every *.key, not the .key_secret files nor anything else.
    assert load_public_keys(folder) == expected

    listing = tmp_path / "allowed.txt"
    first, second = sorted(expected)
    listing.write_bytes(b"# workers on the build farm\n\n  " + first + b"  \n#" + b"\n" + second)
    assert load_public_keys(listing) == expected


def test_load_public_keys_errors(tmp_path: Path) -> None:
    good = CurveKeys.generate().public
    bad_line = tmp_path / "allowed.txt"
    bad_line.write_bytes(b"# ok\n" + good + b"\n" + good[:-1] + b"\n")
    comments_only = tmp_path / "empty.txt"
    comments_only.write_text("# nobody yet\n\n")
    empty_folder = tmp_path / "none"
    empty_folder.mkdir()
    bad_cert_folder = tmp_path / "bad"
    bad_cert_folder.mkdir()
    (bad_cert_folder / "w.key").write_text("curve\n")
    cases = [
        (tmp_path / "missing.txt", "does not exist"),
        (bad_line, r"allowed\.txt:3: not a CURVE public key"),
        (comments_only, "has no keys"),
        (empty_folder, r"has no \*\.key files"),
        (bad_cert_folder / "w.key", "not a CURVE certificate"),
        (bad_cert_folder, "not a CURVE certificate"),
    ]
    for path, message in cases:
        with pytest.raises(ConfigError, match=message) as caught:
            load_public_keys(path)
        assert str(path) in str(caught.value)
    # A bad key is described, never echoed: it may be a secret pasted by mistake.
    with pytest.raises(ConfigError) as caught:
        load_public_keys(bad_line)
    assert good[:-1].decode() not in str(caught.value)
