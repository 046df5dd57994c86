"""A fake Kubernetes API server and kubelet, for tests of the Pod launcher.

No cluster can run where andon's tests run (no API server, kubelet or k3s image can be had there),
yet the launcher must be tested against what a real cluster does on the wire: the official
``kubernetes`` client deserializes every answer into its models, and a launcher that only ever met
a mocked client would meet the real API's shapes, errors and timing for the first time in
production. :class:`FakeKubernetes` is a real HTTP/1.1 server on 127.0.0.1 that the unmodified
client talks to (keep-alive connections, chunked watch streams, abrupt disconnects), serving the few
core/v1 endpoints a Pod launcher uses, plus a fake kubelet that really runs each Pod's command as
local processes.

What it reproduces, in the API reference's shapes (camelCase keys, RFC 3339 seconds):

- Pod, PodList, Secret, SecretList, Status and WatchEvent bodies; list items without ``kind`` and
  ``apiVersion`` (as the API server sends them); server-filled metadata (uid, one global
  resourceVersion counter, creationTimestamp) and the spec defaults the API fills in.
- Errors as Status objects: NotFound and AlreadyExists (``details.kind`` is the resource, "pods"),
  Invalid 422 with ``causes`` (``details.kind`` is the Kind, "Pod"), BadRequest, Conflict for a
  failed delete precondition, and the generic "could not find the requested resource".
- Deletion as the API server does it: DeleteOptions from a JSON body, or (only when there is no
  body) from the query; graceful deletion that sets ``deletionTimestamp`` and only shortens;
  unscheduled, finished and zero-grace pods removed at once; the Pod returned for pods, a success
  Status for secrets; owned Secrets and Pods garbage-collected once every owner Pod is gone.
- Watches: synthetic ADDED for a fresh watch, replay from a resourceVersion, "too old resource
  version" (410 Expired) once history is forgotten, bookmarks, ``timeoutSeconds``, label and field
  selectors, with the watch cache's conversion: an object leaving the selection is DELETED, one
  entering it ADDED.
- The pod lifecycle the kubelet reports: Pending (Unschedulable, ErrImagePull/ImagePullBackOff,
  ContainerCreating while a Secret volume's Secret is missing), Running, Succeeded/Failed with the
  container's exit code (StartError 128 when the command cannot start), eviction (Failed with a
  reason).
- Stopping as a node does it, no kinder: SIGTERM to the container's init, SIGKILL at the end of
  the grace; the kubelet keeps the grace of the first deletion it acts on (a later, shorter one
  changes the API object only: kubernetes issues 83916, 113717); a grace-0 deletion takes the Pod
  out of the API at once while the kubelet still gives SIGTERM and its floor of FORCE_GRACE
  seconds. A lost node (:meth:`FakeKubernetes.lose_node`) is the node lifecycle controller's: the
  unreachable NoExecute taint, ``Ready`` False, and after each pod's toleration (300 s by
  default, added at create as the DefaultTolerationSeconds plugin does) a taint-manager deletion
  that stays Terminating, since no kubelet confirms it; processes run on. Grace periods and
  tolerations follow the fake's clock, which a test may drive by hand (``manual_clock``).

What it does not: authentication, other resources, PUT/PATCH, restarts (every restartPolicy acts
as Never), init and multiple containers, probes, resource enforcement, a network partition (a
lost node's processes still reach the pool), a node that comes back.

The container is local processes: the first container's ``command + args`` runs as pid 1 of a
pid namespace of its own (``unshare --pid --fork --mount-proc``, which needs root), in
``<root>/<namespace>/<pod>``, with exactly the Pod's environment plus ``extra_env`` and
``ANDON_FAKE_POD=<pod uid>``. The container's end is its namespace's: when its init ends, the
kernel kills every process in it, however it hid (``env -i setsid`` drops the marker, not the
namespace), as a container runtime does. Where pid namespaces cannot be made (no root), the fake
falls back to the marker (``isolation == "marker"``): every process that kept it is found
(:mod:`andon.procs`) and killed. The mount namespace only gives the container its own /proc, so
Secret volumes are written under the pod's directory and argv words (and env values) naming a
mount path are rewritten to that directory.

This module is long because it holds a whole test double in one place: the API server's
validation and answers, the watch machinery, and the kubelet whose states those answers report.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import copy
import http.server
import json
import os
import re
import secrets as _random
import shutil
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final, final
from urllib.parse import parse_qsl, unquote, urlsplit

from andon import procs
from andon.base import clean_text

__all__ = ["FakeKubernetes", "Hold", "Recorded"]

Json = dict[str, Any]

NODE_NAME: Final = "fake-node"
HOST_IP: Final = "10.0.0.1"
POD_IP: Final = "10.0.0.2"
MARKER_VAR: Final = "ANDON_FAKE_POD"
DEFAULT_GRACE: Final = 30
FORCE_GRACE: Final = 2
"""The kubelet's floor on a container's grace (``minimumGracePeriodInSeconds`` of its runtime
manager): a Pod deleted with grace 0 leaves the API at once, yet its container still gets SIGTERM
and this long before SIGKILL."""
TOLERATION: Final = 300
"""The ``tolerationSeconds`` the DefaultTolerationSeconds admission plugin gives every Pod for
the ``not-ready`` and ``unreachable`` NoExecute taints: how long a lost node keeps its Pods."""
UNREACHABLE_TAINT: Final = "node.kubernetes.io/unreachable"
NOT_READY_TAINT: Final = "node.kubernetes.io/not-ready"
KILL_WAIT: Final = 5.0
"""How long a kill waits for the pod's processes to exit (they are SIGKILLed: only a process in
uninterruptible sleep takes longer)."""
PULL_BACKOFF: Final = 0.1
"""Between ErrImagePull and ImagePullBackOff: long enough for a watcher to see both states."""
UNSCHEDULABLE: Final = (
    "0/1 nodes are available: 1 Insufficient cpu. preemption: 0/1 nodes are available: "
    "1 No preemption victims found for incoming pod."
)

UNREACHABLE: Final = (
    f"0/1 nodes are available: 1 node(s) had untolerated taint {{{UNREACHABLE_TAINT}: }}. "
    "preemption: 0/1 nodes are available: 1 Preemption is not helpful for scheduling."
)
_TERMINAL: Final = ("Succeeded", "Failed")
_CONDITIONS: Final = ("Initialized", "Ready", "ContainersReady", "PodScheduled")
_TRUE: Final = frozenset({"1", "t", "T", "true", "TRUE", "True"})  # Go's strconv.ParseBool
_KINDS: Final = {"pods": "Pod", "secrets": "Secret"}
_ROUTE: Final = re.compile(r"/api/v1/namespaces/([^/]+)/(pods|secrets)(?:/([^/]+))?")

_DNS_LABEL: Final = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS_SUBDOMAIN: Final = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
)
_LABEL_VALUE: Final = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_LABEL_KEY: Final = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_./]*)?[A-Za-z0-9]")
_CONFIG_KEY: Final = re.compile(r"[-._a-zA-Z0-9]+")
_SUBDOMAIN_MSG: Final = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
    "for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_LABEL_MSG: Final = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and "
    "must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex "
    "used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
_LABEL_VALUE_MSG: Final = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or "
    "'my_value',  or '12345', regex used for validation is "
    "'(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)
_CONFIG_KEY_MSG: Final = (
    "a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. "
    "'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')"
)
_POD_FIELDS: Final = frozenset(
    {
        "metadata.name",
        "metadata.namespace",
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    }
)
_SECRET_FIELDS: Final = frozenset({"metadata.name", "metadata.namespace", "type"})
_GENERATE_ALPHABET: Final = "bcdfghjklmnpqrstvwxz2456789"  # the API server's: no vowels, no 0/1/3


# -- public small types ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Recorded:
    """One request as it arrived: ``body`` is the parsed JSON (the raw text if it did not parse,
    None if there was none)."""

    method: str
    path: str
    query: dict[str, str]
    body: Any | None


class Hold:
    """Requests matching one (method, kind) wait, before anything is done with them, until
    :meth:`release`; :attr:`arrived` is set when the first of them arrives."""

    def __init__(self, method: str, kind: str) -> None:
        self.method = method
        self.kind = kind
        self.arrived = threading.Event()
        self._released = threading.Event()

    @property
    def released(self) -> bool:
        return self._released.is_set()

    def release(self) -> None:
        self._released.set()

    def _wait(self) -> None:
        self.arrived.set()
        self._released.wait()


# -- API errors and validation ---------------------------------------------------------------


class _ApiError(Exception):
    """An answer other than success: the HTTP code and the Status body."""

    def __init__(self, code: int, body: Json) -> None:
        super().__init__(body.get("message", ""))
        self.code = code
        self.body = body


def _status(code: int, reason: str, message: str, details: Json | None = None) -> Json:
    body: Json = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
    }
    if details is not None:
        body["details"] = details
    body["code"] = code
    return body


def _error(code: int, reason: str, message: str, details: Json | None = None) -> _ApiError:
    return _ApiError(code, _status(code, reason, message, details))


def _not_found(kind: str, name: str) -> _ApiError:
    return _error(404, "NotFound", f'{kind} "{name}" not found', {"name": name, "kind": kind})


def _bad_request(message: str) -> _ApiError:
    return _error(400, "BadRequest", message)


_Cause = tuple[str, str, str]  # (reason, field, message)


def _invalid_value(field: str, value: Any, detail: str) -> _Cause:
    return ("FieldValueInvalid", field, f"Invalid value: {json.dumps(value)}: {detail}")


def _required(field: str, detail: str = "") -> _Cause:
    return ("FieldValueRequired", field, "Required value" + (f": {detail}" if detail else ""))


def _invalid(kind: str, name: str, causes: list[_Cause]) -> _ApiError:
    lines = [f"{field}: {message}" for _, field, message in causes]
    joined = lines[0] if len(lines) == 1 else "[" + ", ".join(lines) + "]"
    return _error(
        422,
        "Invalid",
        f'{kind} "{name}" is invalid: {joined}',
        {
            "name": name,
            "kind": kind,
            "causes": [{"reason": r, "message": m, "field": f} for r, f, m in causes],
        },
    )


def _subdomain_causes(field: str, name: str) -> list[_Cause]:
    if len(name) > 253:
        return [_invalid_value(field, name, "must be no more than 253 characters")]
    if not _DNS_SUBDOMAIN.fullmatch(name):
        return [_invalid_value(field, name, _SUBDOMAIN_MSG)]
    return []


def _label_causes(meta: Json) -> list[_Cause]:
    labels = meta.get("labels") or {}
    if not isinstance(labels, dict):
        return [_invalid_value("metadata.labels", labels, "must be a map of strings")]
    causes: list[_Cause] = []
    for key, value in labels.items():
        if not isinstance(value, str):
            causes.append(_invalid_value("metadata.labels", value, "must be a string"))
        elif len(value) > 63:
            causes.append(
                _invalid_value("metadata.labels", value, "must be no more than 63 characters")
            )
        elif not _LABEL_VALUE.fullmatch(value):
            causes.append(_invalid_value("metadata.labels", value, _LABEL_VALUE_MSG))
        if not _LABEL_KEY.fullmatch(key) or len(key.rsplit("/", 1)[-1]) > 63:
            causes.append(_invalid_value("metadata.labels", key, "name part " + _LABEL_MSG))
    return causes


def _pod_causes(pod: Json) -> list[_Cause]:
    meta: Json = pod["metadata"]
    # As the API: any DNS subdomain up to 253 characters (the hostname is cut to 63, not refused).
    causes = _subdomain_causes("metadata.name", meta["name"]) + _label_causes(meta)
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return [*causes, _required("spec.containers")]
    volumes = [v for v in spec.get("volumes") or [] if isinstance(v, dict)]
    for i, volume in enumerate(volumes):
        name = volume.get("name")
        if not isinstance(name, str) or not name:
            causes.append(_required(f"spec.volumes[{i}].name"))
        elif not _DNS_LABEL.fullmatch(name) or len(name) > 63:
            causes.append(_invalid_value(f"spec.volumes[{i}].name", name, _LABEL_MSG))
    volume_names = {v.get("name") for v in volumes}
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        causes.append(_required("spec.containers"))
        containers = []
    for i, container in enumerate(containers):
        where = f"spec.containers[{i}]"
        if not isinstance(container, dict):
            causes.append(_required(where))
            continue
        name = container.get("name")
        if not isinstance(name, str) or not name:
            causes.append(_required(f"{where}.name"))
        elif not _DNS_LABEL.fullmatch(name) or len(name) > 63:
            causes.append(_invalid_value(f"{where}.name", name, _LABEL_MSG))
        if not isinstance(container.get("image"), str) or not container["image"]:
            causes.append(_required(f"{where}.image"))
        for j, mount in enumerate(container.get("volumeMounts") or []):
            mount_name = mount.get("name") if isinstance(mount, dict) else None
            if mount_name not in volume_names:
                causes.append(
                    (
                        "FieldValueNotFound",
                        f"{where}.volumeMounts[{j}].name",
                        f"Not found: {json.dumps(mount_name)}",
                    )
                )
    policy = spec.get("restartPolicy")
    if policy is not None and policy not in ("Always", "OnFailure", "Never"):
        causes.append(
            (
                "FieldValueNotSupported",
                "spec.restartPolicy",
                f'Unsupported value: {json.dumps(policy)}: supported values: "Always", '
                '"OnFailure", "Never"',
            )
        )
    return causes


# -- selectors -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!"
    values: frozenset[str]

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        if self.op in ("=", "in"):
            return present and labels[self.key] in self.values
        return not present or labels[self.key] not in self.values  # "!=" and "notin"


_SET_TERM: Final = re.compile(r"\s*([^\s=!(),]+)\s+(in|notin)\s+\(([^()]*)\)\s*")


def _terms(text: str) -> list[str]:
    """Split a selector at its top-level commas (``k in (a,b)`` holds commas of its own)."""
    terms: list[str] = []
    depth, start = 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "," and depth == 0:
            terms.append(text[start:i])
            start = i + 1
    terms.append(text[start:])
    return [t for t in terms if t.strip()]


def _split_operator(term: str) -> tuple[str, bool, str] | None:
    """``k=v``, ``k==v`` or ``k!=v`` as (k, equal, v); None for a term with none of them."""
    for sep, equal in (("!=", False), ("==", True), ("=", True)):
        if sep in term:
            key, value = (p.strip() for p in term.split(sep, 1))
            return key, equal, value
    return None


def _parse_labels(text: str) -> list[_Requirement]:
    found: list[_Requirement] = []
    for term in _terms(text):
        bad = _bad_request(f"unable to parse requirement: found '{term.strip()}'")
        match = _SET_TERM.fullmatch(term)
        if match:
            values = frozenset(v.strip() for v in match.group(3).split(",") if v.strip())
            key, op = match.group(1), match.group(2)
        else:
            stripped = term.strip()
            if stripped.startswith("!"):
                key, op, values = stripped[1:].strip(), "!", frozenset()
            else:
                split = _split_operator(stripped)
                if split is None:
                    key, op, values = stripped, "exists", frozenset()
                else:
                    key, equal, value = split
                    op, values = ("=" if equal else "!="), frozenset({value})
        if not _LABEL_KEY.fullmatch(key) or not all(_LABEL_VALUE.fullmatch(v) for v in values):
            raise bad
        found.append(_Requirement(key, op, values))
    return found


def _parse_fields(text: str, kind: str) -> list[tuple[str, bool, str]]:
    """``field=value`` / ``field==value`` / ``field!=value`` terms: (field, equal, value)."""
    supported = _POD_FIELDS if kind == "pods" else _SECRET_FIELDS
    found: list[tuple[str, bool, str]] = []
    for term in _terms(text):
        split = _split_operator(term)
        if split is None:
            raise _bad_request(f"invalid selector: '{text}'; can't understand '{term}'")
        if split[0] not in supported:
            raise _bad_request(f"field label not supported: {split[0]}")
        found.append(split)
    return found


def _field(obj: Json, path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return "" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


@dataclass(frozen=True, slots=True)
class _Filter:
    labels: tuple[_Requirement, ...]
    fields: tuple[tuple[str, bool, str], ...]

    @classmethod
    def parse(cls, kind: str, query: Mapping[str, str]) -> _Filter:
        return cls(
            tuple(_parse_labels(query.get("labelSelector", ""))),
            tuple(_parse_fields(query.get("fieldSelector", ""), kind)),
        )

    def matches(self, obj: Json) -> bool:
        labels = obj.get("metadata", {}).get("labels") or {}
        return all(r.matches(labels) for r in self.labels) and all(
            (_field(obj, f) == v) == equal for f, equal, v in self.fields
        )


# -- small helpers ---------------------------------------------------------------------------


def _rfc3339(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _now() -> str:
    return _rfc3339(time.time())


def _event_line(type_: str, obj: Json) -> bytes:
    return json.dumps({"type": type_, "object": obj}, separators=(",", ":")).encode() + b"\n"


def _int_param(query: Mapping[str, str], name: str) -> int | None:
    text = query.get(name, "")
    if text == "":
        return None
    try:
        return int(text)
    except ValueError:
        raise _bad_request(f'strconv.ParseInt: parsing "{text}": invalid syntax') from None


def _list_item(obj: Json) -> Json:
    # The API server's list items carry no kind/apiVersion (the list says what they are).
    return {k: copy.deepcopy(v) for k, v in obj.items() if k not in ("kind", "apiVersion")}


def _with_kind(obj: Json, kind: str) -> Json:
    rest = {k: v for k, v in obj.items() if k not in ("kind", "apiVersion")}
    return {"kind": kind, "apiVersion": "v1", **rest}


def _pull_policy(image: str) -> str:
    if "@" in image:
        return "IfNotPresent"
    last = image.rsplit("/", 1)[-1]
    tag = last.split(":", 1)[1] if ":" in last else "latest"
    return "Always" if tag == "latest" else "IfNotPresent"


def _qos(spec: Json) -> str:
    anything, guaranteed = False, True
    for container in spec.get("containers") or []:
        resources = container.get("resources") or {}
        requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
        for resource in ("cpu", "memory"):
            anything = anything or resource in requests or resource in limits
            if (
                resource not in limits
                or requests.get(resource, limits[resource]) != limits[resource]
            ):
                guaranteed = False
    return "BestEffort" if not anything else "Guaranteed" if guaranteed else "Burstable"


def _set_condition(
    status: Json, type_: str, value: bool, reason: str | None = None, message: str | None = None
) -> None:
    conditions: list[Json] = status.setdefault("conditions", [])
    text = "True" if value else "False"
    found = next((c for c in conditions if c["type"] == type_), None)
    if found is None:
        found = {"type": type_, "status": text, "lastProbeTime": None, "lastTransitionTime": _now()}
        conditions.append(found)
    elif found["status"] != text:
        found["status"] = text
        found["lastTransitionTime"] = _now()
    for key, given in (("reason", reason), ("message", message)):
        if given is None:
            found.pop(key, None)
        else:
            found[key] = given
    conditions.sort(key=lambda c: _CONDITIONS.index(c["type"]) if c["type"] in _CONDITIONS else 9)


def _not_ready(status: Json, container: Json) -> None:
    unready = f"containers with unready status: [{container['name']}]"
    _set_condition(status, "Ready", False, "ContainersNotReady", unready)
    _set_condition(status, "ContainersReady", False, "ContainersNotReady", unready)


def _container_status(
    container: Json, state: Json, *, ready: bool = False, started: bool = False, cid: str = ""
) -> Json:
    found: Json = {
        "name": container["name"],
        "state": state,
        "lastState": {},
        "ready": ready,
        "restartCount": 0,
        "image": container["image"],
        "imageID": "",
        "started": started,
    }
    if cid:
        found["containerID"] = cid
    return found


def _waiting(status: Json, container: Json, reason: str, message: str | None = None) -> None:
    state: Json = {"reason": reason}
    if message is not None:
        state["message"] = message
    status["containerStatuses"] = [_container_status(container, {"waiting": state})]


_REFERENCE: Final = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def _expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion in command, args and env values (``$$`` escapes; an
    undefined reference stays as written)."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "$"
        return env.get(name, match.group(0))

    return _REFERENCE.sub(one, text)


def _rewrite(word: str, mounts: list[tuple[str, str]]) -> str:
    """Point a container path at the volume's local directory: the whole word, or what follows
    an ``=`` (``--keys=/var/run/x/k``). ``mounts`` is longest mount path first, so a nested
    mount wins over its parent."""

    def local(text: str) -> str | None:
        for mount, where in mounts:
            if text == mount:
                return where
            if text.startswith(mount + "/"):
                return where + text[len(mount) :]
        return None

    found = local(word)
    if found is not None:
        return found
    at = word.find("=")
    while at >= 0:
        found = local(word[at + 1 :])
        if found is not None:
            return word[: at + 1] + found
        at = word.find("=", at + 1)
    return word


def _write_secret(target: Path, source: Json, secret: Json) -> None:
    data: dict[str, str] = secret.get("data") or {}
    default_mode = int(source.get("defaultMode", 0o644))
    items = source.get("items")
    entries = (
        [
            (str(i.get("key")), str(i.get("path", "")), int(i.get("mode", default_mode)))
            for i in items
        ]
        if items
        else [(key, key, default_mode) for key in data]
    )
    for key, relative, mode in entries:
        rel = Path(relative)
        if key not in data or not relative or rel.is_absolute() or ".." in rel.parts:
            continue
        path = target / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data[key]))
        path.chmod(mode)


def _materialise(root: Path, volumes: Iterable[tuple[str, Json, Json | None]]) -> dict[str, Path]:
    """Every volume as a directory under ``root`` (a Secret volume with its files): name → dir."""
    shutil.rmtree(root, ignore_errors=True)  # a pod of the same name may have run here before
    local: dict[str, Path] = {}
    for name, volume, secret in volumes:
        target = root / name
        target.mkdir(parents=True)
        local[name] = target
        if secret is not None:
            _write_secret(target, volume["secret"], secret)
    return local


def _mount_map(container: Json, local: Mapping[str, Path]) -> list[tuple[str, str]]:
    found: list[tuple[str, str]] = []
    for mount in container.get("volumeMounts") or []:
        where = local.get(mount.get("name", ""))
        path = str(mount.get("mountPath", "")).rstrip("/")
        if where is None or not path:
            continue
        if mount.get("subPath"):
            where = where / mount["subPath"]
        found.append((path, str(where)))
    found.sort(key=lambda m: len(m[0]), reverse=True)
    return found


def _container_env(container: Json, mounts: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for entry in container.get("env") or []:
        if not isinstance(entry, dict) or "name" not in entry:
            continue
        if "value" not in entry and "valueFrom" in entry:
            continue  # no ConfigMaps, no downward API here
        env[str(entry["name"])] = _rewrite(_expand(str(entry.get("value", "")), env), mounts)
    return env


def _runnable(command: str, env: Mapping[str, str]) -> bool:
    if "/" in command:
        return os.access(command, os.X_OK) and not os.path.isdir(command)
    return shutil.which(command, path=env.get("PATH", os.defpath)) is not None


def _default_tolerations(spec: Json) -> None:
    """As the DefaultTolerationSeconds admission plugin: a pod that does not tolerate the
    not-ready and unreachable NoExecute taints tolerates each for TOLERATION seconds."""
    tolerations = spec.get("tolerations")
    if not isinstance(tolerations, list):
        tolerations = []
    for key in (NOT_READY_TAINT, UNREACHABLE_TAINT):
        if not any(_tolerates(t, key) for t in tolerations):
            tolerations.append(
                {
                    "key": key,
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": TOLERATION,
                }
            )
    spec["tolerations"] = tolerations


def _tolerates(toleration: Any, key: str) -> bool:
    if not isinstance(toleration, dict) or toleration.get("effect") not in (None, "", "NoExecute"):
        return False
    if toleration.get("operator") == "Exists" and not toleration.get("key"):
        return True
    return bool(toleration.get("key") == key)


def _toleration(spec: Json) -> float | None:
    """How long the pod stays on an unreachable node: None for ever (a toleration without
    ``tolerationSeconds``), 0 when nothing tolerates the taint."""
    found: list[float] = []
    for toleration in spec.get("tolerations") or []:
        if _tolerates(toleration, UNREACHABLE_TAINT):
            seconds = toleration.get("tolerationSeconds")
            if seconds is None:
                return None
            found.append(max(0.0, float(seconds)))
    return max(found) if found else 0.0


def _already_exists(kind: str, name: str) -> _ApiError:
    details = {"name": name, "kind": kind}
    return _error(409, "AlreadyExists", f'{kind} "{name}" already exists', details)


def _start_error(argv: list[str], exc: OSError | None) -> str:
    if exc is None:
        cause = "no command specified"
    elif isinstance(exc, FileNotFoundError):
        cause = f'exec: "{argv[0]}": executable file not found in $PATH'
    else:
        cause = f'exec: "{argv[0]}": {exc.strerror or exc}'
    return (
        "failed to create containerd task: failed to create shim task: OCI runtime create "
        f"failed: runc create failed: unable to start container process: {cause}: unknown"
    )


# -- the container's pid namespace -------------------------------------------------------------

_UNSHARE: Final = ("unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "--")
"""How a container's command starts: pid 1 of a pid namespace of its own (with its own /proc),
as a container runtime starts it; ``--kill-child`` ends it if the launcher program is killed."""

_probed: list[bool] = []


def _pid_namespaces() -> bool:
    """Whether this machine lets us make pid namespaces (root, or a user namespace that allows
    it): asked once per process by running ``true`` in one."""
    if not _probed:
        try:
            done = subprocess.run(
                [*_UNSHARE, "true"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=30,
                check=False,
            )
            _probed.append(done.returncode == 0)
        except (OSError, subprocess.TimeoutExpired):
            _probed.append(False)
    return _probed[0]


def _namespace_of(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/pid").st_ino
    except OSError:
        return None


def _members(namespace_id: int) -> list[procs.ProcInfo]:
    """Every live process of that pid namespace (seen from ours)."""
    return [p for p in procs.snapshot() if not p.zombie and _namespace_of(p.pid) == namespace_id]


def _child_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as f:
            words = f.read().split()
    except OSError:
        return None
    return int(words[0]) if words else None


# -- state -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Event:
    kind: str
    namespace: str
    rv: int
    type: str
    obj: Json
    prev: Json | None  # the object as the previous event left it (a MODIFIED's "before")
    line: bytes

    def line_for(self, filt: _Filter) -> bytes | None:
        """The event as a watch with ``filt`` sees it, as the API server's watch cache converts
        it: an object that enters the selection is ADDED, one that leaves it is DELETED (its
        previous content at this event's resourceVersion), one outside it is not sent."""
        now = filt.matches(self.obj)
        if self.type != "MODIFIED" or self.prev is None:
            return self.line if now else None
        before = filt.matches(self.prev)
        if now and before:
            return self.line
        if now:
            return _event_line("ADDED", self.obj)
        if before:
            gone = copy.deepcopy(self.prev)
            gone["metadata"]["resourceVersion"] = str(self.rv)
            return _event_line("DELETED", gone)
        return None


class _Watch:
    """One open watch stream: what it selects and the event lines queued for it."""

    def __init__(
        self, kind: str, namespace: str, filt: _Filter, bookmarks: bool, sock: socket.socket
    ) -> None:
        self.kind = kind
        self.namespace = namespace
        self.filter = filt
        self.bookmarks = bookmarks
        self.sock = sock
        self.queue: deque[bytes] = deque()
        self.stop: str | None = None  # "end" (terminating chunk) or "drop" (socket shut down)
        self.started = False  # headers sent

    def shut(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)


class _PodRuntime:
    """What the kubelet knows of one pod (one uid), beyond its API object."""

    def __init__(self, uid: str, namespace: str, name: str) -> None:
        self.uid = uid
        self.namespace = namespace
        self.name = name
        self.marker = f"{MARKER_VAR}={uid}".encode()
        self.scheduled = False
        self.proc: subprocess.Popen[bytes] | None = None
        # Signals go through a pidfd opened while the child was unreaped: it names that process
        # for good, whatever the kubelet thread's wait() reaps meanwhile.
        self.pidfd: procs.Pidfd | None = None
        # The container's init: the first process of the Pod's own pid namespace (the launcher
        # program's child). Its end ends every process of the namespace, however it hid.
        self.init: procs.Pidfd | None = None
        self.namespace_id: int | None = None  # the inode of that pid namespace
        # Held open while the pod's processes may live: a namespace's inode number is reused
        # once the namespace is freed, and then names another pod's.
        self.namespace_fd: int | None = None
        self.term_pending = False  # SIGTERM asked for before the init was known
        self.exited = False
        self.removed = False
        self.failed = False  # evicted (fail_pod): the kubelet reports nothing more
        self.node_lost = False  # its node stopped reporting (lose_node): likewise
        # The kubelet's SIGKILL deadline (the fake's clock), set by the first deletion it acted
        # on: a later, shorter deletion does not move it.
        self.kill_at: float | None = None
        self.api_deadline: float | None = None  # the deletion's end the API shows (shortens)
        self.started_at = ""
        self.cid = ""

    @property
    def running(self) -> bool:
        return self.proc is not None and not self.exited


# -- HTTP ------------------------------------------------------------------------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server
    streaming = False

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_OPTIONS(self) -> None:
        self._serve("OPTIONS")

    def log_message(self, format: str, *args: Any) -> None:
        pass  # tests read requests(), not a log on stderr

    def _serve(self, method: str) -> None:
        self.streaming = False
        try:
            raw = self._read_body()
        except ValueError:
            self.close_connection = True  # framing lost: nothing more can be read
            return
        self.server.fake._handle(self, method, raw)

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            parts: list[bytes] = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    def send_json(self, code: int, body: Json) -> None:
        data = json.dumps(body, separators=(",", ":")).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def start_stream(self) -> None:
        self.streaming = True
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

    def send_chunk(self, data: bytes) -> None:
        # wfile is unbuffered (wbufsize 0): every chunk leaves in its own write.
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))

    def end_stream(self) -> None:
        self.wfile.write(b"0\r\n\r\n")


