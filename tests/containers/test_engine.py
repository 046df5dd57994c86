"""The real-container test infrastructure itself: the worker image runs the host's Python with
andon from read-only bind mounts, and removing a container leaves nothing of it on the host, a
``setsid`` escapee included (docs/scale-out.md, The launcher seam: the engine's remove is the
backstop)."""

from __future__ import annotations

import contextlib
import secrets
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import andon
from andon import procs
from andon.procs import ProcInfo
from andon.testing import IMAGE_LABEL, host_mount_paths, make_worker_image, remove_image
from tests.support import alive_after

if TYPE_CHECKING:
    from docker import DockerClient


def _cmdline(pid: int) -> list[bytes]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")[:-1]
    except OSError:
        return []


def _running(argv: list[bytes]) -> list[ProcInfo]:
    """Live processes on the host whose command line is exactly ``argv``."""
    return [p for p in procs.snapshot() if not p.zombie and _cmdline(p.pid) == argv]


def _mentioning(word: str) -> list[ProcInfo]:
    """Live processes on the host with ``word`` somewhere in their command line."""
    needle = word.encode()
    return [p for p in procs.snapshot() if not p.zombie and needle in b" ".join(_cmdline(p.pid))]


def test_the_host_python_runs_andon_in_the_worker_image(
    engine: DockerClient, worker_image: str, container_options: dict[str, Any]
) -> None:
    argv = [sys.executable, "-c", "import andon, zmq; print('ok')"]
    out = engine.containers.run(worker_image, argv, remove=True, **container_options)
    assert out == b"ok\n"


def test_removing_a_container_leaves_no_setsid_escapee(
    engine: DockerClient, worker_image: str, container_options: dict[str, Any]
) -> None:
    import docker

    marker = f"1000{secrets.randbelow(10**8):08d}"  # sleep's argument, this test's alone
    head, tail = marker[:4], marker[4:]
    # The marker is spelt "${h}<tail>" in the script, so only the sleeps' command lines hold it.
    # The escapee is in place once its first argument reads "sleep": setsid runs before that exec.
    # (A busy wait, bounded: nothing inside the container can signal the exec.)
    script = (
        f"h={head}; setsid sleep ${{h}}{tail} & "
        "until read -r -d '' first < /proc/$!/cmdline && [ \"$first\" = sleep ]; do "
        "[ $SECONDS -lt 10 ] || exit 1; done; "
        f"echo ready; exec sleep ${{h}}{tail}"
    )
    container = engine.containers.create(
        worker_image, ["/bin/bash", "-c", script], **container_options
    )
    output = None
    try:
        container.start()
        # The log replays from the start, so a line written before this call is not missed.
        output = container.logs(stream=True, follow=True)
        seen = b""
        for chunk in output:
            seen += chunk
            if b"ready\n" in seen:
                break
        assert seen == b"ready\n"
        sleeps = _running([b"sleep", marker.encode()])
        assert len(sleeps) == 2, "the container's main process and the escapee"
        assert len({p.sid for p in sleeps}) == 2, "the escapee left the main process's session"
        conmon = _mentioning(container.id)  # the engine's monitor of this container
        assert conmon
        container.remove(force=True)
    finally:
        with contextlib.suppress(docker.errors.NotFound):
            container.remove(force=True)
        # The log ends with the container: read it to its end, which frees the connection (a
        # stream closed half-read leaves an unclosed socket behind in docker-py 7).
        for _ in output or ():
            pass
    assert alive_after([*sleeps, *conmon], timeout=10.0) == []
    assert _running([b"sleep", marker.encode()]) == []


def test_remove_image_takes_the_containers_made_from_it(engine: DockerClient) -> None:
    import docker

    ref = make_worker_image(engine, f"localhost/andon-test-{secrets.token_hex(6)}:1")
    try:
        assert engine.images.get(ref).labels[IMAGE_LABEL] == ref
        left = engine.containers.create(ref, ["/nothing"], network_mode="none")
    finally:
        remove_image(engine, ref)
    with pytest.raises(docker.errors.NotFound):
        engine.images.get(ref)
    with pytest.raises(docker.errors.NotFound):
        engine.containers.get(left.id)
    remove_image(engine, ref)  # gone already is fine


def test_host_mount_paths_drop_nested_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    # A distribution's Python lives in /usr; a venv inside the folder holding the andon package.
    monkeypatch.setattr(sys, "base_prefix", "/usr")
    holder = Path(andon.__file__).resolve().parents[1]
    monkeypatch.setattr(sys, "prefix", str(holder / "venv"))
    paths = host_mount_paths()
    assert "/usr" in paths
    assert str(holder / "venv") not in paths
    assert len(paths) == len(set(paths))
    for path in paths:
        assert not any(Path(path).is_relative_to(o) for o in paths if o != path)


def test_two_runs_images_share_nothing_and_removing_one_leaves_the_other(
    engine: DockerClient,
) -> None:
    """Two copies of the suite on one machine each make an image: they must not be one image
    under two names, or the first run's clean-up takes the other's image away."""
    first = make_worker_image(engine, f"localhost/andon-test-{secrets.token_hex(6)}:1")
    second = make_worker_image(engine, f"localhost/andon-test-{secrets.token_hex(6)}:1")
    try:
        assert engine.images.get(first).id != engine.images.get(second).id
        # Not even a layer in common (engines share identical layers between images, and one
        # run's removal racing another run's use of a shared layer broke the other's image).
        layers = [set(engine.images.get(ref).attrs["RootFS"]["Layers"]) for ref in (first, second)]
        assert not layers[0] & layers[1]
        remove_image(engine, first)
        assert engine.images.get(second).attrs["Config"]["Labels"][IMAGE_LABEL] == second
    finally:
        remove_image(engine, first)
        remove_image(engine, second)
