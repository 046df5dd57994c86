"""Workers started by a command: ``ssh HOST``, ``ip netns exec NS``, a batch system's launcher.

The command is a prefix; the pool appends ``andon worker --connect ENDPOINT --id ID …`` and the
launcher hands the worker its CURVE keys on stdin (never on a command line, which ``ps`` shows, nor
in an environment, which tools inherit). The local process (an ssh client, or the worker itself) is
what the launcher holds: its exit is the worker's exit.

stdin then stays open as the worker's **lifeline** (``--lifeline``): ``kill`` closes it, and the
worker, seeing end of file, kills its call's processes at once and exits, wherever it runs (an ssh
client passes the end of file on). Only if the local process is still there after
:data:`KILL_AFTER` seconds is its process group SIGKILLed. A supervisor killed with -9 closes
the pipe too, so its workers stop without waiting for the heartbeat deadline.

With ``same_machine`` (a network namespace of this machine, say) the call's processes are this pid
namespace's, and a lost worker's call is also killed from here by its tag.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal as _signal
import subprocess
from collections.abc import Mapping, Sequence
from typing import IO, Any

from andon import procs
from andon.base import WorkerError
from andon.fleet._launch import (
    LaunchedWorker,
    PidfdWorker,
    PoolSetup,
    WorkerLauncher,
    WorkerSpec,
    server_key_argument,
    worker_argv,
)
from andon.protocol import Started
from andon.workers import KEYS_END

__all__ = ["KILL_AFTER", "CommandLauncher"]

KILL_AFTER = 2.0
"""Seconds between closing a worker's lifeline and SIGKILLing the local process that runs it."""


class _CommandWorker(PidfdWorker):
    def __init__(self, worker_id: str, process: subprocess.Popen[bytes], handle: procs.Pidfd):
        super().__init__(worker_id, process.pid, handle)
        self.process = process

    def describe(self) -> str:
        return f"worker {self.worker_id} (command pid {self.pid})"


class CommandLauncher(WorkerLauncher):
    """``CommandLauncher(["ssh", "build-box"], transport="tcp")``: each worker is
    ``[*prefix, *worker_command, "worker", "--connect", …]``, run here in its own session."""

    heartbeats = True
    containment = None

    def __init__(
        self,
        prefix: Sequence[str],
        *,
        transport: str = "tcp",
        worker_command: Sequence[str] = ("andon",),
        tools: str = "default",
        same_machine: bool = False,
        environment: Mapping[str, str] | None = None,
        welcome_timeout: float = 60.0,
        insecure: bool = False,
    ) -> None:
        if transport not in ("tcp", "ipc"):
            raise ValueError("transport must be 'tcp' or 'ipc'")
        self.transport = transport  # type: ignore[assignment]
        self.prefix = tuple(prefix)
        self.worker_command = tuple(worker_command)
        self.tools = tools
        self.local_processes = same_machine
        if same_machine:
            self.lost_call_note = "andon killed the call's processes"
        self.environment = dict(environment) if environment is not None else None
        self.welcome_timeout = welcome_timeout
        self.insecure = insecure
        self._setup: PoolSetup | None = None

    async def open(self, setup: PoolSetup) -> None:
        self._setup = setup

    async def start(self, spec: WorkerSpec) -> LaunchedWorker:
        setup = self._setup
        assert setup is not None, "open() first"
        argv = [
            *self.prefix,
            *self.worker_command,
            *worker_argv(spec, self.tools, self.welcome_timeout),
            "--lifeline",
        ]
        secret: bytes | None = None
        if spec.worker_keys is not None and spec.server_key is not None:
            argv += [server_key_argument(spec.server_key), "--keys", "-"]
            secret = spec.worker_keys.certificate() + KEYS_END
        elif self.insecure:
            argv.append("--insecure")
        env = dict(self.environment if self.environment is not None else os.environ)
        for name in setup.hidden_env:
            env.pop(name, None)  # no model key in a worker
        log = open(setup.runtime_dir / f"{spec.worker_id}.log", "ab")  # noqa: SIM115 - handed over
        try:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=log,
                env=env,
                start_new_session=True,  # a terminal's Ctrl-C is the supervisor's to decide
            )
        except OSError as e:
            raise WorkerError(
                f"could not start worker {spec.worker_id} with {argv[0]!r}: {e}",
                worker=spec.worker_id,
            ) from None
        finally:
            log.close()
        _hand_over(process.stdin, secret)
        info = procs.stat(process.pid)
        handle = procs.Pidfd.open(info.key, zombie_ok=True) if info is not None else None
        if handle is None:
            process.wait()
            raise WorkerError(
                f"worker {spec.worker_id} ended as it started (exit {process.returncode}); "
                f"see {setup.runtime_dir / (spec.worker_id + '.log')}",
                worker=spec.worker_id,
            )
        return _CommandWorker(spec.worker_id, process, handle)

    def kill(self, worker: LaunchedWorker) -> None:
        assert isinstance(worker, _CommandWorker)
        if worker.process.stdin is not None and not worker.process.stdin.closed:
            with contextlib.suppress(OSError):
                worker.process.stdin.close()  # the lifeline: the worker stops its call and exits
            asyncio.get_running_loop().call_later(KILL_AFTER, self._backstop, worker)
            return
        self._backstop(worker)

    @staticmethod
    def _backstop(worker: _CommandWorker) -> None:
        if worker.handle is not None and not worker.has_exited():
            procs.signal_group(worker.handle, _signal.SIGKILL)

    def kill_call(self, worker: LaunchedWorker, tag: str, started: Started | None) -> None:
        if not self.local_processes:
            return  # on another machine: the worker stops its call when it loses the pool
        leader = (
            procs.ProcessKey.from_create_time(started.pid, started.create_time)
            if started is not None
            else None
        )
        procs.kill_call(procs.CallIdentity(tag, leader, None), cgroup_owned=False)

    def release(self, worker: LaunchedWorker) -> None:
        assert isinstance(worker, _CommandWorker)
        if worker.process.stdin is not None:
            with contextlib.suppress(OSError):
                worker.process.stdin.close()
        if not worker.has_exited():
            # Released while its local process still runs (written off as lost): the pool is
            # done with it, so nothing of it stays behind here.
            self._backstop(worker)
        with contextlib.suppress(Exception):
            worker.process.wait(5.0)
        worker.close_handle()


def _hand_over(stdin: IO[bytes] | None, secret: bytes | None) -> Any:
    """Write the worker's key certificate to its stdin, which then stays open (the lifeline).
    A worker that is already gone (broken pipe) is found by its exit."""
    if stdin is None or secret is None:
        return
    with contextlib.suppress(BrokenPipeError, OSError):
        stdin.write(secret)
        stdin.flush()
