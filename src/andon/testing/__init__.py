"""Helpers for tests, ours and users': hard-to-stop process trees, the mock model server (a
scripted OpenAI-compatible streaming endpoint on 127.0.0.1) and real containers (a private Podman
API service, a registry-free worker image, host bind mounts; needs the ``containers`` extra) and a
stand-in Kubernetes API server whose kubelet runs Pods as local processes."""

from andon.testing._engine import (
    ENGINE_URL_VAR,
    IMAGE_LABEL,
    PodmanService,
    engine_host_mounts,
    host_mount_paths,
    make_worker_image,
    open_engine,
    remove_image,
    why_no_engine,
    worker_ulimits,
)
from andon.testing._kube import FakeKubernetes
from andon.testing._mock_server import (
    OVERFLOW_SHAPES,
    SERVER_ONLY_FIELDS,
    SUMMARY_MARKER,
    MockModelServer,
    RecordedRequest,
    mock_prompt_tokens,
)
from andon.testing._mock_server import main as mock_model_main
from andon.testing._trees import (
    SHELL_SLEEP,
    STUBBORN,
    TRAP_INT,
    benchmark_tree,
    leader_obeys_member_stubborn,
)

__all__ = [
    "ENGINE_URL_VAR",
    "IMAGE_LABEL",
    "OVERFLOW_SHAPES",
    "SERVER_ONLY_FIELDS",
    "SHELL_SLEEP",
    "STUBBORN",
    "SUMMARY_MARKER",
    "TRAP_INT",
    "FakeKubernetes",
    "MockModelServer",
    "PodmanService",
    "RecordedRequest",
    "benchmark_tree",
    "engine_host_mounts",
    "host_mount_paths",
    "leader_obeys_member_stubborn",
    "make_worker_image",
    "mock_model_main",
    "mock_prompt_tokens",
    "open_engine",
    "remove_image",
    "why_no_engine",
    "worker_ulimits",
]
