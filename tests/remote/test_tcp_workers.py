"""Workers on another "host" (a network namespace joined by a veth pair) over tcp + CURVE.

The supervisor is this test process, in its own namespace; the workers are ``andon worker
--connect tcp://…`` programs started in the other one by a :class:`CommandLauncher`. What crosses
is only the network: every claim below is about what the workers do on their own side (their
processes are this machine's, so the tests can look for them by their tags afterwards).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from andon import cancel, procs
from andon.base import ErrorCode, GracePolicy
from andon.fleet import (
    CommandLauncher,
    LaunchedWorker,
    PoolObserver,
    TcpListen,
    WorkerPool,
    WorkerPoolConfig,
)
from andon.protocol import load_public_keys, write_keys
from andon.supervisor import ToolCallRequest, ToolExecutor
from andon.workers import WORKER_REFUSED, default
from tests.remote.conftest import Hosts, Refusals
from tests.support import escapee_tree, procs_with_marker
from tests.workers.support import start

pytestmark = pytest.mark.timeout(120)

WORKER = [sys.executable, "-m", "andon"]
INTERVAL = 0.25  # heartbeats; the deadline is three of them


def _bash(call_id: str, command: str) -> ToolCallRequest:
    return ToolCallRequest(call_id, "bash", json.dumps({"command": command}), os.getcwd())


def _netns_of_this_process() -> str:
    return os.readlink("/proc/self/ns/net")


def _pool(
    hosts: Hosts, launcher: CommandLauncher, size: int = 2, observer: PoolObserver | None = None
) -> WorkerPool:
    config = WorkerPoolConfig(
        size=size,
        heartbeat_interval=INTERVAL,
        start_timeout=30,
        tcp=TcpListen(f"tcp://{hosts.local_address}:0"),
    )
    return WorkerPool(config, default(), launcher=launcher, observer=observer)


def _launcher(hosts: Hosts, **options: object) -> CommandLauncher:
    return CommandLauncher(hosts.run_there(), worker_command=WORKER, **options)  # type: ignore[arg-type]


async def test_calls_run_in_the_other_namespace_over_curve(hosts: Hosts) -> None:
    async with _pool(hosts, _launcher(hosts)) as pool:
        assert pool.endpoint.startswith(f"tcp://{hosts.local_address}:")
        assert pool.server_public_key is not None
        executor = ToolExecutor(pool, pool.registry)
        outcomes = await asyncio.gather(
            *[
                (await start(executor, _bash(f"c1-1-{i}", "readlink /proc/self/ns/net")))[0]
                for i in (1, 2)
            ]
        )
    ours = _netns_of_this_process()
    for outcome in outcomes:
        assert outcome.error is None, outcome.error
        theirs = outcome.content.strip()
        assert theirs.startswith("net:[") and theirs != ours


def _tree(marker: str) -> str:
    return escapee_tree(marker)


async def test_a_cancel_stops_a_remote_tree_with_no_survivor(hosts: Hosts) -> None:
    marker = os.urandom(4).hex()
    marker_digits = str(int(marker, 16))
    async with _pool(hosts, _launcher(hosts), size=1) as pool:
        executor = ToolExecutor(pool, pool.registry, grace=GracePolicy(True, 0.5, 0.5))
        task, recorder, controller = await start(executor, _bash("c1-1-1", _tree(marker_digits)))
        await asyncio.wait_for(recorder.wait_output(b"ready"), 30)
        assert len(procs_with_marker(marker_digits)) >= 2  # the two escapees
        controller.abort(cancel.User())
        outcome = await asyncio.wait_for(task, 30)
    assert outcome.ended_by in ("interrupt", "term", "kill")
    assert outcome.error is not None and outcome.error.code == ErrorCode.ABORTED
    assert leftovers_with(marker_digits) == []


def leftovers_with(marker: str) -> list[int]:
    return [p.pid for p in procs_with_marker(marker, wait=5.0)]


async def test_a_worker_whose_key_is_not_allowed_is_refused_before_any_frame(
    hosts: Hosts, tmp_path: Path
) -> None:
    refused: asyncio.Queue[str] = asyncio.Queue()
    async with _pool(hosts, _launcher(hosts), size=1, observer=Refusals(refused)) as pool:
        public, secret = write_keys(tmp_path / "keys", "stranger")
        (stranger_key,) = load_public_keys(public)
        server_key = pool.server_public_key
        assert server_key is not None
        stranger = subprocess.Popen(
            [
                *hosts.run_there(),
                *WORKER,
                "worker",
                "--connect",
                pool.endpoint,
                "--id",
                "w1",  # the id of a real worker: the key, not the id, decides
                f"--server-key={server_key.decode()}",
                "--keys",
                str(secret),
                "--welcome-timeout",
                "3",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            reason = await asyncio.wait_for(refused.get(), 30)
            assert stranger_key.decode() in reason and "not on the allow-list" in reason
            # The real w1 is untouched, and still runs calls.
            executor = ToolExecutor(pool, pool.registry)
            task, _, _ = await start(executor, _bash("c1-1-1", "echo still-mine"))
            outcome = await asyncio.wait_for(task, 30)
            assert outcome.content.startswith("still-mine")
            assert pool.statistics().error_replies == ()
        finally:
            # The refused worker learns it from the handshake, says so and exits non-zero.
            code = await asyncio.to_thread(stranger.wait, 30)
            assert stranger.stderr is not None
            said = stranger.stderr.read().decode()
            stranger.stderr.close()
    assert code == WORKER_REFUSED, said
    (line,) = said.splitlines()
    assert "refused this worker's key" in line and stranger_key.decode() in line, line


class _Unreachable(CommandLauncher):
    """A launcher whose kill cannot reach the worker while its host is cut off: only the
    worker's own heartbeat deadline can stop its call then."""

    cut = False

    def kill(self, worker: LaunchedWorker) -> None:
        if not self.cut:
            super().kill(worker)


async def test_a_cut_link_is_worker_lost_and_the_worker_stops_its_tree(hosts: Hosts) -> None:
    marker = str(int(os.urandom(4).hex(), 16))
    launcher = _Unreachable(hosts.run_there(), worker_command=WORKER)
    async with _pool(hosts, launcher, size=1) as pool:
        executor = ToolExecutor(pool, pool.registry)
        task, recorder, _ = await start(executor, _bash("c1-1-1", _tree(marker)))
        await asyncio.wait_for(recorder.wait_output(b"ready"), 30)
        (worker_pid,) = pool.workers.values()
        info = procs.stat(worker_pid)
        assert info is not None
        worker = procs.Pidfd.open(info.key)
        assert worker is not None
        launcher.cut = True
        hosts.link("down")
        try:
            outcome = await asyncio.wait_for(task, 30)
            assert outcome.error is not None
            assert outcome.error.code == ErrorCode.WORKER_LOST
            # Whichever side's deadline passed first: the pool's (silent worker), or the
            # worker's own (it stopped its call and exited, and the pool saw it end).
            message = outcome.error.message or ""
            assert "heartbeat" in message or "process died" in message
            assert "the worker stops the call's processes" in message
            # On its side of the cut, the worker found its supervisor silent and stopped its
            # tree: nothing of the call is left, and the worker itself has exited.
            assert leftovers_with(marker) == []
            procs.wait_exited([worker], 10.0)
            assert worker.exited()
        finally:
            worker.close()
            hosts.link("up")
            launcher.cut = False
