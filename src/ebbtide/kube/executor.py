"""The Kubernetes executor: each attempt is a pod on this agent's node.

(Longer than our modules should be: it is one backend behind the executor interface, and
each verb (start, warn, kill, observe, logs, leftovers) acts on the same pods and handles;
pods' manifests (``pods``), resource profiles (``profiles``), the watch (``watch``) and
outcomes (``outcome``) already stand alone.)

The node agent (a DaemonSet pod with NVML and the host's PID namespace) creates the pod
of each attempt it is sent, watches it (:mod:`ebbtide.kube.watch`), warns it and takes it
down.  The agent's loop is the same as with local processes; only the verbs differ:

- **start**: the job's slice is turned into the node's resource profile's resources
  (:mod:`ebbtide.kube.profiles`) and the pod (:mod:`ebbtide.kube.pods`) is created.  An
  API server that does not answer defers the start (the job is requeued, not failed).
- **warn**: a delete with ``gracePeriodSeconds`` = what is left of the eviction deadline
  less ``grace_margin_s`` (detection and API latency), with a UID precondition so a pod of
  the same name is never hit (as Koordinator's koordlet evicts).  The kubelet sends
  SIGTERM now and SIGKILL at the end of the grace period — so, as the shim does for local
  processes, the node itself kills the attempt by the deadline even if the agent cannot.
- **kill** (the deadline, a sweep): a delete with grace 0.
- **observe**: the watcher's last state of the pod, read by :func:`~.outcome.exit_of`.  The
  slice counts as free only when the pod's processes are gone from the host (looked up
  through ``/proc/PID/cgroup``), not when the API says the pod is terminated.
- **logs**: the container's log is copied into the attempt's ``stdout.log`` when its end
  is observed, so ``ebb logs`` reads it as it reads a local attempt's.

On Kubernetes an attempt has no lease: a pod outlives its agent.  A restarted agent
delivers the outcome of what its previous incarnation's pods did meanwhile and deletes
those still running (:meth:`KubernetesExecutor.reap_leftovers`), as a restarted local
agent kills the shims it finds.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes.client.exceptions import ApiException

from ebbtide.errors import PlatformUnavailable
from ebbtide.kube.outcome import exit_of
from ebbtide.kube.pods import (
    LABEL_ATTEMPT,
    LABEL_JOB,
    LABEL_NODE,
    PodRequest,
    label_value,
    pod_manifest,
)
from ebbtide.kube.profiles import profile_named
from ebbtide.kube.watch import PodWatcher, wait_until
from ebbtide.workers.cgroups import pod_markers, pod_uids, read_cgroup
from ebbtide.workers.executor import Exit, Handle, Launch, Leftover, StartDeferred
from ebbtide.workers.ownership import Tree

log = logging.getLogger("ebbtide.kube.executor")

#: Where the host's cgroup tree is, first found: the DaemonSet's mount, else this host's.
HOST_CGROUP_ROOTS = (Path("/host/sys/fs/cgroup"), Path("/sys/fs/cgroup"))
#: How long a sweep waits for a pod's processes to be gone, in seconds.
SWEEP_WAIT_S = 2.0
#: How long a starting agent waits for its leftover pods' processes to be gone, in s.
LEFTOVER_WAIT_S = 10.0
#: The longest one API call may take before it counts as failed, in seconds: the agent's
#: loop makes them, and must go on keeping deadlines if the API server hangs.
API_TIMEOUT_S = 5.0
#: A pod labelled for this node that no attempt holds for this long is deleted, in s.
ORPHAN_AFTER_S = 30.0
#: How often the spare capacity is advertised in the node's status (``direct``), in s.
ADVERTISE_PERIOD_S = 10.0
#: The extended resources the agent advertises: percent of a GPU's SMs, and MiB.
RESOURCE_CORE = "ebbtide.io/gpu-core"
RESOURCE_MEMORY = "ebbtide.io/gpu-memory"


@dataclass
class PodHandle(Handle):
    """An attempt's pod."""

    name: str = ""
    namespace: str = ""
    uid: str = ""
    #: ``time.monotonic()`` when it was created (for the start timeout)
    created_mono: float = 0.0
    stdout_path: Path | None = None
    #: ``time.monotonic()`` by which the attempt must be gone (``kill_at``)
    kill_at_mono: float | None = None
    #: ebbtide asked for its deletion (a warning or a kill)
    deleting: bool = False
    #: its container log is being (or has been) copied to ``stdout_path`` for good
    logs_saved: bool = False
    log_final_written: bool = False
    log_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    log_thread: threading.Thread | None = field(default=None, repr=False)


