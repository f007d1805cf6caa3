"""A test kubelet, with a minimal scheduler, for :class:`tests.k8s.emulator.KubeEmulator`.

It runs the first container of each pod bound to its nodes as a real local process
(``command`` + ``args``, ``env``, ``workingDir``; its own session, so its process group can be
signalled; stdout and stderr captured to a file that ``pods/log`` serves) and writes the pod's
status through the emulator (every write a new resourceVersion and a ``MODIFIED`` event), in
the shapes a real kubelet writes:

* ``Pending`` (``waiting.reason: ContainerCreating``), then ``Running``
  (``state.running.startedAt``, ``hostIP``, ``podIP``, ``startTime``, Ready conditions);
* when the process exits: ``Succeeded`` (exit 0) or ``Failed``, with
  ``containerStatuses[0].state.terminated`` = ``exitCode``, ``reason`` (``Completed``,
  ``Error``, ``OOMKilled``, ``StartError``), ``startedAt``, ``finishedAt``; a process killed by
  signal N reports ``exitCode`` 128 + N, as containerd does (no ``signal`` field, as with
  containerd); when the main process exits, what is left of its process group is SIGKILLed, as
  the end of a container's PID namespace does;
* graceful deletion: SIGTERM to the process group (``signal_group=False``: to the main process
  only) when ``deletionTimestamp`` appears, SIGKILL after ``max(deletionGracePeriodSeconds,
  min_grace_s)`` (the kubelet's pod worker never gives less than 1 s), the terminated status,
  then removal of the object (``DELETED``); a shorter second delete brings the SIGKILL
  forward; a pod removed while its process runs (a delete with grace 0) is killed the same way
  with ``min_grace_s``, as recent kubelets do;
* ``spec.activeDeadlineSeconds``: killed as on deletion, ``Failed`` / ``DeadlineExceeded``;
* admission: extended (and other) resources the node advertises in ``status.allocatable`` are
  counted; a pod that does not fit is ``Failed`` with ``reason: OutOf<resource>``;
* ``hostPath`` volumes of type ``DirectoryOrCreate`` are created (no volume is mounted: the
  process sees this host's filesystem);
* image pulls fail for images containing ``image_failure_marker`` (default
  ``"does-not-exist"``) or pods named in :meth:`Kubelet.fail_image`: ``Pending`` with
  ``waiting.reason`` ``ErrImagePull``, then ``ImagePullBackOff``; never run.

The scheduler part binds pods that have no ``spec.nodeName`` (and a ``schedulerName`` in
``scheduler_names``, by default only ``default-scheduler``) to a node a kubelet serves that
matches ``nodeSelector``, required node affinity and allocatable resources:
``spec.nodeName`` is set and condition ``PodScheduled`` is ``True``.  When none fits, the pod
stays ``Pending`` with ``PodScheduled=False``, ``reason: Unschedulable`` and a message in the
scheduler's format (``0/N nodes are available: ...``).  A pod created with ``spec.nodeName``
bypasses the scheduler, as in a cluster: bound to a node no kubelet serves, it stays
``Pending`` with no conditions.

Knobs for what a cluster does to a pod: :meth:`Kubelet.oom_kill`,
:meth:`Kubelet.evict_for_pressure` (node-pressure eviction), :meth:`Kubelet.preempt`
(kube-scheduler preemption), :meth:`Kubelet.lose_node` (node gone, PodGC).

Not emulated: containers other than the first, init and sidecar containers, restarts
(``restartPolicy`` is treated as ``Never``), images (the command runs on this host), probes,
volumes, resource limits (memory is not capped; use :meth:`Kubelet.oom_kill`), PID-1 signal
semantics of a container (see ``signal_group``), Events objects, node heartbeats, the
taint-based eviction of pods on an unreachable node, and PodGC of pods bound to a node that
never existed.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import hashlib
import logging
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import kmock

from tests.k8s.emulator import JSON, NODES, PODS, TERMINAL_PHASES, KubeEmulator, rfc3339

log = logging.getLogger(__name__)

HOST_IP = "127.0.0.1"
NEVER_STARTED = "1970-01-01T00:00:00Z"
UNREACHABLE = "node(s) had untolerated taint {node.kubernetes.io/unreachable: }"
MAX_ERRORS = 20

_SUFFIXES = {
    "n": 1e-9,
    "u": 1e-6,
    "m": 1e-3,
    "": 1.0,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2.0**10,
    "Mi": 2.0**20,
    "Gi": 2.0**30,
    "Ti": 2.0**40,
    "Pi": 2.0**50,
    "Ei": 2.0**60,
}


def parse_quantity(value: str | float) -> float:
    """A Kubernetes quantity (``"2"``, ``"500m"``, ``"4Gi"``) as a number."""
    if isinstance(value, int | float):
        return float(value)
    m = re.fullmatch(r"([+-]?[0-9.]+)([a-zA-Z]*)", value.strip())
    if m is None or m[2] not in _SUFFIXES:
        raise ValueError(f"not a quantity: {value!r}")
    return float(m[1]) * _SUFFIXES[m[2]]


def pod_requests(pod: Mapping[str, Any]) -> dict[str, float]:
    """The pod's resource requests, summed over its containers."""
    totals: dict[str, float] = collections.defaultdict(float)
    for container in pod.get("spec", {}).get("containers") or []:
        for name, value in ((container.get("resources") or {}).get("requests") or {}).items():
            totals[name] += parse_quantity(value)
    return dict(totals)


