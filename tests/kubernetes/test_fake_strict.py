"""The stand-in cluster is no kinder than a real one where stopping is concerned: a Pod's end takes
every process of its pid namespace (an ``env -i setsid`` escapee too), a grace-0 deletion still
gives the kubelet's short grace, a later shorter deletion does not shorten the kubelet's grace, a
lost node is a taint-based eviction that leaves the Pod Terminating, Pod names are DNS subdomains,
and a watch is told DELETED when an object leaves its selector. Driven through the real client."""

from __future__ import annotations

import os
import secrets
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from andon import procs
from andon.testing import FakeKubernetes
from tests.kubernetes.conftest import IMAGE, kubernetes
from tests.support import RUN_TAG_VAR

pytestmark = pytest.mark.timeout(60)

NS = "default"


@pytest.fixture
def manual(tmp_path: Path) -> Iterator[FakeKubernetes]:
    with FakeKubernetes(
        tmp_path / "cluster", extra_env={RUN_TAG_VAR: os.environ[RUN_TAG_VAR]}, manual_clock=True
    ) as fake:
        if fake.isolation != "pid-namespace":
            pytest.skip("no pid namespaces here (they need root): the fake kills by marker")
        yield fake


def _api(cluster: FakeKubernetes) -> Any:
    configuration = kubernetes.client.Configuration()
    configuration.host = cluster.url
    return kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(configuration))


def _pod(name: str, script: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "strict"}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": IMAGE,
                    "command": ["bash", "-c", script],
                    "env": [{"name": "PATH", "value": os.environ.get("PATH", "/usr/bin:/bin")}],
                }
            ],
            **spec,
        },
    }


def _eventually(check: Callable[[], bool], timeout: float = 20.0) -> bool:
    """For what the fake's store does not see (a process of the Pod starting, a file written):
    checked every 20 ms, bounded."""
    deadline = time.monotonic() + timeout
    tick = threading.Event()
    while not check():
        if time.monotonic() >= deadline:
            return False
        tick.wait(0.02)
    return True


def _phase(cluster: FakeKubernetes, name: str) -> str | None:
    pod = cluster.pod(name)
    return None if pod is None else pod["status"].get("phase")


def _by_argv(words: list[bytes]) -> list[procs.ProcInfo]:
    found = []
    for info in procs.snapshot():
        try:
            with open(f"/proc/{info.pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")[:-1]
        except OSError:
            continue
        if argv == words and not info.zombie:
            found.append(info)
    return found


# A process that hears SIGTERM (the container's init has a handler, so it gets it), says so in a
# file, and goes on: only SIGKILL ends it.
_STUBBORN = (
    'trap \'echo term >> "$OUT"\' TERM; echo up >> "$OUT"; while :; do sleep 1 & wait $!; done'
)


def _stubborn(name: str, out: Path) -> dict[str, Any]:
    body = _pod(name, _STUBBORN)
    body["spec"]["containers"][0]["env"].append({"name": "OUT", "value": str(out)})
    return body


def test_an_eviction_ends_a_process_that_hid_with_env_i_setsid(
    tmp_path: Path, manual: FakeKubernetes
) -> None:
    # A container runtime ends the Pod's whole pid namespace; an environment marker does not
    # reach a process started with a cleared environment in a session of its own.
    token = f"3000.{secrets.randbelow(10**9)}"
    api = _api(manual)
    api.create_namespaced_pod(NS, _pod("hider", f"env -i setsid sleep {token} & exec sleep 300"))
    words = [b"sleep", token.encode()]
    try:
        assert _eventually(lambda: len(_by_argv(words)) == 1), "the escapee never started"
        manual.fail_pod("hider", "Evicted", "The node was low on resource: memory.")
        assert _phase(manual, "hider") == "Failed"
        assert _by_argv(words) == []
        assert manual.processes("hider") == []
    finally:
        for info in _by_argv(words):  # only if the fake failed: the test's own escapee
            procs.signal_key(info.key, signal.SIGKILL)


def test_a_grace_0_delete_still_gives_the_kubelets_short_grace(
    tmp_path: Path, manual: FakeKubernetes
) -> None:
    out = tmp_path / "said"
    api = _api(manual)
    api.create_namespaced_pod(NS, _stubborn("forced", out))
    assert _eventually(lambda: out.exists() and "up" in out.read_text())
    api.delete_namespaced_pod("forced", NS, grace_period_seconds=0)
    # Gone from the API at once; the container got SIGTERM and runs on for the kubelet's grace.
    assert manual.pod("forced") is None
    assert _eventually(lambda: "term" in out.read_text()), "no SIGTERM before the SIGKILL"
    assert manual.processes("forced") != []
    manual.advance(manual.force_grace)
    assert manual.wait_for(lambda c: c.processes("forced") == [])


