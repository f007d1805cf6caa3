"""An in-process Kubernetes API server for tests: kmock's ``KubernetesEmulator`` plus what a
real API server adds on top of storing objects.

It serves HTTP on 127.0.0.1 (a free port) from a background thread with its own asyncio loop,
so that the official synchronous ``kubernetes`` client (``CoreV1Api``, ``kubernetes.watch``)
talks to it as to a cluster.  All of it is thread-safe: a test, the test kubelet
(``tests.k8s.kubelet``) and the HTTP handlers change the same store under one lock.

Emulated:

* every change (create, patch, replace, status update, deletion marking, final removal) bumps
  one global, increasing ``metadata.resourceVersion``; objects get ``uid``,
  ``creationTimestamp``, ``namespace`` (and ``generateName`` works); lists carry the current
  resourceVersion; creating an existing name answers 409 ``AlreadyExists``;
* watches (``?watch=true``) replay every change after ``resourceVersion`` from an event history,
  then stream live changes until ``timeoutSeconds``; with no resourceVersion (or ``"0"``)
  they start with ``ADDED`` for what exists; ``BOOKMARK`` events every ``bookmark_interval_s``
  when ``allowWatchBookmarks=true``; after :meth:`KubeEmulator.compact` a watch from an older
  resourceVersion gets an ``ERROR`` event with a ``410 Expired`` Status, as the API server sends
  it; :meth:`KubeEmulator.break_watches` ends (or aborts) every live stream;
* ``labelSelector`` (``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``, ``k in (a,b)``,
  ``k notin (a,b)``) and ``fieldSelector`` (``=``, ``==``, ``!=`` on ``metadata.name``,
  ``metadata.namespace``, and for pods ``spec.nodeName``, ``status.phase`` and a few more) on
  lists and watches; a watched object that stops (starts) matching is sent as ``DELETED``
  (``ADDED``), as the API server does;
* patches: JSON merge patch, JSON patch, and strategic merge patch (lists merged by their
  Kubernetes merge keys: conditions by ``type``, containers and env by ``name``, and so on;
  ``$patch: delete`` and ``$deleteFromPrimitiveList``); the ``status`` subresource of pods and
  nodes (``patch_node_status``, ``patch_namespaced_pod_status``) changes only ``status``, the
  main resource never changes ``status``; ``metadata.resourceVersion`` in a patch or replace
  body is a precondition (409 ``Conflict``); a pod's spec is immutable apart from container
  images, ``activeDeadlineSeconds`` and ``tolerations`` (422 ``Invalid``); PUT replaces;
* pod creation validates against the Kubernetes OpenAPI schema (``kubernetes-validate``) and
  applies the API server's main defaults (``restartPolicy``, ``terminationGracePeriodSeconds``,
  ``schedulerName``, ``status.phase: Pending``, ``qosClass``, requests from limits, ...);
* deletion with ``V1DeleteOptions``: ``preconditions.uid`` / ``preconditions.resourceVersion``
  mismatch answers 409 ``Conflict``, a missing object 404 ``NotFound``; graceful deletion of a
  pod bound to a node that a test kubelet serves (grace defaults to the pod's
  ``terminationGracePeriodSeconds``): ``deletionTimestamp`` = now + grace and
  ``deletionGracePeriodSeconds`` (a ``MODIFIED`` event), removal left to the kubelet; a second
  delete with a shorter grace shortens it; grace 0, an unbound pod, a pod on a node no kubelet
  serves, or a pod in a terminal phase is removed at once (``DELETED``); finalizers hold the
  removal until they are patched away; the response is the object (200);
* ``GET .../pods/{name}/log`` (``tailLines``, ``limitBytes``, ``follow``) from the kubelet's
  capture of the container's stdout and stderr; 400 while the container waits to start;
* nodes: :meth:`KubeEmulator.add_node`; any other resource is stored generically (CRUD, watch).

Not emulated: authentication, authorization and admission webhooks; server-side apply;
``limit``/``continue`` paging (lists are always whole); ``resourceVersion`` semantics on lists
(always the latest); ``resourceVersionMatch``, ``sendInitialEvents``; ``deletecollection``;
the ``binding``, ``eviction``, ``exec``, ``attach`` and ``portforward`` subresources; protobuf
and CBOR; namespaces as objects (any namespace name is accepted); ``managedFields`` and
``generation``; garbage collection of dependents; Events objects.

What kmock provides, and what is replaced and why:

* kept: request parsing (resource, namespace, name, subresource, action), the reaction DSL (a
  test may still inject a response, e.g. ``emulator['post /api/v1/namespaces/default/pods']
  << 503``, and the injected reaction wins over the emulation), Status rendering of
  ``kmock.KubernetesError``, JSON-lines streaming of async generators, and the object store
  ``emulator.objects`` with each object's version history;
* replaced: ``KubernetesEmulator._handle`` writes every create, patch and delete before the
  reaction DSL runs, with no versions, uids, preconditions or grace periods, and its watch is a
  live bus with no history, so it can neither replay from a resourceVersion nor expire; this
  class skips that write-through and writes in its own fallback handlers, from its own event
  history;
* not used: ``kmock.Server`` patches aiohttp's resolver for the whole process and must be
  exited in the reverse order of entry, which does not hold for emulators started and stopped
  from different threads and tests; a plain aiohttp ``ServerRunner`` serves the handler.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import copy
import datetime
import functools
import json
import re
import secrets
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Self

import aiohttp.web
import attrs
import jsonpatch
import kmock
import kubernetes.client

JSON = dict[str, Any]
Matcher = Callable[[Mapping[str, Any]], bool]

KINDS = {
    "pods": "Pod",
    "nodes": "Node",
    "namespaces": "Namespace",
    "configmaps": "ConfigMap",
    "secrets": "Secret",
    "services": "Service",
    "events": "Event",
    "serviceaccounts": "ServiceAccount",
    "persistentvolumes": "PersistentVolume",
    "persistentvolumeclaims": "PersistentVolumeClaim",
}
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
DEFAULT_GRACE_S = 30
INITIAL_RESOURCE_VERSION = 1000
LOG_FOLLOW_POLL_S = 0.05

PODS = kmock.resource("", "v1", "pods")
NODES = kmock.resource("", "v1", "nodes")


def rfc3339(offset_s: float = 0.0) -> str:
    """The UTC time ``offset_s`` seconds from now, in the API's format (whole seconds)."""
    moment = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=offset_s)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(value: str) -> datetime.datetime:
    """A timestamp of the API's format as an aware datetime."""
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))


