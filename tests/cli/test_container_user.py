"""Who ``andon run --workers-in container:IMAGE`` runs the tools as (docs/scale-out.md, Who the
tools run as): the ids that are the invoking user on the host. A rootful engine keeps ids as they
are; a rootless one (its socket is the invoking user's) maps its containers' root to that user,
so there the tools run as ``0:0``. ``user`` says otherwise; ``user = "image"`` leaves the image's
``USER``. No engine is needed: the launcher is made, not opened."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from andon.cli._workers import ContainerSettings, invoking_user, launcher_of, parse_containers
from andon.fleet import ContainerLauncher

OTHER_GID = 4322


@pytest.fixture
def me(monkeypatch: pytest.MonkeyPatch) -> int:
    """A non-root invoking user: this process's own uid if it is not root, else 4321."""
    uid = os.getuid() or 4321
    monkeypatch.setattr(os, "getuid", lambda: uid)
    monkeypatch.setattr(os, "getgid", lambda: OTHER_GID)
    return uid


def _socket(path: Path, owner: int | None) -> str:
    """A real unix socket file at ``path`` (listening), owned by ``owner`` when root may say so."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(path))
    if owner is not None and os.geteuid() == 0:
        os.chown(path, owner, -1)
    return f"unix://{path}"


def test_a_rootful_engine_runs_the_tools_as_the_invoking_user(tmp_path: Path, me: int) -> None:
    if os.geteuid() != 0:
        pytest.skip("a socket of another user's needs root to make")
    url = _socket(tmp_path / "engine.sock", owner=0)
    assert invoking_user(url) == f"{me}:{OTHER_GID}"


def test_a_rootless_engine_runs_them_as_its_root_which_is_the_invoking_user(
    tmp_path: Path, me: int
) -> None:
    url = _socket(tmp_path / "engine.sock", owner=me)
    assert invoking_user(url) == "0:0"


def test_docker_host_names_the_engine_when_the_settings_do_not(
    tmp_path: Path, me: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_HOST", _socket(tmp_path / "engine.sock", owner=me))
    assert invoking_user(None) == "0:0"


@pytest.mark.parametrize("url", ["ssh://build-box", "tcp://10.0.0.1:2375", "unix:///nowhere.sock"])
def test_an_engine_with_no_socket_of_ours_here_gets_our_ids(url: str, me: int) -> None:
    assert invoking_user(url) == f"{me}:{OTHER_GID}"


def test_root_is_root() -> None:
    if os.getuid() != 0:
        pytest.skip("not root")
    assert invoking_user(None) == "0:0"


def _launcher(toml_table: dict[str, object], tmp_path: Path) -> ContainerLauncher:
    settings = parse_containers(toml_table, tmp_path / "andon.toml")
    launcher = launcher_of("container:img:1", settings, str(tmp_path))
    assert isinstance(launcher, ContainerLauncher)
    return launcher


def test_the_settings_choose_the_user(tmp_path: Path, me: int) -> None:
    engine = _socket(tmp_path / "engine.sock", owner=None)
    assert _launcher({"engine": "ssh://box"}, tmp_path).user == f"{me}:{OTHER_GID}"
    assert _launcher({"engine": engine, "user": "1000"}, tmp_path).user == "1000"
    assert _launcher({"user": "1000:1001"}, tmp_path).user == "1000:1001"
    image = _launcher({"user": "image", "userns": "host"}, tmp_path)
    assert image.user is None and image.userns == "host"
    assert launcher_of("local", ContainerSettings(), str(tmp_path)) is None
