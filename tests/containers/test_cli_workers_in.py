"""``andon run --workers-in container:IMAGE``: the CLI end to end, with the engine and the mounts
from ``[containers]`` in andon.toml, against the real Podman service of the session."""

from __future__ import annotations

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
        ('workers-in = "container:"\n', "workers-in must be 'local' or 'container:IMAGE'"),
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


def test_a_missing_image_is_one_line_and_loses_nothing(
    engine: Any, engine_url: str, tmp_path: Path
) -> None:
    (tmp_path / "andon.toml").write_text(_toml(engine_url))
    model = script(tmp_path / "s.json", [{"text": "never"}])
    result = run(
        "run",
        "--workers-in",
        "container:localhost/andon-no-such-image:1",
        "--model",
        model,
        "go",
        cwd=tmp_path,
        environ=env(ANDON_HOME=str(tmp_path / "h")),
    )
    assert result.returncode in (1, 2), result.stderr
    assert "no image 'localhost/andon-no-such-image:1'" in result.stderr
    assert "Traceback" not in result.stderr


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