def as_resource(resource: str | kmock.resource) -> kmock.resource:
    """``"pods"`` (core v1), ``"v1/pods"`` or ``"apps/v1/deployments"`` as a kmock resource."""
    if isinstance(resource, kmock.resource):
        return resource
    if "/" not in resource:
        return kmock.resource("", "v1", resource)
    return kmock.resource(resource)


def api_version_of(resource: kmock.resource) -> str:
    return f"{resource.group}/{resource.version}" if resource.group else str(resource.version)


def api_error(code: int, reason: str, message: str, *, kind: str = "", name: str = "") -> Exception:
    """An error the kmock handler renders as a Kubernetes ``Status`` with HTTP ``code``."""
    details: JSON = {"kind": kind} if kind else {"causes": []}
    if name:
        details["name"] = name
    return kmock.KubernetesError(status=code, reason=reason, message=message, details=details)


def not_found(resource: kmock.resource, name: str) -> Exception:
    plural = str(resource.plural)
    return api_error(404, "NotFound", f'{plural} "{name}" not found', kind=plural, name=name)


def conflict(resource: kmock.resource, name: str, why: str) -> Exception:
    plural = str(resource.plural)
    message = f'Operation cannot be fulfilled on {plural} "{name}": {why}'
    return api_error(409, "Conflict", message, kind=plural, name=name)


def bad_request(message: str) -> Exception:
    return api_error(400, "BadRequest", message)


# -- selectors ----------------------------------------------------------------------------------

_LABEL_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
_LABEL_VALUE = r"[-A-Za-z0-9_.]*"


def _split_top_level(text: str) -> list[str]:
    """Split a selector at commas that are not inside parentheses."""
    parts: list[str] = []
    depth, start = 0, 0
    for index, char in enumerate(text):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    parts.append(text[start:])
    return [part.strip() for part in parts if part.strip()]


def parse_label_selector(text: str) -> Callable[[Mapping[str, str]], bool]:
    """A predicate on a labels dict for a ``labelSelector`` string; ValueError if malformed."""
    checks: list[Callable[[Mapping[str, str]], bool]] = []
    for part in _split_top_level(text):
        if m := re.fullmatch(rf"({_LABEL_KEY})\s+(in|notin)\s*\(([^()]*)\)", part):
            key, negate = m[1], m[2] == "notin"
            values = frozenset(v.strip() for v in m[3].split(",") if v.strip())
            checks.append(
                lambda labels, k=key, vs=values, n=negate: (
                    (labels.get(k) in vs) != n if k in labels else n
                )
            )
        elif m := re.fullmatch(rf"!\s*({_LABEL_KEY})", part):
            checks.append(lambda labels, k=m[1]: k not in labels)
        elif m := re.fullmatch(rf"({_LABEL_KEY})\s*(==|=|!=)\s*({_LABEL_VALUE})", part):
            key, op, value = m[1], m[2], m[3]
            if op == "!=":
                checks.append(lambda labels, k=key, v=value: labels.get(k) != v)
            else:
                checks.append(lambda labels, k=key, v=value: labels.get(k) == v)
        elif re.fullmatch(_LABEL_KEY, part):
            checks.append(lambda labels, k=part: k in labels)
        else:
            raise ValueError(f"unable to parse requirement: {part!r}")
    return lambda labels: all(check(labels) for check in checks)


FIELD_LABELS: dict[str, frozenset[str]] = {
    "pods": frozenset(
        {
            "metadata.name",
            "metadata.namespace",
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        }
    ),
    "nodes": frozenset({"metadata.name", "spec.unschedulable"}),
}
_GENERIC_FIELD_LABELS = frozenset({"metadata.name", "metadata.namespace"})


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """A field as a field selector sees it: missing is ``""``, booleans are lower-case."""
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def parse_field_selector(plural: str, text: str) -> Matcher:
    """A predicate on an object for a ``fieldSelector``; ValueError if unsupported."""
    supported = FIELD_LABELS.get(plural, _GENERIC_FIELD_LABELS)
    checks: list[Matcher] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        m = re.fullmatch(r"([A-Za-z.]+)\s*(==|=|!=)\s*(.*)", part)
        if m is None:
            raise ValueError(f"invalid selector: {part!r}")
        path, op, value = m[1], m[2], m[3].strip()
        if path not in supported:
            raise ValueError(f"field label not supported: {path}")
        if op == "!=":
            checks.append(lambda obj, p=path, v=value: field_value(obj, p) != v)
        else:
            checks.append(lambda obj, p=path, v=value: field_value(obj, p) == v)
    return lambda obj: all(check(obj) for check in checks)


def selector_matcher(plural: str, params: Mapping[str, str]) -> Matcher:
    """The object predicate for a request's ``labelSelector`` and ``fieldSelector``."""
    try:
        labels = parse_label_selector(params.get("labelSelector", ""))
        fields = parse_field_selector(plural, params.get("fieldSelector", ""))
    except ValueError as exc:
        raise bad_request(str(exc)) from None
    return lambda obj: labels(obj.get("metadata", {}).get("labels") or {}) and fields(obj)


# -- patching -----------------------------------------------------------------------------------

# Lists that a strategic merge patch merges by a key (None: a set of scalars), by field name.
MERGE_KEYS: dict[str, str | None] = {
    "conditions": "type",
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "ports": "containerPort",
    "imagePullSecrets": "name",
    "ownerReferences": "uid",
    "addresses": "type",
    "podIPs": "ip",
    "hostIPs": "ip",
    "finalizers": None,
}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: dicts merge, ``None`` deletes, anything else replaces."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """A strategic merge patch with the Kubernetes merge keys of :data:`MERGE_KEYS`."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            result[name] = [v for v in result.get(name) or [] if v not in value]
            continue
        if key.startswith("$"):
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and key in MERGE_KEYS:
            result[key] = _merge_list(result.get(key) or [], value, MERGE_KEYS[key])
        else:
            merged = strategic_merge_patch(result.get(key), value)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
    return result


