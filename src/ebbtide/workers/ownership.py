"""Which GPU process is whose: ebbtide's attempts' processes, or an online tenant's.

A process is an attempt's when

- it is the attempt's supervisor (the shim) or one of its descendants — the shim is a
  child subreaper, so a process that daemonises or ``setsid``\\ s away stays below it; or
- its ``/proc/PID/cgroup`` names one of the attempt's cgroup markers (a Kubernetes pod's
  UID, a systemd scope): the way to recognise processes that live in a container with a
  PID namespace of their own, whose ancestry on the host runs through a container runtime.
  A marker that is a pod UID (:func:`~ebbtide.workers.cgroups.pod_markers`) matches a
  process whose cgroup path runs through that pod, in any cgroup layout
  (:mod:`~ebbtide.workers.cgroups`); any other marker matches as a substring of the file
  (as does a UID marker when the file names no pod in a layout ebbtide knows).

Everything else is online.  NVML reports host pids: an agent that does not share the
host's PID namespace sees no ancestry for them, and counts them online (erring towards
less headroom, never towards evicting the online side's room to an offline job).

Lookups are cached per (pid, start time), so a GPU process costs one walk up its
ancestry when it first appears, not one per sample (a later lookup reads one file,
``/proc/PID/stat``); pid reuse starts a new entry.  A
process's verdict changes only when the attempts do: :attr:`ProcessOwnership.epoch` counts
those changes, so that a headroom source may keep the verdicts of a process list it has
not read again.  An
attempt's process that has exited while the driver still lists it (its context being
torn down) stays the attempt's for a few seconds, rather than turning into online load.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

from ebbtide.workers.cgroups import canonical_uid, pod_uids, read_cgroup
from ebbtide.workers.shim import stat_fields

#: Forget cached verdicts of processes not asked about for this many lookups' generations.
_CACHE_GENERATIONS = 200


@dataclass(frozen=True)
class Tree:
    """One attempt's process tree, as the agent knows it."""

    job_id: int
    #: the supervisor's pid and start time (``psutil.Process.create_time``); 0 when it has
    #: none on this host (a Kubernetes pod's attempt: known by its cgroup markers alone)
    root_pid: int
    root_created: float
    #: what marks the attempt's processes in ``/proc/PID/cgroup``: its pod's
    #: :func:`~ebbtide.workers.cgroups.pod_markers` (matched by pod UID), or substrings
    cgroup_markers: tuple[str, ...] = ()


class ProcessOwnership:
    """An :class:`~ebbtide.workers.headroom.base.Offline` over the attempts' process trees.

    The agent calls :meth:`update` every tick with its attempts and the slices they hold;
    a headroom source then asks :meth:`owner` about each GPU process it sees.
    ``proc`` is the ``/proc`` to read cgroups from (tests point it elsewhere).
    """

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self._proc = proc
        self._trees: frozenset[Tree] = frozenset()
        #: root pid → tree, for the trees with a supervisor here
        self._roots: dict[int, Tree] = {}
        #: the trees with cgroup markers, by job id
        self._marked: list[Tree] = []
        self._granted: dict[int, tuple[float, float]] = {}
        #: (pid, start time in clock ticks since boot) → (job, generation last asked)
        self._cache: dict[tuple[int, int], tuple[int | None, int]] = {}
        #: pid → job of processes found to be an attempt's (a process that just exited
        #: may still be listed by the driver; it was offline, not online)
        self._recent: dict[int, int] = {}
        self._generation = 0
        #: changes whenever the trees do (then a pid's owner may have changed); while it
        #: stays the same, a process's owner does too
        self.epoch = 0

    def update(
        self,
        trees: list[Tree],
        granted: Mapping[int, tuple[float, float]] | None = None,
    ) -> None:
        """The attempts now running here, and (compute %, memory MiB) granted per device."""
        new = frozenset(trees)
        if new != self._trees:
            self._cache.clear()  # a tree began or ended: verdicts may have changed
            self.epoch += 1
            self._trees = new
            self._roots = {t.root_pid: t for t in trees if t.root_pid > 0}
            self._marked = sorted((t for t in new if t.cgroup_markers), key=lambda t: t.job_id)
        self._granted = dict(granted or {})
        self.tick()

    def tick(self) -> None:
        """A lookups' generation passed with the same trees (:meth:`update` counts one
        too): verdicts not asked about for ``_CACHE_GENERATIONS`` are forgotten."""
        self._generation += 1
        if self._generation % _CACHE_GENERATIONS == 0:
            horizon = self._generation - _CACHE_GENERATIONS
            self._cache = {k: v for k, v in self._cache.items() if v[1] >= horizon}
            live = {pid for pid, _ in self._cache}
            self._recent = {p: j for p, j in self._recent.items() if p in live}

    def owner(self, pid: int) -> int | None:
        fields = stat_fields(pid) if pid > 0 else []
        if len(fields) <= 19:
            # gone, though the driver still lists it for a moment: what it last was
            return self._recent.get(pid)
        key = (pid, int(fields[19]))
        hit = self._cache.get(key)
        if hit is not None:
            self._cache[key] = (hit[0], self._generation)
            return hit[0]
        try:
            proc = psutil.Process(pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
            return self._recent.get(pid)
        job = self._resolve(proc)
        self._cache[key] = (job, self._generation)
        if job is not None:
            self._recent[pid] = job
        return job

    def _resolve(self, proc: psutil.Process) -> int | None:
        try:
            chain = [proc, *proc.parents()]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            chain = [proc]
        for p in chain:
            tree = self._roots.get(p.pid)
            if tree is None:
                continue
            try:
                if abs(p.create_time() - tree.root_created) < 0.05:
                    return tree.job_id
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return self._by_cgroup(proc.pid)

    def _by_cgroup(self, pid: int) -> int | None:
        if not self._marked:
            return None
        text = read_cgroup(pid, self._proc)
        if text is None:
            return None
        pods = pod_uids(text)
        for tree in self._marked:
            if any(_marks(marker, text, pods) for marker in tree.cgroup_markers):
                return tree.job_id
        return None

    def granted_compute_pct(self, index: int) -> float:
        return self._granted.get(index, (0.0, 0.0))[0]

    def granted_memory_mib(self, index: int) -> float:
        return self._granted.get(index, (0.0, 0.0))[1]


def _marks(marker: str, text: str, pods: frozenset[str]) -> bool:
    """Whether ``marker`` marks a process with cgroup file ``text`` running through
    ``pods``: a pod UID marker (``pod<uid>``, or a bare UUID) by UID, when the file names
    pods; anything else as a substring."""
    uid = _marker_uid(marker)
    if uid is None or not pods:
        return marker in text
    return uid in pods


def _marker_uid(marker: str) -> str | None:
    """The pod UID a marker names, if it is one: ``pod`` and a whole UID, or a bare UUID
    (a bare 32-hex-digit string could be part of anything: it stays a substring)."""
    uid = canonical_uid(marker)
    if uid is None or not (marker.startswith("pod") or "-" in uid):
        return None
    return uid
