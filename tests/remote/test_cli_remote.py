"""``andon run --workers-in tcp:ADDRESS`` from the command line: andon listens on tcp + CURVE and
adopts a worker started by hand in another network namespace ("another host"), whose key the
``[remote]`` table allows. The README's main job runs there; SIGINT at seeded moments of a run
whose tool leaves escapees ends andon with 130, the worker with it, and nothing of either
behind."""

from __future__ import annotations

import json
import random
import re
import secrets
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from andon.workers import WORKER_REFUSED
from tests.cli.support import ANDON, assert_balanced, env, records, script
from tests.remote.conftest import Hosts, SshHost
from tests.support import escapee_tree, procs_with_marker

pytestmark = pytest.mark.timeout(180)

REPO = Path(__file__).resolve().parents[2]
WAITING = re.compile(
    r"andon: waiting for a tool worker: start one with andon worker --connect "
    r"(?P<endpoint>tcp://\S+) --server-key=(?P<key>[0-9a-f]{64})"
)


def _keys(folder: Path) -> None:
    for name in ("supervisor", "builder"):
        made = subprocess.run(
            [ANDON, "keys", "generate", str(folder / "keys"), "--name", name],
            capture_output=True,
            timeout=60,
        )
        assert made.returncode == 0, made.stderr
    (folder / "andon.toml").write_text(
        '[remote]\nserver-keys = "keys/supervisor.key_secret"\n'
        'allowed-keys = "keys/builder.key"\nwait = 60\n'
    )