def _merge_list(target: list[Any], patch: list[Any], merge_key: str | None) -> list[Any]:
    if merge_key is None:
        return list(target) + [v for v in patch if v not in target]
    if any(isinstance(item, Mapping) and item.get("$patch") == "replace" for item in patch):
        return [copy.deepcopy(i) for i in patch if not (isinstance(i, Mapping) and "$patch" in i)]
    result = [copy.deepcopy(item) for item in target]
    for item in patch:
        if not isinstance(item, Mapping) or merge_key not in item:
            result.append(copy.deepcopy(item))
            continue
        index = next(
            (i for i, old in enumerate(result) if old.get(merge_key) == item[merge_key]), None
        )
        if item.get("$patch") == "delete":
            if index is not None:
                del result[index]
        elif index is None:
            result.append({k: copy.deepcopy(v) for k, v in item.items() if k != "$patch"})
        else:
            result[index] = strategic_merge_patch(result[index], item)
    return result


def apply_patch(obj: JSON, patch: Any, content_type: str) -> JSON:
    """``obj`` with ``patch`` applied as the request's Content-Type says."""
    kind = content_type.split(";")[0].strip().lower()
    if kind == "application/json-patch+json" or isinstance(patch, list):
        try:
            result = jsonpatch.apply_patch(obj, patch, in_place=False)
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
            raise api_error(422, "Invalid", f"the patch could not be applied: {exc}") from None
        return dict(result)
    if not isinstance(patch, Mapping):
        raise bad_request("the body of the request was in an unknown format")
    if kind == "application/merge-patch+json":
        return dict(merge_patch(obj, patch))
    if kind.startswith("application/apply-patch"):
        raise api_error(415, "UnsupportedMediaType", "server-side apply is not emulated")
    return dict(strategic_merge_patch(obj, patch))


# -- validation and defaults --------------------------------------------------------------------


@functools.cache
def _schema_validator(kind: str, api_version: str) -> Any:
    """A cached JSON-schema validator from ``kubernetes-validate`` (None if it has no schema)."""
    import jsonschema
    import referencing
    from kubernetes_validate import utils

    version = utils.latest_version()
    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    folder = f"kubernetes-json-schema/v{version}-local"
    try:
        schema = utils.schema_contents(f"{folder}/{kind.lower()}-{group_version}.json", version)
    except FileNotFoundError:
        return None
    definitions = utils.schema_contents(f"{folder}/_definitions.json", version)
    registry = referencing.Resource.from_contents(schema) @ referencing.Registry()
    registry = referencing.Resource.from_contents(definitions) @ registry
    return jsonschema.validators.Draft202012Validator(schema, registry=registry)


def validate_schema(obj: JSON) -> None:
    """422 Invalid if ``obj`` does not fit the Kubernetes OpenAPI schema of its kind."""
    import jsonschema.exceptions

    validator = _schema_validator(str(obj.get("kind")), str(obj.get("apiVersion")))
    if validator is None:
        return
    error = jsonschema.exceptions.best_match(validator.iter_errors(obj))
    if error is not None:
        path = ".".join(str(p) for p in error.absolute_path) or "<root>"
        name = obj.get("metadata", {}).get("name", "")
        message = f'{obj.get("kind")} "{name}" is invalid: {path}: {error.message}'
        raise api_error(422, "Invalid", message, kind=str(obj.get("kind")), name=name)


_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _invalid(kind: str, name: str, detail: str) -> Exception:
    return api_error(422, "Invalid", f'{kind} "{name}" is invalid: {detail}', kind=kind, name=name)


def validate_pod(pod: JSON) -> None:
    """The API server's main semantic checks of a new pod (422 Invalid)."""
    name = pod["metadata"]["name"]
    containers = pod.get("spec", {}).get("containers") or []
    if not containers:
        raise _invalid("Pod", name, "spec.containers: Required value")
    for index, container in enumerate(containers):
        for key in ("name", "image"):
            if not container.get(key):
                raise _invalid("Pod", name, f"spec.containers[{index}].{key}: Required value")
    grace = pod["spec"].get("terminationGracePeriodSeconds")
    if grace is not None and grace < 0:
        raise _invalid("Pod", name, "spec.terminationGracePeriodSeconds: must be >= 0")


def _quantity_default_requests(container: JSON) -> None:
    resources = container.setdefault("resources", {})
    limits = resources.get("limits") or {}
    requests = resources.setdefault("requests", {}) if limits else resources.get("requests")
    for key, value in limits.items():
        if requests is not None:
            requests.setdefault(key, value)


def _qos_class(containers: Iterable[JSON]) -> str:
    guaranteed, besteffort = True, True
    for container in containers:
        resources = container.get("resources") or {}
        requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
        for name in ("cpu", "memory"):
            if name in requests or name in limits:
                besteffort = False
            if name not in limits or requests.get(name, limits[name]) != limits[name]:
                guaranteed = False
    if besteffort:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def default_pod(pod: JSON) -> None:
    """Apply the API server's main pod defaults in place."""
    spec = pod.setdefault("spec", {})
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", DEFAULT_GRACE_S)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("securityContext", {})
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("priority", 0)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    tolerations = spec.setdefault("tolerations", [])
    for taint in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
        if not any(t.get("key") == taint for t in tolerations):
            tolerations.append(
                {
                    "key": taint,
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                }
            )
    for container in spec.get("containers") or []:
        image = str(container.get("image", ""))
        tag = image.rsplit("/", 1)[-1]
        latest = "@" not in image and (":" not in tag or tag.endswith(":latest"))
        container.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
        _quantity_default_requests(container)
    status = pod.setdefault("status", {})
    status.setdefault("phase", "Pending")
    status.setdefault("qosClass", _qos_class(spec.get("containers") or []))


_MUTABLE_POD_SPEC = ("activeDeadlineSeconds", "tolerations")


def _comparable_pod_spec(spec: JSON) -> JSON:
    spec = {k: v for k, v in spec.items() if k not in _MUTABLE_POD_SPEC}
    for key in ("containers", "initContainers"):
        spec[key] = [{k: v for k, v in c.items() if k != "image"} for c in spec.get(key) or []]
    return spec


# -- the emulator -------------------------------------------------------------------------------


@dataclass(frozen=True)
class WatchEvent:
    """One change in the event history: ``obj`` after it (``old`` before it)."""

    rv: int
    resource: kmock.resource
    type: str
    obj: JSON
    old: JSON | None


