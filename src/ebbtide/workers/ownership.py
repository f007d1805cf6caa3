"""Which GPU process is whose: ebbtide's attempts' processes, or an online tenant's.

A process is an attempt's when

- it is the attempt's supervisor (the shim) or one of its descendants — the shim is a
  child subreaper, so a process that daemonises or ``setsid``\\ s away stays below it; or
- its ``/proc/PID/cgroup`` names one of the attempt's cgroup markers (a Kubernetes pod's
  UID, a systemd scope): the way to recognise processes that live in a container with a
  PID namespace of their own, whose ancestry on the host runs through a container runtime.

Everything else is online.  NVML reports host pids: an agent that does not share the
host's PID namespace sees no ancestry for them, and counts them online (erring towards
less headroom, never towards evicting the online side's room to an offline job).

Lookups are cached per (pid, start time), so a GPU process costs one walk up its
ancestry when it first appears, not one per sample; pid reuse starts a new entry.  An
attempt's process that has exited while the driver still lists it (its context being
torn down) stays the attempt's for a few seconds, rather than turning into online load.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

#: Forget cached verdicts of processes not asked about for this many lookups' generations.
_CACHE_GENERATIONS = 200


@dataclass(frozen=True)
class Tree:
    """One attempt's process tree, as the agent knows it."""

    job_id: int
    #: the supervisor's pid and start time (``psutil.Process.create_time``)
    root_pid: int
    root_created: float
    #: substrings of ``/proc/PID/cgroup`` that mark the attempt's processes
    cgroup_markers: tuple[str, ...] = ()


class ProcessOwnership:
    """An :class:`~ebbtide.workers.headroom.base.Offline` over the attempts' process trees.

    The agent calls :meth:`update` every tick with its attempts and the slices they hold;
    a headroom source then asks :meth:`owner` about each GPU process it sees.
    ``proc`` is the ``/proc`` to read cgroups from (tests point it elsewhere).
    """

    def __init__(self, proc: Path = Path("/proc")) -> None:
        self._proc = proc
        self._trees: dict[int, Tree] = {}
        self._granted: dict[int, tuple[float, float]] = {}
        self._cache: dict[tuple[int, float], tuple[int | None, int]] = {}
        #: pid → job of processes found to be an attempt's (a process that just exited
        #: may still be listed by the driver; it was offline, not online)
        self._recent: dict[int, int] = {}
        self._generation = 0

    def update(
        self,
        trees: list[Tree],
        granted: Mapping[int, tuple[float, float]] | None = None,
    ) -> None:
        """The attempts now running here, and (compute %, memory MiB) granted per device."""
        new = {t.root_pid: t for t in trees}
        if new != self._trees:
            self._cache.clear()  # a tree began or ended: verdicts may have changed
            self._trees = new
        self._granted = dict(granted or {})
        self._generation += 1
        if self._generation % _CACHE_GENERATIONS == 0:
            horizon = self._generation - _CACHE_GENERATIONS
            self._cache = {k: v for k, v in self._cache.items() if v[1] >= horizon}
            live = {pid for pid, _ in self._cache}
            self._recent = {p: j for p, j in self._recent.items() if p in live}

    def owner(self, pid: int) -> int | None:
        try:
            proc = psutil.Process(pid)
            key = (pid, proc.create_time())
        except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
            # gone, though the driver still lists it for a moment: what it last was
            return self._recent.get(pid)
        hit = self._cache.get(key)
        if hit is not None:
            self._cache[key] = (hit[0], self._generation)
            return hit[0]
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
            tree = self._trees.get(p.pid)
            if tree is None:
                continue
            try:
                if abs(p.create_time() - tree.root_created) < 0.05:
                    return tree.job_id
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return self._by_cgroup(proc.pid)

    def _by_cgroup(self, pid: int) -> int | None:
        marked = [t for t in self._trees.values() if t.cgroup_markers]
        if not marked:
            return None
        try:
            text = (self._proc / str(pid) / "cgroup").read_text()
        except OSError:
            return None
        for tree in marked:
            if any(marker in text for marker in tree.cgroup_markers):
                return tree.job_id
        return None

    def granted_compute_pct(self, index: int) -> float:
        return self._granted.get(index, (0.0, 0.0))[0]

    def granted_memory_mib(self, index: int) -> float:
        return self._granted.get(index, (0.0, 0.0))[1]