def _start_andon(
    folder: Path, hosts: Hosts, model: str, *extra: str
) -> tuple[subprocess.Popen[str], str, str]:
    """``andon run`` listening on our end of the veth pair (port 0: any), returned once it
    said how to start a worker: (process, endpoint, server key in hex)."""
    proc = subprocess.Popen(
        [
            ANDON,
            "run",
            "--json",
            "--workers",
            "1",
            "--workers-in",
            f"tcp:{hosts.local_address}:0",
            "--model",
            model,
            *extra,
            "go",
        ],
        cwd=folder,
        env=env(ANDON_HOME=str(folder / "home")),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    assert proc.stderr is not None
    for line in proc.stderr:  # bounded by the test's timeout: andon waits 60 s at most
        found = WAITING.search(line)
        if found:
            return proc, found["endpoint"], found["key"]
    raise AssertionError(f"andon never said how to start a worker (exit {_end(proc)})")


def _start_worker(
    folder: Path, hosts: Hosts, endpoint: str, key: str, name: str = "builder-1"
) -> subprocess.Popen[bytes]:
    """The worker, started by hand in the other namespace with the allowed key."""
    return subprocess.Popen(
        [
            *hosts.run_there(),
            sys.executable,
            "-m",
            "andon",
            "worker",
            "--connect",
            endpoint,
            f"--server-key={key}",
            "--keys",
            str(folder / "keys" / "builder.key_secret"),
            "--id",
            name,
        ],
        cwd=folder,
        env=env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def _end(proc: subprocess.Popen[bytes] | subprocess.Popen[str], timeout: float = 30) -> int:
    """Its exit code, once it ended (killed past ``timeout``), its pipes read and closed."""
    try:
        proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
    except ValueError:  # communicate() ran already: its pipes are closed
        proc.wait()
    return proc.returncode


def test_the_main_job_runs_in_a_worker_started_by_hand_on_another_host(
    hosts: Hosts, tmp_path: Path
) -> None:
    _keys(tmp_path)
    shutil.copytree(REPO / "examples" / "ci-build", tmp_path / "examples" / "ci-build")
    model = "script:examples/ci-build/script.yaml"
    andon, endpoint, key = _start_andon(tmp_path, hosts, model)
    worker = _start_worker(tmp_path, hosts, endpoint, key)
    try:
        out, err = andon.communicate(timeout=120)
    finally:
        _end(andon)
        code = _end(worker)
    assert andon.returncode == 0, err
    assert code == 0  # let go at the end of the session
    summary = json.loads(out.splitlines()[-1])
    assert summary["type"] == "run/summary" and summary["exit_code"] == 0
    session = tmp_path / "home" / "sessions" / summary["session_id"]
    assert_balanced(session)
    results = [r for r in records(session) if r["type"] == "tool/result"]
    assert len(results) == 5 and all(not r["data"].get("error") for r in results)
    # The build ran in the worker, on the same files, and is green now.
    build = subprocess.run(
        ["bash", "build.sh"], cwd=tmp_path / ".andon" / "ci-build", capture_output=True, timeout=60
    )
    assert build.returncode == 0, build.stdout


MOMENTS = 10


def test_sigint_at_any_moment_stops_both_sides_and_leaves_nothing(
    hosts: Hosts, tmp_path: Path
) -> None:
    """Each trial sends SIGINT after a seeded number of andon's --json events (0: before the
    worker is even started), with a tool that leaves a setsid escapee and a double-forked
    daemon behind it."""
    _keys(tmp_path)
    rng = random.Random("cli-remote-sigint")
    for trial in range(MOMENTS):
        marker = str(secrets.randbits(48))  # digits: the sleeps take it as a number
        model = script(
            tmp_path / f"s{trial}.json",
            [
                {
                    "text": "Building.",
                    "tool_calls": [
                        {"name": "bash", "arguments": {"command": escapee_tree(marker)}}
                    ],
                },
                {"text": "Done."},
            ],
        )
        # 0: before the worker is even started; the last trial: once the escapees run.
        after = 0 if trial == 0 else 10**6 if trial == MOMENTS - 1 else rng.randrange(1, 60)
        andon, endpoint, key = _start_andon(tmp_path, hosts, model, "--grace", "0.5,0.5")
        worker: subprocess.Popen[bytes] | None = None
        ready = False
        try:
            if after == 0:
                andon.send_signal(signal.SIGINT)  # still waiting for its worker
            else:
                worker = _start_worker(tmp_path, hosts, endpoint, key, f"builder-{trial}")
                assert andon.stdout is not None
                for seen, line in enumerate(andon.stdout, start=1):
                    event = json.loads(line)
                    ready = event.get("type") == "tool/output" and "ready" in line
                    if seen >= after or ready:
                        break
                if ready:  # the tree runs over there, escapees and all
                    assert len(procs_with_marker(marker)) >= 2
                andon.send_signal(signal.SIGINT)
            code = _end(andon)
        finally:
            _end(andon)
            worker_code = _end(worker) if worker is not None else None
        where = f"trial {trial} (after {after} events, ready={ready})"
        assert ready or after != 10**6, where  # the last trial stops a running tree
        assert code == 130, where
        # Let go (0), or refused as andon closed before it adopted the worker (3).
        assert worker_code in (None, 0, WORKER_REFUSED), where
        assert procs_with_marker(marker, wait=5.0) == [], where


def _ssh_toml(folder: Path, hosts: Hosts, ssh_host: SshHost) -> None:
    (folder / "andon.toml").write_text(
        "[remote]\n"
        f'advertise = "tcp://{hosts.local_address}"\n'
        f'listen = "tcp://{hosts.local_address}:0"\n'
        f"ssh = {json.dumps(ssh_host.ssh)}\n"
        f"command = {json.dumps([sys.executable, '-m', 'andon'])}\n"
    )


def test_the_main_job_runs_through_a_real_ssh_server(
    hosts: Hosts, ssh_host: SshHost, tmp_path: Path
) -> None:
    _ssh_toml(tmp_path, hosts, ssh_host)
    shutil.copytree(REPO / "examples" / "ci-build", tmp_path / "examples" / "ci-build")
    done = subprocess.run(
        [
            ANDON,
            "run",
            "--json",
            "--workers",
            "1",
            "--workers-in",
            f"ssh:{ssh_host.destination}",
            "--model",
            "script:examples/ci-build/script.yaml",
            "fix it",
        ],
        cwd=tmp_path,
        env=env(ANDON_HOME=str(tmp_path / "home")),
        capture_output=True,
        text=True,
        timeout=150,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.splitlines()[-1])
    session = tmp_path / "home" / "sessions" / summary["session_id"]
    assert_balanced(session)
    results = [r for r in records(session) if r["type"] == "tool/result"]
    assert len(results) == 5 and all(not r["data"].get("error") for r in results)


def test_sigint_through_ssh_stops_the_remote_tree(
    hosts: Hosts, ssh_host: SshHost, tmp_path: Path
) -> None:
    """SIGINT while the tool's escapees run on the other side of a real ssh connection: andon
    exits 130, and the worker (told through the lifeline, ssh's stdin) leaves nothing there."""
    _ssh_toml(tmp_path, hosts, ssh_host)
    marker = str(secrets.randbits(48))  # digits: the sleeps take it as a number
    model = script(
        tmp_path / "s.json",
        [
            {
                "text": "Building.",
                "tool_calls": [{"name": "bash", "arguments": {"command": escapee_tree(marker)}}],
            },
            {"text": "Done."},
        ],
    )
    andon = subprocess.Popen(
        [
            ANDON,
            "run",
            "--json",
            "--workers",
            "1",
            "--grace",
            "0.5,0.5",
            "--tool-timeout",
            "20",
            "--workers-in",
            f"ssh:{ssh_host.destination}",
            "--model",
            model,
            "go",
        ],
        cwd=tmp_path,
        env=env(ANDON_HOME=str(tmp_path / "home")),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        assert andon.stdout is not None
        lines = []
        for line in andon.stdout:
            lines.append(line)
            if json.loads(line).get("type") == "tool/output" and "ready" in line:
                break
        else:
            raise AssertionError(f"andon ended first: {_end(andon)} {lines}")
        assert len(procs_with_marker(marker)) >= 2  # the escapees run, there
        andon.send_signal(signal.SIGINT)
    finally:
        code = _end(andon)
    assert code == 130
    assert procs_with_marker(marker, wait=5.0) == []