class _Server(http.server.ThreadingHTTPServer):
    """ThreadingHTTPServer that remembers its daemon connection threads and sockets, so close()
    can end every connection and join every thread (the stdlib tracks neither for daemons)."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, fake: FakeKubernetes) -> None:
        self.fake = fake
        self._track = threading.Lock()
        self._handlers: list[threading.Thread] = []
        self._connections: set[socket.socket] = set()
        super().__init__(("127.0.0.1", 0), _Handler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the host's FQDN, a DNS lookup that can stall for
        # seconds and whose answer nothing here uses.
        socketserver.TCPServer.server_bind(self)
        self.server_name = "127.0.0.1"
        self.server_port = self.socket.getsockname()[1]

    def process_request(
        self, request: socket.socket | tuple[bytes, socket.socket], client_address: Any
    ) -> None:
        thread = threading.Thread(
            target=self.process_request_thread,
            args=(request, client_address),
            name="fake-kubernetes-connection",
            daemon=True,
        )
        with self._track:
            self._handlers = [t for t in self._handlers if t.is_alive()]
            self._handlers.append(thread)
            if isinstance(request, socket.socket):
                self._connections.add(request)
        thread.start()

    def shutdown_request(self, request: socket.socket | tuple[bytes, socket.socket]) -> None:
        with self._track:
            if isinstance(request, socket.socket):
                self._connections.discard(request)
        super().shutdown_request(request)

    def handle_error(
        self, request: socket.socket | tuple[bytes, socket.socket], client_address: Any
    ) -> None:
        # A client gone mid-answer (a dropped watch, a pool closing its connections) is routine.
        if isinstance(sys.exc_info()[1], OSError):
            return
        super().handle_error(request, client_address)

    def drop_connections(self) -> None:
        with self._track:
            for connection in self._connections:
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)

    def join_connections(self) -> None:
        with self._track:
            threads = list(self._handlers)
        for thread in threads:
            thread.join()


# -- the fake --------------------------------------------------------------------------------


@final
class FakeKubernetes:
    """A Kubernetes API server (core/v1 Pods and Secrets) with a kubelet that runs each Pod's
    command as local processes under ``root``. Thread-safe; every thread and process it starts
    is ended by :meth:`close`."""

    def __init__(
        self,
        root: Path,
        *,
        extra_env: Mapping[str, str] | None = None,
        images: set[str] | None = None,
        manual_clock: bool = False,
        force_grace: int = FORCE_GRACE,
    ) -> None:
        self.url = ""
        self.schedulable = True
        self.images = images
        self.force_grace = force_grace
        # With a manual clock, grace periods and tolerations end only by advance(): a test can
        # look at the moment between a deletion and its SIGKILL, or skip a 300 s toleration.
        self._manual: float | None = 0.0 if manual_clock else None
        self.isolation = "pid-namespace" if _pid_namespaces() else "marker"
        self._node_lost_at: float | None = None
        self._root = Path(root)
        self._extra_env = dict(extra_env or {})
        # One lock for the whole store: every change notifies the Condition, which is what the
        # kubelets, grace timers, watches and wait_for() wait on.
        self._cond = threading.Condition(threading.RLock())
        self._rv = 0
        self._changes = 0
        self._objects: dict[str, dict[str, dict[str, Json]]] = {"pods": {}, "secrets": {}}
        self._runtimes: dict[str, _PodRuntime] = {}
        self._uids: dict[tuple[str, str], str] = {}  # (namespace, name) → newest pod uid
        self._history: list[_Event] = []
        self._last: dict[str, Json] = {}  # uid → the object as its last event showed it
        self._history_floor = 0  # events with rv > floor are retained
        self._watches: set[_Watch] = set()
        self._watch_total = 0
        self._watches_paused = False
        self._requests: list[Recorded] = []
        self._holds: list[Hold] = []
        self._failures: list[tuple[str, str, int, Json]] = []
        self._threads: list[threading.Thread] = []
        self._server: _Server | None = None
        self._serve_thread: threading.Thread | None = None
        self._closed = False

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> FakeKubernetes:
        with self._cond:
            if self._server is not None or self._closed:
                raise RuntimeError("a FakeKubernetes starts once")
            self._server = server = _Server(self)
        self.url = f"http://127.0.0.1:{server.server_port}"
        # A short poll interval: shutdown() waits for serve_forever to notice, once per close().
        self._serve_thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="fake-kubernetes",
            daemon=True,
        )
        self._serve_thread.start()
        return self

    def close(self) -> None:
        """End every watch, SIGKILL every pod's processes and wait for them, stop the server and
        join every thread. Idempotent."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            holds, self._holds = self._holds, []
            for watch in self._watches:
                watch.stop = watch.stop or "end"
            runtimes = list(self._runtimes.values())
            for rt in runtimes:
                self._signal_main(rt, signal.SIGKILL)
            self._changed()
        for hold in holds:
            hold.release()
        for rt in runtimes:
            if rt.proc is not None:  # no process starts once closed (checked under the lock)
                self._end_tree(rt)
        server, serve_thread = self._server, self._serve_thread
        if server is not None and serve_thread is not None:
            server.shutdown()  # no connection is accepted after this returns
            serve_thread.join()
            server.drop_connections()  # idle keep-alive connections wake from their read
            server.join_connections()
            server.server_close()
        while True:
            with self._cond:
                pending = [t for t in self._threads if t.is_alive()]
                self._threads = pending
            if not pending:
                break
            for thread in pending:
                thread.join()

    def __enter__(self) -> FakeKubernetes:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- inspection --------------------------------------------------------------------------

    def pods(self, namespace: str = "default") -> list[Json]:
        with self._cond:
            return [copy.deepcopy(p) for p in self._bucket("pods", namespace).values()]

    def pod(self, name: str, namespace: str = "default") -> Json | None:
        with self._cond:
            found = self._bucket("pods", namespace).get(name)
            return copy.deepcopy(found) if found is not None else None

    def secrets(self, namespace: str = "default") -> list[Json]:
        with self._cond:
            return [copy.deepcopy(s) for s in self._bucket("secrets", namespace).values()]

    def requests(self) -> list[Recorded]:
        with self._cond:
            return list(self._requests)

    def processes(self, name: str, namespace: str = "default") -> list[int]:
        """Live pids of the newest pod of that name (removed or not): every process of its pid
        namespace, and whatever carries its marker."""
        with self._cond:
            uid = self._uids.get((namespace, name))
            rt = self._runtimes.get(uid) if uid is not None else None
            namespace_id = rt.namespace_id if rt is not None else None
        if uid is None:
            return []
        found = {p.pid for p in procs.tagged(f"{MARKER_VAR}={uid}".encode(), [os.getpid()])}
        if namespace_id is not None:
            found.update(p.pid for p in _members(namespace_id))
        return sorted(found)

    def watch_count(self) -> int:
        """Watch requests accepted so far (streams begun, a 410 ERROR stream included)."""
        with self._cond:
            return self._watch_total

    def wait_for(self, predicate: Callable[[FakeKubernetes], bool], timeout: float = 10.0) -> bool:
        """Wait until ``predicate(self)`` holds, re-checking after every store change and every
        request (the predicate runs outside the lock, so it may call any method)."""
        deadline = time.monotonic() + timeout
        while True:
            with self._cond:
                seen = self._changes
            if predicate(self):
                return True
            with self._cond:
                while self._changes == seen:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return False
                    self._cond.wait(left)

    # -- controls ----------------------------------------------------------------------------

    def delete_pod(self, name: str, namespace: str = "default", grace: int | None = None) -> None:
        """Delete as the API does for someone else's request (grace None: the pod's default)."""
        with self._cond:
            pod, rt = self._require(namespace, name)
            if grace is None:
                grace = int(pod["spec"].get("terminationGracePeriodSeconds", DEFAULT_GRACE))
            self._delete(pod, rt, grace)

    def fail_pod(self, name: str, reason: str, message: str, namespace: str = "default") -> None:
        """Evict: SIGKILL the pod's processes (waiting for them), then phase Failed with
        ``status.reason``/``status.message`` (one MODIFIED)."""
        with self._cond:
            _, rt = self._require(namespace, name)
            rt.failed = True  # from here the kubelet reports nothing, nor starts anything
            had_process = rt.proc is not None
            self._signal_main(rt, signal.SIGKILL)
        self._end_tree(rt)
        with self._cond:
            pod = self._live(rt)
            if pod is None:
                return
            status, container = pod["status"], pod["spec"]["containers"][0]
            status.update(phase="Failed", reason=reason, message=message)
            _set_condition(status, "Ready", False, "PodFailed")
            _set_condition(status, "ContainersReady", False, "PodFailed")
            if had_process:
                state = {
                    "terminated": {
                        "exitCode": 137,
                        "reason": "Error",
                        "startedAt": rt.started_at,
                        "finishedAt": _now(),
                        "containerID": rt.cid,
                    }
                }
                status["containerStatuses"] = [_container_status(container, state, cid=rt.cid)]
            self._modified("pods", pod)

    def advance(self, seconds: float) -> None:
        """Move a manual clock on (``manual_clock=True``): grace periods and tolerations that
        end by then end now."""
        with self._cond:
            if self._manual is None:
                raise RuntimeError("advance() needs FakeKubernetes(manual_clock=True)")
            self._manual += seconds
            self._changed()

    def lose_node(self) -> None:
        """The node stops reporting, as a partition does: its processes run on, but its kubelet
        neither reports nor kills. As the node lifecycle controller: the node is tainted
        ``node.kubernetes.io/unreachable:NoExecute``, each of its pods gets ``Ready`` False;
        once a pod's toleration of that taint is over (300 s unless its spec says otherwise),
        the taint manager deletes it (``DisruptionTarget`` condition, a graceful delete): it
        stays Terminating, since no kubelet confirms its end. A force delete (grace 0) removes
        it from the API; its processes run on. No pod is scheduled on the node any more."""
        with self._cond:
            if self._node_lost_at is not None:
                return
            self._node_lost_at = self._clock()
            for bucket in self._objects["pods"].values():
                for pod in list(bucket.values()):
                    rt = self._runtimes[pod["metadata"]["uid"]]
                    if not rt.scheduled or rt.removed:
                        continue
                    rt.node_lost = True
                    if pod["status"].get("phase") in _TERMINAL:
                        continue
                    _set_condition(pod["status"], "Ready", False, "NodeLost")
                    self._modified("pods", pod)
                    seconds = _toleration(pod["spec"])
                    if seconds is not None:
                        self._spawn(f"fake-taint-{rt.name}", self._taint_evict, rt, seconds)

    def _taint_evict(self, rt: _PodRuntime, seconds: float) -> None:
        with self._cond:
            lost_at = self._node_lost_at or 0.0
            if not self._wait_until(lost_at + seconds, lambda: self._live(rt) is None):
                return
            pod = self._live(rt)
            if pod is None or pod["metadata"].get("deletionTimestamp"):
                return
            _set_condition(
                pod["status"],
                "DisruptionTarget",
                True,
                "DeletionByTaintManager",
                "Taint manager: deleting due to NoExecute taint",
            )
            self._delete(
                pod, rt, int(pod["spec"].get("terminationGracePeriodSeconds", DEFAULT_GRACE))
            )

    def schedule_pending(self) -> None:
        """Make the node schedulable and schedule every pod left Unschedulable."""
        with self._cond:
            self.schedulable = True
            for bucket in self._objects["pods"].values():
                for pod in bucket.values():
                    rt = self._runtimes[pod["metadata"]["uid"]]
                    if not rt.scheduled and not rt.failed and self._node_lost_at is None:
                        self._schedule(pod, rt)

    def fail_next(self, method: str, kind: str, status: int, reason: str, message: str) -> None:
        """Answer the next ``method`` request on ``kind`` ("pods"/"secrets") with this Status."""
        with self._cond:
            self._failures.append((method.upper(), kind, status, _status(status, reason, message)))

    def hold(self, method: str, kind: str) -> Hold:
        found = Hold(method.upper(), kind)
        with self._cond:
            self._holds.append(found)
        return found

    def drop_watches(self) -> None:
        """Abruptly close every open watch connection: no terminating chunk."""
        with self._cond:
            for watch in self._watches:
                watch.stop = "drop"
                # Before its headers the stream drops itself once they are out: a connection
                # closed before any answer is one urllib3 silently retries, and the client
                # would never see the drop.
                if watch.started:
                    watch.shut()
            self._changed()

    def end_watches(self) -> None:
        """End every open watch cleanly, as the API server does at ``timeoutSeconds``."""
        with self._cond:
            for watch in self._watches:
                watch.stop = watch.stop or "end"
            self._changed()

    def pause_watches(self) -> None:
        """New watch requests wait, before their headers, until :meth:`resume_watches`."""
        with self._cond:
            self._watches_paused = True

    def resume_watches(self) -> None:
        with self._cond:
            self._watches_paused = False
            self._changed()

    def expire_history(self) -> None:
        """Forget all event history: resuming from an older resourceVersion gets 410 Expired."""
        with self._cond:
            self._history.clear()
            self._history_floor = self._rv
            self._changed()

    def send_bookmarks(self) -> None:
        """One BOOKMARK at the current resourceVersion to every watch that allowed them."""
        with self._cond:
            rv = str(self._rv)
            for watch in self._watches:
                if watch.bookmarks and watch.stop is None:
                    obj = {"kind": _KINDS[watch.kind], "apiVersion": "v1"}
                    watch.queue.append(
                        _event_line("BOOKMARK", {**obj, "metadata": {"resourceVersion": rv}})
                    )
            self._changed()

    # -- store (every method below that touches state runs under self._cond) -----------------

    def _clock(self) -> float:
        return time.monotonic() if self._manual is None else self._manual

    def _wait_until(self, deadline: float, stop: Callable[[], bool]) -> bool:
        """Wait (under the lock) until the fake's clock reaches ``deadline``: True then, False if
        ``stop()`` or close() came first. A manual clock moves only by advance()."""
        while not stop() and not self._closed:
            left = deadline - self._clock()
            if left <= 0:
                return True
            self._cond.wait(left if self._manual is None else None)
        return False

    def _changed(self) -> None:
        self._changes += 1
        self._cond.notify_all()

    def _bump(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _bucket(self, kind: str, namespace: str) -> dict[str, Json]:
        return self._objects[kind].setdefault(namespace, {})

    def _emit(self, kind: str, type_: str, obj: Json) -> None:
        snapshot = copy.deepcopy(obj)
        line = _event_line(type_, snapshot)
        meta = snapshot["metadata"]
        namespace, uid = meta["namespace"], meta["uid"]
        prev = self._last.get(uid)
        if type_ == "DELETED":
            self._last.pop(uid, None)
        else:
            self._last[uid] = snapshot
        event = _Event(kind, namespace, int(meta["resourceVersion"]), type_, snapshot, prev, line)
        self._history.append(event)
        for watch in self._watches:
            if watch.kind == kind and watch.namespace == namespace:
                found = event.line_for(watch.filter)
                if found is not None:
                    watch.queue.append(found)
        self._changed()

    def _modified(self, kind: str, obj: Json) -> None:
        obj["metadata"]["resourceVersion"] = self._bump()
        self._emit(kind, "MODIFIED", obj)

    def _live(self, rt: _PodRuntime) -> Json | None:
        pod = self._bucket("pods", rt.namespace).get(rt.name)
        if rt.removed or pod is None or pod["metadata"]["uid"] != rt.uid:
            return None
        return pod

    def _require(self, namespace: str, name: str) -> tuple[Json, _PodRuntime]:
        pod = self._bucket("pods", namespace).get(name)
        if pod is None:
            raise KeyError(f"no pod {namespace}/{name}")
        return pod, self._runtimes[pod["metadata"]["uid"]]

    def _spawn(self, name: str, target: Callable[..., None], *args: Any) -> None:
        with self._cond:
            if self._closed:
                return  # close() kills what the thread would have handled
            self._threads = [t for t in self._threads if t.is_alive()]
            thread = threading.Thread(target=target, args=args, name=name, daemon=True)
            self._threads.append(thread)
            thread.start()

    def _signal_main(self, rt: _PodRuntime, sig: int) -> None:
        """Signal the container's main process, as the runtime does: its init (pid 1 of its
        namespace: a signal it has no handler for is ignored, SIGKILL never is). SIGKILL also
        goes to the launcher program, whose death kills an init not yet known."""
        if rt.exited:
            return
        if rt.init is not None:
            rt.init.send(sig)
        elif sig == signal.SIGTERM and self.isolation == "pid-namespace":
            rt.term_pending = True  # the init is not known yet: it gets it when it is
        elif rt.pidfd is not None:
            rt.pidfd.send(sig)
        if sig == signal.SIGKILL and rt.pidfd is not None:
            rt.pidfd.send(sig)

    def _forget_namespace(self, rt: _PodRuntime) -> None:
        """Once every process of the pod has ended: its namespace's number may name another's."""
        if rt.namespace_fd is not None:
            os.close(rt.namespace_fd)
        rt.namespace_fd = rt.namespace_id = None

    def _end_tree(self, rt: _PodRuntime) -> None:
        """SIGKILL every process of the pod and wait for them (bounded): its pid namespace's
        (however they hid: ``env -i``, ``setsid``, double forks), and whatever carries its
        marker (the launcher program, and every process where there are no pid namespaces)."""
        with self._cond:
            namespace_id = rt.namespace_id
        found = {p.pid: p for p in procs.tagged(rt.marker, [os.getpid()])}
        if namespace_id is not None:
            found.update((p.pid, p) for p in _members(namespace_id))
        fds = [fd for fd in (procs.Pidfd.open(p.key) for p in found.values()) if fd is not None]
        try:
            sent = [fd for fd in fds if fd.send(signal.SIGKILL)]
            procs.wait_exited(sent, KILL_WAIT)
        finally:
            for fd in fds:
                fd.close()

    def _new_object(self, namespace: str, body: Any, kind: str) -> Json:
        if not isinstance(body, dict):
            raise _bad_request(f'{kind} in version "v1" cannot be handled as a {kind}')
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise _bad_request(f'{kind} in version "v1" cannot be handled as a {kind}')
        if meta.get("namespace") not in (None, "", namespace):
            raise _bad_request(
                "the namespace of the provided object does not match the namespace sent on the "
                "request"
            )
        if meta.get("resourceVersion"):
            raise _error(
                500, "InternalError", "resourceVersion should not be set on objects to be created"
            )
        if not meta.get("name") and meta.get("generateName"):
            suffix = "".join(_random.choice(_GENERATE_ALPHABET) for _ in range(5))
            meta["name"] = str(meta["generateName"]) + suffix
        if not isinstance(meta.get("name"), str) or not meta["name"]:
            raise _invalid(
                kind, "", [_required("metadata.name", "name or generateName is required")]
            )
        for server_owned in ("uid", "creationTimestamp", "deletionTimestamp", "selfLink"):
            meta.pop(server_owned, None)
        meta.pop("deletionGracePeriodSeconds", None)
        return obj

    def _stamp(self, obj: Json, namespace: str, kind: str) -> Json:
        meta = obj["metadata"]
        meta.update(
            namespace=namespace,
            uid=str(uuid.uuid4()),
            resourceVersion=self._bump(),
            creationTimestamp=_now(),
        )
        return _with_kind(obj, kind)

    # -- pods --------------------------------------------------------------------------------

    def _create_pod(self, namespace: str, body: Any) -> Json:
        pod = self._new_object(namespace, body, "Pod")
        causes = _pod_causes(pod)
        name: str = pod["metadata"]["name"]
        if causes:
            raise _invalid("Pod", name, causes)
        spec: Json = pod["spec"]
        for key, default in (
            ("restartPolicy", "Always"),
            ("terminationGracePeriodSeconds", DEFAULT_GRACE),
            ("dnsPolicy", "ClusterFirst"),
            ("schedulerName", "default-scheduler"),
            ("securityContext", {}),
        ):
            spec.setdefault(key, default)
        for container in spec["containers"]:
            container.setdefault("resources", {})
            container.setdefault("terminationMessagePath", "/dev/termination-log")
            container.setdefault("terminationMessagePolicy", "File")
            container.setdefault("imagePullPolicy", _pull_policy(container["image"]))
        for volume in spec.get("volumes") or []:
            if isinstance(volume.get("secret"), dict):
                volume["secret"].setdefault("defaultMode", 0o644)
        _default_tolerations(spec)
        pod["status"] = {"phase": "Pending", "qosClass": _qos(spec)}
        with self._cond:
            bucket = self._bucket("pods", namespace)
            if name in bucket:
                raise _already_exists("pods", name)
            pod = self._stamp(pod, namespace, "Pod")
            bucket[name] = pod
            uid = pod["metadata"]["uid"]
            rt = self._runtimes[uid] = _PodRuntime(uid, namespace, name)
            self._uids[(namespace, name)] = uid
            self._emit("pods", "ADDED", pod)
            created = copy.deepcopy(pod)  # the answer is the pod as created, before scheduling
            if self.schedulable and self._node_lost_at is None:
                self._schedule(pod, rt)
            else:
                why = UNSCHEDULABLE if self._node_lost_at is None else UNREACHABLE
                _set_condition(pod["status"], "PodScheduled", False, "Unschedulable", why)
                self._modified("pods", pod)
            return created

    def _schedule(self, pod: Json, rt: _PodRuntime) -> None:
        rt.scheduled = True
        pod["spec"]["nodeName"] = NODE_NAME
        _set_condition(pod["status"], "PodScheduled", True)
        self._modified("pods", pod)
        self._spawn(f"fake-kubelet-{rt.name}", self._kubelet, rt)

    def _api_delete_pod(
        self, namespace: str, name: str, query: Json, body: Any
    ) -> tuple[int, Json]:
        options = self._delete_options(query, body)
        with self._cond:
            pod = self._bucket("pods", namespace).get(name)
            if pod is None:
                raise _not_found("pods", name)
            self._check_preconditions("pods", pod, options)
            rt = self._runtimes[pod["metadata"]["uid"]]
            grace = options.get("gracePeriodSeconds")
            if grace is None:
                grace = pod["spec"].get("terminationGracePeriodSeconds", DEFAULT_GRACE)
            answer = self._delete(pod, rt, int(grace))
            accepted = not rt.removed and options.get("orphanDependents") is False
            return (202 if accepted else 200), answer

    def _delete(self, pod: Json, rt: _PodRuntime, grace: int) -> Json:
        grace = 1 if grace < 0 else grace  # as the API server's pod strategy does
        terminal = pod["status"]["phase"] in _TERMINAL
        if grace == 0 or terminal or not (rt.running or (rt.scheduled and rt.node_lost)):
            # The API forgets the pod at once. Its kubelet, if it can still act, ends the
            # container on its own time: SIGTERM and its floor grace (or a deadline it already
            # had): processes outlive the object for a moment, as on a node.
            running = rt.running and not terminal
            final = self._remove_pod(pod, rt)
            if running and not rt.node_lost:
                self._terminate(rt, self.force_grace)
            return final
        # Graceful: the API records the deletion and only ever shortens it; the kubelet acts on
        # the first one it sees and does not shorten its grace for a later one (kubernetes
        # issues 83916, 113717).
        now = self._clock()
        if rt.api_deadline is None or now + grace < rt.api_deadline:
            rt.api_deadline = now + grace
            meta = pod["metadata"]
            meta["deletionTimestamp"] = _rfc3339(time.time() + grace)
            meta["deletionGracePeriodSeconds"] = grace
            self._modified("pods", pod)
        if not rt.node_lost:
            self._terminate(rt, grace)
        return copy.deepcopy(pod)

    def _terminate(self, rt: _PodRuntime, grace: int) -> None:
        """The kubelet's kill of a container: SIGTERM, SIGKILL once ``grace`` is over. Only the
        first one counts."""
        if rt.kill_at is not None or rt.exited:
            return
        rt.kill_at = self._clock() + grace
        self._signal_main(rt, signal.SIGTERM)
        self._spawn(f"fake-grace-{rt.name}", self._enforce_grace, rt)

    def _remove_pod(self, pod: Json, rt: _PodRuntime) -> Json:
        # What the kubelet's final zero-grace delete leaves in the last object the API shows.
        meta = pod["metadata"]
        now = _now()
        meta["deletionTimestamp"] = min(meta.get("deletionTimestamp", now), now)
        meta["deletionGracePeriodSeconds"] = 0
        del self._bucket("pods", rt.namespace)[rt.name]
        rt.removed = True
        meta["resourceVersion"] = self._bump()
        self._emit("pods", "DELETED", pod)
        self._collect_garbage(rt.namespace)
        return copy.deepcopy(pod)

    def _collect_garbage(self, namespace: str) -> None:
        secrets = self._bucket("secrets", namespace)
        for name, secret in list(secrets.items()):
            if self._orphaned(namespace, secret):
                self._remove_secret(namespace, name)
        # Pods owned by a Pod that is gone (background propagation): deleted as anyone's delete
        # would be, with their own default grace period.
        for pod in list(self._bucket("pods", namespace).values()):
            rt = self._runtimes.get(pod["metadata"]["uid"])
            if rt is not None and not rt.removed and self._orphaned(namespace, pod):
                grace = int(pod["spec"].get("terminationGracePeriodSeconds", DEFAULT_GRACE))
                self._delete(pod, rt, grace)

    def _orphaned(self, namespace: str, obj: Json) -> bool:
        """Whether every owner of ``obj`` is a Pod that no longer exists (the garbage collector
        deletes a dependent once all its owners are gone; only Pod owners are known here)."""
        owners = obj["metadata"].get("ownerReferences") or []
        if not owners or any(not isinstance(o, dict) or o.get("kind") != "Pod" for o in owners):
            return False
        alive = {p["metadata"]["uid"] for p in self._bucket("pods", namespace).values()}
        return all(o.get("uid") not in alive for o in owners)

    # -- the kubelet -------------------------------------------------------------------------

    def _abandoned(self, rt: _PodRuntime) -> bool:
        return rt.removed or rt.failed or self._closed

    def _report(self, rt: _PodRuntime, change: Callable[[Json], None]) -> bool:
        """Apply a status change the kubelet reports; False if the pod is gone or no longer the
        kubelet's to report (evicted, node lost)."""
        with self._cond:
            pod = self._live(rt)
            if pod is None or rt.failed or rt.node_lost:
                return False
            change(pod["status"])
            self._modified("pods", pod)
            return True

    def _kubelet(self, rt: _PodRuntime) -> None:
        with self._cond:
            pod = self._live(rt)
            if pod is None:
                return
            spec = copy.deepcopy(pod["spec"])
        container: Json = spec["containers"][0]

        def creating(status: Json) -> None:
            status.update(hostIP=HOST_IP, hostIPs=[{"ip": HOST_IP}], startTime=_now())
            _set_condition(status, "Initialized", True)
            _not_ready(status, container)
            _waiting(status, container, "ContainerCreating")

        if not self._report(rt, creating) or not self._pull(rt, container):
            return
        volumes = self._await_volumes(rt, spec)
        if volumes is None:
            return
        proc = self._launch(rt, container, volumes)
        if proc is None:
            return
        if self.isolation == "pid-namespace":
            self._find_init(rt, proc)
        returncode = proc.wait()
        self._finish(rt, container, returncode)

    def _pull(self, rt: _PodRuntime, container: Json) -> bool:
        image: str = container["image"]
        images = self.images
        if images is None or image in images:
            return True
        pull_error = f'failed to pull and unpack image "{image}": not found'
        self._report(rt, lambda s: _waiting(s, container, "ErrImagePull", pull_error))
        with self._cond:
            self._cond.wait_for(lambda: self._abandoned(rt), timeout=PULL_BACKOFF)
        backoff = f'Back-off pulling image "{image}"'
        self._report(rt, lambda s: _waiting(s, container, "ImagePullBackOff", backoff))
        return False

    def _await_volumes(
        self, rt: _PodRuntime, spec: Json
    ) -> list[tuple[str, Json, Json | None]] | None:
        """Wait until every non-optional Secret of a Secret volume exists (woken by every store
        change); the volumes with those Secrets' current contents, or None if the pod is gone."""
        volumes: list[Json] = spec.get("volumes") or []

        def secret_of(volume: Json) -> tuple[str, bool] | None:
            source = volume.get("secret")
            if isinstance(source, dict) and source.get("secretName"):
                return str(source["secretName"]), bool(source.get("optional"))
            return None

        needed = [s for s in map(secret_of, volumes) if s is not None]
        with self._cond:
            secrets = self._bucket("secrets", rt.namespace)
            self._cond.wait_for(
                lambda: self._abandoned(rt) or all(opt or n in secrets for n, opt in needed)
            )
            if self._abandoned(rt):
                return None
            found: list[tuple[str, Json, Json | None]] = []
            for volume in volumes:
                named = secret_of(volume)
                secret = secrets.get(named[0]) if named is not None else None
                found.append((volume["name"], volume, copy.deepcopy(secret)))
            return found

    def _launch(
        self, rt: _PodRuntime, container: Json, volumes: list[tuple[str, Json, Json | None]]
    ) -> subprocess.Popen[bytes] | None:
        pod_dir = self._root / rt.namespace / rt.name
        pod_dir.mkdir(parents=True, exist_ok=True)
        mounts = _mount_map(container, _materialise(pod_dir / "volumes", volumes))
        env = _container_env(container, mounts)
        words = [*(container.get("command") or []), *(container.get("args") or [])]
        argv = [_rewrite(_expand(str(w), env), mounts) for w in words]
        env.update(self._extra_env)
        env[MARKER_VAR] = rt.uid
        # The start happens under the lock so that a delete either sees no process (and the
        # pod is gone before one can start) or sees it running (and terminates it).
        with (pod_dir / "log").open("wb") as log, self._cond:
            if self._abandoned(rt):
                return None
            proc: subprocess.Popen[bytes] | None = None
            failure: OSError | None = None
            if argv and self.isolation == "pid-namespace" and not _runnable(argv[0], env):
                failure = FileNotFoundError(argv[0])  # as exec would have said, not unshare
            elif argv:
                wrapped = [*_UNSHARE, *argv] if self.isolation == "pid-namespace" else argv
                try:
                    proc = subprocess.Popen(
                        wrapped,
                        env=env,
                        cwd=pod_dir,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                except OSError as exc:
                    failure = exc
            if proc is None:
                self._start_failed(rt, container, _start_error(argv, failure))
                return None
            rt.proc = proc
            info = procs.stat(proc.pid)  # unreaped: the pid is still this child's
            rt.pidfd = None if info is None else procs.Pidfd.open(info.key, zombie_ok=True)
            rt.started_at = _now()
            rt.cid = "containerd://" + uuid.uuid4().hex + uuid.uuid4().hex

            def running(status: Json) -> None:
                status.update(phase="Running", podIP=POD_IP, podIPs=[{"ip": POD_IP}])
                _set_condition(status, "Ready", True)
                _set_condition(status, "ContainersReady", True)
                state = {"running": {"startedAt": rt.started_at}}
                status["containerStatuses"] = [
                    _container_status(container, state, ready=True, started=True, cid=rt.cid)
                ]

            self._report(rt, running)
            return proc

    def _find_init(self, rt: _PodRuntime, proc: subprocess.Popen[bytes]) -> None:
        """Learn the container's init (``unshare``'s child) and its pid namespace: polled, since
        the launcher program forks it a moment after it starts (bounded by KILL_WAIT; until it
        is known, a kill goes to the launcher program, whose death kills the child)."""
        deadline = time.monotonic() + KILL_WAIT
        poll = threading.Event()
        while proc.poll() is None and time.monotonic() < deadline:
            child = _child_of(proc.pid)
            info = procs.stat(child) if child is not None else None
            namespace_id = _namespace_of(child) if child is not None else None
            if info is not None and namespace_id not in (None, procs.pid_namespace()):
                pidfd = procs.Pidfd.open(info.key)
                try:
                    fd: int | None = os.open(f"/proc/{info.pid}/ns/pid", os.O_RDONLY)
                except OSError:
                    fd = None  # gone already: its namespace with it
                if fd is not None and os.fstat(fd).st_ino != namespace_id:
                    os.close(fd)
                    fd = None
                with self._cond:
                    if fd is None:
                        namespace_id = None
                    rt.init, rt.namespace_id, rt.namespace_fd = pidfd, namespace_id, fd
                    if rt.term_pending and pidfd is not None:
                        pidfd.send(signal.SIGTERM)
                    self._changed()
                return
            poll.wait(0.002)

    def _start_failed(self, rt: _PodRuntime, container: Json, message: str) -> None:
        cid = "containerd://" + uuid.uuid4().hex + uuid.uuid4().hex

        def failed(status: Json) -> None:
            status["phase"] = "Failed"
            _set_condition(status, "Ready", False, "PodFailed")
            _set_condition(status, "ContainersReady", False, "PodFailed")
            state = {
                "terminated": {
                    "exitCode": 128,
                    "reason": "StartError",
                    "message": message,
                    "startedAt": "1970-01-01T00:00:00Z",
                    "finishedAt": _now(),
                    "containerID": cid,
                }
            }
            status["containerStatuses"] = [_container_status(container, state, cid=cid)]

        self._report(rt, failed)

    def _finish(self, rt: _PodRuntime, container: Json, returncode: int) -> None:
        # The container's end takes every process in it, as its cgroup's would.
        self._end_tree(rt)
        exit_code = returncode if returncode >= 0 else 128 - returncode

        def terminated(status: Json) -> None:
            succeeded = exit_code == 0
            status["phase"] = "Succeeded" if succeeded else "Failed"
            if succeeded:
                _set_condition(status, "Ready", False, "PodCompleted")
                _set_condition(status, "ContainersReady", False, "PodCompleted")
            else:
                _set_condition(status, "Ready", False, "PodFailed")
                _set_condition(status, "ContainersReady", False, "PodFailed")
            state = {
                "terminated": {
                    "exitCode": exit_code,
                    "reason": "Completed" if succeeded else "Error",
                    "startedAt": rt.started_at,
                    "finishedAt": _now(),
                    "containerID": rt.cid,
                }
            }
            status["containerStatuses"] = [_container_status(container, state, cid=rt.cid)]

        with self._cond:
            rt.exited = True
            for fd in (rt.pidfd, rt.init):
                if fd is not None:
                    fd.close()
            rt.pidfd = rt.init = None
            self._forget_namespace(rt)
            self._report(rt, terminated)
            pod = self._live(rt)
            if pod is not None and rt.kill_at is not None and not rt.node_lost:
                self._remove_pod(pod, rt)
            self._changed()

    def _enforce_grace(self, rt: _PodRuntime) -> None:
        """SIGKILL the pod's processes once the kubelet's grace is over (a wait on the Condition:
        an exit, a clock's advance or close() wakes it)."""
        with self._cond:
            kill_at = rt.kill_at
            if kill_at is None or not self._wait_until(kill_at, lambda: rt.exited):
                return
            self._signal_main(rt, signal.SIGKILL)
        self._end_tree(rt)
        with self._cond:
            self._changed()  # wake wait_for() callers watching processes()

    # -- secrets -----------------------------------------------------------------------------

    def _create_secret(self, namespace: str, body: Any) -> Json:
        secret = self._new_object(namespace, body, "Secret")
        name: str = secret["metadata"]["name"]
        causes = _subdomain_causes("metadata.name", name) + _label_causes(secret["metadata"])
        data = secret.get("data") or {}
        string_data = secret.pop("stringData", None) or {}
        if not isinstance(data, dict) or not isinstance(string_data, dict):
            raise _bad_request('Secret in version "v1" cannot be handled as a Secret')
        for value in data.values():
            try:
                base64.b64decode(str(value), validate=True)
            except binascii.Error:
                raise _bad_request(
                    'Secret in version "v1" cannot be handled as a Secret: illegal base64 data'
                ) from None
        for key, value in string_data.items():
            data[key] = base64.b64encode(str(value).encode()).decode()
        causes += [
            _invalid_value(f"data[{key}]", key, _CONFIG_KEY_MSG)
            for key in data
            if not _CONFIG_KEY.fullmatch(key)
        ]
        if causes:
            raise _invalid("Secret", name, causes)
        if data:
            secret["data"] = data
        secret.setdefault("type", "Opaque")
        with self._cond:
            bucket = self._bucket("secrets", namespace)
            if name in bucket:
                raise _already_exists("secrets", name)
            secret = self._stamp(secret, namespace, "Secret")
            bucket[name] = secret
            self._emit("secrets", "ADDED", secret)
            created = copy.deepcopy(secret)
            if self._orphaned(namespace, secret):  # its owner was deleted before it came
                self._remove_secret(namespace, name)
            return created

    def _remove_secret(self, namespace: str, name: str) -> Json:
        secret = self._bucket("secrets", namespace).pop(name)
        secret["metadata"]["resourceVersion"] = self._bump()
        self._emit("secrets", "DELETED", secret)
        return secret

    def _api_delete_secret(self, namespace: str, name: str, query: Json, body: Any) -> Json:
        options = self._delete_options(query, body)
        with self._cond:
            secret = self._bucket("secrets", namespace).get(name)
            if secret is None:
                raise _not_found("secrets", name)
            self._check_preconditions("secrets", secret, options)
            self._remove_secret(namespace, name)
            uid = secret["metadata"]["uid"]
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Success",
            "details": {"name": name, "kind": "secrets", "uid": uid},
        }

    # -- requests ----------------------------------------------------------------------------

    @staticmethod
    def _delete_options(query: Mapping[str, str], body: Any) -> Json:
        # As the API server: a non-empty body is the DeleteOptions and the query is ignored;
        # only without a body are the options read from the query.
        if body is not None:
            if not isinstance(body, dict):
                raise _bad_request("decoded object cannot be converted to DeleteOptions")
            options = dict(body)
            grace = options.get("gracePeriodSeconds")
            if grace is not None and not isinstance(grace, int):
                raise _bad_request("json: cannot unmarshal into DeleteOptions.gracePeriodSeconds")
            return options
        options = {"gracePeriodSeconds": _int_param(query, "gracePeriodSeconds")}
        if query.get("orphanDependents"):
            options["orphanDependents"] = query["orphanDependents"] in _TRUE
        return options

    @staticmethod
    def _check_preconditions(kind: str, obj: Json, options: Json) -> None:
        wanted = options.get("preconditions") or {}
        meta = obj["metadata"]
        for key, label in (("uid", "UID"), ("resourceVersion", "ResourceVersion")):
            if wanted.get(key) is not None and wanted[key] != meta[key]:
                name = meta["name"]
                raise _error(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {kind} "{name}": Precondition failed: '
                    f"{label} in precondition: {wanted[key]}, {label} in object meta: {meta[key]}",
                    {"name": name, "kind": kind},
                )

    def _handle(self, h: _Handler, method: str, raw: bytes) -> None:
        split = urlsplit(h.path)
        query = dict(parse_qsl(split.query, keep_blank_values=True))
        body: Any = None
        unparsable: str | None = None
        if raw.strip():
            try:
                body = json.loads(raw)
            except ValueError as exc:
                body = clean_text(raw)
                unparsable = str(exc)
        with self._cond:
            self._requests.append(Recorded(method, split.path, query, body))
            self._changed()
        route = _ROUTE.fullmatch(split.path)
        try:
            if route is not None:
                self._await_hold(method, route.group(2))
                self._inject_failure(method, route.group(2))
            if unparsable is not None:
                raise _bad_request(f"couldn't get version/kind; json parse error: {unparsable}")
            if route is None:
                raise self._no_such_resource()
            namespace, kind = unquote(route.group(1)), route.group(2)
            name = unquote(route.group(3)) if route.group(3) else None
            answer = self._route(h, method, kind, namespace, name, query, body)
        except _ApiError as err:
            answer = err.code, err.body
        except Exception as exc:
            # A bug of the fake: shown on stderr and answered as the API server would.
            traceback.print_exc()
            answer = 500, _status(500, "InternalError", f"fake kubernetes: {exc!r}")
        if answer is None:
            return  # a watch, answered as a stream
        if h.streaming:
            h.close_connection = True  # a failure mid-stream: the stream cannot be mended
            return
        h.send_json(*answer)

    @staticmethod
    def _no_such_resource() -> _ApiError:
        return _error(404, "NotFound", "the server could not find the requested resource", {})

    def _await_hold(self, method: str, kind: str) -> None:
        with self._cond:
            self._holds = [h for h in self._holds if not h.released]
            found = next((h for h in self._holds if (h.method, h.kind) == (method, kind)), None)
        if found is not None:
            found._wait()

    def _inject_failure(self, method: str, kind: str) -> None:
        with self._cond:
            for i, (m, k, code, body) in enumerate(self._failures):
                if (m, k) == (method, kind):
                    del self._failures[i]
                    raise _ApiError(code, body)

    def _route(
        self,
        h: _Handler,
        method: str,
        kind: str,
        namespace: str,
        name: str | None,
        query: dict[str, str],
        body: Any,
    ) -> tuple[int, Json] | None:
        if name is None and method == "POST":
            create = self._create_pod if kind == "pods" else self._create_secret
            return 201, create(namespace, body)
        if name is None and method == "GET":
            filt = _Filter.parse(kind, query)
            if query.get("watch", "") in _TRUE:
                self._serve_watch(h, kind, namespace, filt, query)
                return None
            with self._cond:
                items = [
                    _list_item(o) for o in self._bucket(kind, namespace).values() if filt.matches(o)
                ]
                return 200, {
                    "kind": _KINDS[kind] + "List",
                    "apiVersion": "v1",
                    "metadata": {"resourceVersion": str(self._rv)},
                    "items": items,
                }
        if name is not None and method == "GET":
            with self._cond:
                found = self._bucket(kind, namespace).get(name)
                if found is None:
                    raise _not_found(kind, name)
                return 200, copy.deepcopy(found)
        if name is not None and method == "DELETE":
            if kind == "pods":
                return self._api_delete_pod(namespace, name, query, body)
            return 200, self._api_delete_secret(namespace, name, query, body)
        raise self._no_such_resource()

    def _serve_watch(
        self, h: _Handler, kind: str, namespace: str, filt: _Filter, query: Mapping[str, str]
    ) -> None:
        since_text = query.get("resourceVersion", "")
        since: int | None = None
        if since_text not in ("", "0"):
            try:
                since = int(since_text)
            except ValueError:
                raise _bad_request(f"invalid resource version: {since_text}") from None
        timeout = _int_param(query, "timeoutSeconds")
        deadline = time.monotonic() + timeout if timeout is not None and timeout > 0 else None
        with self._cond:
            self._cond.wait_for(lambda: not self._watches_paused or self._closed)
            if self._closed:
                raise _error(503, "ServiceUnavailable", "the server is shutting down")
            bookmarks = query.get("allowWatchBookmarks", "") in _TRUE
            watch = _Watch(kind, namespace, filt, bookmarks, h.connection)
            if since is not None and since < self._history_floor:
                message = f"too old resource version: {since} ({self._history_floor})"
                watch.queue.append(_event_line("ERROR", _status(410, "Expired", message)))
                watch.stop = "end"
            elif since is not None:
                for e in self._history:
                    if e.kind == kind and e.namespace == namespace and e.rv > since:
                        found = e.line_for(filt)
                        if found is not None:
                            watch.queue.append(found)
            else:
                watch.queue.extend(
                    _event_line("ADDED", o)
                    for o in self._bucket(kind, namespace).values()
                    if filt.matches(o)
                )
            self._watches.add(watch)
            self._watch_total += 1
            self._changed()
        try:
            h.start_stream()
            with self._cond:
                watch.started = True
            self._pump(h, watch, deadline)
        except OSError:
            h.close_connection = True
        finally:
            with self._cond:
                self._watches.discard(watch)

    def _pump(self, h: _Handler, watch: _Watch, deadline: float | None) -> None:
        def over() -> bool:
            return deadline is not None and time.monotonic() >= deadline

        while True:
            with self._cond:
                self._cond.wait_for(
                    lambda: bool(watch.queue) or watch.stop is not None or self._closed or over(),
                    timeout=None if deadline is None else max(0.0, deadline - time.monotonic()),
                )
                lines = list(watch.queue)
                watch.queue.clear()
                stop = watch.stop or ("end" if self._closed or over() else None)
            if stop == "drop":
                watch.shut()
                h.close_connection = True
                return
            for line in lines:
                h.send_chunk(line)
            if stop == "end":
                h.end_stream()
                return