def is_extended(resource: str) -> bool:
    return "/" in resource and not resource.startswith(("kubernetes.io/", "requests."))


def shortages(
    pod: Mapping[str, Any],
    node: Mapping[str, Any],
    others: Iterable[Mapping[str, Any]],
    *,
    missing_extended_counts: bool,
) -> list[tuple[str, float, float, float]]:
    """``(resource, requested, used, allocatable)`` for each resource ``pod`` does not fit in
    on ``node`` beside ``others``; ``"pods"`` for the pod count."""
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    others = list(others)
    used: dict[str, float] = collections.defaultdict(float)
    for other in others:
        for name, value in pod_requests(other).items():
            used[name] += value
    short: list[tuple[str, float, float, float]] = []
    for name, amount in sorted(pod_requests(pod).items()):
        if amount <= 0:
            continue
        if name not in allocatable:
            if missing_extended_counts and is_extended(name):
                short.append((name, amount, used[name], 0.0))
            continue
        capacity = parse_quantity(allocatable[name])
        if used[name] + amount > capacity:
            short.append((name, amount, used[name], capacity))
    if "pods" in allocatable and len(others) + 1 > parse_quantity(allocatable["pods"]):
        short.append(("pods", 1, len(others), parse_quantity(allocatable["pods"])))
    return short


def _expression_matches(expr: Mapping[str, Any], value: str | None) -> bool:
    op, values = expr.get("operator"), expr.get("values") or []
    if op == "In":
        return value is not None and value in values
    if op == "NotIn":
        return value is None or value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and values:
        try:
            number, bound = int(value), int(values[0])
        except ValueError:
            return False
        return number > bound if op == "Gt" else number < bound
    return False