def processes_gone(uid: str, proc: Path = Path("/proc")) -> bool:
    """Whether no process on this host belongs to the pod with ``uid`` (the agent shares
    the host's PID namespace, so it sees the pod's processes and their cgroups)."""
    for entry in proc.iterdir():
        if entry.name.isdigit() and uid in pod_uids(read_cgroup(int(entry.name), proc) or ""):
            return False
    return True


class KubernetesExecutor:
    """Runs attempts as pods on ``node`` through ``core`` (a ``CoreV1Api``).

    ``settings`` is the policy's ``kubernetes:`` section; ``profile`` overrides its
    resource profile for this node.  ``queue_settings`` maps a queue to its own
    ``image`` / ``checkpoint_claim`` defaults and ``tolerations``.  ``gone`` tells
    whether a pod's processes have left the host (default: a look through ``/proc``,
    :func:`processes_gone`; tests give their kubelet's).
    """

    inherit_env = False
    #: a pod is paused by its cgroup v2 freezer, else by SIGSTOP to its processes
    can_pause = True

    def __init__(
        self,
        core: Any,
        settings: Any,
        *,
        node: str,
        profile: str | None = None,
        queue_settings: Mapping[str, Any] | None = None,
        gone: Callable[[PodHandle], bool] | None = None,
        watcher: PodWatcher | None = None,
        cgroup_root: Path | None = None,
        proc: Path = Path("/proc"),
    ) -> None:
        self.core = core
        self.settings = settings
        self.node = node
        self.profile_name = profile or settings.profile
        self.profile = profile_named(self.profile_name, settings)
        self.queue_settings = dict(queue_settings or {})
        self.namespace: str = settings.namespace
        self._gone = gone or (lambda handle: processes_gone(handle.uid))
        #: the host's cgroup tree (the DaemonSet mounts it at /host/sys/fs/cgroup)
        self.cgroup_root = cgroup_root or next(
            (p for p in HOST_CGROUP_ROOTS if p.is_dir()), HOST_CGROUP_ROOTS[-1]
        )
        self.proc = proc
        self.watcher = watcher or PodWatcher(
            core, self.namespace, f"{LABEL_NODE}={label_value(node)}"
        )
        self._started = False
        self._spare: dict[str, str] | None = None
        self._advertised: dict[str, str] | None = None
        self._stop = threading.Event()
        self._advertiser: threading.Thread | None = None
        self._pod_names: dict[str, str] = {}
        #: the pods this agent holds (created, not yet swept): any other pod labelled for
        #: this node is an orphan (a create that timed out but happened, a failed delete)
        self._live: set[str] = set()
        self._first_seen: dict[str, float] = {}

    def open(self) -> None:
        """List this node's pods and start watching them (before the first start)."""
        if not self._started:
            try:
                self.watcher.sync()
            except Exception as exc:
                host = getattr(getattr(self.core.api_client, "configuration", None), "host", "?")
                why = getattr(exc, "reason", None) or exc
                raise PlatformUnavailable(
                    f"cannot reach the Kubernetes API server at {host}: {str(why)[:300]}"
                ) from None
            self._started = True
            self.watcher.start()
            self._advertiser = threading.Thread(
                target=self._node_loop, name="node-status", daemon=True
            )
            self._advertiser.start()

    def close(self) -> None:
        self._stop.set()
        self.watcher.stop()
        if self._advertiser is not None:
            self._advertiser.join(2.0)

    # -- the node's spare capacity (direct mode) ----------------------------------------

    def advertise(self, devices: list[dict[str, Any]]) -> None:
        """Take the heartbeat's device reports: the node's spare capacity (headroom less
        the forecast reserve, on healthy devices) is patched into its status as the
        extended resources ``ebbtide.io/gpu-core`` and ``ebbtide.io/gpu-memory``, so
        quotas and the kube-scheduler see it (as Koordinator's batch resources do).  The
        patch happens on a thread of its own, every ``ADVERTISE_PERIOD_S``."""
        self._spare = spare_capacity(devices)

    def _node_loop(self) -> None:
        while True:
            self.refresh_pod_names()
            self.sweep_orphans()
            if self._stop.wait(ADVERTISE_PERIOD_S):
                return
            if self.profile_name == "direct":
                self.advertise_now()

    def sweep_orphans(self, now: float | None = None) -> list[str]:
        """Delete the pods labelled for this node that no attempt here holds and that have
        been seen for ``ORPHAN_AFTER_S`` (never one being created): a create that timed
        out on the way back, a delete that failed.  Returns their names."""
        now = time.monotonic() if now is None else now
        names = set(self.watcher.names())
        for name in list(self._first_seen):
            if name not in names:
                del self._first_seen[name]
        orphans = []
        for name in sorted(names - self._live):
            first = self._first_seen.setdefault(name, now)
            seen = self.watcher.get(name)
            if seen is None or now - first < ORPHAN_AFTER_S:
                continue
            uid = (seen.pod.get("metadata") or {}).get("uid")
            log.warning("deleting pod %s: no attempt on this node holds it", name)
            self._delete(name, uid, 0)
            orphans.append(name)
        return orphans

    # -- which online pod a GPU process is in -------------------------------------------

    def pod_name_of(self, uid: str) -> str | None:
        """``namespace/name`` of the pod with ``uid`` on this node, as last listed (every
        ``ADVERTISE_PERIOD_S``); None when unknown.  For ``ebb nodes -f``."""
        return self._pod_names.get(uid)

    def refresh_pod_names(self) -> None:
        try:
            listing = self.core.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={self.node}", _request_timeout=API_TIMEOUT_S
            )
        except Exception as exc:
            log.debug("listing the pods of node %s failed: %s", self.node, exc)
            return
        self._pod_names = {
            p.metadata.uid: f"{p.metadata.namespace}/{p.metadata.name}" for p in listing.items
        }

    def advertise_now(self) -> None:
        spare = self._spare
        if spare is None or spare == self._advertised:
            return
        body = {"status": {"capacity": spare, "allocatable": spare}}
        try:
            self.core.patch_node_status(self.node, body, _request_timeout=API_TIMEOUT_S)
            self._advertised = spare
        except Exception as exc:
            log.warning("advertising node %s's spare GPU capacity failed: %s", self.node, exc)

    # -- Executor -----------------------------------------------------------------------

    def start(self, launch: Launch) -> PodHandle:
        try:
            self.open()
        except PlatformUnavailable as exc:
            raise StartDeferred(str(exc)) from None
        grant = self.profile.grant(launch.compute_pct, launch.gpus, launch.memory_mib)
        queue = self.queue_settings.get(launch.queue)
        image = launch.image or getattr(queue, "image", None) or self.settings.image
        if not image:
            raise ValueError(
                f"no image: the job names none, and neither queue {launch.queue!r} nor the "
                "policy's kubernetes section has a default"
            )
        env = dict(launch.env)
        if self.profile_name != "direct":
            # the sharing layer's device plugin hands the pod its card (or MIG instance)
            # and sets what CUDA sees: the card ebbtide planned may not be it
            env.pop("CUDA_VISIBLE_DEVICES", None)
        request = PodRequest(
            job_id=launch.job_id,
            attempt=launch.attempt,
            owner=launch.owner,
            queue=launch.queue,
            node=self.node,
            argv=list(launch.argv),
            env=env,
            cwd=launch.cwd,
            image=image,
            deadline_s=launch.deadline_s,
            grant=grant,
            profile=self.profile_name,
            device_uuids=launch.device_uuids,
            checkpoint_claim=getattr(queue, "checkpoint_claim", None)
            or self.settings.checkpoint_claim,
            tolerations=_tuple_or_none(getattr(queue, "tolerations", None)),
            cpus=launch.cpus,
            host_memory_mib=launch.host_memory_mib,
        )
        manifest = pod_manifest(request, self.settings)
        name = manifest["metadata"]["name"]
        launch.stdout_path.parent.mkdir(parents=True, exist_ok=True)
        self._hand_over(launch)
        try:
            created = self.core.create_namespaced_pod(
                self.namespace, manifest, _request_timeout=API_TIMEOUT_S
            )
        except ApiException as exc:
            if exc.status in (400, 422):  # the pod itself is invalid: the job's to fix
                raise ValueError(f"the API server refused pod {name}: {_api_error(exc)}") from None
            # 409: a pod of this attempt is left (the orphan sweep deletes it); 403/404:
            # the install (admission, namespace) is wrong; 5xx: the API is unwell. None is
            # the job's fault: it is requeued, not failed
            raise StartDeferred(f"creating pod {name}: {_api_error(exc)}") from None
        except Exception as exc:  # the API server unreachable (the pod may exist: swept)
            raise StartDeferred(f"creating pod {name}: {exc}") from None
        pod = self.core.api_client.sanitize_for_serialization(created)
        self.watcher.note(pod)
        self._live.add(name)
        return PodHandle(
            pid=0,
            pgid=0,
            name=name,
            namespace=self.namespace,
            uid=pod["metadata"]["uid"],
            created_mono=time.monotonic(),
            stdout_path=launch.stdout_path,
        )

    def _hand_over(self, launch: Launch) -> None:
        """Give the attempt's directory and its checkpoint directory on this node to the
        user its pod runs as (``run_as_user``), so the job can write them.  A link a pod
        left in their place is changed itself, never what it points to."""
        uid, gid = self.settings.run_as_user, self.settings.run_as_group
        if uid is None and gid is None:
            return
        dirs = [launch.stdout_path.parent]
        ckpt = launch.env.get("EBBTIDE_CHECKPOINT_DIR")
        # only ebbtide's own checkpoint directory (<home>/checkpoints/<job>): one the job
        # named is the user's to provide, never a directory of the node's handed over
        own = launch.stdout_path.parents[3] / "checkpoints"
        if not self.settings.checkpoint_claim and ckpt and Path(ckpt).parent == own:
            dirs.append(Path(ckpt))
        for d in dirs:
            d.mkdir(parents=True, exist_ok=True)
            try:
                os.chown(
                    d, -1 if uid is None else uid, -1 if gid is None else gid, follow_symlinks=False
                )
            except OSError as exc:
                log.warning("cannot hand %s to uid %s gid %s: %s", d, uid, gid, exc)

    def tree(self, job_id: int, handle: Handle) -> Tree:
        assert isinstance(handle, PodHandle)
        return Tree(
            job_id=job_id, root_pid=0, root_created=0.0, cgroup_markers=pod_markers(handle.uid)
        )

    def describe(self, handle: Handle) -> str:
        assert isinstance(handle, PodHandle)
        return f"pod {handle.namespace}/{handle.name}"

    def poll(self, handle: Handle) -> Exit | None:
        assert isinstance(handle, PodHandle)
        seen = self.watcher.get(handle.name)
        if seen is None:
            return None  # created, not yet seen by the watch
        if seen.pod.get("metadata", {}).get("uid") not in (None, handle.uid):
            seen = None  # another pod of the same name: ours is gone
        ended = exit_of(
            seen.pod if seen else None,
            gone=seen is None or seen.gone,
            deleting=handle.deleting,
            pending_s=time.monotonic() - handle.created_mono,
            start_timeout_s=self.settings.start_timeout_s,
        )
        if ended is None:
            return None
        if not self._gone(handle):
            return None  # the API says it ended; its processes still hold the GPU
        self._save_logs(handle)
        return ended

    def signal(self, handle: Handle, signum: int) -> None:
        """A warning deletes the pod with the grace left before ``kill_at`` (the kubelet
        sends SIGTERM, whatever ``signum``: a pod cannot be sent another signal);
        SIGKILL deletes it at once."""
        assert isinstance(handle, PodHandle)
        if signum == signal.SIGKILL:
            grace = 0
        elif handle.kill_at_mono is not None:
            left_s = handle.kill_at_mono - time.monotonic() - self.settings.grace_margin_s
            grace = max(1, math.floor(left_s))
        else:
            grace = None  # the pod's own terminationGracePeriodSeconds
        handle.deleting = True
        self._delete(handle.name, handle.uid, grace)
        self._save_logs(handle, final=False)  # what it wrote so far, while the pod is there

    def renew(self, handle: Handle) -> None:
        """Nothing to renew: a pod has no lease (see the module's docstring)."""

    def pause(self, handle: Handle) -> None:
        """Freeze the pod in place: its cgroup v2 freezer (``cgroup.freeze``), found below
        the host's cgroup tree by the pod's UID; where there is none (cgroup v1), SIGSTOP
        to each of its processes on this host."""
        assert isinstance(handle, PodHandle)
        if not self._freeze(handle, True):
            signal_pod_processes(handle.uid, signal.SIGSTOP, self.proc)

    def thaw(self, handle: Handle) -> None:
        assert isinstance(handle, PodHandle)
        if not self._freeze(handle, False):
            signal_pod_processes(handle.uid, signal.SIGCONT, self.proc)

    def _freeze(self, handle: PodHandle, frozen: bool) -> bool:
        """Write the pod's ``cgroup.freeze``; False where it has none to write."""
        directory = find_pod_cgroup(handle.uid, self.cgroup_root)
        if directory is None:
            return False
        try:
            (directory / "cgroup.freeze").write_text("1" if frozen else "0")
        except OSError as exc:
            log.warning("pod %s: cannot write its freezer: %s", handle.name, exc)
            return False
        return True

    def kill_at(self, handle: Handle, monotonic_s: float) -> None:
        assert isinstance(handle, PodHandle)
        handle.kill_at_mono = monotonic_s

    def sweep(self, handle: Handle) -> None:
        assert isinstance(handle, PodHandle)
        if not self._gone(handle):
            # a kill (the deadline, a fence): the slice first.  The deadline waits neither
            # for the API server nor for the kubelet's grace minimum: the pod's processes
            # on this host are killed here, and the pod deleted at once
            kill_pod_processes(handle.uid)
            handle.deleting = True
            self._delete(handle.name, handle.uid, 0)
            self._save_logs(handle)  # what can still be read of it
        else:
            # it ended: its log goes with the pod, so it is read before the pod is deleted
            self._save_logs(handle)
            if handle.log_thread is not None:
                handle.log_thread.join(API_TIMEOUT_S)
            if not handle.deleting:
                handle.deleting = True
                self._delete(handle.name, handle.uid, 0)
        if not wait_until(lambda: self._gone(handle), SWEEP_WAIT_S):
            log.warning("pod %s: its processes are still on this host after a kill", handle.name)
        self.watcher.forget(handle.name)
        self._live.discard(handle.name)

    def reap_leftovers(self) -> list[Leftover]:
        """The pods of this node no agent holds: a finished one's outcome is delivered, a
        running one is deleted at once and its processes waited for."""
        self.open()
        leftovers = []
        for name in self.watcher.names():
            seen = self.watcher.get(name)
            if seen is None:
                continue
            meta = seen.pod.get("metadata") or {}
            labels = meta.get("labels") or {}
            try:
                job_id, attempt = int(labels[LABEL_JOB]), int(labels[LABEL_ATTEMPT])
            except (KeyError, ValueError):
                continue
            handle = PodHandle(
                pid=0,
                pgid=0,
                name=name,
                namespace=self.namespace,
                uid=str(meta.get("uid", "")),
                created_mono=-math.inf,  # past any start timeout
            )
            ended = exit_of(
                seen.pod, gone=False, deleting=False, pending_s=0.0, start_timeout_s=math.inf
            )
            if ended is None:
                log.warning("deleting pod %s, left running by a previous agent", name)
                handle.deleting = True
                self._delete(name, handle.uid, 0)
                wait_until(lambda h=handle: self._gone(h), LEFTOVER_WAIT_S)  # type: ignore[misc]
            else:
                self._delete(name, handle.uid, 0)
            self.watcher.forget(name)
            leftovers.append(Leftover(job_id, attempt, ended))
        return leftovers

    # -- the API ------------------------------------------------------------------------

    def _delete(self, name: str, uid: str | None, grace_s: int | None) -> None:
        from kubernetes.client import V1DeleteOptions, V1Preconditions

        body = V1DeleteOptions(
            grace_period_seconds=grace_s,
            preconditions=V1Preconditions(uid=uid) if uid else None,
        )
        try:
            self.core.delete_namespaced_pod(
                name, self.namespace, body=body, _request_timeout=API_TIMEOUT_S
            )
        except ApiException as exc:
            if exc.status not in (404, 409):  # gone already; another pod of that name
                log.warning("deleting pod %s failed: %s", name, _api_error(exc))
        except Exception as exc:
            log.warning("deleting pod %s failed: %s", name, exc)

    def _save_logs(self, handle: PodHandle, *, final: bool = True) -> None:
        """Copy the container's log to the attempt's ``stdout.log`` (once it ended; and,
        before a deletion, what there is so far), on a thread of its own: the agent's
        loop never waits for the API server's answer."""
        if handle.logs_saved or handle.stdout_path is None:
            return
        if final:
            handle.logs_saved = True
        handle.log_thread = threading.Thread(
            target=self._copy_log, args=(handle, final), name="pod-log", daemon=True
        )
        handle.log_thread.start()

    def _copy_log(self, handle: PodHandle, final: bool) -> None:
        assert handle.stdout_path is not None
        try:
            text = self.core.read_namespaced_pod_log(
                handle.name, self.namespace, container="job", _request_timeout=API_TIMEOUT_S
            )
            text = text if isinstance(text, str) else str(text)
        except Exception as exc:
            if not final:
                return
            text = None
            note = f"[ebbtide] the rest of the log of pod {handle.name} is gone: {exc}\n"
        with handle.log_lock:
            if handle.log_final_written:
                return  # a later, whole copy is there already
            if text is not None:
                _write_no_follow(handle.stdout_path, text, append=False)
            else:
                _write_no_follow(handle.stdout_path, note, append=True)
            handle.log_final_written = final