@dataclass(eq=False)
class _LiveStream:
    """A served watch or log follow: set ``closed`` and wake it to end it."""

    wake: asyncio.Event
    request: kmock.Request
    closed: bool = False
    abrupt: bool = False


class LogSource(Protocol):
    """What a kubelet tells about a pod's container output."""

    def log_source(self, uid: str) -> tuple[Path, bool] | None:
        """The captured output's file and whether the container still runs; None if none yet."""
        ...


@dataclass
class _Server:
    thread: threading.Thread
    ready: threading.Event = field(default_factory=threading.Event)
    loop: asyncio.AbstractEventLoop | None = None
    stopping: asyncio.Event | None = None
    port: int | None = None
    failure: BaseException | None = None


@attrs.define(kw_only=True, eq=False)
class KubeEmulator(kmock.KubernetesEmulator):
    """A Kubernetes API server on 127.0.0.1 for tests; see the module docstring.

    ``bookmark_interval_s`` is the time between watch bookmarks (seconds).
    Use as a context manager, or :meth:`start` and :meth:`stop`.
    """

    bookmark_interval_s: float = 1.0
    host: str = "127.0.0.1"

    _state_lock: threading.RLock = attrs.field(factory=threading.RLock, init=False)
    _current_rv: int = attrs.field(default=INITIAL_RESOURCE_VERSION, init=False)
    _history: list[WatchEvent] = attrs.field(factory=list, init=False)
    _history_rvs: list[int] = attrs.field(factory=list, init=False)
    _compacted_rv: int = attrs.field(default=0, init=False)
    _live_streams: set[_LiveStream] = attrs.field(factory=set, init=False)
    _listeners: list[Callable[[], None]] = attrs.field(factory=list, init=False)
    _kubelets: dict[str, LogSource] = attrs.field(factory=dict, init=False)
    _server: _Server | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.fallback[kmock.method.PUT] << self._serve_replace
        # Its own reaction, ahead of kmock's fetch fallback: kmock keeps the headers of a
        # returned kmock.Response on the reaction, so text/plain must not reach other fetches.
        (self.fallback**1)["get"][kmock.subresource("log")] << self._serve_log
        self.fallback["get /version/"] << self._serve_server_version  # the client's spelling

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> Self:
        """Serve on a free port from a background thread; returns once it accepts requests."""
        if self._server is not None:
            raise RuntimeError("the emulator is already started")
        server = _Server(threading.Thread(target=self._run, name="kube-emulator", daemon=True))
        self._server = server
        server.thread.start()
        if not server.ready.wait(30):
            raise RuntimeError("the emulator did not start within 30 s")
        if server.failure is not None:
            raise RuntimeError("the emulator failed to start") from server.failure
        return self

    def stop(self) -> None:
        """End every stream, stop serving and join the thread."""
        server = self._server
        if server is None:
            return
        loop, stopping = server.loop, server.stopping
        if loop is not None and stopping is not None and server.thread.is_alive():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stopping.set)
        server.thread.join(30)
        self._server = None
        if server.thread.is_alive():
            raise RuntimeError("the emulator's thread did not stop within 30 s")
        if server.failure is not None:
            raise RuntimeError("the emulator failed") from server.failure

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _run(self) -> None:
        server = self._server
        assert server is not None
        try:
            asyncio.run(self._serve(server))
        except BaseException as exc:
            server.failure = exc
        finally:
            server.ready.set()

    async def _serve(self, server: _Server) -> None:
        server.loop = asyncio.get_running_loop()
        server.stopping = asyncio.Event()
        async with self:
            web_server = aiohttp.web.Server(self, handler_cancellation=True, access_log=None)
            runner = aiohttp.web.ServerRunner(web_server, shutdown_timeout=5.0)
            await runner.setup()
            try:
                site = aiohttp.web.TCPSite(runner, self.host, 0)
                await site.start()
                server.port = int(runner.addresses[0][1])
                server.ready.set()
                await server.stopping.wait()
                self._end_streams(abrupt=False)
            finally:
                await runner.cleanup()

    @property
    def port(self) -> int:
        """The TCP port it serves on."""
        if self._server is None or self._server.port is None:
            raise RuntimeError("the emulator is not started")
        return self._server.port

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def configuration(self) -> kubernetes.client.Configuration:
        """A client configuration for this server (no authentication)."""
        return kubernetes.client.Configuration(host=self.url)

    def api_client(self) -> kubernetes.client.ApiClient:
        """A new ``ApiClient`` for this server; the caller closes it."""
        return kubernetes.client.ApiClient(self.configuration())

    def write_kubeconfig(self, path: Path, *, namespace: str = "default") -> Path:
        """Write a kubeconfig (JSON is valid YAML) that points at this server; returns ``path``."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
            "users": [{"name": "emulator", "user": {}}],
            "contexts": [
                {
                    "name": "emulator",
                    "context": {"cluster": "emulator", "user": "emulator", "namespace": namespace},
                }
            ],
            "current-context": "emulator",
        }
        path.write_text(json.dumps(config, indent=2))
        return path

    # -- test hooks -----------------------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        """The latest resourceVersion."""
        with self._state_lock:
            return self._current_rv

    def compact(self) -> int:
        """Drop the event history up to now; an older watch gets 410. Returns the new floor."""
        with self._state_lock:
            self._history.clear()
            self._history_rvs.clear()
            self._compacted_rv = self._current_rv
            return self._compacted_rv

    def break_watches(self, *, abrupt: bool = False) -> int:
        """End every live watch and log stream (``abrupt``: drop the TCP connection instead of
        ending the response); returns how many there were."""
        server = self._server
        if server is None or server.loop is None:
            return 0

        async def end() -> int:
            return self._end_streams(abrupt=abrupt)

        return asyncio.run_coroutine_threadsafe(end(), server.loop).result(10)

    def live_stream_count(self) -> int:
        """How many watches and log follows are being served."""
        return len(self._live_streams)

    def history(self, resource: str | kmock.resource = "pods") -> list[tuple[int, str, str]]:
        """The retained events of one resource as ``(resourceVersion, type, name)``."""
        res = as_resource(resource)
        with self._state_lock:
            return [
                (ev.rv, ev.type, ev.obj["metadata"]["name"])
                for ev in self._history
                if ev.resource == res
            ]

    def subscribe(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` (from any thread, under the store's lock) after every change."""
        self._listeners.append(listener)

    def unsubscribe(self, listener: Callable[[], None]) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(listener)

    def attach_kubelet(self, node: str, kubelet: LogSource) -> None:
        """Declare that ``kubelet`` runs the pods bound to ``node``."""
        with self._state_lock:
            self._kubelets[node] = kubelet
        self._notify()

    def detach_kubelet(self, node: str) -> None:
        with self._state_lock:
            self._kubelets.pop(node, None)
        self._notify()

    def kubelet_nodes(self) -> set[str]:
        """The nodes a kubelet serves."""
        with self._state_lock:
            return set(self._kubelets)

    def add_node(
        self,
        name: str,
        *,
        labels: Mapping[str, str] | None = None,
        allocatable: Mapping[str, str] | None = None,
        unschedulable: bool = False,
    ) -> JSON:
        """Create node ``name`` (Ready, on 127.0.0.1), or merge labels/allocatable into it."""
        merged_labels = {
            "kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            **(labels or {}),
        }
        resources = {"cpu": "64", "memory": "256Gi", "pods": "110", **(allocatable or {})}
        with self._state_lock:
            existing = self._get(NODES, None, name)
            if existing is not None:
                node = copy.deepcopy(existing)
                node["metadata"].setdefault("labels", {}).update(labels or {})
                if allocatable:
                    node.setdefault("status", {}).setdefault("allocatable", {}).update(allocatable)
                    node["status"].setdefault("capacity", {}).update(allocatable)
                if unschedulable:
                    node.setdefault("spec", {})["unschedulable"] = True
                return copy.deepcopy(self._commit(NODES, "MODIFIED", node, existing))
            now = rfc3339()
            node = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": merged_labels},
                "spec": {"unschedulable": True} if unschedulable else {},
                "status": {
                    "capacity": dict(resources),
                    "allocatable": dict(resources),
                    "addresses": [
                        {"type": "InternalIP", "address": "127.0.0.1"},
                        {"type": "Hostname", "address": name},
                    ],
                    "conditions": [
                        {
                            "type": "Ready",
                            "status": "True",
                            "reason": "KubeletReady",
                            "message": "kubelet is posting ready status",
                            "lastHeartbeatTime": now,
                            "lastTransitionTime": now,
                        }
                    ],
                    "nodeInfo": {
                        "architecture": "amd64",
                        "bootID": str(uuid.uuid4()),
                        "containerRuntimeVersion": "containerd://1.7.0",
                        "kernelVersion": "6.1.0",
                        "kubeProxyVersion": "",
                        "kubeletVersion": "v1.31.0",
                        "machineID": uuid.uuid4().hex,
                        "operatingSystem": "linux",
                        "osImage": "emulated",
                        "systemUUID": str(uuid.uuid4()),
                    },
                },
            }
            return copy.deepcopy(self._create(NODES, None, node))

    # -- the store (thread-safe; raises kmock.KubernetesError as the API would answer) ----------

    def get_object(
        self, resource: str | kmock.resource, namespace: str | None, name: str
    ) -> JSON | None:
        """A copy of the object, or None."""
        with self._state_lock:
            obj = self._get(as_resource(resource), namespace, name)
            return copy.deepcopy(obj) if obj is not None else None

    def list_objects(
        self,
        resource: str | kmock.resource,
        namespace: str | None = None,
        *,
        label_selector: str = "",
        field_selector: str = "",
    ) -> list[JSON]:
        """Copies of the matching objects (all namespaces if ``namespace`` is None)."""
        res = as_resource(resource)
        params = {"labelSelector": label_selector, "fieldSelector": field_selector}
        match = selector_matcher(str(res.plural), params)
        with self._state_lock:
            return [copy.deepcopy(o) for o in self._current(res, namespace) if match(o)]

    def create_object(
        self, resource: str | kmock.resource, namespace: str | None, body: Mapping[str, Any]
    ) -> JSON:
        """Create as POST does (validation, defaults for pods); returns a copy."""
        res = as_resource(resource)
        with self._state_lock:
            return copy.deepcopy(self._create(res, namespace, copy.deepcopy(dict(body))))

    def patch_object(
        self,
        resource: str | kmock.resource,
        namespace: str | None,
        name: str,
        patch: Any,
        *,
        subresource: str | None = None,
        content_type: str = "application/merge-patch+json",
    ) -> JSON:
        """Patch as PATCH does; returns a copy of the result."""
        res = as_resource(resource)
        with self._state_lock:
            obj = self._patch(res, namespace, name, patch, subresource, content_type)
            return copy.deepcopy(obj)

    def mutate(
        self,
        resource: str | kmock.resource,
        namespace: str | None,
        name: str,
        change: Callable[[JSON], None],
        *,
        uid: str | None = None,
    ) -> JSON | None:
        """Change the object in place with ``change(obj)`` (no validation: what a controller or
        the kubelet writes); a MODIFIED event if anything changed. None if it is gone (or has
        another uid)."""
        res = as_resource(resource)
        with self._state_lock:
            current = self._get(res, namespace, name)
            if current is None or (uid is not None and current["metadata"].get("uid") != uid):
                return None
            updated = copy.deepcopy(current)
            change(updated)
            if updated == current:
                return copy.deepcopy(current)
            obj = self._commit(res, "MODIFIED", updated, current)
            self._finish_if_released(res, obj)
            return copy.deepcopy(obj)

    def delete_object(
        self,
        resource: str | kmock.resource,
        namespace: str | None,
        name: str,
        *,
        grace_period_seconds: int | None = None,
        uid: str | None = None,
        resource_version: str | None = None,
    ) -> JSON:
        """Delete as DELETE does (preconditions, graceful deletion of pods); returns a copy."""
        res = as_resource(resource)
        with self._state_lock:
            obj = self._delete(res, namespace, name, grace_period_seconds, uid, resource_version)
            return copy.deepcopy(obj)

    # -- internals (the caller holds the lock) --------------------------------------------------

    def _get(self, res: kmock.resource, namespace: str | None, name: str) -> JSON | None:
        key = (res, namespace, name)
        if key not in self._objects:
            return None
        obj = self._objects[key]
        return None if obj.deleted else obj.history.last.raw

    def _current(self, res: kmock.resource, namespace: str | None) -> list[JSON]:
        found = [
            obj.history.last.raw
            for (r, ns, _), obj in self._objects.items()
            if r == res and not obj.deleted and (namespace is None or ns == namespace)
        ]
        return sorted(
            found, key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"])
        )

    def _commit(self, res: kmock.resource, type_: str, obj: JSON, old: JSON | None) -> JSON:
        """Store a change with the next resourceVersion, record it, wake watchers."""
        self._current_rv += 1
        obj["metadata"]["resourceVersion"] = str(self._current_rv)
        meta = obj["metadata"]
        key = (res, meta.get("namespace"), meta["name"])
        if type_ == "DELETED":
            self._objects[key].delete()
        elif key in self._objects:
            self._objects[key].history.append(obj)
        else:
            self._objects[key] = obj
        self._history.append(WatchEvent(self._current_rv, res, type_, obj, old))
        self._history_rvs.append(self._current_rv)
        self._notify()
        return obj

    def _notify(self) -> None:
        server = self._server
        if server is not None and server.loop is not None:
            with contextlib.suppress(RuntimeError):
                server.loop.call_soon_threadsafe(self._wake_streams)
        for listener in list(self._listeners):
            listener()

    def _wake_streams(self) -> None:
        for stream in self._live_streams:
            stream.wake.set()

    def _end_streams(self, *, abrupt: bool) -> int:
        streams = list(self._live_streams)
        for stream in streams:
            stream.closed = True
            stream.abrupt = abrupt
            stream.wake.set()
        return len(streams)

    def _create(self, res: kmock.resource, namespace: str | None, body: JSON) -> JSON:
        plural = str(res.plural)
        kind = KINDS.get(plural, body.get("kind") or plural.capitalize())
        body.setdefault("apiVersion", api_version_of(res))
        body.setdefault("kind", kind)
        meta = body.setdefault("metadata", {})
        if namespace is not None and meta.get("namespace", namespace) != namespace:
            raise bad_request(
                "the namespace of the provided object does not match the namespace sent on the"
                " request"
            )
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise _invalid(kind, "", "metadata.name: Required value: name or generateName")
            alphabet = "bcdfghjklmnpqrstvwxz2456789"
            meta["name"] = meta["generateName"] + "".join(
                secrets.choice(alphabet) for _ in range(5)
            )
        name = meta["name"]
        if not _DNS_SUBDOMAIN.fullmatch(name) or len(name) > 253:
            raise _invalid(kind, name, "metadata.name: Invalid value: a lowercase RFC 1123 name")
        if self._get(res, namespace, name) is not None:
            raise api_error(
                409, "AlreadyExists", f'{plural} "{name}" already exists', kind=plural, name=name
            )
        if res == PODS:
            validate_schema(body)
            validate_pod(body)
            default_pod(body)
        for key in ("resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(key, None)
        if namespace is not None:
            meta["namespace"] = namespace
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = rfc3339()
        return self._commit(res, "ADDED", body, None)

    def _patch(
        self,
        res: kmock.resource,
        namespace: str | None,
        name: str,
        patch: Any,
        subresource: str | None,
        content_type: str,
    ) -> JSON:
        current = self._get(res, namespace, name)
        if current is None:
            raise not_found(res, name)
        if subresource not in (None, "status"):
            raise api_error(404, "NotFound", f"the subresource {subresource!r} is not emulated")
        if isinstance(patch, Mapping):
            wanted_rv = (patch.get("metadata") or {}).get("resourceVersion")
            if wanted_rv and wanted_rv != current["metadata"]["resourceVersion"]:
                raise conflict(res, name, _MODIFIED)
        patched = apply_patch(copy.deepcopy(current), patch, content_type)
        return self._update(res, current, patched, subresource)

    def _replace(
        self, res: kmock.resource, namespace: str | None, name: str, body: Any, sub: str | None
    ) -> JSON:
        current = self._get(res, namespace, name)
        if current is None:
            raise not_found(res, name)
        if not isinstance(body, Mapping):
            raise bad_request("the body of the request was in an unknown format")
        meta = body.get("metadata") or {}
        if meta.get("name", name) != name:
            raise bad_request("the name of the object does not match the name on the URL")
        wanted_rv = meta.get("resourceVersion")
        if wanted_rv and wanted_rv != current["metadata"]["resourceVersion"]:
            raise conflict(res, name, _MODIFIED)
        return self._update(res, current, copy.deepcopy(dict(body)), sub)

    def _update(self, res: kmock.resource, current: JSON, new: JSON, sub: str | None) -> JSON:
        """Keep what the request may not change, check, and commit (MODIFIED)."""
        name = current["metadata"]["name"]
        if sub == "status":
            updated = copy.deepcopy(current)
            if new.get("status") is None:
                updated.pop("status", None)
            else:
                updated["status"] = new["status"]
        else:
            updated = new
            if "status" in current:
                updated["status"] = copy.deepcopy(current["status"])
            else:
                updated.pop("status", None)
            updated["apiVersion"], updated["kind"] = current["apiVersion"], current["kind"]
            meta = updated.setdefault("metadata", {})
            for key in _SERVER_OWNED_META:
                if key in current["metadata"]:
                    meta[key] = current["metadata"][key]
                else:
                    meta.pop(key, None)
            if res == PODS:
                validate_schema(updated)
                old_spec = _comparable_pod_spec(current.get("spec") or {})
                if _comparable_pod_spec(updated.get("spec") or {}) != old_spec:
                    raise _invalid(
                        "Pod",
                        name,
                        "spec: Forbidden: pod updates may not change fields other than"
                        " `spec.containers[*].image`, `spec.activeDeadlineSeconds`,"
                        " `spec.tolerations` (only additions to existing tolerations)",
                    )
            old_finalizers = set(current["metadata"].get("finalizers") or [])
            new_finalizers = set(meta.get("finalizers") or [])
            if current["metadata"].get("deletionTimestamp") and new_finalizers - old_finalizers:
                raise _invalid(
                    current["kind"],
                    name,
                    "metadata.finalizers: Forbidden: no new finalizers can be added if the"
                    " object is being deleted",
                )
        if updated == current:
            return current
        obj = self._commit(res, "MODIFIED", updated, current)
        return self._finish_if_released(res, obj)

    def _finish_if_released(self, res: kmock.resource, obj: JSON) -> JSON:
        """Remove an object whose deletion only waited for its finalizers."""
        meta = obj["metadata"]
        if (
            meta.get("deletionTimestamp")
            and not meta.get("finalizers")
            and meta.get("deletionGracePeriodSeconds", 0) == 0
        ):
            return self._commit(res, "DELETED", copy.deepcopy(obj), obj)
        return obj

    def _delete(
        self,
        res: kmock.resource,
        namespace: str | None,
        name: str,
        grace: int | None,
        uid: str | None,
        resource_version: str | None,
    ) -> JSON:
        current = self._get(res, namespace, name)
        if current is None:
            raise not_found(res, name)
        meta = current["metadata"]
        if uid is not None and uid != meta.get("uid"):
            raise conflict(
                res,
                name,
                f"Precondition failed: UID in precondition: {uid}, UID in object meta:"
                f" {meta.get('uid')}",
            )
        if resource_version is not None and resource_version != meta["resourceVersion"]:
            raise conflict(
                res,
                name,
                f"Precondition failed: ResourceVersion in precondition: {resource_version},"
                f" ResourceVersion in object meta: {meta['resourceVersion']}",
            )
        if grace is not None and grace < 0:
            grace = 0
        graceful = False
        if res == PODS:
            spec = current.get("spec") or {}
            if grace is None:
                grace = int(spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_S))
            phase = (current.get("status") or {}).get("phase")
            bound = spec.get("nodeName") in self._kubelets
            graceful = grace > 0 and bound and phase not in TERMINAL_PHASES
        grace = grace or 0
        marked = meta.get("deletionTimestamp")
        if graceful or meta.get("finalizers"):
            grace_now = grace if graceful else 0
            updated = copy.deepcopy(current)
            umeta = updated["metadata"]
            if not marked:
                umeta["deletionTimestamp"] = rfc3339(grace_now)
                umeta["deletionGracePeriodSeconds"] = grace_now
            elif grace_now < int(meta.get("deletionGracePeriodSeconds", 0)):
                requested_at = parse_rfc3339(marked) - datetime.timedelta(
                    seconds=int(meta["deletionGracePeriodSeconds"])
                )
                deadline = requested_at + datetime.timedelta(seconds=grace_now)
                umeta["deletionTimestamp"] = deadline.strftime("%Y-%m-%dT%H:%M:%SZ")
                umeta["deletionGracePeriodSeconds"] = grace_now
            if updated == current:
                return current
            return self._commit(res, "MODIFIED", updated, current)
        return self._commit(res, "DELETED", copy.deepcopy(current), current)

    # -- HTTP handlers (kmock fallbacks) --------------------------------------------------------

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        # Skip KubernetesEmulator's write-through: the fallbacks below do every write.
        return await kmock.RawHandler._handle(self, request)

    @staticmethod
    def _resource_of(request: kmock.Request) -> kmock.resource:
        if request.resource is None:
            raise bad_request("not a Kubernetes resource URL")
        return kmock.resource(request.resource)

    async def _serve_list(self, request: kmock.Request) -> kmock.Payload:
        res = self._resource_of(request)
        match = selector_matcher(str(res.plural), request.params)
        with self._state_lock:
            items = [obj for obj in self._current(res, request.namespace) if match(obj)]
            rv = self._current_rv
        kind = KINDS.get(str(res.plural)) or (items[0]["kind"] if items else "")
        return {
            "apiVersion": api_version_of(res),
            "kind": f"{kind}List",
            "metadata": {"resourceVersion": str(rv)},
            "items": items,
        }

    async def _serve_fetch(self, request: kmock.Request) -> kmock.Payload:
        res = self._resource_of(request)
        if request.name is None:
            raise bad_request("no name")
        if request.subresource not in (None, "status"):
            raise api_error(404, "NotFound", f"the subresource {request.subresource!r} is absent")
        obj = self.get_object(res, request.namespace, request.name)
        if obj is None:
            raise not_found(res, request.name)
        return obj

    async def _serve_create(self, request: kmock.Request) -> kmock.Payload:
        res = self._resource_of(request)
        if request.name is not None or not isinstance(request.data, Mapping):
            raise bad_request("the body of the request was in an unknown format")
        with self._state_lock:
            obj = self._create(res, request.namespace, copy.deepcopy(dict(request.data)))
        return kmock.Response(status=201, payload=obj)

    async def _serve_update(self, request: kmock.Request) -> kmock.Payload:
        res = self._resource_of(request)
        if request.name is None or request.data is None:
            raise bad_request("the body of the request was in an unknown format")
        content_type = _header(request, "Content-Type") or "application/merge-patch+json"
        with self._state_lock:
            return self._patch(
                res,
                request.namespace,
                request.name,
                request.data,
                request.subresource,
                content_type,
            )

    async def _serve_replace(self, request: kmock.Request) -> kmock.Payload:
        res = self._resource_of(request)
        if request.name is None or request.subresource not in (None, "status"):
            raise api_error(405, "MethodNotAllowed", "PUT is served on objects and their status")
        with self._state_lock:
            return self._replace(
                res, request.namespace, request.name, request.data, request.subresource
            )

    async def _serve_delete(self, request: kmock.Request) -> kmock.Payload:
        res = self._resource_of(request)
        if request.name is None:
            raise api_error(405, "MethodNotAllowed", "deletecollection is not emulated")
        options = request.data if isinstance(request.data, Mapping) else {}
        grace = options.get("gracePeriodSeconds")
        if grace is None and "gracePeriodSeconds" in request.params:
            grace = int(request.params["gracePeriodSeconds"])
        preconditions = options.get("preconditions") or {}
        with self._state_lock:
            return self._delete(
                res,
                request.namespace,
                request.name,
                grace,
                preconditions.get("uid"),
                preconditions.get("resourceVersion"),
            )

    async def _serve_watch(self, request: kmock.Request) -> AsyncIterator[kmock.Payload]:
        res = self._resource_of(request)
        match = selector_matcher(str(res.plural), request.params)
        params = request.params
        since = params.get("resourceVersion", "")
        if since not in ("", "0") and not since.isdigit():
            raise bad_request(f"invalid resourceVersion {since!r}")
        timeout = float(params["timeoutSeconds"]) if params.get("timeoutSeconds") else None
        bookmarks = params.get("allowWatchBookmarks") == "true"
        namespace, name = request.namespace, request.name

        def visible(obj: JSON | None) -> bool:
            if obj is None:
                return False
            meta = obj["metadata"]
            return (
                (namespace is None or meta.get("namespace") == namespace)
                and (name is None or meta["name"] == name)
                and match(obj)
            )

        stream = _LiveStream(asyncio.Event(), request)
        self._live_streams.add(stream)
        try:
            yield b""  # send the headers now, as the API server does
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout if timeout else None
            with self._state_lock:
                if since in ("", "0"):
                    initial = [o for o in self._current(res, None) if visible(o)]
                    last = self._current_rv
                else:
                    initial, last = [], int(since)
            for obj in initial:
                yield {"type": "ADDED", "object": obj}
            next_bookmark = loop.time() + self.bookmark_interval_s
            while not stream.closed:
                stream.wake.clear()
                with self._state_lock:
                    expired = last < self._compacted_rv
                    start = bisect.bisect_right(self._history_rvs, last)
                    events = self._history[start:]
                    last = max(last, self._current_rv)
                if expired:
                    yield _expired_event(since)
                    return
                for event in events:
                    if event.resource == res and (out := _watch_view(event, visible)):
                        yield out
                now = loop.time()
                if deadline is not None and now >= deadline:
                    return
                if bookmarks and now >= next_bookmark:
                    yield {
                        "type": "BOOKMARK",
                        "object": {
                            "kind": KINDS.get(str(res.plural), ""),
                            "apiVersion": api_version_of(res),
                            "metadata": {"resourceVersion": str(last)},
                        },
                    }
                    next_bookmark = now + self.bookmark_interval_s
                wake_at = [t for t in (deadline, next_bookmark if bookmarks else None) if t]
                delay = max(0.0, min(wake_at) - now) if wake_at else None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stream.wake.wait(), delay)
            if stream.abrupt:
                _abort(request)
        finally:
            self._live_streams.discard(stream)

    def _serve_log(self, request: kmock.Request) -> kmock.Payload:
        if self._resource_of(request) != PODS or request.name is None:
            raise api_error(404, "NotFound", "the log subresource is served for pods")
        pod = self.get_object(PODS, request.namespace, request.name)
        if pod is None:
            raise not_found(PODS, request.name)
        containers = pod["spec"]["containers"]
        container = request.params.get("container") or containers[0]["name"]
        if container != containers[0]["name"]:
            raise bad_request(
                f"container {container} is not valid for pod {request.name}"
                " (only the first container is emulated)"
            )
        node = pod["spec"].get("nodeName")
        if not node:
            raise bad_request(f"pod {request.name} does not have a host assigned")
        with self._state_lock:
            kubelet = self._kubelets.get(node)
        source = kubelet.log_source(pod["metadata"]["uid"]) if kubelet is not None else None
        if source is None:
            statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
            waiting = (statuses[0].get("state") or {}).get("waiting") or {}
            reason = waiting.get("reason", "ContainerCreating")
            raise bad_request(
                f'container "{container}" in pod "{request.name}" is waiting to start: {reason}'
            )
        path, _ = source
        headers = {"Content-Type": "text/plain"}
        if request.params.get("follow") == "true":
            follow = self._follow_log(request, kubelet, pod["metadata"]["uid"])
            return kmock.Response(headers=headers, payload=follow)
        data = _tail(path.read_bytes(), request.params)
        return kmock.Response(headers=headers, payload=data)

    async def _follow_log(
        self, request: kmock.Request, kubelet: LogSource | None, uid: str
    ) -> AsyncIterator[bytes]:
        stream = _LiveStream(asyncio.Event(), request)
        self._live_streams.add(stream)
        try:
            yield b""
            source = kubelet.log_source(uid) if kubelet is not None else None
            if source is None:
                return
            path = source[0]
            data = _tail(path.read_bytes(), request.params)
            offset = path.stat().st_size
            yield data
            while not stream.closed:
                source = kubelet.log_source(uid) if kubelet is not None else None
                running = source is not None and source[1]
                size = path.stat().st_size if path.exists() else offset
                if size > offset:
                    with path.open("rb") as f:
                        f.seek(offset)
                        chunk = f.read(size - offset)
                    offset = size
                    yield chunk
                elif not running:
                    return
                else:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stream.wake.wait(), LOG_FOLLOW_POLL_S)
                    stream.wake.clear()
            if stream.abrupt:
                _abort(request)
        finally:
            self._live_streams.discard(stream)