def node_matches(pod: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Whether ``node`` satisfies the pod's ``nodeSelector`` and required node affinity."""
    labels = node["metadata"].get("labels") or {}
    spec = pod.get("spec") or {}
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    required = (
        ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        or {}
    ).get("nodeSelectorTerms") or []
    if not required:
        return True
    fields = {"metadata.name": node["metadata"]["name"]}
    return any(
        all(_expression_matches(e, labels.get(e["key"])) for e in t.get("matchExpressions") or [])
        and all(_expression_matches(e, fields.get(e["key"])) for e in t.get("matchFields") or [])
        for t in required
    )


def set_condition(
    status: JSON, type_: str, value: str, reason: str | None = None, message: str | None = None
) -> None:
    """Insert or update a condition; ``lastTransitionTime`` moves only when ``status`` does."""
    conditions = status.setdefault("conditions", [])
    for condition in conditions:
        if condition["type"] == type_:
            if condition.get("status") != value:
                condition["lastTransitionTime"] = rfc3339()
            condition["status"] = value
            break
    else:
        condition = {"type": type_, "status": value, "lastTransitionTime": rfc3339()}
        conditions.append(condition)
    for key, text in (("reason", reason), ("message", message)):
        if text is None:
            condition.pop(key, None)
        else:
            condition[key] = text


def group_pids(pgid: int) -> list[int]:
    """Live (not zombie) processes in process group ``pgid``."""
    if not os.path.isdir("/proc"):
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [pgid]
    found: list[int] = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            found.append(int(entry.name))
    return sorted(found)


def _rss_ki(pids: Iterable[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, ValueError, IndexError):
            pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
            total += pages * os.sysconf("SC_PAGE_SIZE") // 1024
    return total


_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Expand ``$(VAR)`` from the container's env as the kubelet does (``$$`` is ``$``)."""
    return _REFERENCE.sub(lambda m: "$" if m[0] == "$$" else env.get(m[1], m[0]), text)


@dataclass(eq=False)
class _Run:
    """What the kubelet knows of one pod (by uid) it admitted."""

    uid: str
    namespace: str
    name: str
    node: str
    container: str
    image: str
    log_path: Path
    workdir: Path
    state: str = "new"  # waiting (image), running, exited (reaping its group), done
    popen: subprocess.Popen[bytes] | None = None
    pgid: int | None = None
    container_id: str = ""
    started_at: str | None = None
    started_mono: float = 0.0
    finished_at: str | None = None
    waiting_reason: str = ""
    waiting_since: float = 0.0
    term_started: float | None = None
    kill_at: float | None = None
    killed: bool = False
    exit_code: int | None = None
    forced_reason: str | None = None
    pod_reason: tuple[str, str] | None = None
    disruption: tuple[str, str] | None = None
    active_deadline_s: float | None = None
    grace_s: int = 30
    removed: bool = False
    log_ready: bool = False


class Kubelet:
    """Runs the pods bound to ``nodes`` as local processes; see the module docstring.

    ``poll_interval_s``: how often processes are polled (seconds); ``min_grace_s``: the least
    time between SIGTERM and SIGKILL (seconds); ``image_backoff_s``: time from
    ``ErrImagePull`` to ``ImagePullBackOff`` (seconds).
    """

    def __init__(
        self,
        emulator: KubeEmulator,
        nodes: Iterable[str] = ("gpu-0",),
        *,
        poll_interval_s: float = 0.02,
        min_grace_s: float = 1.0,
        image_failure_marker: str = "does-not-exist",
        image_backoff_s: float = 0.3,
        signal_group: bool = True,
        scheduler_names: Iterable[str] = ("default-scheduler",),
    ) -> None:
        self.emulator = emulator
        self.poll_interval_s = poll_interval_s
        self.min_grace_s = min_grace_s
        self.image_failure_marker = image_failure_marker
        self.image_backoff_s = image_backoff_s
        self.signal_group = signal_group
        self.scheduler_names = frozenset(scheduler_names)
        self.errors: list[str] = []
        self._initial_nodes = list(nodes)
        self._nodes: set[str] = set()
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._runs: dict[str, _Run] = {}
        self._failing: set[tuple[str, str]] = set()
        self._root: Path | None = None
        self._seen_rv = -1

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> Self:
        """Register the nodes (creating their Node objects) and start the kubelet thread."""
        self._root = Path(tempfile.mkdtemp(prefix="test-kubelet-"))
        self.emulator.subscribe(self._wake.set)
        for node in self._initial_nodes:
            self.add_node(node)
        self._thread = threading.Thread(target=self._loop, name="test-kubelet", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the thread, SIGKILL and reap every process, detach from the emulator."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(30)
            if self._thread.is_alive():
                raise RuntimeError("the test kubelet's thread did not stop within 30 s")
            self._thread = None
        self.emulator.unsubscribe(self._wake.set)
        with self._lock:
            for run in self._runs.values():
                if run.popen is not None and run.pgid is not None:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(run.pgid, signal.SIGKILL)
                    run.popen.wait(10)
            nodes, self._nodes = set(self._nodes), set()
        for node in nodes:
            self.emulator.detach_kubelet(node)
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def add_node(
        self,
        name: str,
        *,
        labels: Mapping[str, str] | None = None,
        allocatable: Mapping[str, str] | None = None,
    ) -> None:
        """Serve node ``name`` too (creating its Node object, Ready, if absent)."""
        self.emulator.add_node(name, labels=labels, allocatable=allocatable)
        with self._lock:
            self._nodes.add(name)
        self.emulator.attach_kubelet(name, self)
        self._wake.set()

    @property
    def nodes(self) -> set[str]:
        with self._lock:
            return set(self._nodes)

    # -- what tests look at ---------------------------------------------------------------------

    def pgid(self, pod_name: str, namespace: str = "default") -> int | None:
        """The process group of the pod's container (None if it never started)."""
        with self._lock:
            run = self._find(pod_name, namespace)
            return run.pgid if run is not None else None

    def pids(self, pod_name: str, namespace: str = "default") -> list[int]:
        """The live processes of the pod's container (its process group)."""
        pgid = self.pgid(pod_name, namespace)
        return group_pids(pgid) if pgid is not None else []

    def processes_gone(self, pod_name: str, namespace: str = "default") -> bool:
        """Whether no process of the pod's container is left (True if it never started)."""
        return not self.pids(pod_name, namespace)

    def log_source(self, uid: str) -> tuple[Path, bool] | None:
        """The pod's captured output and whether its container still runs (for pods/log)."""
        with self._lock:
            run = self._runs.get(uid)
            if run is None or not run.log_ready:
                return None
            return run.log_path, run.state in ("running", "exited")

    # -- knobs ----------------------------------------------------------------------------------

    def fail_image(self, pod_name: str, namespace: str = "default") -> None:
        """Make the image pull of pod ``pod_name`` (created later) fail."""
        with self._lock:
            self._failing.add((namespace, pod_name))

    def oom_kill(self, pod_name: str, namespace: str = "default") -> None:
        """The kernel OOM-kills the container: SIGKILL, ``OOMKilled``, exit code 137."""
        with self._lock:
            run = self._running(pod_name, namespace)
            run.forced_reason = "OOMKilled"
            self._signal(run, signal.SIGKILL, group=True)
        self._wake.set()

    def evict_for_pressure(
        self, pod_name: str, namespace: str = "default", resource: str = "memory"
    ) -> None:
        """Node-pressure eviction: SIGTERM, SIGKILL after ``min_grace_s`` (a hard eviction's
        1 s), then ``Failed``, ``reason: Evicted``, DisruptionTarget ``TerminationByKubelet``."""
        with self._lock:
            run = self._running(pod_name, namespace)
            used = _rss_ki(group_pids(run.pgid)) if run.pgid is not None else 0
            message = (
                f"The node was low on resource: {resource}. Threshold quantity: 100Mi,"
                f" available: 51200Ki. Container {run.container} was using {used}Ki, request is"
                f" 0, has larger consumption of {resource}. "
            )
            run.pod_reason = ("Evicted", message)
            run.disruption = ("TerminationByKubelet", message)
            self._terminate(run, self.min_grace_s)
        self._wake.set()

    def preempt(
        self, pod_name: str, namespace: str = "default", preemptor: str = "default/high-priority"
    ) -> None:
        """kube-scheduler preemption: DisruptionTarget ``PreemptionByScheduler``, then a
        graceful delete with the pod's grace period."""
        message = f"{preemptor}: preempting to accommodate a higher priority pod"

        def mark(pod: JSON) -> None:
            status = pod.setdefault("status", {})
            set_condition(status, "DisruptionTarget", "True", "PreemptionByScheduler", message)

        if self.emulator.mutate(PODS, namespace, pod_name, mark) is None:
            raise KeyError(f"no pod {namespace}/{pod_name}")
        self.emulator.delete_object(PODS, namespace, pod_name)

    def lose_node(self, node: str) -> None:
        """The node is gone: its processes die, its Node object is deleted, and PodGC marks its
        pods (DisruptionTarget ``DeletionByPodGC``, ``Failed``) and removes them."""
        with self._lock:
            self._nodes.discard(node)
            for run in self._runs.values():
                if run.node == node:
                    run.removed = True
                    if run.state == "running":
                        self._signal(run, signal.SIGKILL, group=True)
                    elif run.state == "waiting":
                        run.state = "done"
        self.emulator.detach_kubelet(node)
        with contextlib.suppress(kmock.KubernetesError):
            self.emulator.delete_object(NODES, None, node)

        def mark(pod: JSON) -> None:
            status = pod.setdefault("status", {})
            if status.get("phase") not in TERMINAL_PHASES:
                status["phase"] = "Failed"
            message = "PodGC: node no longer exists"
            set_condition(status, "DisruptionTarget", "True", "DeletionByPodGC", message)

        for pod in self.emulator.list_objects(PODS, field_selector=f"spec.nodeName={node}"):
            meta = pod["metadata"]
            self.emulator.mutate(PODS, meta["namespace"], meta["name"], mark, uid=meta["uid"])
            with contextlib.suppress(kmock.KubernetesError):
                self.emulator.delete_object(
                    PODS, meta["namespace"], meta["name"], grace_period_seconds=0, uid=meta["uid"]
                )
        self._wake.set()

    # -- the loop -------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(self.poll_interval_s)
            self._wake.clear()
            if self._stopping.is_set():
                break
            try:
                with self._lock:
                    self._tick()
            except Exception:
                log.exception("test kubelet tick failed")
                if len(self.errors) < MAX_ERRORS:
                    self.errors.append(traceback.format_exc())

    def _tick(self) -> None:
        rv = self.emulator.resource_version
        if rv != self._seen_rv:
            self._seen_rv = rv
            pods = self.emulator.list_objects(PODS)
            self._schedule(pods)
            self._sync(pods)
        self._poll()

    def _schedule(self, pods: list[JSON]) -> None:
        nodes = sorted(self.emulator.list_objects(NODES), key=lambda n: n["metadata"]["name"])
        served = self.emulator.kubelet_nodes()
        bound: dict[str, list[JSON]] = collections.defaultdict(list)
        for pod in pods:
            node = pod["spec"].get("nodeName")
            if node and pod.get("status", {}).get("phase") not in TERMINAL_PHASES:
                bound[node].append(pod)
        for pod in pods:
            spec, meta = pod["spec"], pod["metadata"]
            if (
                spec.get("nodeName")
                or meta.get("deletionTimestamp")
                or spec.get("schedulerName", "default-scheduler") not in self.scheduler_names
                or pod.get("status", {}).get("phase", "Pending") != "Pending"
            ):
                continue
            reasons: collections.Counter[str] = collections.Counter()
            chosen: str | None = None
            for node in nodes:
                name = node["metadata"]["name"]
                if name not in served:
                    reasons[UNREACHABLE] += 1
                elif (node.get("spec") or {}).get("unschedulable"):
                    reasons["node(s) were unschedulable"] += 1
                elif not node_matches(pod, node):
                    reasons["node(s) didn't match Pod's node affinity/selector"] += 1
                elif short := shortages(pod, node, bound[name], missing_extended_counts=True):
                    for resource, *_ in short:
                        reasons[
                            "Too many pods" if resource == "pods" else f"Insufficient {resource}"
                        ] += 1
                else:
                    chosen = name
                    break
            if chosen is not None:
                self._bind(pod, chosen)
                bound[chosen].append(pod)
                continue
            if nodes:
                parts = sorted(f"{count} {reason}" for reason, count in reasons.items())
                message = f"0/{len(nodes)} nodes are available: {', '.join(parts)}."
            else:
                message = "no nodes available to schedule pods"
            self.emulator.mutate(
                PODS,
                meta["namespace"],
                meta["name"],
                lambda p, m=message: set_condition(
                    p.setdefault("status", {}), "PodScheduled", "False", "Unschedulable", m
                ),
                uid=meta["uid"],
            )

    def _bind(self, pod: JSON, node: str) -> None:
        def bind(p: JSON) -> None:
            if not p["spec"].get("nodeName"):
                p["spec"]["nodeName"] = node
                set_condition(p.setdefault("status", {}), "PodScheduled", "True")

        meta = pod["metadata"]
        self.emulator.mutate(PODS, meta["namespace"], meta["name"], bind, uid=meta["uid"])

    def _sync(self, pods: list[JSON]) -> None:
        present: set[str] = set()
        for pod in pods:
            if pod["spec"].get("nodeName") not in self._nodes:
                continue
            uid = pod["metadata"]["uid"]
            present.add(uid)
            run = self._runs.get(uid)
            if run is None:
                self._admit(pod)
            else:
                self._follow(run, pod)
        for uid, run in self._runs.items():
            if uid not in present and not run.removed:
                self._orphan(run)

    def _admit(self, pod: JSON) -> None:
        meta, spec = pod["metadata"], pod["spec"]
        if pod.get("status", {}).get("phase") in TERMINAL_PHASES:
            return
        if meta.get("deletionTimestamp"):
            self._remove(meta["namespace"], meta["name"], meta["uid"])
            return
        node = self.emulator.get_object(NODES, None, spec["nodeName"]) or {}
        admitted = [
            self.emulator.get_object(PODS, r.namespace, r.name) or {}
            for r in self._runs.values()
            if r.node == spec["nodeName"] and r.state != "done" and not r.removed
        ]
        if short := shortages(pod, node, admitted, missing_extended_counts=False):
            resource, requested, used, capacity = short[0]
            message = (
                f"Pod was rejected: Node didn't have enough resource: {resource}, requested:"
                f" {requested:g}, used: {used:g}, capacity: {capacity:g}"
            )

            def reject(p: JSON) -> None:
                status = p.setdefault("status", {})
                status.update(phase="Failed", reason=f"OutOf{resource}", message=message)

            self.emulator.mutate(PODS, meta["namespace"], meta["name"], reject, uid=meta["uid"])
            return
        container = spec["containers"][0]
        assert self._root is not None
        folder = self._root / meta["uid"]
        folder.mkdir(parents=True, exist_ok=True)
        run = _Run(
            uid=meta["uid"],
            namespace=meta["namespace"],
            name=meta["name"],
            node=spec["nodeName"],
            container=container["name"],
            image=container["image"],
            log_path=folder / "container.log",
            workdir=folder / "work",
            grace_s=int(spec.get("terminationGracePeriodSeconds", 30)),
        )
        if spec.get("activeDeadlineSeconds") is not None:
            run.active_deadline_s = float(spec["activeDeadlineSeconds"])
        self._runs[run.uid] = run
        if (self.image_failure_marker and self.image_failure_marker in run.image) or (
            run.namespace,
            run.name,
        ) in self._failing:
            run.state = "waiting"
            run.waiting_since = time.monotonic()
            self._post_waiting(run, "ErrImagePull", _pull_error(run.image))
            return
        self._post_waiting(run, "ContainerCreating", None)
        self._start(run, pod)

    def _follow(self, run: _Run, pod: JSON) -> None:
        meta = pod["metadata"]
        if not meta.get("deletionTimestamp"):
            return
        if run.state in ("waiting", "done"):
            run.state = "done"
            self._remove(run.namespace, run.name, run.uid)
        elif run.state == "running":
            grace = int(meta.get("deletionGracePeriodSeconds", 0))
            self._terminate(run, max(float(grace), self.min_grace_s))

    def _orphan(self, run: _Run) -> None:
        run.removed = True
        if run.state == "running":
            self._terminate(run, self.min_grace_s)
        elif run.state == "waiting":
            run.state = "done"

    def _terminate(self, run: _Run, budget_s: float) -> None:
        """SIGTERM now (once) and SIGKILL after ``budget_s`` seconds (only ever sooner)."""
        now = time.monotonic()
        if run.term_started is None:
            run.term_started = now
            run.kill_at = now + budget_s
            self._signal(run, signal.SIGTERM, group=self.signal_group)
        elif run.kill_at is not None:
            run.kill_at = min(run.kill_at, now + budget_s)

    def _poll(self) -> None:
        now = time.monotonic()
        for run in list(self._runs.values()):
            if run.state == "waiting":
                backoff_due = now - run.waiting_since >= self.image_backoff_s
                if run.waiting_reason == "ErrImagePull" and backoff_due and not run.removed:
                    self._post_waiting(
                        run, "ImagePullBackOff", f'Back-off pulling image "{run.image}"'
                    )
            if run.state == "running":
                self._poll_running(run, now)
            if run.state == "exited":
                pids = group_pids(run.pgid) if run.pgid is not None else []
                if pids:
                    self._signal(run, signal.SIGKILL, group=True)
                    continue
                run.state = "done"
                self._post_terminated(run)

    def _poll_running(self, run: _Run, now: float) -> None:
        assert run.popen is not None
        if (
            run.active_deadline_s is not None
            and run.pod_reason is None
            and now - run.started_mono >= run.active_deadline_s
        ):
            message = "Pod was active on the node longer than the specified deadline"
            run.pod_reason = ("DeadlineExceeded", message)
            self._terminate(run, max(float(run.grace_s), self.min_grace_s))
        if run.kill_at is not None and now >= run.kill_at and not run.killed:
            run.killed = True
            self._signal(run, signal.SIGKILL, group=True)
        code = run.popen.poll()
        if code is None:
            return
        run.exit_code = 128 - code if code < 0 else code
        run.finished_at = rfc3339()
        run.state = "exited"
        self._signal(run, signal.SIGKILL, group=True)

    # -- actions --------------------------------------------------------------------------------

    def _signal(self, run: _Run, sig: signal.Signals, *, group: bool) -> None:
        if run.pgid is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if group:
                os.killpg(run.pgid, sig)
            elif run.popen is not None and run.popen.returncode is None:
                run.popen.send_signal(sig)

    def _start(self, run: _Run, pod: JSON) -> None:
        container = pod["spec"]["containers"][0]
        env = self._env(pod, container)
        argv = [expand(str(a), env) for a in container.get("command") or []]
        argv += [expand(str(a), env) for a in container.get("args") or []]
        cwd = Path(container["workingDir"]) if container.get("workingDir") else run.workdir
        for volume in pod["spec"].get("volumes") or []:
            host_path = volume.get("hostPath") or {}
            if host_path.get("type") == "DirectoryOrCreate":
                Path(host_path["path"]).mkdir(parents=True, exist_ok=True)
        run.container_id = "containerd://" + uuid.uuid4().hex + uuid.uuid4().hex
        run.log_path.touch()
        run.log_ready = True
        failure: str | None = None
        if not argv:
            failure = "no command specified (the test kubelet runs only command and args)"
        else:
            try:
                cwd.mkdir(parents=True, exist_ok=True)
                with run.log_path.open("ab") as out:
                    run.popen = subprocess.Popen(
                        argv,
                        env={
                            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                            "HOME": os.environ.get("HOME", "/root"),
                            "HOSTNAME": run.name,
                            **env,
                        },
                        cwd=cwd,
                        stdin=subprocess.DEVNULL,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
            except OSError as exc:
                failure = (
                    "failed to create containerd task: failed to create shim task: OCI runtime"
                    " create failed: runc create failed: unable to start container process:"
                    f' exec: "{argv[0]}": {exc.strerror or exc}: unknown'
                )
        if failure is not None or run.popen is None:
            run.exit_code = 128
            run.forced_reason = "StartError"
            run.pod_reason = None
            run.finished_at = rfc3339()
            run.state = "done"
            self._post_terminated(run, message=failure)
            return
        run.pgid = run.popen.pid
        run.started_at = rfc3339()
        run.started_mono = time.monotonic()
        run.state = "running"
        self._post_running(run)

    def _env(self, pod: JSON, container: JSON) -> dict[str, str]:
        env: dict[str, str] = {}
        namespace = pod["metadata"]["namespace"]
        for item in container.get("env") or []:
            name = item["name"]
            source = item.get("valueFrom") or {}
            if "value" in item:
                env[name] = expand(str(item.get("value") or ""), env)
            elif field_ref := source.get("fieldRef"):
                env[name] = _field_ref(pod, field_ref["fieldPath"])
            elif ref := source.get("configMapKeyRef"):
                config = self.emulator.get_object("configmaps", namespace, ref["name"]) or {}
                env[name] = str((config.get("data") or {}).get(ref["key"], ""))
            elif ref := source.get("secretKeyRef"):
                secret = self.emulator.get_object("secrets", namespace, ref["name"]) or {}
                raw = (secret.get("data") or {}).get(ref["key"])
                env[name] = base64.b64decode(raw).decode() if raw else ""
            else:
                env[name] = ""
        return env

    def _remove(self, namespace: str, name: str, uid: str) -> None:
        """The kubelet's final delete (grace 0, uid precondition) once nothing runs."""
        with contextlib.suppress(kmock.KubernetesError):
            self.emulator.delete_object(PODS, namespace, name, grace_period_seconds=0, uid=uid)

    # -- statuses -------------------------------------------------------------------------------

    def _post(self, run: _Run, change: Callable[[JSON], None]) -> JSON | None:
        if run.removed:
            return None
        pod = self.emulator.mutate(PODS, run.namespace, run.name, change, uid=run.uid)
        if pod is None:
            run.removed = True
        return pod

    def _common(self, status: JSON) -> None:
        status["hostIP"] = HOST_IP
        status["hostIPs"] = [{"ip": HOST_IP}]
        status.setdefault("startTime", rfc3339())
        if not any(c["type"] == "PodScheduled" for c in status.get("conditions") or []):
            set_condition(status, "PodScheduled", "True")

    def _container_status(
        self, run: _Run, state: JSON, *, ready: bool, started: bool, pulled: bool = True
    ) -> JSON:
        image_id = f"{run.image}@sha256:{hashlib.sha256(run.image.encode()).hexdigest()}"
        status: JSON = {
            "name": run.container,
            "image": run.image,
            "imageID": image_id if pulled else "",
            "ready": ready,
            "started": started,
            "restartCount": 0,
            "state": state,
            "lastState": {},
        }
        if run.container_id and pulled:
            status["containerID"] = run.container_id
        return status

    def _post_waiting(self, run: _Run, reason: str, message: str | None) -> None:
        run.waiting_reason = reason
        waiting: JSON = {"reason": reason}
        if message is not None:
            waiting["message"] = message
        unready = f"containers with unready status: [{run.container}]"
        sandbox = "False" if reason == "ContainerCreating" else "True"

        def change(pod: JSON) -> None:
            status = pod.setdefault("status", {})
            status["phase"] = "Pending"
            self._common(status)
            set_condition(status, "PodReadyToStartContainers", sandbox)
            set_condition(status, "Initialized", "True")
            set_condition(status, "Ready", "False", "ContainersNotReady", unready)
            set_condition(status, "ContainersReady", "False", "ContainersNotReady", unready)
            status["containerStatuses"] = [
                self._container_status(
                    run, {"waiting": waiting}, ready=False, started=False, pulled=False
                )
            ]

        self._post(run, change)

    def _post_running(self, run: _Run) -> None:
        def change(pod: JSON) -> None:
            status = pod.setdefault("status", {})
            status["phase"] = "Running"
            self._common(status)
            status["podIP"] = HOST_IP
            status["podIPs"] = [{"ip": HOST_IP}]
            for type_ in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady"):
                set_condition(status, type_, "True")
            state = {"running": {"startedAt": run.started_at}}
            status["containerStatuses"] = [
                self._container_status(run, state, ready=True, started=True)
            ]

        self._post(run, change)

    def _post_terminated(self, run: _Run, message: str | None = None) -> None:
        code = run.exit_code if run.exit_code is not None else 137
        reason = run.forced_reason or ("Completed" if code == 0 else "Error")
        failed = code != 0 or run.pod_reason is not None
        phase = "Failed" if failed else "Succeeded"
        terminated: JSON = {
            "exitCode": code,
            "reason": reason,
            "startedAt": run.started_at or NEVER_STARTED,
            "finishedAt": run.finished_at or rfc3339(),
        }
        if run.container_id:
            terminated["containerID"] = run.container_id
        if message is not None:
            terminated["message"] = message
        done = "PodFailed" if failed else "PodCompleted"

        def change(pod: JSON) -> None:
            status = pod.setdefault("status", {})
            status["phase"] = phase
            self._common(status)
            if run.pod_reason is not None:
                status["reason"], status["message"] = run.pod_reason
            if run.disruption is not None:
                set_condition(status, "DisruptionTarget", "True", *run.disruption)
            set_condition(status, "PodReadyToStartContainers", "False")
            set_condition(status, "Initialized", "True", None if failed else "PodCompleted")
            set_condition(status, "Ready", "False", done)
            set_condition(status, "ContainersReady", "False", done)
            status["containerStatuses"] = [
                self._container_status(run, {"terminated": terminated}, ready=False, started=False)
            ]

        pod = self._post(run, change)
        if pod is not None and pod["metadata"].get("deletionTimestamp"):
            self._remove(run.namespace, run.name, run.uid)

    # -- lookups --------------------------------------------------------------------------------

    def _find(self, pod_name: str, namespace: str) -> _Run | None:
        found = [r for r in self._runs.values() if (r.namespace, r.name) == (namespace, pod_name)]
        return found[-1] if found else None

    def _running(self, pod_name: str, namespace: str) -> _Run:
        run = self._find(pod_name, namespace)
        if run is None or run.state != "running":
            raise KeyError(f"pod {namespace}/{pod_name} is not running under this kubelet")
        return run


def _pull_error(image: str) -> str:
    return (
        f'failed to pull and unpack image "{image}": failed to resolve reference "{image}":'
        f" {image}: not found"
    )


def _field_ref(pod: JSON, path: str) -> str:
    meta, spec = pod["metadata"], pod["spec"]
    if m := re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path):
        return str((meta.get(m[1]) or {}).get(m[2], ""))
    values = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.hostIP": HOST_IP,
        "status.podIP": HOST_IP,
    }
    return str(values.get(path) or "")
