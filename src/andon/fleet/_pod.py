"""Tool workers as Kubernetes Pods (docs/scale-out.md, Kubernetes).

One Pod per worker, its only container running ``andon worker --connect tcp://…`` with the same
image and entrypoint as :class:`ContainerLauncher`: the worker dials the pool over tcp + CURVE,
and its key pair comes from a Secret of its own (owned by the Pod, so the cluster removes it with
the Pod), mounted read-only, never on the command line or in the environment. ``restartPolicy:
Never``: a worker that ended is replaced by the pool, not restarted behind its back. No tool call
is ever ``exec``'d into a Pod (an exec'd tree outlives its client, as in a container).

Stopping is the API's own: a stop deletes the Pod with ``gracePeriodSeconds`` (the kubelet sends
SIGTERM, then SIGKILL at the end of the grace, and every process of the container ends with it);
the backstop deletes it with grace 0 (the API forgets the Pod at once; the kubelet still kills
its processes promptly, with a short grace of its own). Liveness is the pool's heartbeats, as for
every worker elsewhere; ``exit`` comes from **one watch per pool** on the pool's label: a Pod
``Succeeded``, ``Failed`` or deleted has ended. A Pod the API forgot while its container still ran
(a grace-0 deletion) has ended once its kubelet's kill is due: the kubelet still gives it SIGTERM
and a short grace of its own. A Pod the cluster is deleting (Terminating: a taint-based eviction
after its node was lost, a drain) is not an end, nor is ``Unknown``: the worker may still run, and
the heartbeats decide.

The watch is resumed where it stopped (its last resourceVersion) when the connection ends or
drops; when the server no longer has that history (410 Gone) the pool's Pods are listed again,
and a Pod missing from the list has ended. A Pod that cannot be scheduled, or whose container
cannot start (a bad image), ends its worker's start at once with the cluster's own reason,
instead of leaving the pool to wait for a hello that cannot come.

Every Pod and Secret is named and labelled with a digest of the pool's identity, so nothing of
another pool (another session, another test run against the same cluster) is ever touched.
The ``kubernetes`` client is synchronous: requests run in threads of the launcher's own.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import logging
import math
import os
import threading
from collections.abc import Generator, Mapping, Sequence
from typing import Any

from andon.base import ConfigError, WorkerError
from andon.fleet._launch import (
    LaunchedWorker,
    PoolSetup,
    WorkerLauncher,
    WorkerSpec,
    server_key_argument,
    worker_argv,
)
from andon.fleet._threads import EngineThreads

__all__ = ["PodLauncher"]

_log = logging.getLogger("andon.pool")

POOL_LABEL = "andon.pool"
WORKER_LABEL = "andon.worker"
KEY_DIR = "/var/run/secrets/andon"
_KEY_NAME = "worker.key_secret"
_CONTAINER = "worker"

# A container that waits in one of these will not start by waiting longer.
_FATAL_WAITING = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "ErrImageNeverPull",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)


class _PodWorker(LaunchedWorker):
    def __init__(self, worker_id: str, pod: str, secret: str | None, namespace: str) -> None:
        super().__init__(worker_id, pid=0)
        self.pod = pod
        self.secret = secret
        self.namespace = namespace
        self.uid: str | None = None  # known once the API has created the Pod
        self.delete_grace: int | None = None  # the shortest deletion asked for so far
        self.released = False
        self.unknown_logged = False
        # When (the loop's clock) the kubelet's SIGKILL is due: set by the first deletion, which
        # is the one a kubelet acts on (it does not shorten its grace for a later one).
        self.kill_due: float | None = None
        self.running = False  # the last status seen had the container running
        self.deleted_by: str | None = None  # why the cluster is deleting it, if not by andon
        self.ending = False  # its end is known, and reported once the kubelet's kill is due

    def describe(self) -> str:
        return f"worker {self.worker_id} (Pod {self.namespace}/{self.pod})"

    def end(self, reason: str | None) -> None:
        if reason is not None and self.exit_reason is None:
            self.exit_reason = reason
        self._set_exited()


class PodLauncher(WorkerLauncher):
    """Workers as Pods of ``image`` in ``namespace``.

    The cluster: ``configuration`` (a ``kubernetes.client.Configuration``), else the in-cluster
    service account when andon runs in a Pod, else ``kubeconfig`` (default ``~/.kube/config``,
    ``KUBECONFIG``) and its ``context``. The image must hold Python 3.11+ with andon installed
    (``command`` starts it, as for :class:`ContainerLauncher`); ``tools`` is what the worker
    imports. ``requests`` and ``limits`` are the container's resources (``{"cpu": "500m",
    "memory": "1Gi"}``); ``environment`` its variables (the model API keys are always left out);
    ``labels``, ``node_selector``, ``service_account`` and ``image_pull_policy`` pass to the Pod;
    ``volumes`` and ``volume_mounts`` too, in the API's own shapes (``{"name": "work",
    "persistentVolumeClaim": {"claimName": "ws"}}``, ``{"name": "work", "mountPath": "/ws"}``):
    the workspace the tools work in, at the path the session uses.
    ``termination_grace`` is the Pod's ``terminationGracePeriodSeconds``, the longest a deletion
    by anyone else may take. ``owner_pod`` names andon's own Pod (in ``namespace``) when it runs
    in one: every worker Pod is then owned by it, and the cluster deletes the workers if andon's
    Pod goes (deleted, or its node lost) while andon could not.

    The pool must listen on tcp (its config's ``tcp``, advertising an address the Pods can
    reach, such as this Pod's IP). A Pod that cannot be scheduled fails its worker's start at
    once; with ``wait_for_nodes`` (a cluster that adds nodes on demand) it waits instead, up to
    the pool's start deadline. ``kubelet_grace`` is the kubelet's floor on a container's grace
    (2 s): a Pod deleted with grace 0 has ended that long after, not when the API forgot it.
    """

    transport = "tcp"
    heartbeats = True
    local_processes = False
    lost_call_note = "deleting its Pod kills the call's processes"
    containment = None

    def __init__(
        self,
        image: str,
        *,
        namespace: str = "default",
        configuration: Any = None,
        kubeconfig: str | None = None,
        context: str | None = None,
        command: Sequence[str] = ("andon",),
        tools: str = "default",
        environment: Mapping[str, str] | None = None,
        requests: Mapping[str, str] | None = None,
        limits: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        node_selector: Mapping[str, str] | None = None,
        volumes: Sequence[Mapping[str, Any]] = (),
        volume_mounts: Sequence[Mapping[str, Any]] = (),
        service_account: str | None = None,
        image_pull_policy: str = "IfNotPresent",
        termination_grace: int = 30,
        owner_pod: str | None = None,
        wait_for_nodes: bool = False,
        engine_timeout: float = 30.0,
        welcome_timeout: float = 60.0,
        watch_timeout: int = 300,
        watch_backoff: tuple[float, float] = (0.2, 5.0),
        kubelet_grace: float = 2.0,
    ) -> None:
        if termination_grace < 0:
            raise ValueError("termination_grace must be >= 0")
        self.image = image
        self.namespace = namespace
        self.configuration = configuration
        self.kubeconfig = kubeconfig
        self.context = context
        self.command = tuple(command)
        self.tools = tools
        self.environment = dict(environment or {})
        self.requests = dict(requests or {})
        self.limits = dict(limits or {})
        self.labels = dict(labels or {})
        self.node_selector = dict(node_selector or {})
        self.volumes = [dict(v) for v in volumes]
        self.volume_mounts = [dict(m) for m in volume_mounts]
        self.service_account = service_account
        self.image_pull_policy = image_pull_policy
        self.termination_grace = termination_grace
        self.wait_for_nodes = wait_for_nodes
        self.owner_pod = owner_pod
        self._owner: dict[str, str] | None = None  # the ownerReference to owner_pod
        self.engine_timeout = engine_timeout
        self.welcome_timeout = welcome_timeout
        self.watch_timeout = watch_timeout
        self.watch_backoff = watch_backoff
        self.kubelet_grace = kubelet_grace
        self._engine = EngineThreads("andon-kube")
        self._api: Any = None
        self._k8s: Any = None
        self._setup: PoolSetup | None = None
        self._tag = ""
        self._pods: dict[str, _PodWorker] = {}  # by Pod name; touched on the loop only
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = threading.Event()
        self._response_lock = threading.Lock()
        self._response: Any = None  # the watch's open response, shut down at close

    # -- opening ------------------------------------------------------------------------------

    async def open(self, setup: PoolSetup) -> None:
        try:
            import kubernetes
        except ImportError:
            raise ConfigError(
                "tool workers as Kubernetes Pods need the kubernetes package: "
                "pip install 'andon[kubernetes]'"
            ) from None
        self._k8s = kubernetes
        self._setup = setup
        self._loop = asyncio.get_running_loop()
        # Names and label values are DNS labels (lowercase, 63 characters at most): a digest of
        # the pool's identity is both, and as unique.
        self._tag = hashlib.sha256(setup.identity.encode()).hexdigest()[:12]
        configuration = await self._engine.run(self._load_configuration, "configure")
        self._api = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(configuration))
        where = f"namespace {self.namespace!r} at {configuration.host}"
        try:
            # The resourceVersion the watch starts from, and a check that the API answers.
            version = await self._engine.run(lambda: self._list("pods")[1], "probe")
        except kubernetes.client.exceptions.ApiException as e:
            if e.status in (401, 403):
                raise ConfigError(
                    f"the Kubernetes API refused andon in {where} ({_api_message(e)}): its "
                    f"account needs create, get, list, watch and delete on pods and secrets"
                ) from None
            raise WorkerError(f"the Kubernetes API failed in {where}: {_api_message(e)}") from None
        except Exception as e:
            raise WorkerError(f"cannot reach the Kubernetes API for {where}: {e}") from None
        if self.owner_pod is not None:
            self._owner = await self._owner_reference(self.owner_pod, where)
        watch = self._engine.run(lambda: self._watch(version), "watch")
        watch.add_done_callback(_retrieve)

    async def _owner_reference(self, name: str, where: str) -> dict[str, str]:
        api = self._api
        try:
            pod = await self._engine.run(
                lambda: api.read_namespaced_pod(
                    name, self.namespace, _request_timeout=self.engine_timeout
                ),
                "owner",
            )
        except self._k8s.client.exceptions.ApiException as e:
            raise ConfigError(
                f"owner_pod {name!r}: no such Pod in {where} ({_api_message(e)})"
            ) from None
        return {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": str(pod.metadata.uid)}

    def _load_configuration(self) -> Any:
        if self.configuration is not None:
            return self.configuration
        k8s = self._k8s
        configuration = k8s.client.Configuration()
        try:
            if self.kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
                k8s.config.load_incluster_config(client_configuration=configuration)
            else:
                k8s.config.load_kube_config(
                    config_file=self.kubeconfig,
                    context=self.context,
                    client_configuration=configuration,
                    persist_config=False,
                )
        except Exception as e:
            raise ConfigError(f"cannot load the Kubernetes configuration: {e}") from None
        return configuration

    def _selector(self) -> str:
        return f"{POOL_LABEL}={self._tag}"

    def _list(self, kind: str) -> tuple[list[dict[str, Any]], str]:
        method = (
            self._api.list_namespaced_pod if kind == "pods" else self._api.list_namespaced_secret
        )
        response = method(
            self.namespace,
            label_selector=self._selector(),
            _preload_content=False,
            _request_timeout=self.engine_timeout,
        )
        body = json.loads(response.data)
        return list(body.get("items") or []), str(body["metadata"].get("resourceVersion", ""))

    # -- starting -----------------------------------------------------------------------------

    async def start(self, spec: WorkerSpec) -> LaunchedWorker:
        setup, k8s = self._setup, self._k8s
        assert setup is not None and k8s is not None, "open() first"
        name = f"andon-{self._tag}-{spec.worker_id}"
        keys = spec.worker_keys if spec.server_key is not None else None
        worker = _PodWorker(spec.worker_id, name, f"{name}-key" if keys else None, self.namespace)
        pod = k8s.client.V1Pod.from_dict(self._pod_body(spec, worker))
        api, namespace = self._api, self.namespace

        def create() -> str:
            made = api.create_namespaced_pod(namespace, pod, _request_timeout=self.engine_timeout)
            uid = str(made.metadata.uid)
            if keys is not None and worker.secret is not None:
                secret = k8s.client.V1Secret.from_dict(
                    self._secret_body(worker.secret, spec.worker_id, name, uid, keys.certificate())
                )
                try:
                    api.create_namespaced_secret(
                        namespace, secret, _request_timeout=self.engine_timeout
                    )
                except BaseException:
                    self._delete_now(name, worker.secret)
                    raise
            return uid

        # Known before the API answers: the watch may report the Pod first.
        self._pods[name] = worker
        try:
            worker.uid = await self._engine.run(
                create,
                f"start-{spec.worker_id}",
                orphan=lambda _uid: self._delete_now(name, worker.secret),
            )
        except Exception as e:
            self._pods.pop(name, None)
            if isinstance(e, k8s.client.exceptions.ApiException):
                why = f"Kubernetes would not create the Pod: {_api_message(e)}"
            else:  # the API cannot be reached (refused, timed out, TLS)
                why = f"cannot reach the Kubernetes API: {type(e).__name__}: {e}"
            raise WorkerError(
                f"worker {spec.worker_id} cannot start: {why}", worker=spec.worker_id
            ) from None
        except BaseException:
            self._pods.pop(name, None)
            raise
        return worker

    def _pod_body(self, spec: WorkerSpec, worker: _PodWorker) -> dict[str, Any]:
        setup = self._setup
        assert setup is not None
        command = [*self.command, *worker_argv(spec, self.tools, self.welcome_timeout)]
        environment = dict(self.environment)
        for hidden in setup.hidden_env:
            environment.pop(hidden, None)  # no model key in a worker, even one passed on purpose
        container: dict[str, Any] = {
            "name": _CONTAINER,
            "image": self.image,
            "imagePullPolicy": self.image_pull_policy,
            "command": command,
            "env": [{"name": k, "value": v} for k, v in sorted(environment.items())],
        }
        resources = {k: v for k, v in (("requests", self.requests), ("limits", self.limits)) if v}
        if resources:
            container["resources"] = resources
        spec_body: dict[str, Any] = {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": self.termination_grace,
            "enableServiceLinks": False,  # the worker needs no service variables
            # A tool call needs no credentials to the cluster unless an account is chosen.
            "automountServiceAccountToken": self.service_account is not None,
            "containers": [container],
        }
        mounts = list(self.volume_mounts)
        volumes = list(self.volumes)
        if spec.server_key is not None and worker.secret is not None:
            command.append(server_key_argument(spec.server_key))
            command += ["--keys", f"{KEY_DIR}/{_KEY_NAME}"]
            mounts.append({"name": "andon-keys", "mountPath": KEY_DIR, "readOnly": True})
            volumes.append(
                {
                    "name": "andon-keys",
                    "secret": {"secretName": worker.secret, "defaultMode": 0o400},
                }
            )
        if mounts:
            container["volumeMounts"] = mounts
        if volumes:
            spec_body["volumes"] = volumes
        if self.node_selector:
            spec_body["nodeSelector"] = self.node_selector
        if self.service_account is not None:
            spec_body["serviceAccountName"] = self.service_account
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": worker.pod,
                "labels": {**self.labels, **self._labels(spec.worker_id)},
                **({"ownerReferences": [self._owner]} if self._owner is not None else {}),
            },
            "spec": spec_body,
        }

    def _labels(self, worker_id: str) -> dict[str, str]:
        return {
            POOL_LABEL: self._tag,
            WORKER_LABEL: worker_id,
            "app.kubernetes.io/managed-by": "andon",
        }

    def _secret_body(
        self, name: str, worker_id: str, pod: str, uid: str, certificate: bytes
    ) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": {
                "name": name,
                "labels": self._labels(worker_id),
                # Owned by the Pod: the cluster deletes it with the Pod, even if andon is gone.
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": uid}],
            },
            "data": {_KEY_NAME: base64.b64encode(certificate).decode("ascii")},
        }

    # -- the watch (its own thread) -----------------------------------------------------------

    def _watch(self, version: str | None) -> None:
        """Follow the pool's Pods until the close: resume from the last resourceVersion when
        the stream ends or drops, list again when that history is gone (410)."""
        first, cap = self.watch_backoff
        backoff = first
        while not self._closing.is_set():
            failed = False
            try:
                if version is None:
                    items, version = self._list("pods")
                    self._post(self._on_list, items)
                events = self._events(version)
                for event in events:
                    kind, obj = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":
                        if obj.get("code") == 410:  # that history is gone: list again
                            version = None
                            events.close()
                            break
                        raise WorkerError(f"the Pod watch failed: {obj.get('message')}")
                    version = (obj.get("metadata") or {}).get("resourceVersion") or version
                    backoff = first
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        self._post(self._on_pod, kind, obj)
            except Exception as e:
                if getattr(e, "status", None) == 410:
                    version = None
                elif not self._closing.is_set():
                    failed = True
                    _log.info("the Pod watch ended (%s: %s); resuming", type(e).__name__, e)
            if failed:
                # A clean end (the server's timeout) or a 410 resumes at once; a failure waits
                # a little longer each time, so an API that is down is not hammered.
                self._closing.wait(backoff)
                backoff = min(cap, backoff * 2)

    def _events(self, version: str) -> Generator[dict[str, Any], None, None]:
        response = self._api.list_namespaced_pod(
            self.namespace,
            label_selector=self._selector(),
            watch=True,
            resource_version=version,
            allow_watch_bookmarks=True,
            timeout_seconds=self.watch_timeout,
            _preload_content=False,
            _request_timeout=(self.engine_timeout, self.watch_timeout + self.engine_timeout),
        )
        with self._response_lock:
            self._response = response
        try:
            if self._closing.is_set():
                return
            pending = b""
            for chunk in response.stream(65536, decode_content=True):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield json.loads(line)
        finally:
            with self._response_lock:
                self._response = None
            response.release_conn()

    def _post(self, fn: Any, *args: Any) -> None:
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody listens
                loop.call_soon_threadsafe(fn, *args)

    # -- what the watch says (on the loop) ----------------------------------------------------

    def _on_list(self, items: list[dict[str, Any]]) -> None:
        present = {(i.get("metadata") or {}).get("uid") for i in items}
        for worker in list(self._pods.values()):
            # A Pod whose create is still in flight (no uid yet) is judged by the watch.
            if worker.uid is not None and worker.uid not in present:
                self._end_gone(worker, worker.deleted_by or "its Pod is gone", None)
        for item in items:
            self._on_pod("MODIFIED", item)

    def _on_pod(self, kind: str, pod: dict[str, Any]) -> None:
        metadata = pod.get("metadata") or {}
        worker = self._pods.get(str(metadata.get("name")))
        if worker is None or worker.has_exited():
            return
        if worker.uid is not None and metadata.get("uid") != worker.uid:
            return  # another Pod of that name (one this pool did not make)
        status = pod.get("status") or {}
        phase = status.get("phase")
        if kind != "DELETED":
            worker.running = _container_running(status)
        if kind != "DELETED" and metadata.get("deletionTimestamp"):
            self._on_deleting(worker, metadata, status)
        if kind == "DELETED":
            why = worker.deleted_by or "its Pod was deleted"
            self._end_gone(worker, None if worker.delete_grace is not None else why, status)
        elif phase in ("Succeeded", "Failed"):
            worker.end(_ended_how(status))
        elif phase == "Unknown":
            if not worker.unknown_logged:
                worker.unknown_logged = True
                _log.warning("%s: its node stopped reporting (phase Unknown)", worker.describe())
        elif phase == "Pending":
            reason = self._cannot_start(status)
            if reason is not None:
                worker.exit_reason = worker.exit_reason or reason
                self._delete(worker, 0)

    def _on_deleting(
        self, worker: _PodWorker, metadata: dict[str, Any], status: dict[str, Any]
    ) -> None:
        """The Pod is Terminating. If andon did not ask for it (a taint-based eviction after its
        node was lost, a drain, someone's delete), the worker is not taken for ended: the
        container may run for its whole grace, or for as long as its node is unreachable. The
        cluster's reason is said now and kept for its end."""
        if worker.kill_due is None:
            grace = metadata.get("deletionGracePeriodSeconds")
            seconds = float(grace) if isinstance(grace, int | float) else 0.0
            worker.kill_due = self._now() + max(seconds, self.kubelet_grace)
        if worker.delete_grace is not None or worker.deleted_by is not None:
            return
        cause = next(
            (
                c
                for c in status.get("conditions") or ()
                if c.get("type") == "DisruptionTarget" and c.get("status") == "True"
            ),
            None,
        )
        words = f" ({cause.get('reason')}: {cause.get('message')})" if cause is not None else ""
        worker.deleted_by = f"its Pod was deleted by the cluster{words}"
        _log.warning(
            "%s: the cluster is deleting its Pod%s; the worker serves until it ends",
            worker.describe(),
            words,
        )

    def _end_gone(
        self, worker: _PodWorker, reason: str | None, status: dict[str, Any] | None
    ) -> None:
        """The Pod left the API. If its container was still running (a force delete: the API
        forgets the Pod before its kubelet has ended it), its processes run until the kubelet's
        kill is due; the worker is reported ended then, not before."""
        if worker.ending:
            return
        running = _container_running(status) if status is not None else worker.running
        if not running:
            worker.end(reason)
            return
        worker.ending = True
        now = self._now()
        due = worker.kill_due if worker.kill_due is not None else now + self.kubelet_grace
        if reason is not None and worker.exit_reason is None:
            worker.exit_reason = reason
        loop = self._loop
        if due <= now or loop is None:
            worker.end(reason)
        else:
            loop.call_later(due - now, worker.end, reason)

    def _now(self) -> float:
        loop = self._loop
        return loop.time() if loop is not None else 0.0

    def _cannot_start(self, status: dict[str, Any]) -> str | None:
        for condition in status.get("conditions") or ():
            if (
                condition.get("type") == "PodScheduled"
                and condition.get("status") == "False"
                and condition.get("reason") == "Unschedulable"
                and not self.wait_for_nodes
            ):
                return f"its Pod cannot be scheduled: {condition.get('message') or 'no node fits'}"
        for container in status.get("containerStatuses") or ():
            waiting = (container.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in _FATAL_WAITING:
                message = waiting.get("message")
                return f"its container cannot start: {waiting['reason']}" + (
                    f": {message}" if message else ""
                )
        return None

    # -- ending -------------------------------------------------------------------------------

    def _delete(self, worker: _PodWorker, grace: int) -> None:
        """Ask the API to delete the worker's Pod with ``grace`` seconds (a shorter one than
        asked before, or nothing). A Pod the API no longer has has ended."""
        if worker.delete_grace is not None and worker.delete_grace <= grace:
            return
        worker.delete_grace = grace
        if worker.kill_due is None:  # the first deletion is the one the kubelet keeps
            worker.kill_due = self._now() + max(grace, self.kubelet_grace)
        api, k8s = self._api, self._k8s

        def delete() -> bool:
            try:
                api.delete_namespaced_pod(
                    worker.pod,
                    worker.namespace,
                    grace_period_seconds=grace,
                    _request_timeout=self.engine_timeout,
                )
            except k8s.client.exceptions.ApiException as e:
                if e.status == 404:
                    return False
                raise
            return True

        def done(future: asyncio.Future[bool]) -> None:
            if future.cancelled():
                return
            error = future.exception()
            if error is not None:
                _log.warning("could not delete the Pod of %s: %s", worker.describe(), error)
                worker.delete_grace = None  # a later kill tries again
            elif not future.result():
                self._end_gone(worker, None, None)  # already gone from the API

        self._engine.run(delete, f"delete-{worker.worker_id}").add_done_callback(done)

    def _delete_now(self, pod: str | None, secret: str | None) -> None:
        """In a thread: delete a Pod (grace 0) and a Secret, whatever is left of them."""
        if pod is not None:
            with contextlib.suppress(Exception):
                self._api.delete_namespaced_pod(
                    pod,
                    self.namespace,
                    grace_period_seconds=0,
                    _request_timeout=self.engine_timeout,
                )
        if secret is not None:
            with contextlib.suppress(Exception):
                self._api.delete_namespaced_secret(
                    secret, self.namespace, _request_timeout=self.engine_timeout
                )

    def kill(self, worker: LaunchedWorker) -> None:
        assert isinstance(worker, _PodWorker)
        self._delete(worker, 0)

    async def stop(self, worker: LaunchedWorker, timeout: float) -> None:
        assert isinstance(worker, _PodWorker)
        grace = max(1, math.ceil(timeout))
        self._delete(worker, grace)
        try:
            # The kubelet ends the container by the end of the grace; the API reports it a
            # moment later.
            await asyncio.wait_for(self.exited(worker), grace + self.engine_timeout)
        except TimeoutError:
            self.kill(worker)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.exited(worker), 5.0)

    def release(self, worker: LaunchedWorker) -> None:
        # A Pod that ended stays in the API (Succeeded, Failed) until deleted: delete it and its
        # Secret now rather than leave them to the garbage collector.
        assert isinstance(worker, _PodWorker)
        if worker.released:
            return
        worker.released = True
        if self._pods.get(worker.pod) is worker:
            del self._pods[worker.pod]
        # A Pod already deleted with grace 0 needs no second request; its Secret does.
        pod = worker.pod if worker.delete_grace != 0 else None
        worker.delete_grace = 0
        if pod is not None or worker.secret is not None:
            secret = worker.secret
            self._engine.run(lambda: self._delete_now(pod, secret), f"release-{worker.worker_id}")

    async def aclose(self) -> None:
        """Wait for the starts in flight, delete whatever carries this pool's label, stop the
        watch and join every thread (bounded)."""
        api = self._api
        await asyncio.to_thread(self._engine.join_starts, self.engine_timeout)
        self._closing.set()
        if api is not None:

            def sweep() -> None:
                for item in self._list("pods")[0]:
                    self._delete_now(item["metadata"]["name"], None)
                for item in self._list("secrets")[0]:
                    self._delete_now(None, item["metadata"]["name"])

            try:
                await asyncio.wait_for(self._engine.run(sweep, "sweep"), self.engine_timeout * 2)
            except Exception as e:
                _log.warning("could not sweep this pool's Pods: %s", e)
        with self._response_lock:
            response = self._response
        if response is not None:
            _shutdown(response)
        await asyncio.to_thread(self._engine.join, self.engine_timeout)
        if api is not None:
            with contextlib.suppress(Exception):
                api.api_client.close()
            self._api = None


def _container_running(status: dict[str, Any]) -> bool:
    """Whether the status shows the worker's container running (or not yet known to have ended:
    a Pod that never started has no process)."""
    for container in status.get("containerStatuses") or ():
        state = container.get("state") or {}
        if state.get("running") is not None:
            return True
    return False


def _ended_how(status: dict[str, Any]) -> str | None:
    """The cluster's words for how a Pod ended (Evicted, OOMKilled, an exit code), if any."""
    if status.get("phase") == "Succeeded":
        return None
    parts = [str(status[k]) for k in ("reason", "message") if status.get(k)]
    for container in status.get("containerStatuses") or ():
        terminated = (container.get("state") or {}).get("terminated") or {}
        if terminated:
            parts.append(
                f"container {terminated.get('reason') or 'ended'}, "
                f"exit code {terminated.get('exitCode')}"
            )
    return "its Pod failed" + (f" ({'; '.join(parts)})" if parts else "")


def _api_message(error: Any) -> str:
    """``409 AlreadyExists: pods "x" already exists`` from an ApiException's Status body."""
    try:
        body = json.loads(error.body)
        return f"{error.status} {body.get('reason')}: {body.get('message')}"
    except (TypeError, ValueError, AttributeError):
        return f"{error.status} {error.reason}"


def _shutdown(response: Any) -> None:
    """Unblock a read of the watch from another thread (urllib3 2.3+), else close it."""
    with contextlib.suppress(Exception):
        shutdown = getattr(response, "shutdown", None)
        if shutdown is not None:
            shutdown()
        else:
            response.close()


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled() and future.exception() is not None:
        _log.warning("Kubernetes request failed: %s", future.exception())