def _write_no_follow(path: Path, text: str, *, append: bool) -> None:
    """Write a file in a directory the pod can write too, never through a link the job
    put there (the agent is root on the host)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_APPEND if append else os.O_TRUNC)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        log.warning("cannot write %s: %s", path, exc)
        return
    with os.fdopen(fd, "w") as out:
        out.write(text)


def kill_pod_processes(uid: str, proc: Path = Path("/proc")) -> int:
    """SIGKILL every process on this host in the pod with ``uid`` (the agent shares the
    host's PID namespace); how many were signalled."""
    return signal_pod_processes(uid, signal.SIGKILL, proc)


def signal_pod_processes(uid: str, signum: int, proc: Path = Path("/proc")) -> int:
    """Send ``signum`` to every process on this host in the pod with ``uid``; how many."""
    sent = 0
    for entry in proc.iterdir():
        if entry.name.isdigit() and uid in pod_uids(read_cgroup(int(entry.name), proc) or ""):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signum)
                sent += 1
    return sent


def find_pod_cgroup(uid: str, root: Path) -> Path | None:
    """The pod-level cgroup v2 directory of the pod with ``uid`` below ``root`` (the
    host's cgroup tree), under the systemd driver (``kubepods-burstable-pod<uid with
    underscores>.slice``) or cgroupfs (``pod<uid>``), at any QoS level; None when there is
    none with a freezer (cgroup v1, or the pod is gone)."""
    names = {f"*pod{m[3:]}*" for m in pod_markers(uid)}
    for depth in ("kubepods*", "kubepods*/*", "*/kubepods*", "*/kubepods*/*"):
        for name in sorted(names):
            for found in sorted(root.glob(f"{depth}/{name}")):
                if (found / "cgroup.freeze").exists():
                    return found
    return None


def spare_capacity(devices: list[dict[str, Any]]) -> dict[str, str]:
    """The extended resources of a node's spare GPU capacity, from its device reports:
    compute in percent of one GPU (100 per idle card), memory in MiB."""
    core = memory = 0.0
    for d in devices:
        if d.get("health", "healthy") != "healthy" or not d.get("sample_ok", True):
            continue
        held_c = float(d.get("online_compute_pct") or 0) + float(d.get("reserve_compute_pct") or 0)
        held_m = float(d.get("online_memory_mib") or 0) + float(d.get("reserve_memory_mib") or 0)
        core += max(0.0, 100.0 - held_c)
        memory += max(0.0, float(d.get("memory_mib") or 0) - held_m)
    return {RESOURCE_CORE: str(int(core)), RESOURCE_MEMORY: str(int(memory))}


def _tuple_or_none(items: Any) -> tuple[Any, ...] | None:
    """A queue's list setting as a tuple; None (the section's) when it sets none."""
    return None if items is None else tuple(items)


def _api_error(exc: ApiException) -> str:
    return f"{exc.status} {exc.reason}".strip()