_MODIFIED = (
    "the object has been modified; please apply your changes to the latest version and try again"
)
_SERVER_OWNED_META = (
    "name",
    "namespace",
    "uid",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "resourceVersion",
    "generateName",
)


def _header(request: kmock.Request, name: str) -> str | None:
    for key, value in request.headers.items():
        if key.lower() == name.lower():
            return value
    return None


def _abort(request: kmock.Request) -> None:
    raw = request._raw_request
    transport = raw.transport if raw is not None else None
    if transport is not None:
        transport.abort()


def _tail(data: bytes, params: Mapping[str, str]) -> bytes:
    if params.get("tailLines"):
        lines = data.splitlines(keepends=True)
        count = int(params["tailLines"])
        data = b"".join(lines[-count:]) if count > 0 else b""
    if params.get("limitBytes"):
        data = data[: int(params["limitBytes"])]
    return data


def _expired_event(since: str) -> JSON:
    return {
        "type": "ERROR",
        "object": {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": f"too old resource version: {since}",
            "reason": "Expired",
            "code": 410,
        },
    }


def _watch_view(event: WatchEvent, visible: Callable[[JSON | None], bool]) -> JSON | None:
    """The event as a watch with selectors sees it (an object leaving them is DELETED)."""
    if event.type == "ADDED":
        return {"type": "ADDED", "object": event.obj} if visible(event.obj) else None
    if event.type == "DELETED":
        seen = visible(event.old) or visible(event.obj)
        return {"type": "DELETED", "object": event.obj} if seen else None
    was, now = visible(event.old), visible(event.obj)
    if was and now:
        return {"type": "MODIFIED", "object": event.obj}
    if now:
        return {"type": "ADDED", "object": event.obj}
    if was:
        return {"type": "DELETED", "object": event.obj}
    return None
