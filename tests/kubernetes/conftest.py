"""A stand-in cluster for the PodLauncher tests: :class:`andon.testing.FakeKubernetes`, a local
HTTP server with the Pod, Secret and watch endpoints in the real API's shapes, whose kubelet runs
each Pod's command as processes of this machine (no cluster can run here). Its processes carry
this test run's tag, so the leftover check sees them like any other."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from andon.fleet import PodLauncher
from andon.testing import FakeKubernetes
from tests.cli.conftest import killer  # noqa: F401  (the CLI tests' fixture, for the CLI here)
from tests.support import RUN_TAG_VAR

kubernetes = pytest.importorskip("kubernetes", reason="the kubernetes extra is not installed")

IMAGE = "registry.example/andon-worker:test"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[FakeKubernetes]:
    with FakeKubernetes(
        tmp_path / "cluster", extra_env={RUN_TAG_VAR: os.environ[RUN_TAG_VAR]}
    ) as fake:
        yield fake


def launcher_for(cluster: FakeKubernetes, **options: Any) -> PodLauncher:
    configuration = kubernetes.client.Configuration()
    configuration.host = cluster.url
    settings: dict[str, Any] = {
        "configuration": configuration,
        # The fake kubelet runs the command on this machine: this interpreter is the image's.
        "command": (sys.executable, "-m", "andon"),
        "environment": {"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        "engine_timeout": 10.0,
        "watch_backoff": (0.05, 0.5),
    }
    settings.update(options)
    return PodLauncher(IMAGE, **settings)
