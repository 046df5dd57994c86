"""Real containers for tests, ours and users': a private Podman API service, a tiny image made
without a registry, and the read-only bind mounts that let it run this machine's Python and andon
(docs/scale-out.md, What is tested, and how).

Everything here speaks the Docker Engine API through docker-py (the ``containers`` extra), so the
same tests run against Podman's compatible service or a real dockerd (``ANDON_TEST_ENGINE_URL``).
docker-py is imported inside the functions that use it: ``andon.testing`` must stay importable
without it.

Podman 4.3 quirks met here, each handled where it bites:

- The compat API ignores ``HostConfig.Runtime`` (a container asked for ``"crun"`` or any name runs
  on podman's default, and reports runtime ``"oci"``): the runtime is the service's global
  ``--runtime`` flag instead. crun refuses some hosts' hybrid cgroups, so runc is preferred.
- Image import (``POST /images/create?fromSrc=-``) ignores the ``tag`` parameter and names the
  image ``repo:latest``: the tag goes inside ``repo`` (``name:tag``), as the docker CLI sends it.
- Without explicit ulimits podman asks for ``nofile``/``nproc`` far above ours, which root
  without ``CAP_SYS_RESOURCE`` cannot set: see :func:`worker_ulimits`.
- With ``auto_remove`` the exit code is lost: ``wait`` answers ``StatusCode 0`` and an error
  saying the container is gone. Remove explicitly when the exit code matters.
- Removing a missing image answers 404 "image not known", which docker-py raises as
  ``NotFound``, not ``ImageNotFound``: catch ``NotFound`` (``ImageNotFound`` is one).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

from andon.base import clean_text

if TYPE_CHECKING:
    from docker import DockerClient
    from docker.types import Mount

__all__ = [
    "ENGINE_URL_VAR",
    "IMAGE_LABEL",
    "PodmanService",
    "engine_host_mounts",
    "host_mount_paths",
    "make_worker_image",
    "open_engine",
    "remove_image",
    "why_no_engine",
    "worker_ulimits",
]

ENGINE_URL_VAR: Final = "ANDON_TEST_ENGINE_URL"
"""Names an engine that is already running (``unix:///run/docker.sock``, ``ssh://host``): tests
use it instead of starting a Podman service of their own."""

IMAGE_LABEL: Final = "io.andon.test-image"
"""Label of every image :func:`make_worker_image` makes; its value is the image's reference."""

_START_TIMEOUT: Final = 20.0
_POLL: Final = 0.05
_LOG_LINES: Final = 3


def _which(name: str) -> str | None:
    # runc lives in /usr/sbin, which a normal user's PATH often lacks; podman looks there anyway.
    path = os.pathsep.join([os.environ.get("PATH", os.defpath), "/usr/local/sbin", "/usr/sbin"])
    return shutil.which(name, path=path)


def _log_head(path: Path) -> str:
    """The first lines of a log, on one line (for a skip reason or an error message)."""
    try:
        lines = clean_text(path.read_bytes()).splitlines()
    except OSError:
        return "(no log)"
    head = [line.strip() for line in lines if line.strip()][:_LOG_LINES]
    return " | ".join(head) or "(empty log)"


def _ping(base_url: str, timeout: float) -> str | None:
    """None if the engine at ``base_url`` answers ``/_ping``, else why not."""
    import docker

    if base_url.startswith("unix://"):
        # Connect once ourselves first: docker-py 7 leaks (ResourceWarning) the socket of a unix
        # connection that fails, and a missing or stale socket is the usual way this fails.
        path = base_url.removeprefix("unix://")
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(timeout)
            try:
                probe.connect(path)
            except OSError as exc:
                return f"cannot connect to {path}: {exc.strerror or exc}"

    # A fixed API version, so that the constructor sends nothing: a DockerClient whose version
    # negotiation fails raises from its constructor and leaks the connection it opened. The
    # unversioned /_ping is answered by every engine, whatever versions it speaks.
    version = docker.constants.DEFAULT_DOCKER_API_VERSION
    try:
        api = docker.APIClient(base_url=base_url, version=version, timeout=timeout)
    except docker.errors.DockerException as exc:  # a malformed URL
        return str(exc)
    try:
        response = api.get(f"{api.base_url}/_ping")
        try:
            if response.ok:
                return None
            return f"HTTP {response.status_code} {response.text.strip()[:200]}"
        finally:
            response.close()
    except (docker.errors.DockerException, OSError) as exc:
        return str(exc)
    finally:
        api.close()


class PodmanService:
    """``podman system service`` on a socket in a private folder, while this object is open.

    The service uses podman's default storage: two test runs on one machine share it, so every
    image and container a test makes carries a name or label of its own. ``runtime`` is podman's
    global ``--runtime`` (the compat API ignores a per-container one); None means runc when it is
    installed (crun refuses hybrid cgroup hosts), else podman's default. ``env`` is the service's
    environment (default: this process's); conmon and the containers get environments of
    podman's making, not this one.

    Raises ``RuntimeError``, with the first lines of the service's log, if the socket does not
    answer within ``timeout`` seconds or the service exits first.
    """

    def __init__(
        self,
        *,
        runtime: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float = _START_TIMEOUT,
    ) -> None:
        podman = _which("podman")
        if podman is None:
            raise RuntimeError("podman is not installed")
        if runtime is None and _which("runc") is not None:
            runtime = "runc"
        # mkdtemp makes the folder 0700: nobody else may talk to a root-owned engine through it.
        self.folder: Final = Path(tempfile.mkdtemp(prefix="andon-podman-"))
        self.log_path: Final = self.folder / "podman.log"
        self.base_url: Final = f"unix://{self.folder / 'podman.sock'}"
        argv = [podman, *(["--runtime", runtime] if runtime else [])]
        argv += ["system", "service", "--time=0", self.base_url]
        with open(self.log_path, "wb") as log:
            # Its own session: a Ctrl-C meant for the test run must not stop the engine before
            # the run's teardown has removed its containers through it.
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None,
                start_new_session=True,
            )
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.close(grace=0.0)
            raise

    def _wait_ready(self, timeout: float) -> None:
        sock = self.folder / "podman.sock"
        deadline = time.monotonic() + timeout
        while True:
            if sock.exists() and _ping(self.base_url, timeout=5.0) is None:
                return
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"podman system service did not answer within {timeout:g} s: "
                    f"{_log_head(self.log_path)}"
                )
            try:
                # Waiting on the child is the pause between tries, and notices an early exit.
                self._proc.wait(timeout=_POLL)  # sleep-ok: the socket gives no readiness event
            except subprocess.TimeoutExpired:
                continue
            raise RuntimeError(
                f"podman system service exited with status {self._proc.returncode}: "
                f"{_log_head(self.log_path)}"
            )

    def close(self, grace: float = 5.0) -> None:
        """Stop the service (SIGTERM; SIGKILL after ``grace`` seconds) and remove its folder.

        Containers it started keep running under their conmon: remove them first.
        """
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> PodmanService:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def why_no_engine(*, env: Mapping[str, str] | None = None) -> str | None:
    """None if :func:`open_engine` can work here, else a one-line reason (for ``pytest.skip``).

    With ``ANDON_TEST_ENGINE_URL`` set, that engine must answer. Otherwise podman must be
    installed, usable by this user, and its API service must start: one is started (with
    ``env``, as :class:`PodmanService`) and stopped again.
    """
    try:
        import docker  # noqa: F401 (only: is it there?)
    except ImportError:
        return "the docker package is not installed (pip install 'andon[containers]')"
    url = os.environ.get(ENGINE_URL_VAR)
    if url:
        error = _ping(url, timeout=10.0)
        return None if error is None else f"{ENGINE_URL_VAR}={url} does not answer: {error}"
    podman = _which("podman")
    if podman is None:
        return "podman is not installed (apt-get install podman runc)"
    if os.geteuid() != 0:
        # Rootless podman needs a user namespace; this is the cheapest command that makes one.
        try:
            out = subprocess.run(
                [podman, "unshare", "true"],
                capture_output=True,
                text=True,
                timeout=30,
                env=dict(env) if env is not None else None,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"not root, and rootless podman is unusable: {exc}"
        if out.returncode != 0:
            first = (out.stderr.strip().splitlines() or ["(no message)"])[0]
            return f"not root, and rootless podman is unusable: {first}"
    try:
        service = PodmanService(env=env)
    except RuntimeError as exc:
        return str(exc)
    service.close()
    return None


@contextlib.contextmanager
def open_engine(*, env: Mapping[str, str] | None = None) -> Iterator[DockerClient]:
    """A docker-py client for ``ANDON_TEST_ENGINE_URL`` if set, else for a :class:`PodmanService`
    started for the block (with ``env``) and stopped after it. docker-py negotiates the API
    version (1.41 with podman 4.3)."""
    import docker

    url = os.environ.get(ENGINE_URL_VAR)
    service = None if url else PodmanService(env=env)
    try:
        client = docker.DockerClient(base_url=service.base_url if service is not None else url)
        try:
            yield client
        finally:
            client.close()
    finally:
        if service is not None:
            service.close()


# --- the image ----------------------------------------------------------------------------------

_DIRS: Final = ("usr", "etc", "tmp", "proc", "sys", "dev", "root", "run", "work", "var", "var/tmp")
# /root is open to all (0755): a host Python under it (pyenv's ~/.pyenv), bind-mounted there, must
# run for a container user other than root too (ContainerLauncher's ``user``).
_MODES: Final = {"tmp": 0o1777, "var/tmp": 0o1777, "root": 0o755}
# Merged /usr: these are symlinks into /usr on the host (then mirrored), or real folders (then
# bind-mounted like /usr, see engine_host_mounts).
_USR_LINKS: Final = ("bin", "lib", "lib32", "lib64", "libx32", "sbin")
_FILES: Final = {
    "etc/passwd": "root:x:0:0:root:/root:/bin/bash\n",
    "etc/group": "root:x:0:\n",
    "etc/hosts": "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
}


def _host_top_dirs() -> list[str]:
    """The merged-/usr names that are real folders on this host (not symlinks)."""
    return [
        name for name in _USR_LINKS if os.path.isdir(f"/{name}") and not os.path.islink(f"/{name}")
    ]


def _rootfs_tar(tag: str) -> bytes:
    """A root filesystem of empty folders, the host's /usr symlinks, three /etc files and
    ``/etc/andon-image`` naming ``tag``: the layer is this image's alone. (Two runs importing the
    same bytes would share one layer and one image id, and the first run's removal would take the
    other run's image with it; an ``ancestor`` filter would match the other run's containers.)"""
    now = int(time.time())

    def entry(name: str, kind: bytes, mode: int) -> tarfile.TarInfo:
        info = tarfile.TarInfo(name)
        info.type, info.mode, info.mtime = kind, mode, now
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        return info

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in [*_DIRS, *_host_top_dirs()]:
            tar.addfile(entry(name, tarfile.DIRTYPE, _MODES.get(name, 0o755)))
        for name in _USR_LINKS:
            if os.path.islink(f"/{name}"):
                link = entry(name, tarfile.SYMTYPE, 0o777)
                link.linkname = os.readlink(f"/{name}")
                tar.addfile(link)
        for name, text in {**_FILES, "etc/andon-image": f"{tag}\n"}.items():
            data = text.encode()
            info = entry(name, tarfile.REGTYPE, 0o644)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _import_error(answer: Any) -> str | None:
    """The error in an import's answer (JSON lines, HTTP 200 even when it failed), if any."""
    for line in str(answer).splitlines():
        with contextlib.suppress(ValueError):
            message = json.loads(line)
            if isinstance(message, dict) and (message.get("error") or message.get("errorDetail")):
                return str(message.get("error") or message.get("errorDetail"))
    return None


def _is_local_podman(client: DockerClient) -> bool:
    """Whether the engine is Podman on this machine (a unix socket; its storage is the CLI's)."""
    components = client.version().get("Components") or []
    local = str(client.api.base_url).startswith("http+docker://localhost")
    return local and any("podman" in str(c.get("Name", "")).lower() for c in components)


def make_worker_image(client: DockerClient, tag: str) -> str:
    """Import a tiny image named ``tag`` (``name:tag``; make it unique to the run) and return its
    reference. It holds no program at all: run it with :func:`engine_host_mounts`.

    The image comes from a tar of a root filesystem (no registry, no build), through the API's
    image import; should a Podman engine refuse that route, through ``podman import`` (only when
    the engine is the local podman, whose storage the CLI shares).
    """
    import docker

    data = _rootfs_tar(tag)
    changes = [f"LABEL {IMAGE_LABEL}={tag}"]
    try:
        error = _import_error(
            client.api.import_image_from_data(data, repository=tag, changes=changes)
        )
    except docker.errors.APIError as exc:
        error = str(exc)
    if error is not None:
        podman = _which("podman")
        if podman is None or not _is_local_podman(client):
            raise RuntimeError(f"cannot import the worker image {tag}: {error}")
        argv = [podman, "import", *(f"--change={c}" for c in changes), "-", tag]
        done = subprocess.run(argv, input=data, capture_output=True, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(
                f"cannot import the worker image {tag}: {error}; podman import: "
                f"{clean_text(done.stderr).strip()}"
            )
    client.images.get(tag)  # either route: the engine must now know it by that name
    return tag


def remove_image(client: DockerClient, ref: str) -> None:
    """Remove an image :func:`make_worker_image` made, with every container still made from it
    (the reference is unique to its run, so they are that run's own). Gone already is fine."""
    import docker

    # sparse: a container that goes while it is listed must not fail the listing.
    for container in client.containers.list(all=True, filters={"ancestor": ref}, sparse=True):
        with contextlib.suppress(docker.errors.NotFound):
            container.remove(force=True)
    # NotFound, not ImageNotFound: docker-py files podman's "image not known" 404 under NotFound.
    with contextlib.suppress(docker.errors.NotFound):
        client.images.remove(ref)


# --- running the host's Python in it ------------------------------------------------------------


def host_mount_paths() -> list[str]:
    """The host paths a container of the worker image needs, read-only at the same paths, to run
    this interpreter (``sys.executable``) with andon and its dependencies: /usr (bash, libc,
    coreutils), the Python prefix, the virtualenv and the folder holding the andon package (the
    source of an editable install). A path inside another one is left to the outer one."""
    # This file is andon/testing/_engine.py, so parents[2] is the folder holding the andon
    # package: src/ of an editable install (else site-packages, inside a prefix already).
    source = Path(__file__).resolve().parents[2]
    wanted = ["/usr", *(f"/{name}" for name in _host_top_dirs())]
    wanted += [sys.base_prefix, sys.prefix, str(source)]
    kept: list[Path] = []
    for path in sorted({Path(os.path.abspath(p)) for p in wanted}, key=lambda p: len(p.parts)):
        if not any(path.is_relative_to(outer) for outer in kept):
            kept.append(path)
    return [str(p) for p in kept]


def engine_host_mounts() -> list[Mount]:
    """:func:`host_mount_paths` as docker-py read-only bind mounts (``mounts=`` of
    ``containers.run``/``create``)."""
    from docker.types import Mount

    return [Mount(p, p, type="bind", read_only=True) for p in host_mount_paths()]


def worker_ulimits() -> dict[str, tuple[int, int]]:
    """``nofile`` and ``nproc`` as ``(soft, hard)``, no higher than this process's own soft
    limits and at most 1024 and 4096: podman's defaults are higher, and raising a limit needs
    ``CAP_SYS_RESOURCE``, which root in a VM or a container often lacks. For docker-py:
    ``[Ulimit(name=n, soft=s, hard=h) for n, (s, h) in worker_ulimits().items()]``."""
    limits = {}
    for name, which, most in (
        ("nofile", resource.RLIMIT_NOFILE, 1024),
        ("nproc", resource.RLIMIT_NPROC, 4096),
    ):
        soft, _ = resource.getrlimit(which)
        value = most if soft == resource.RLIM_INFINITY else min(most, soft)
        limits[name] = (value, value)
    return limits
