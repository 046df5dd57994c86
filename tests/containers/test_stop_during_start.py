"""A signal while a container pool starts (docs/scale-out.md, Containers): ``andon run`` exits
with 128 + the signal within the bound of a local stop (grace + 2 s), and no container of the
pool is left, wherever in the start the signal lands.

The engine is the session's real Podman service behind a proxy that answers the launcher's
``wait`` (its watch of each container) only after 30 s, as a loaded engine or one over ssh may:
the stop must not hang on the engine's answers to anything but what it asked for itself.
SIGINT lands at seeded moments from the run's ``andon: session`` line (before the engine is
opened, while the container is created and started, while its worker boots, after its hello),
and from the moment the pool's first container exists.
"""

from __future__ import annotations

import json
import random
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from andon import procs
from andon.testing import host_mount_paths, worker_ulimits
from tests.cli.support import env, long_script, signal_and_wait, start
from tests.containers.engine_proxy import SlowWaitEngine

pytestmark = [pytest.mark.slow]

SEED = 20261207
GRACE = (1.0, 1.0)
BOUND = sum(GRACE) + 2.0  # a local stop's bound
WAIT = 90.0  # for the session line, or the exit: far above any bound


def _moments() -> list[tuple[float, bool]]:
    """(delay, from the first container's existence rather than the session line)."""
    rng = random.Random(SEED)
    return [
        (rng.uniform(0.0, 0.5), True) if n % 3 == 2 else (rng.uniform(0.0, 1.5), False)
        for n in range(10)
    ]


@pytest.fixture
def slow_engine(engine_url: str) -> Iterator[SlowWaitEngine]:
    folder = Path(tempfile.mkdtemp(prefix="andon-proxy-"))  # short: a socket path's limit
    try:
        with SlowWaitEngine(folder / "engine.sock", engine_url, hold=30.0) as proxy:
            yield proxy
    finally:
        (folder / "engine.sock").unlink(missing_ok=True)
        folder.rmdir()


def _toml(engine_url: str) -> str:
    mounts = ", ".join(json.dumps(f"{p}:{p}:ro") for p in host_mount_paths())
    ulimits = ", ".join(f"{k} = [{s}, {h}]" for k, (s, h) in worker_ulimits().items())
    command = json.dumps([sys.executable, "-m", "andon"])
    return (
        f'[containers]\nengine = {json.dumps(engine_url)}\nruntime = "runc"\n'
        f"command = {command}\nmounts = [{mounts}]\nulimits = {{ {ulimits} }}\n"
    )


def _pool_containers(engine: Any, prefix: str) -> list[Any]:
    """The containers of the pools of one andon process: their label starts with its pid and
    start time (the pool's identity, andon.fleet)."""
    found = engine.containers.list(all=True, filters={"label": "andon.pool"}, sparse=True)
    return [c for c in found if c.attrs.get("Labels", {}).get("andon.pool", "").startswith(prefix)]


def _wait_for(predicate: Any, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)  # sleep-ok: polling the engine's state, which sends no event here
    return bool(predicate())


@pytest.mark.timeout(600)
def test_sigint_during_a_container_pools_start_exits_in_bound_leaving_no_container(
    engine: Any, slow_engine: SlowWaitEngine, worker_image: str, tmp_path: Path
) -> None:
    (tmp_path / "andon.toml").write_text(_toml(slow_engine.url))
    model = long_script(tmp_path)
    failures = []
    for n, (delay, after_container) in enumerate(_moments()):
        proc = start(
            "run",
            "--json",
            "--grace",
            ",".join(f"{g:g}" for g in GRACE),
            "--workers-in",
            f"container:{worker_image}",
            "--model",
            model,
            "go",
            cwd=tmp_path,
            environ=env(ANDON_HOME=str(tmp_path / "home")),
        )
        info = procs.stat(proc.pid)
        assert info is not None
        prefix = f"{proc.pid}-s{info.start}-"
        try:
            assert proc.stderr is not None
            assert proc.stderr.readline().startswith("andon: session"), "no session line"
            if after_container:
                assert _wait_for(lambda p=prefix: bool(_pool_containers(engine, p)), WAIT)
            time.sleep(delay)  # sleep-ok: the signal's moment is what this test varies (seeded)
            _, err, took = signal_and_wait(proc, signal.SIGINT, WAIT)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        left = _pool_containers(engine, prefix)
        for container in left:  # not this test's business to leave them, even on failure
            container.remove(force=True)
        where = f"moment {n} ({delay:.2f} s after {'a container' if after_container else 'start'})"
        if proc.returncode != 128 + signal.SIGINT or took > BOUND or left:
            failures.append(
                f"{where}: exit {proc.returncode} after {took:.2f} s, {len(left)} container(s) "
                f"left; stderr: {err.strip()[-300:]}"
            )
    assert not failures, "\n".join(failures)


def test_the_proxy_holds_a_wait(
    engine: Any, slow_engine: SlowWaitEngine, worker_image: str
) -> None:
    """The proxy is what it says: a ``wait`` through it is not answered within a few seconds,
    while other requests pass (else the test above would prove nothing)."""
    import docker

    client = docker.DockerClient(base_url=slow_engine.url, timeout=2)
    try:
        assert client.ping()
        made = engine.containers.create(
            worker_image, command=["/nonexistent"], labels={"andon.test": "proxy"}
        )
        try:
            with pytest.raises(Exception, match="timed out"):
                client.containers.get(made.id).wait(timeout=2)
        finally:
            made.remove(force=True)
    finally:
        client.close()


HEARTBEAT_DEADLINE = 3.0  # andon run's pool: a heartbeat each second, three missed
# The worker cannot give up before it runs: the margin covers its own boot (an interpreter
# importing andon, at load) and the engine's removal of the exited container.
MARGIN = 12.0


@pytest.mark.timeout(600)
def test_kill_9_during_the_start_leaves_no_container_past_the_heartbeat_deadline(
    engine: Any, engine_url: str, worker_image: str, tmp_path: Path
) -> None:
    """Nothing of andon is left to remove the container: its worker, never welcomed, gives up at
    the heartbeat deadline (not after a minute), and ``auto_remove`` takes the container."""
    (tmp_path / "andon.toml").write_text(_toml(engine_url))
    model = long_script(tmp_path)
    rng = random.Random(SEED + 9)
    failures = []
    for n in range(5):
        delay = rng.uniform(0.0, 1.0)
        proc = start(
            "run",
            "--json",
            "--workers-in",
            f"container:{worker_image}",
            "--model",
            model,
            "go",
            cwd=tmp_path,
            environ=env(ANDON_HOME=str(tmp_path / "home")),
        )
        info = procs.stat(proc.pid)
        assert info is not None
        prefix = f"{proc.pid}-s{info.start}-"
        try:
            assert proc.stderr is not None
            assert proc.stderr.readline().startswith("andon: session"), "no session line"
            assert _wait_for(lambda p=prefix: bool(_pool_containers(engine, p)), WAIT)
            time.sleep(delay)  # sleep-ok: the kill's moment is what this test varies (seeded)
            proc.kill()
            killed = time.monotonic()
            proc.communicate(timeout=WAIT)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        gone = _wait_for(
            lambda p=prefix: not _pool_containers(engine, p), HEARTBEAT_DEADLINE + MARGIN
        )
        took = time.monotonic() - killed
        for container in _pool_containers(engine, prefix):  # whatever happens, not left
            container.remove(force=True)
        if not gone:
            failures.append(
                f"kill {n} ({delay:.2f} s after a container): still there at {took:.1f} s"
            )
    assert not failures, "\n".join(failures)
