"""Which Kubernetes pod a host process belongs to, from its ``/proc/PID/cgroup``.

On Kubernetes the node agent runs with the host's PID namespace, and NVML names GPU
processes by host pid; a process in a container has no ancestry on the host that leads to
ebbtide, but its cgroup path names its pod.  Layouts understood (``<uid>`` is the pod's
UID, ``<id>`` a container id, 64 hex digits):

- cgroup v1 (one ``ID:controllers:path`` line per hierarchy) and v2 (one ``0::path``
  line), and hybrid hosts with both; every line that names a pod must name the same one;
- the ``cgroupfs`` driver: ``/kubepods[/besteffort|/burstable]/pod<uid>/<id>`` (UID with
  dashes; a guaranteed pod has no QoS level), CRI-O's ``crio-<id>`` as the container;
- the ``systemd`` driver: ``/kubepods.slice/kubepods-burstable.slice/
  kubepods-burstable-pod<uid_with_underscores>.slice/<runtime>-<id>.scope``, where the
  runtime is ``cri-containerd``, ``crio`` (``crio-conmon`` for CRI-O's monitor) or
  ``docker`` (dockershim, cri-dockerd); a guaranteed pod's slice is ``kubepods-pod….slice``;
- runc's unexpanded systemd form ``kubepods-…-pod<uid>.slice:cri-containerd:<id>`` (k3s,
  containerd's own cgroup: ``/system.slice/containerd.service/kubepods-…``);
- Kubernetes nested in a container (kind): the pod's part lies below a prefix such as
  ``/system.slice/docker-<id>.scope/kubelet.slice/kubelet-kubepods-…`` or
  ``/docker/<id>/kubepods/…``;
- paths seen from a private cgroup namespace, relative to the reader's own cgroup
  (``/../../kubepods-besteffort.slice/…``): a pod is recognised by its own directory, not
  by a ``kubepods`` ancestor the reader may not see.

A pod UID is a UUID (``1f2e3d4c-5b6a-7980-a1b2-c3d4e5f60718``), or for a static pod the
kubelet's 32-hex-digit config hash; :class:`PodRef` holds it in canonical form (lower
case, with dashes for a UUID).  When the path runs through several pods (Kubernetes in a
pod), :func:`parse_cgroup` names the innermost, the one whose container holds the process.

Followed: the cgroup path formatters of Koordinator's koordlet
(``koordinator-sh/koordinator``, ``pkg/koordlet/util/system/cgroup_driver.go``: pod-slice
prefixes per QoS class, container-scope prefixes per runtime, CRI-O's scope-less
``crio-<id>`` under cgroupfs), and SPIRE's Kubernetes workload attestor
(``spiffe/spire``, ``pkg/agent/plugin/workloadattestor/k8s/k8s_posix.go``: a pod UID with
either separator, no reliance on a ``kubepods`` ancestor under cgroup namespaces, all
lines agreeing on one pod).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "PodRef",
    "canonical_uid",
    "online_pods",
    "parse_cgroup",
    "pod_markers",
    "pod_of",
    "pod_uids",
    "read_cgroup",
]

#: At most this many names in :func:`online_pods`' list (then one "… and N more").
ONLINE_PODS_SHOWN = 8

_H = "[0-9a-fA-F]"
#: a pod UID as a cgroup path spells it: a UUID with dashes or underscores, or a static
#: pod's config hash (32 hex digits)
_UID = rf"{_H}{{8}}[-_]{_H}{{4}}[-_]{_H}{{4}}[-_]{_H}{{4}}[-_]{_H}{{12}}|{_H}{{32}}"
_UID_TEXT = re.compile(rf"(?:pod)?({_UID})", re.IGNORECASE)
#: systemd driver: ``kubepods-burstable-pod<uid>.slice``, ``kubelet-kubepods-pod<uid>.slice``
_POD_SLICE = re.compile(rf"(?:(.*)-)?pod({_UID})\.slice")
#: cgroupfs driver: ``pod<uid>``
_POD_DIR = re.compile(rf"pod({_UID})")
#: the container below the pod: ``cri-containerd-<id>.scope``, ``crio-<id>.scope``,
#: ``crio-conmon-<id>.scope``, ``docker-<id>.scope``; ``crio-<id>`` or a bare ``<id>``
#: under cgroupfs
_CONTAINER = re.compile(
    rf"(?:(cri-containerd|crio-conmon|crio|docker)-({_H}+)|({_H}{{64}}))(?:\.scope)?"
)
#: runc's unexpanded systemd form: ``<pod>.slice:<runtime prefix>:<id>``
_COLON_FORM = re.compile(r"([^:]+\.slice):([^:]+):([^:]+)")
_RUNTIMES = {
    "cri-containerd": "containerd",
    "crio": "cri-o",
    "crio-conmon": "cri-o",
    "docker": "docker",
}
_QOS = {"besteffort": "besteffort", "burstable": "burstable", "kubepods": "guaranteed"}


@dataclass(frozen=True)
class PodRef:
    """The pod (and container) a process's cgroup names."""

    #: the pod's UID, canonical: lower case, with dashes (a static pod's: 32 hex digits)
    uid: str
    #: the container's id (64 hex digits), when the path goes down to one
    container_id: str | None = None
    #: ``containerd``, ``cri-o`` or ``docker``, when the path tells (cgroupfs does not)
    runtime: str | None = None
    #: ``guaranteed``, ``burstable`` or ``besteffort``, when the path tells
    qos: str | None = None