def test_a_shorter_graceful_delete_does_not_shorten_the_kubelets_grace(
    tmp_path: Path, manual: FakeKubernetes
) -> None:
    out = tmp_path / "said"
    api = _api(manual)
    api.create_namespaced_pod(NS, _stubborn("graceful", out))
    assert _eventually(lambda: out.exists() and "up" in out.read_text())
    api.delete_namespaced_pod("graceful", NS, grace_period_seconds=30)
    assert _eventually(lambda: "term" in out.read_text())
    api.delete_namespaced_pod("graceful", NS, grace_period_seconds=5)
    pod = manual.pod("graceful")
    assert pod is not None and pod["metadata"]["deletionGracePeriodSeconds"] == 5  # the API's
    manual.advance(10)
    # Past the shorter grace, the kubelet still keeps to its 30 s: all runs, the Pod Terminating.
    manual.send_bookmarks()  # a store change, for the wait below to look again
    assert not manual.wait_for(lambda c: c.processes("graceful") == [], timeout=1.0)
    assert manual.pod("graceful") is not None
    manual.advance(20)
    assert manual.wait_for(lambda c: c.pod("graceful") is None and c.processes("graceful") == [])


def test_a_lost_node_is_a_taint_based_eviction_that_never_completes(
    tmp_path: Path, manual: FakeKubernetes
) -> None:
    out = tmp_path / "said"
    api = _api(manual)
    api.create_namespaced_pod(NS, _stubborn("stranded", out))
    assert manual.wait_for(lambda c: _phase(c, "stranded") == "Running")
    tolerations = {t["key"]: t for t in manual.pod("stranded")["spec"]["tolerations"]}  # type: ignore[index]
    assert tolerations["node.kubernetes.io/unreachable"]["tolerationSeconds"] == 300
    manual.lose_node()
    pod = manual.pod("stranded")
    assert pod is not None and pod["status"]["phase"] == "Running"  # not Unknown
    ready = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "False"
    manual.advance(299)
    manual.send_bookmarks()
    assert not manual.wait_for(
        lambda c: bool(c.pod("stranded")["metadata"].get("deletionTimestamp")),  # type: ignore[index]
        timeout=1.0,
    )
    manual.advance(1)
    assert manual.wait_for(
        lambda c: bool(c.pod("stranded")["metadata"].get("deletionTimestamp"))  # type: ignore[index]
    )
    pod = manual.pod("stranded")
    assert pod is not None
    disruption = next(c for c in pod["status"]["conditions"] if c["type"] == "DisruptionTarget")
    assert disruption["reason"] == "DeletionByTaintManager"
    # No kubelet confirms the end: the Pod stays Terminating, its processes run; not even a
    # force delete, which takes it out of the API, reaches them.
    manual.advance(3600)
    manual.send_bookmarks()
    assert not manual.wait_for(lambda c: c.pod("stranded") is None, timeout=1.0)
    api.delete_namespaced_pod("stranded", NS, grace_period_seconds=0)
    assert manual.pod("stranded") is None
    assert manual.processes("stranded") != []
    assert "term" not in out.read_text()
    # And nothing new lands on the node.
    api.create_namespaced_pod(NS, _pod("newcomer", "exec sleep 300"))
    newcomer = manual.pod("newcomer")
    assert newcomer is not None
    scheduled = next(c for c in newcomer["status"]["conditions"] if c["type"] == "PodScheduled")
    assert "node.kubernetes.io/unreachable" in scheduled["message"]


def test_a_pod_name_is_a_dns_subdomain_of_up_to_253_characters(cluster: FakeKubernetes) -> None:
    api = _api(cluster)
    long_name = ".".join(["a" * 60] * 4)  # 243 characters, dotted, labels of 60
    api.create_namespaced_pod(NS, _pod(long_name, "exit 0"))
    assert cluster.pod(long_name) is not None
    with pytest.raises(kubernetes.client.exceptions.ApiException) as raised:
        api.create_namespaced_pod(NS, _pod("b" * 254, "exit 0"))
    assert raised.value.status == 422
    assert "must be no more than 253 characters" in raised.value.body


def test_a_watch_is_told_deleted_when_an_object_leaves_its_selector(
    cluster: FakeKubernetes,
) -> None:
    # The API server's watch cache: an object that stops matching is DELETED (its last matching
    # content at the new resourceVersion), one that starts matching is ADDED.
    api = _api(cluster)
    api.create_namespaced_pod(NS, _pod("watched", "exec sleep 300"))
    assert cluster.wait_for(lambda c: _phase(c, "watched") == "Running")
    events: list[tuple[str, str, str]] = []
    watch = kubernetes.watch.Watch()
    stream = watch.stream(
        api.list_namespaced_pod,
        NS,
        field_selector="status.phase=Running",
        resource_version="1",
        timeout_seconds=20,
    )
    for event in stream:
        pod = event["object"]
        events.append((event["type"], pod.status.phase, pod.metadata.resource_version))
        if len(events) == 1:
            cluster.fail_pod("watched", "Evicted", "The node was low on resource: memory.")
        if event["type"] == "DELETED":
            watch.stop()
    failed = cluster.pod("watched")
    assert failed is not None and failed["status"]["phase"] == "Failed"
    assert [(t, phase) for t, phase, _ in events] == [("ADDED", "Running"), ("DELETED", "Running")]
    assert events[-1][2] == failed["metadata"]["resourceVersion"]
