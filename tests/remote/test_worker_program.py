"""``andon worker`` as a program: its command line, its keys, its stop on SIGTERM, its lifeline.

These run on this machine (``ipc://`` and loopback tcp): what they check is the program, not the
network between two hosts (``test_tcp_workers`` does that).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import zmq
import zmq.asyncio

from andon import procs
from andon.base import ErrorCode, GracePolicy, ManualClock, User, WorkerError
from andon.fleet import (
    CommandLauncher,
    LaunchedWorker,
    TcpListen,
    WorkerPool,
    WorkerPoolConfig,
    WorkerSpec,
)
from andon.protocol import (
    CurveKeys,
    ErrorReply,
    curve_client,
    encode,
    key_from_text,
    key_to_hex,
    load_keys,
    load_public_keys,
)
from andon.supervisor import ToolCallRequest, ToolExecutor
from andon.workers import WORKER_REFUSED, default, tool
from tests.remote.conftest import Refusals
from tests.support import procs_with_marker
from tests.workers.pytools import more_tools
from tests.workers.support import start

pytestmark = pytest.mark.timeout(90)

ANDON = [sys.executable, "-m", "andon"]


def _andon(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*ANDON, *args], input=stdin, capture_output=True, timeout=60)


def _bash(call_id: str, command: str) -> ToolCallRequest:
    return ToolCallRequest(call_id, "bash", json.dumps({"command": command}), os.getcwd())


def _marker() -> str:
    return str(int.from_bytes(os.urandom(4), "big"))


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--connect", "tcp://127.0.0.1:5555"], "tcp needs CURVE"),
        (["--connect", "tcp://10.1.2.3:5555", "--insecure"], "only to a loopback address"),
        (["--connect", "http://x"], "ipc://PATH or tcp://HOST:PORT"),
        (["--connect", "ipc:///nonexistent/x", "--tools", "nosuchmodule:x"], "cannot import"),
        (["--connect", "ipc:///nonexistent/x", "--tools", "json"], "MODULE:NAME"),
        (["--connect", "ipc:///nonexistent/x", "--tools", "json:dumps"], "no arguments"),
        (["--connect", "ipc:///nonexistent/x", "--tools", "json:decoder"], "not a ToolRegistry"),
    ],
)
def test_a_bad_command_line_is_one_line_and_exit_2(args: list[str], expected: str) -> None:
    done = _andon("worker", *args)
    err = done.stderr.decode()
    assert done.returncode == 2, err
    assert expected in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_keys_generate_writes_a_pair_and_never_overwrites(tmp_path: Path) -> None:
    done = _andon("keys", "generate", str(tmp_path / "k"), "--name", "box")
    assert done.returncode == 0, done.stderr
    public, secret = tmp_path / "k" / "box.key", tmp_path / "k" / "box.key_secret"
    keys = load_keys(secret)
    assert load_public_keys(public) == {keys.public}
    assert keys.public.decode() in done.stdout.decode()
    assert keys.secret.decode() not in done.stdout.decode()
    assert secret.stat().st_mode & 0o777 == 0o600
    again = _andon("keys", "generate", str(tmp_path / "k"), "--name", "box")
    assert again.returncode == 2 and "already exists" in again.stderr.decode()
    assert load_keys(secret) == keys


def test_a_worker_nobody_welcomes_gives_up_and_says_so(tmp_path: Path) -> None:
    done = _andon(
        "worker", "--connect", f"ipc://{tmp_path}/nobody.sock", "--welcome-timeout", "0.5"
    )
    err = done.stderr.decode()
    assert done.returncode == WORKER_REFUSED, err
    (line,) = err.splitlines()
    assert "no welcome from the supervisor at ipc://" in line and "0.5s" in line, line


def _local_launcher(**options: object) -> CommandLauncher:
    return CommandLauncher(
        [],
        transport="ipc",
        worker_command=ANDON,
        same_machine=True,
        **options,  # type: ignore[arg-type]
    )


async def test_sigterm_drains_the_call_on_its_grace_timeline_then_the_worker_exits() -> None:
    marker = _marker()
    config = WorkerPoolConfig(size=1, heartbeat_interval=0.5)
    async with WorkerPool(config, default(), launcher=_local_launcher()) as pool:
        executor = ToolExecutor(pool, pool.registry, grace=GracePolicy(True, 0.2, 0.2))
        # Ignores SIGINT: the drain must go on to SIGTERM, as the grace timeline says.
        command = f"trap '' INT; echo ready; sleep 1000{marker}; echo not-reached"
        task, recorder, _ = await start(executor, _bash("c1-1-1", command))
        await asyncio.wait_for(recorder.wait_output(b"ready"), 30)
        (pid,) = pool.workers.values()
        info = procs.stat(pid)
        assert info is not None
        worker = procs.Pidfd.open(info.key)
        assert worker is not None
        try:
            worker.send(signal.SIGTERM)
            outcome = await asyncio.wait_for(task, 30)
            procs.wait_exited([worker], 10.0)
            assert worker.exited()
        finally:
            worker.close()
    # The call's result came from the worker, with what the drain sent: the tool saw an
    # interrupt it ignored, then the TERM that ended it.
    assert outcome.ended_by != "worker-lost", outcome
    assert "not-reached" not in outcome.content
    assert recorder.stages[:2] == ["interrupt", "term"]
    assert procs_with_marker(marker, wait=5.0) == []


async def test_closing_the_lifeline_stops_the_call_at_once() -> None:
    """The launcher lets go (its kill closes the pipe): the worker kills its call and exits
    without waiting for a heartbeat deadline (set far away here)."""
    marker = _marker()
    config = WorkerPoolConfig(size=1, heartbeat_interval=30)
    async with WorkerPool(config, default(), launcher=_local_launcher()) as pool:
        executor = ToolExecutor(pool, pool.registry)
        task, recorder, _ = await start(
            executor, _bash("c1-1-1", f"setsid sleep 1000{marker} & echo ready; wait")
        )
        await asyncio.wait_for(recorder.wait_output(b"ready"), 30)
        lease_worker = next(iter(pool._workers.values()))
        assert lease_worker.launched is not None
        stdin = lease_worker.launched.process.stdin  # type: ignore[attr-defined]
        stdin.close()
        outcome = await asyncio.wait_for(task, 30)
    assert outcome.error is not None and outcome.error.code == ErrorCode.WORKER_LOST
    assert procs_with_marker(marker, wait=5.0) == []


async def test_insecure_tcp_works_on_loopback_only() -> None:
    with pytest.raises(Exception, match="loopback"):
        TcpListen("tcp://10.9.9.9:0", insecure=True)
    config = WorkerPoolConfig(
        size=1, heartbeat_interval=0.5, tcp=TcpListen("tcp://127.0.0.1:0", insecure=True)
    )
    launcher = CommandLauncher([], worker_command=ANDON, same_machine=True, insecure=True)
    async with WorkerPool(config, default(), launcher=launcher) as pool:
        assert pool.server_public_key is None
        executor = ToolExecutor(pool, pool.registry)
        task, _, _ = await start(executor, _bash("c1-1-1", "echo over-plain-tcp"))
        outcome = await asyncio.wait_for(task, 30)
    assert outcome.content.startswith("over-plain-tcp")


class _Gated(CommandLauncher):
    """Holds each start until the test opens the gate: meanwhile the pool knows the worker's id
    and its key, and nothing of it is connected."""

    def __init__(self) -> None:
        super().__init__([], worker_command=ANDON, same_machine=True)
        self.waiting = asyncio.Event()
        self.gate = asyncio.Event()

    async def start(self, spec: WorkerSpec) -> LaunchedWorker:
        self.waiting.set()
        await self.gate.wait()
        return await super().start(spec)


async def test_an_allowed_key_cannot_speak_for_another_worker() -> None:
    """A key on the allow-list (a worker started with keys of its own) that claims the id of a
    worker the pool is launching: its frames are dropped, and the real worker works."""
    static = CurveKeys.generate()
    config = WorkerPoolConfig(
        size=1,
        heartbeat_interval=0.5,
        tcp=TcpListen("tcp://127.0.0.1:0", allowed=frozenset([static.public])),
    )
    launcher = _Gated()
    refused: asyncio.Queue[str] = asyncio.Queue()
    pool = WorkerPool(config, default(), launcher=launcher, observer=Refusals(refused))
    starting = asyncio.create_task(pool.start())
    try:
        await asyncio.wait_for(launcher.waiting.wait(), 30)
        server_key = pool.server_public_key
        assert server_key is not None
        ctx = zmq.asyncio.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, b"w1")  # the id of the worker being launched
        curve_client(sock, static, server_key)
        sock.connect(pool.endpoint)
        try:
            await sock.send_multipart(encode(ErrorReply(reason="I am w1")))
            reason = await asyncio.wait_for(refused.get(), 30)
        finally:
            sock.close(0)
            ctx.term()
        assert "'w1'" in reason and static.public.decode() in reason
        stats = pool.statistics()
        assert stats.spoofed == 1 and stats.error_replies == ()
        launcher.gate.set()
        await asyncio.wait_for(starting, 60)
        executor = ToolExecutor(pool, pool.registry)
        task, _, _ = await start(executor, _bash("c1-1-1", "echo real-w1"))
        outcome = await asyncio.wait_for(task, 30)
        assert outcome.content.startswith("real-w1")
    finally:
        launcher.gate.set()
        with contextlib.suppress(BaseException):
            await starting
        await pool.aclose()


async def test_a_worker_without_a_tool_of_the_session_is_refused_with_the_names() -> None:
    registry = default()

    @tool
    def only_here() -> str:
        """A tool the worker program cannot import."""
        return "x"

    registry.add(only_here)
    config = WorkerPoolConfig(size=1, heartbeat_interval=0.5)
    with pytest.raises(WorkerError, match="does not offer the tools only_here"):
        async with WorkerPool(config, registry, launcher=_local_launcher()):
            pass


# What ssh does with the command it is given: join the words with spaces and hand the line to
# the remote user's shell.
_JOIN_AND_SHELL = "import os, sys; os.execvp('sh', ['sh', '-c', ' '.join(sys.argv[1:])])"
_LIKE_SSH = [sys.executable, "-c", _JOIN_AND_SHELL]
_SHELL_WORDS = frozenset(b"$()&<>*?[]{}#!")


async def test_a_worker_started_through_a_remote_shell_gets_the_server_key_unchanged() -> None:
    """A remote shell (``ssh HOST``) reads the worker's command line again: Z85 has ``$ ( ) &
    < > * ? [ ] { } # !``, so the key reached the worker changed, or the line did not parse at
    all. The launcher writes the key in hex, which no shell changes."""
    keys = next(
        k for k in iter(CurveKeys.generate, None) if len(_SHELL_WORDS.intersection(k.public)) >= 3
    )
    config = WorkerPoolConfig(
        size=1, heartbeat_interval=0.5, tcp=TcpListen("tcp://127.0.0.1:0", server_keys=keys)
    )
    worker = [shlex.quote(word) for word in ANDON]  # as a user writes it for the remote shell
    launcher = CommandLauncher(_LIKE_SSH, worker_command=worker, same_machine=True)
    async with WorkerPool(config, default(), launcher=launcher) as pool:
        executor = ToolExecutor(pool, pool.registry)
        task, _, _ = await start(executor, _bash("c1-1-1", "echo through-a-shell"))
        outcome = await asyncio.wait_for(task, 30)
    assert outcome.content.startswith("through-a-shell"), outcome.content


@pytest.mark.parametrize("spelling", ["z85", "hex"])
def test_the_worker_reads_a_server_key_in_z85_or_in_hex(spelling: str) -> None:
    keys = CurveKeys.generate()
    text = keys.public.decode() if spelling == "z85" else key_to_hex(keys.public)
    assert key_from_text(text) == keys.public
    assert key_from_text(text[:-1]) is None
    assert key_from_text("g" * 64) is None  # 64 characters, not hex


async def test_a_server_key_that_begins_with_a_dash_reaches_the_worker() -> None:
    """Z85 has '-' among its digits: a key starting with it must not be read as an option by the
    worker's command line (it was, about once in twenty starts)."""
    keys = next(k for k in iter(CurveKeys.generate, None) if k.public.startswith(b"-"))
    config = WorkerPoolConfig(
        size=1, heartbeat_interval=0.5, tcp=TcpListen("tcp://127.0.0.1:0", server_keys=keys)
    )
    launcher = CommandLauncher([], worker_command=ANDON, same_machine=True)
    async with WorkerPool(config, default(), launcher=launcher) as pool:
        assert pool.server_public_key == keys.public
        executor = ToolExecutor(pool, pool.registry)
        task, _, _ = await start(executor, _bash("c1-1-1", "echo dash-key"))
        outcome = await asyncio.wait_for(task, 30)
    assert outcome.content.startswith("dash-key")


async def test_a_python_tool_of_a_program_worker_is_stopped_by_term() -> None:
    """As a program the worker handles SIGTERM itself (through its event loop); the Python
    call processes forked from it must not inherit that handler, or SIGTERM would do nothing
    to a tool and only the KILL stage would stop it."""
    clock = ManualClock()
    launcher = _local_launcher(tools="tests.workers.pytools:more_tools")
    async with WorkerPool(WorkerPoolConfig(size=1), more_tools(), launcher=launcher) as pool:
        grace = GracePolicy(term_after=1.0, kill_after=1.0)
        executor = ToolExecutor(pool, pool.registry, grace=grace, clock=clock)
        request = ToolCallRequest("c1-1-1", "stubborn_sync", '{"seconds": 60}', os.getcwd())
        task, recorder, controller = await start(executor, request)
        await asyncio.wait_for(recorder.wait_until(lambda: recorder.started is not None), 30)
        controller.abort(User())
        await recorder.wait_stage("interrupt")  # the tool ignores it
        clock.advance(1.0)  # SIGTERM to the call's group: its default action ends the tool
        outcome = await asyncio.wait_for(task, 30)
    assert outcome.ended_by == "term", outcome
    assert outcome.exit_signal == signal.SIGTERM