def canonical_uid(text: str) -> str | None:
    """A pod UID in canonical form, from any of its spellings: with dashes or underscores,
    any case, with or without a ``pod`` prefix; ``None`` if ``text`` is not one."""
    m = _UID_TEXT.fullmatch(text.strip())
    return None if m is None else m.group(1).lower().replace("_", "-")


def pod_markers(uid: str) -> tuple[str, ...]:
    """What marks pod ``uid``'s processes in ``/proc/PID/cgroup`` in any layout:
    ``pod<uid-with-dashes>`` (cgroupfs) and ``pod<uid_with_underscores>`` (systemd), for
    :attr:`~ebbtide.workers.ownership.Tree.cgroup_markers`.  ``uid`` may be spelt either
    way; raises :class:`ValueError` when it is not a pod UID."""
    canonical = canonical_uid(uid)
    if canonical is None:
        raise ValueError(f"{uid!r} is not a pod UID")
    return tuple(dict.fromkeys((f"pod{canonical}", f"pod{canonical.replace('-', '_')}")))


def parse_cgroup(text: str) -> PodRef | None:
    """The pod named by the contents of a ``/proc/PID/cgroup`` file; ``None`` for a process
    in no pod (a systemd service, a user session, the root cgroup, a plain container) or
    whose lines name different pods.  Lines that are not ``ID:controllers:path`` are
    skipped; never raises."""
    found = [ref for path in _paths(text) if (ref := _innermost(_segments(path)))]
    if not found or len({ref.uid for ref in found}) > 1:
        return None
    return next((ref for ref in found if ref.container_id), found[0])


def pod_uids(text: str) -> frozenset[str]:
    """Every pod the cgroup paths in ``text`` run through, on any line, the pods of a
    nested cluster and the pod holding it alike (canonical UIDs; empty: none)."""
    uids: set[str] = set()
    for path in _paths(text):
        uids.update(uid for _, uid, _ in _pods(_segments(path)))
    return frozenset(uids)


def pod_of(pid: int, proc: Path = Path("/proc")) -> PodRef | None:
    """The pod process ``pid`` runs in, from ``proc/PID/cgroup``; ``None`` when it is in
    no pod, or has exited, or its cgroup file cannot be read."""
    text = read_cgroup(pid, proc)
    return None if text is None else parse_cgroup(text)


def read_cgroup(pid: int, proc: Path = Path("/proc")) -> str | None:
    """The contents of ``proc/PID/cgroup``, ``None`` when unreadable (gone, no access)."""
    try:
        return (proc / str(pid) / "cgroup").read_text(errors="replace")
    except (OSError, ValueError):
        return None


