"""``--workers-in ssh:HOST`` / ``tcp:ADDRESS`` and the ``[remote]`` table: every mistake is one
line and exit 2, before any session folder exists; a pool that no worker dials into ends the
run with exit 6 and the command line that would have started one."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.cli.support import ANDON, env, script

pytestmark = pytest.mark.timeout(60)


def _run(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    model = script(folder / "s.json", [{"text": "Done."}])
    return subprocess.run(
        [ANDON, "run", "--model", model, *args, "go"],
        cwd=folder,
        env=env(ANDON_HOME=str(folder / "home")),
        capture_output=True,
        text=True,
        timeout=50,
        stdin=subprocess.DEVNULL,
    )


def _keys(folder: Path) -> None:
    for name in ("supervisor", "worker"):
        made = subprocess.run(
            [ANDON, "keys", "generate", str(folder / "keys"), "--name", name],
            capture_output=True,
            timeout=30,
        )
        assert made.returncode == 0, made.stderr


@pytest.mark.parametrize(
    ("toml", "workers_in", "expected"),
    [
        ("", "ssh:", "workers-in ssh:HOST needs a host name"),
        ("", "ssh:-oProxyCommand=x", "workers-in ssh:HOST needs a host name"),
        ("", "tcp:nohost", "workers-in tcp:ADDRESS must be HOST:PORT"),
        ("", "tcp:127.0.0.1:0", "[remote] in andon.toml needs server-keys"),
        ("", "ssh:box", "give [remote] advertise"),
        ('[remote]\nlisten = "x"\n', "local", "listen must be HOST:PORT"),
        ("[remote]\nwait = 0\n", "local", "wait must be a positive number"),
        ("[remote]\nssh = []\n", "local", "ssh must be a string or a list"),
        ("[remote]\nwhat = 1\n", "local", "unknown key 'what'"),
        (
            '[remote]\nserver-keys = "keys/missing.key_secret"\nallowed-keys = "keys/worker.key"\n',
            "tcp:127.0.0.1:0",
            "missing.key_secret",
        ),
        (
            '[remote]\nserver-keys = "keys/worker.key"\nallowed-keys = "keys/worker.key"\n',
            "tcp:127.0.0.1:0",
            "no secret-key",
        ),
    ],
)
def test_a_remote_mistake_is_one_line_exit_2_and_no_session(
    tmp_path: Path, toml: str, workers_in: str, expected: str
) -> None:
    _keys(tmp_path)
    (tmp_path / "andon.toml").write_text(toml)
    done = _run(tmp_path, "--workers-in", workers_in)
    assert done.returncode == 2, done.stderr
    assert expected in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "home" / "sessions").exists() or not any(
        (tmp_path / "home" / "sessions").iterdir()
    )


def test_no_worker_dialing_in_is_exit_6_with_the_command_to_run(tmp_path: Path) -> None:
    _keys(tmp_path)
    (tmp_path / "andon.toml").write_text(
        '[remote]\nserver-keys = "keys/supervisor.key_secret"\nallowed-keys = "keys/worker.key"\n'
        "wait = 0.5\n"
    )
    done = _run(tmp_path, "--workers-in", "tcp:127.0.0.1:0", "--workers", "1")
    assert done.returncode == 6, done.stderr
    assert "no worker connected to tcp://127.0.0.1:" in done.stderr
    assert "andon worker --connect tcp://127.0.0.1:" in done.stderr
    assert "Traceback" not in done.stderr
