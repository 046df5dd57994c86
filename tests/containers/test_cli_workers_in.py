"""``andon run --workers-in container:IMAGE``: the CLI end to end, with the engine and the mounts
from ``[containers]`` in andon.toml, against the real Podman service of the session."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from andon.testing import host_mount_paths, worker_ulimits
from tests.cli.support import env, records, run, script

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]


def _toml(engine_url: str, extra: str = "") -> str:
    mounts = ", ".join(json.dumps(f"{p}:{p}:ro") for p in host_mount_paths())
    ulimits = ", ".join(f"{k} = [{s}, {h}]" for k, (s, h) in worker_ulimits().items())
    command = json.dumps([sys.executable, "-m", "andon"])
    return (
        f'[containers]\nengine = {json.dumps(engine_url)}\nruntime = "runc"\n'
        f"command = {command}\nmounts = [{mounts}]\nulimits = {{ {ulimits} }}\n{extra}"
    )


def test_a_run_with_its_tools_in_a_container(
    engine: Any, engine_url: str, worker_image: str, tmp_path: Path
) -> None:
    (tmp_path / "andon.toml").write_text(_toml(engine_url))
    model = script(
        tmp_path / "s.json",
        [
            {
                "text": "Looking.",
                "tool_calls": [
                    {
                        "name": "bash",
                        "arguments": {
                            "command": "echo pid1=$(cat /proc/1/comm) > where.txt; cat where.txt"
                        },
                    }
                ],
            },
            {"text": "Done."},
        ],
    )
    home = tmp_path / "home"
    result = run(
        "run",
        "--json",
        "--workers-in",
        f"container:{worker_image}",
        "--model",
        model,
        "go",
        cwd=tmp_path,
        environ=env(ANDON_HOME=str(home)),
    )
    assert result.returncode == 0, result.stderr
    # The tool ran in the container (its PID 1 is the worker) on the workspace, mounted at the
    # same path: the file is here, and the log is a normal, balanced one.
    assert (tmp_path / "where.txt").read_text().strip().startswith("pid1=python")
    # As the invoking user (no `user` setting): the file is theirs.
    written = (tmp_path / "where.txt").stat()
    assert (written.st_uid, written.st_gid) == (os.getuid(), os.getgid())
    summary = json.loads(result.stdout.splitlines()[-1])
    session = Path(home / "sessions" / summary["session_id"])
    kinds = [r["type"] for r in records(session)]
    assert kinds.count("tool/result") == 1 and kinds[-1] == "turn/end"


@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        ('workers-in = "container:"\n', "workers-in must be 'local', 'container:IMAGE'"),
        ("[containers]\nmounts = ['relative:/x']\n", "absolute paths"),
        ("[containers]\nulimits = { nofile = [2, 1] }\n", "SOFT <= HARD"),
        ("[containers]\nwhat = 1\n", "unknown key 'what'"),
        ("containers = 3\n", "must be a table"),
        ("[containers]\nuser = 'bob'\n", "user must be 'UID', 'UID:GID' (numeric) or 'image'"),
        ("[containers]\nuser = 1000\n", "user must be 'UID', 'UID:GID' (numeric) or 'image'"),
        ("[containers]\nuserns = 'keep-id'\n", "userns must be 'host' (got 'keep-id')"),
    ],
)
def test_bad_container_settings_are_one_line_and_exit_2(
    tmp_path: Path, toml: str, expected: str
) -> None:
    (tmp_path / "andon.toml").write_text(toml)
    model = script(tmp_path / "s.json", [{"text": "never"}])
    result = run(
        "run", "--model", model, "go", cwd=tmp_path, environ=env(ANDON_HOME=str(tmp_path / "h"))
    )
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "h" / "sessions").exists() or not list(
        (tmp_path / "h" / "sessions").iterdir()
    )


def _refused(tmp_path: Path, image: str) -> tuple[str, bool]:
    """``andon run --json`` with the andon.toml in ``tmp_path``: its exit code must be 2; the
    one line of stderr, and whether a session folder was made."""
    model = script(tmp_path / "s.json", [{"text": "never"}])
    home = tmp_path / "h"
    result = run(
        "run",
        "--json",
        "--workers-in",
        f"container:{image}",
        "--model",
        model,
        "go",
        cwd=tmp_path,
        environ=env(ANDON_HOME=str(home)),
    )
    assert result.returncode == 2, result.stderr
    sessions = home / "sessions"
    return result.stderr, sessions.exists() and any(sessions.iterdir())


def _one_line(stderr: str) -> str:
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("andon: "), stderr
    return lines[0]


def test_a_missing_image_is_one_line_and_loses_nothing(
    engine: Any, engine_url: str, tmp_path: Path
) -> None:
    (tmp_path / "andon.toml").write_text(_toml(engine_url))
    image = "localhost/andon-no-such-image:1"
    stderr, made = _refused(tmp_path, image)
    line = _one_line(stderr)
    assert f"no image {image!r}" in line and f"andon never pulls: `podman pull {image}`" in line
    assert not made


def test_no_engine_at_the_socket_is_one_line_with_the_fix_and_exit_2(
    engine_url: str, worker_image: str, tmp_path: Path
) -> None:
    socket = f"unix://{tmp_path / 'no-engine.sock'}"
    (tmp_path / "andon.toml").write_text(_toml(engine_url).replace(engine_url, socket))
    stderr, made = _refused(tmp_path, worker_image)
    line = _one_line(stderr)
    assert f"no container engine answers at {socket} (no such socket)" in line
    assert "systemctl start podman.socket" in line
    assert not made


def test_an_engine_that_closes_the_connection_is_one_line_and_exit_2(
    engine_url: str, worker_image: str, tmp_path: Path
) -> None:
    """What a socket-activated Podman whose service cannot start (its default runtime is not
    installed) does: the socket takes the connection, and closes it without an answer."""
    import socket
    import tempfile
    import threading

    folder = Path(tempfile.mkdtemp(prefix="andon-closing-"))  # short: a socket path's limit
    path = folder / "engine.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(8)

    def refuse() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = server.accept()
                conn.close()

    thread = threading.Thread(target=refuse, daemon=True)
    thread.start()
    try:
        url = f"unix://{path}"
        (tmp_path / "andon.toml").write_text(_toml(engine_url).replace(engine_url, url))
        stderr, made = _refused(tmp_path, worker_image)
    finally:
        server.shutdown(socket.SHUT_RDWR)
        server.close()
        thread.join(10)
        path.unlink(missing_ok=True)
        folder.rmdir()
    line = _one_line(stderr)
    assert f"no container engine answers at {url} (it took the connection and closed it" in line
    assert "systemctl status podman.service" in line
    assert not made


def test_a_runtime_the_engine_does_not_run_is_one_line_and_exit_2(
    engine_url: str, worker_image: str, tmp_path: Path
) -> None:
    toml = _toml(engine_url).replace('runtime = "runc"', 'runtime = "andon-no-such-runtime"')
    (tmp_path / "andon.toml").write_text(toml)
    stderr, made = _refused(tmp_path, worker_image)
    line = _one_line(stderr)
    # Podman: the check sees the service runs another runtime; Docker: its create refuses it.
    assert "runtime 'andon-no-such-runtime' is not installed or not known" in line
    assert not made


def test_a_ulimit_the_engine_may_not_set_is_one_line_and_exit_2(
    engine_url: str, worker_image: str, tmp_path: Path
) -> None:
    # Above the kernel's fs.nr_open (1048576 unless raised): refused even to root.
    toml = (
        _toml(engine_url).split("ulimits = ")[0]
        + "ulimits = { nofile = [1073741824, 1073741824] }\n"
    )
    (tmp_path / "andon.toml").write_text(toml)
    stderr, made = _refused(tmp_path, worker_image)
    line = _one_line(stderr)
    assert "may not set ulimit nofile = [1073741824, 1073741824]" in line
    assert "set [containers] ulimits" in line
    assert not made


def test_a_command_the_image_lacks_is_one_line_and_exit_2(
    engine_url: str, worker_image: str, tmp_path: Path
) -> None:
    command = json.dumps([sys.executable, "-m", "andon"])
    toml = _toml(engine_url).replace(command, '["/nonexistent/andon"]')
    (tmp_path / "andon.toml").write_text(toml)
    stderr, made = _refused(tmp_path, worker_image)
    line = _one_line(stderr)
    assert f"the image {worker_image!r} has no '/nonexistent/andon'" in line
    assert "set [containers] command" in line
    assert not made


def test_a_user_who_cannot_reach_the_pools_socket_is_one_line_error(
    engine: Any, engine_url: str, worker_image: str, tmp_path: Path
) -> None:
    """The pool's socket folder is private to the invoking user: a worker running as someone
    else (not root) could never dial it, and the run would wait its whole welcome timeout: it
    is said before any container starts."""
    if os.getuid() == 4321:
        pytest.skip("the invoking user is the one this test names")
    (tmp_path / "andon.toml").write_text(_toml(engine_url, 'user = "4321:4321"\n'))
    model = script(tmp_path / "s.json", [{"text": "never"}])
    result = run(
        "run",
        "--workers-in",
        f"container:{worker_image}",
        "--model",
        model,
        "go",
        cwd=tmp_path,
        environ=env(ANDON_HOME=str(tmp_path / "h")),
    )
    assert result.returncode in (1, 2), result.stderr
    assert "the containers' user 4321:4321 cannot reach the pool's socket" in result.stderr
    assert "Traceback" not in result.stderr