def online_pods(
    pids: Iterable[int],
    proc: Path = Path("/proc"),
    *,
    names: Callable[[str], str | None] | None = None,
    limit: int = ONLINE_PODS_SHOWN,
) -> list[str]:
    """Who the processes ``pids`` (host pids) are, for people: the pods first, then the
    processes in no pod, each once, in the order first seen; at most ``limit`` entries
    and then ``… and N more``.

    A pod is ``names(uid)`` when given and it knows the pod (e.g. ``namespace/name``),
    else ``pod:<uid>/<first 12 digits of the container id>`` (``pod:<uid>`` without one);
    a process in no pod (or gone) is ``pid:<n> (<comm>)``.  A ``names`` that raises is
    taken not to know the pod.
    """
    pods: dict[str, None] = {}
    plain: dict[str, None] = {}
    for pid in dict.fromkeys(pids):
        ref = pod_of(pid, proc)
        if ref is None:
            plain[_process_label(pid, proc)] = None
        else:
            pods[_pod_label(ref, names)] = None
    labels = [*pods, *plain]
    if len(labels) <= limit:
        return labels
    return [*labels[:limit], f"… and {len(labels) - limit} more"]


# -- parsing --------------------------------------------------------------------------------


def _paths(text: str) -> list[str]:
    """The cgroup paths of a ``/proc/PID/cgroup`` text (``ID:controllers:path`` lines)."""
    paths = []
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) == 3 and parts[2].startswith("/"):
            paths.append(parts[2])
    return paths


def _segments(path: str) -> list[str]:
    """A path's directories, runc's ``<slice>:<prefix>:<id>`` form expanded to the slice
    and its ``<prefix>-<id>.scope``."""
    out: list[str] = []
    for part in path.split("/"):
        if not part:
            continue
        colon = _COLON_FORM.fullmatch(part)
        if colon:
            out += [colon.group(1), f"{colon.group(2)}-{colon.group(3)}.scope"]
        else:
            out.append(part)
    return out


def _pods(segments: list[str]) -> list[tuple[int, str, str | None]]:
    """The pod directories among ``segments``: (position, canonical UID, QoS class)."""
    pods = []
    for pos, seg in enumerate(segments):
        if "pod" not in seg:
            continue
        sliced = _POD_SLICE.fullmatch(seg)
        if sliced:
            prefix = sliced.group(1) or ""
            qos = _QOS.get(prefix.rsplit("-", 1)[-1]) if prefix else None
            pods.append((pos, _canonical(sliced.group(2)), qos))
            continue
        plain = _POD_DIR.fullmatch(seg)
        if plain:
            qos = _QOS.get(segments[pos - 1]) if pos > 0 else None
            pods.append((pos, _canonical(plain.group(1)), qos))
    return pods


def _innermost(segments: list[str]) -> PodRef | None:
    pods = _pods(segments)
    if not pods:
        return None
    pos, uid, qos = pods[-1]
    container_id = runtime = None
    if pos + 1 < len(segments):
        m = _CONTAINER.fullmatch(segments[pos + 1])
        if m:
            container_id = (m.group(2) or m.group(3)).lower()
            runtime = _RUNTIMES.get(m.group(1) or "")
    return PodRef(uid=uid, container_id=container_id, runtime=runtime, qos=qos)


def _canonical(uid: str) -> str:
    return uid.lower().replace("_", "-")


# -- labels ---------------------------------------------------------------------------------


def _pod_label(ref: PodRef, names: Callable[[str], str | None] | None) -> str:
    if names is not None:
        try:
            name = names(ref.uid)
        except Exception:  # a lookup that fails names nothing; the UID still does
            name = None
        if name:
            return name
    if ref.container_id:
        return f"pod:{ref.uid}/{ref.container_id[:12]}"
    return f"pod:{ref.uid}"


def _process_label(pid: int, proc: Path) -> str:
    try:
        comm = (proc / str(pid) / "comm").read_text(errors="replace").strip()
    except (OSError, ValueError):
        comm = ""
    comm = "".join(c if c.isprintable() else "?" for c in comm[:64])
    return f"pid:{pid} ({comm})" if comm else f"pid:{pid}"
