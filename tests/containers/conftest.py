"""Fixtures for tests against a real container engine (docs/scale-out.md, What is tested, and how).

``engine_url`` is the API address of a Podman service started for the session, or of the engine
``ANDON_TEST_ENGINE_URL`` names; ``engine`` a docker-py client for it; ``worker_image`` an image
made for the session without a registry; ``container_options`` what every container here needs to
run the host's Python. With no usable engine each test that uses them is skipped with the reason,
never passed.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from andon.testing import (
    ENGINE_URL_VAR,
    PodmanService,
    engine_host_mounts,
    make_worker_image,
    remove_image,
    why_no_engine,
    worker_ulimits,
)
from tests.support import RUN_TAG_VAR

if TYPE_CHECKING:
    from docker import DockerClient

# The session-long service must not carry this run's tag, or the leftover check after every test
# would take it for a leak (as it would rootless podman's pause process, which outlives it). conmon
# and a container's processes get environments of podman's making, never ours: the tests here find
# those by a marker of their own.
_ENGINE_ENV = {k: v for k, v in os.environ.items() if k != RUN_TAG_VAR}


@pytest.fixture(scope="session")
def engine_url() -> Iterator[str]:
    """The engine's API address (for a launcher): ``ANDON_TEST_ENGINE_URL``, or the socket of a
    Podman service started for the session."""
    reason = why_no_engine(env=_ENGINE_ENV)
    if reason is not None:
        pytest.skip(reason)
    url = os.environ.get(ENGINE_URL_VAR)
    if url:
        yield url
        return
    with PodmanService(env=_ENGINE_ENV) as service:
        yield service.base_url


@pytest.fixture(scope="session")
def engine(engine_url: str) -> Iterator[DockerClient]:
    """A docker-py client for :func:`engine_url` (the API version negotiated)."""
    import docker

    client = docker.DockerClient(base_url=engine_url)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="session")
def worker_image(engine: DockerClient) -> Iterator[str]:
    # Unique to the run: two runs on one machine share podman's storage.
    ref = make_worker_image(engine, f"localhost/andon-test-{secrets.token_hex(6)}:1")
    try:
        yield ref
    finally:
        remove_image(engine, ref)


@pytest.fixture(scope="session")
def container_options(engine: DockerClient) -> dict[str, Any]:
    """Keyword arguments for ``containers.create``/``run``: the host's Python, andon and the venv
    mounted read-only, no network, and ulimits this machine's root may set."""
    from docker.types import Ulimit

    return {
        "mounts": engine_host_mounts(),
        "network_mode": "none",
        # dockerd honours it; podman 4.3's compat API ignores it (the service's --runtime decides).
        "runtime": "runc",
        "ulimits": [Ulimit(name=n, soft=s, hard=h) for n, (s, h) in worker_ulimits().items()],
    }
